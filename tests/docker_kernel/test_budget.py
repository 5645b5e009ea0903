"""The local kernel budget of the Docker backend (issue 28 item 4): ``max_kernels`` and ``max_memory``
per provisioner process, standbys included; past it a launch waits up to ``launch_timeout`` or
fails with :class:`KernelBudgetExceeded` naming the option."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from kernel_sandbox.docker.containers import LABEL_KERNEL_ID
from kernel_sandbox.docker.connect import docker_client
from kernel_sandbox.errors import ConfigError, KernelBudgetExceeded, KernelLaunchError
from kernel_sandbox.provisioners import budget as budget_module
from kernel_sandbox.docker import provisioner as docker_provisioner
from kernel_sandbox.provisioners import launched, standby
from kernel_sandbox.provisioners.budget import Claim, KernelBudget
from kernel_sandbox.provisioners.standby import POOL, STANDBY_ID_PREFIX
from kernel_sandbox.docker.settings import DockerSettings
from kernel_sandbox.parsers import MiB

from support.kernel import run_cell
from support.reattach import end_launcher, make_orphans

MEMORY = "128m"


@pytest.fixture
def empty_budget(monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelBudget]:
    """A fresh process budget, as a new server has: kernels and standbys that earlier tests of this
    process still hold keep their shares in the old one. The pool's standbys are stopped first."""
    POOL.clear(wait=60)
    fresh = KernelBudget()
    for module in (budget_module, launched, standby):
        monkeypatch.setattr(module, "BUDGET", fresh)
    yield fresh
    POOL.clear(wait=60)


# ---- the budget itself (no engine) -------------------------------------------------------------


async def test_a_launch_waits_for_room_and_gets_it_when_a_kernel_ends() -> None:
    budget = KernelBudget()
    claim = Claim(memory=128 * MiB, max_kernels=2, max_memory=None)
    held = [budget.try_acquire(claim), budget.try_acquire(claim)]
    assert None not in held and budget.try_acquire(claim) is None
    waiting = asyncio.ensure_future(budget.acquire(claim, 60))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    held[0].release()
    held[0].release()  # twice is once
    assert (await waiting) is not None and budget.kernels == 2


async def test_no_room_until_the_deadline_names_the_option() -> None:
    budget = KernelBudget()
    by_count = Claim(memory=0, max_kernels=1, max_memory=None)
    budget.try_acquire(by_count)
    with pytest.raises(KernelBudgetExceeded, match=r"max_kernels=1: this process runs 1 Docker kernels .*launch_timeout"):
        await budget.acquire(by_count, 0.1)
    by_memory = Claim(memory=300 * MiB, max_kernels=None, max_memory=512 * MiB)
    budget.try_acquire(by_memory)
    with pytest.raises(KernelBudgetExceeded, match=r"max_memory=512m: .* hold 300m of memory limits and this one asks for 300m"):
        await budget.acquire(by_memory, 0.1)
    assert isinstance(KernelBudgetExceeded("x"), KernelLaunchError)


def test_a_reattached_kernel_is_counted_even_past_the_limit() -> None:
    budget = KernelBudget()
    claim = Claim(memory=0, max_kernels=1, max_memory=None)
    first = budget.try_acquire(claim)
    again = budget.hold(claim)
    assert budget.kernels == 2 and budget.try_acquire(claim) is None
    first.release()
    again.release()
    assert budget.kernels == 0


def test_a_kernel_let_go_for_the_next_server_gives_its_share_back(empty_budget: KernelBudget) -> None:
    provisioner = docker_provisioner.DockerProvisioner(kernel_id="let-go", kernel_spec=None)
    provisioner._reserve(empty_budget.hold(Claim(memory=0, max_kernels=None, max_memory=None)))
    assert empty_budget.kernels == 1
    provisioner.detach()  # what the server extension does on a shutdown that keeps kernels
    assert empty_budget.kernels == 0


async def test_a_waiting_launch_asks_for_room_from_idle_standbys() -> None:
    budget = KernelBudget()
    claim = Claim(memory=0, max_kernels=1, max_memory=None)
    standby = budget.try_acquire(claim)
    asked: list[bool] = []

    def make_room() -> bool:
        asked.append(True)
        standby.release()
        return True

    assert await budget.acquire(claim, 60, make_room) is not None and asked == [True]


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"max_kernels": 0}, "max_kernels=0"),
        ({"max_kernels": "4"}, "max_kernels='4'"),
        ({"max_kernels": True}, "max_kernels=True"),
        ({"max_memory": "lots"}, "max_memory='lots'"),
        ({"max_suspended_bytes": "lots"}, "max_suspended_bytes='lots'"),
        ({"max_memory": "1g", "memory": "2g"}, "does not fit in max_memory=1024m"),
        ({"max_memory": "1g", "memory": "unlimited"}, "memory='unlimited' does not fit in max_memory"),
    ],
)
def test_bad_budgets_are_refused_naming_the_option(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DockerSettings.from_config(config)


# ---- Docker kernels through jupyter_client ---------------------------------------------------------


def manager(**options: Any) -> AsyncKernelManager:
    config = Config({"DockerProvisioner": {"memory": MEMORY, "standby": 0, **options}})
    return AsyncKernelManager(kernel_name="sandboxed-python", config=config, kernel_id=uuid.uuid4().hex)


class Peak:
    """The most containers of ``kernel_ids`` seen at once, sampled on the engine in a thread."""

    def __init__(self, kernel_ids: set[str]) -> None:
        self.kernel_ids = kernel_ids
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        client = docker_client()
        while not self._stop.is_set():
            containers = client.containers.list(filters={"label": LABEL_KERNEL_ID}, sparse=True)
            mine = [c for c in containers if (c.attrs.get("Labels") or {}).get(LABEL_KERNEL_ID) in self.kernel_ids]
            self.most = max(self.most, len(mine))
            self._stop.wait(0.05)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.security("load", "sessions")
@pytest.mark.usefixtures("docker_engine", "jupyter_prefix")
async def test_twenty_concurrent_starts_never_exceed_the_budget_and_all_run(empty_budget: KernelBudget) -> None:
    """max_kernels=4 and max_memory=512m (4 x 128m): 20 launches at once, at most 4 containers at any time."""
    managers = [manager(max_kernels=4, max_memory="512m", launch_timeout=600.0) for _ in range(20)]

    async def one(km: AsyncKernelManager) -> str:
        await km.start_kernel()
        try:
            out, reply = await run_cell(km, "print(6 * 7)", timeout=300, ready_timeout=300)
            assert reply["status"] == "ok"
            return out
        finally:
            await km.shutdown_kernel(now=True)

    with Peak({km.kernel_id for km in managers}) as peak:
        outputs = await asyncio.gather(*(one(km) for km in managers))
    assert outputs == ["42\n"] * 20
    assert 1 <= peak.most <= 4, f"{peak.most} kernels ran at once"
    assert empty_budget.kernels == 0, "every kernel gave its share back"


@pytest.mark.security("attack", "options")
@pytest.mark.usefixtures("docker_engine", "jupyter_prefix")
async def test_past_the_budget_a_launch_fails_at_its_deadline_naming_the_option(empty_budget: KernelBudget) -> None:
    first = manager(max_kernels=1)
    await first.start_kernel()
    try:
        second = manager(max_kernels=1, launch_timeout=1.0)
        with pytest.raises(KernelBudgetExceeded, match="max_kernels=1"):
            await second.start_kernel()
        assert empty_budget.kernels == 1
    finally:
        await first.shutdown_kernel(now=True)
    assert empty_budget.kernels == 0


@pytest.mark.usefixtures("docker_engine", "jupyter_prefix")
async def test_standbys_count_and_make_room_for_a_launch_of_another_configuration(empty_budget: KernelBudget) -> None:
    first = manager(max_kernels=2, standby=1)
    await first.start_kernel()  # cold, then a standby of its configuration is started beside it
    try:
        for _ in range(600):
            standbys = [s for s in POOL.standbys() if s.kernel_id.startswith(STANDBY_ID_PREFIX) and s.started.done()]
            if standbys and empty_budget.kernels == 2:
                break
            await asyncio.sleep(0.1)
        assert empty_budget.kernels == 2, "the standby holds a share of the budget"
        other = manager(max_kernels=2, env={"OTHER": "1"}, launch_timeout=120.0)
        await other.start_kernel()  # the budget is full with the standby: it is stopped to make room
        try:
            out, _ = await run_cell(other, "import os; print(os.environ['OTHER'])")
            assert out == "1\n"
            assert not [s for s in POOL.standbys() if s.recipe.settings.get("max_kernels") == 2 and s.alive()]
        finally:
            await other.shutdown_kernel(now=True)
    finally:
        await first.shutdown_kernel(now=True)
        POOL.clear(wait=60)
    assert empty_budget.kernels == 0


@pytest.mark.security("attack", "sessions")
@pytest.mark.parametrize("how", ["attach", "server"])
@pytest.mark.usefixtures("docker_engine", "jupyter_prefix")
async def test_a_reattached_kernel_takes_its_share_back_and_the_next_launch_is_refused(
    how: str, empty_budget: KernelBudget, tmp_path: Path
) -> None:
    """A kernel re-attached (Sandbox.attach, a restarted server) holds its share: under max_kernels=1 no second kernel starts."""
    from kernel_sandbox.kernelspecs import SandboxKernelSpecManager
    from kernel_sandbox.reattach import attach
    from kernel_sandbox.server import ReattachingKernelManager

    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    [orphan] = make_orphans(1, runtime)
    try:
        if how == "attach":
            km = manager(max_kernels=1)
            await attach(orphan.kernel_id, km)
            shutdown = km.shutdown_kernel(now=True)
        else:
            server = ReattachingKernelManager(connection_dir=str(runtime), kernel_spec_manager=SandboxKernelSpecManager(),
                                              config=Config({"DockerProvisioner": {"max_kernels": 1}}))
            assert server.list_kernel_ids() == [orphan.kernel_id]  # re-attached as it started
            shutdown = server.shutdown_kernel(orphan.kernel_id, now=True)
        assert empty_budget.kernels == 1, "the re-attached kernel holds its share"
        second = manager(max_kernels=1, launch_timeout=1.0)
        with pytest.raises(KernelBudgetExceeded, match="max_kernels=1: this process runs 1 Docker kernels"):
            await second.start_kernel()
        assert not docker_client().containers.list(filters={"label": f"{LABEL_KERNEL_ID}={second.kernel_id}"})
        await shutdown
        assert empty_budget.kernels == 0, "its share went back when it was shut down"
    finally:
        end_launcher(orphan.launcher_pid)
