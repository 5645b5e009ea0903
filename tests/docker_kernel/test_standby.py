"""Standby kernels (issue 13 item 1): adopted once, clean, matched on their whole configuration,
refilled, replaced after an image rebuild, removed with their process or by the orphan guard."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import httpx
import pytest
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from kernel_sandbox.docker.containers import LABEL, LABEL_KERNEL_ID, LABEL_LAUNCHER_PID, LABEL_OWNER_PID, LABEL_PRIVATE_DIR, OURS, kernel_of
from kernel_sandbox.docker.settings import DEFAULT_IMAGE
from kernel_sandbox.docker.settings import DockerSettings
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import AsyncSandboxPool
from kernel_sandbox.kernelspecs import install
from kernel_sandbox.privdir import LAUNCHER_STATE, OWNER_LOCK, PrivateDir
from kernel_sandbox.provisioners import standby as standby_module
from kernel_sandbox.provisioners.standby import (
    CONNECTION_FILE,
    POOL,
    STANDBY_ID_PREFIX,
    Standby,
)
from kernel_sandbox.parsers import MAX_STANDBY

from support.kernel import run_cell

pytestmark = pytest.mark.usefixtures("docker_engine", "jupyter_prefix")

READY_WAIT = 180
"""Seconds a standby may take to start on a loaded machine (a deadline, not an expectation)."""
PROBE = """\
import json, os, sys
ip = get_ipython()
print(json.dumps({
    "modules": sorted(sys.modules),
    "In": list(In), "Out": {str(k): repr(v) for k, v in Out.items()},
    "history": [entry[2] for entry in ip.history_manager.get_range()],
    "names": sorted(name for name in ip.user_ns if not name.startswith("_")),
    "session": globals().get("__session__"), "session_env": os.environ.get("JPY_SESSION_NAME"),
    "files": sorted(os.listdir("/tmp") + os.listdir(".")),
}))
"""


def provisioner_config(**options: Any) -> Config:
    return Config({"DockerProvisioner": options})


async def start(config: Config, **kwargs: Any) -> AsyncKernelManager:
    km = AsyncKernelManager(kernel_name="sandboxed-python", config=config)
    await km.start_kernel(**kwargs)
    return km


async def run(km: AsyncKernelManager, code: str) -> dict[str, Any]:
    """Execute ``code``; its stdout, the reply's execution count and status."""
    out, reply = await run_cell(km, code)
    return {"stdout": out, "count": reply.get("execution_count"), "status": reply["status"], "ename": reply.get("ename")}


async def probe(km: AsyncKernelManager) -> dict[str, Any]:
    result = await run(km, PROBE)
    assert result["status"] == "ok", result
    return {**json.loads(result["stdout"]), "count": result["count"]}


async def ready_standby(exclude: tuple[Standby, ...] = ()) -> Standby:
    """The pool's next ready standby (waiting for one that is starting), with a deadline."""
    deadline = time.monotonic() + READY_WAIT
    while True:
        waiting = [s for s in POOL.standbys() if s not in exclude and not s.stopped]
        for standby in waiting:
            if standby.started.done() and standby.started.result():
                return standby
        assert time.monotonic() < deadline, f"no standby became ready within {READY_WAIT} s: {POOL.standbys()}"
        await asyncio.sleep(0.2)


def container_of(standby: Standby) -> str:
    assert standby.private is not None
    return str(standby.private.read_json(LAUNCHER_STATE)["container_id"])


def wait_gone(client: Any, container_id: str, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while client.containers.list(all=True, ignore_removed=True, filters={"id": container_id}):
        assert time.monotonic() < deadline, f"{what} {container_id[:12]} still there after {seconds:g} s"
        time.sleep(0.2)


def clear_pool(client: Any) -> None:
    """Stop every standby of this process and wait until their containers are gone."""
    standbys = POOL.standbys()
    containers = [container_of(s) for s in standbys if s.started.done() and s.started.result()]
    POOL.clear()
    for standby in standbys:
        if standby.process is not None:
            standby.process.wait(timeout=READY_WAIT)
    for container_id in containers:
        wait_gone(client, container_id, 60, "the standby's container")


@pytest.fixture(autouse=True)
def empty_pool(docker_engine) -> Iterator[None]:
    clear_pool(docker_engine)
    yield
    clear_pool(docker_engine)


@pytest.fixture
async def kernels() -> AsyncIterator[list[AsyncKernelManager]]:
    """Kernel managers the test starts; all shut down at the end."""
    started: list[AsyncKernelManager] = []
    yield started
    await asyncio.gather(*(km.shutdown_kernel(now=True) for km in started if km.has_kernel))


# -- the option --------------------------------------------------------------------------------


@pytest.mark.security("fault", "options")
@pytest.mark.parametrize("value", [-1, MAX_STANDBY + 1, True, 1.5, "1", None])
def test_a_wrong_standby_count_is_refused_naming_the_option(value: object) -> None:
    """standby must be a whole number from 0 to MAX_STANDBY."""
    with pytest.raises(ConfigError, match=r"^standby="):
        DockerSettings.from_config({"standby": value})


def test_standby_defaults_to_one_and_zero_turns_it_off() -> None:
    assert DockerSettings().standby == 1
    assert DockerSettings.from_config({"standby": 0}).standby == 0


def test_a_sandbox_pool_keeps_no_provisioner_standbys_unless_asked() -> None:
    assert AsyncSandboxPool(size=1)._options["standby"] == 0
    assert AsyncSandboxPool(size=1, standby=2)._options["standby"] == 2


# -- adoption ----------------------------------------------------------------------------------


@pytest.mark.security("attack", "sessions")
async def test_a_standby_is_adopted_once_clean_and_replaced(kernels: list[AsyncKernelManager], docker_engine) -> None:
    """A kernel marked by its user is never handed to the next: each launch adopts a fresh, unused standby."""
    config = provisioner_config()
    kernels.append(first := await start(config))  # cold: the pool was empty
    waiting = await ready_standby()
    idle = container_of(waiting)
    assert waiting.private is not None
    assert not PrivateDir(waiting.private.path).hold(OWNER_LOCK), "the pool holds the standby's owner lock"
    assert first.provisioner.container_id != idle

    kernels.append(second := await start(config))
    assert second.provisioner.private is waiting.private and second.provisioner.process is waiting.process
    assert second.provisioner.container_id == idle
    assert OWNER_LOCK in second.provisioner.private._held, "the owner lock passed to the provisioner"
    assert waiting not in POOL.standbys()
    used = await probe(second)
    await run(second, "marker = 'second user'\nopen('/tmp/mark', 'w').write('x'); open('mark', 'w').write('x')")

    replacement = await ready_standby(exclude=(waiting,))
    kernels.append(third := await start(config))
    assert third.provisioner.container_id == container_of(replacement) != idle
    fresh = await probe(third)
    assert "marker" not in fresh["names"] and "mark" not in fresh["files"]
    assert fresh == used  # nothing of the second user: same modules, In, Out, history, names, files
    assert fresh["count"] == 1 and len(fresh["In"]) == 2 and fresh["Out"] == {} and len(fresh["history"]) == 1


@pytest.mark.security("attack", "sessions")
async def test_an_adopted_kernel_is_what_a_cold_start_gives(kernels: list[AsyncKernelManager], docker_engine) -> None:
    """Modules, In/Out, history, names and the session name of an adopted kernel equal a cold kernel's."""
    env = {**os.environ, "JPY_SESSION_NAME": "/home/me/notebooks/analysis.ipynb"}
    kernels.append(await start(provisioner_config(), env={**os.environ}))
    waiting = await ready_standby()
    kernels.append(adopted := await start(provisioner_config(), env=env))
    assert adopted.provisioner.container_id == container_of(waiting)
    assert kernel_of(docker_engine.containers.get(adopted.provisioner.container_id).labels) == adopted.kernel_id
    kernels.append(cold := await start(provisioner_config(standby=0), env=env))
    assert docker_engine.containers.get(cold.provisioner.container_id).labels[LABEL_KERNEL_ID] == cold.kernel_id
    from_standby, from_cold = await probe(adopted), await probe(cold)
    assert from_standby["session"] == from_standby["session_env"] == env["JPY_SESSION_NAME"]
    assert from_standby == from_cold


async def test_restart_of_an_adopted_kernel_is_fresh_and_keeps_its_addresses(kernels: list[AsyncKernelManager]) -> None:
    kernels.append(await start(provisioner_config()))
    waiting = await ready_standby()
    kernels.append(km := await start(provisioner_config()))
    adopted = km.provisioner.container_id
    assert adopted == container_of(waiting)
    await run(km, "secret = 1")
    addresses = km.get_connection_info()
    replacement = await ready_standby(exclude=(waiting,))
    await km.restart_kernel(now=True)
    assert km.get_connection_info() == addresses  # connected clients stay connected
    assert km.provisioner.container_id not in (adopted, container_of(replacement))
    assert replacement in POOL.standbys()  # a restart never takes the standby
    assert (await run(km, "secret"))["ename"] == "NameError"


@pytest.mark.security("attack", "sessions")
async def test_a_standby_of_other_settings_is_never_handed_out(
    kernels: list[AsyncKernelManager], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launches that differ in an option, the kernel's environment, the server's or a mount start cold."""
    monkeypatch.setattr(standby_module, "MAX_CONFIGURATIONS", 8)
    base = {"env": {"WHO": "a"}}
    kernels.append(await start(provisioner_config(**base)))
    waiting = await ready_standby()
    idle = container_of(waiting)
    (tmp_path / "data").mkdir()
    others = [
        (provisioner_config(env={"WHO": "b"}), {}),
        (provisioner_config(**base, memory="512m"), {}),
        (provisioner_config(**base, mounts=[f"{tmp_path / 'data'}:data"]), {}),
        (provisioner_config(**base), {"env": {**os.environ, "DOCKER_CONFIG": str(tmp_path)}}),
    ]
    for config, kwargs in others:
        kernels.append(km := await start(config, **kwargs))
        assert km.provisioner.container_id != idle
        assert waiting in POOL.standbys() and waiting.alive()
    kernels.append(same := await start(provisioner_config(**base)))
    assert same.provisioner.container_id == idle


async def test_standbys_are_kept_for_the_most_recent_configurations(
    kernels: list[AsyncKernelManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(standby_module, "MAX_CONFIGURATIONS", 2)
    for who in ("a", "b"):
        kernels.append(await start(provisioner_config(env={"WHO": who})))
    first, second = [await ready_standby()], []
    second.append(await ready_standby(exclude=tuple(first)))
    kernels.append(await start(provisioner_config(env={"WHO": "c"})))  # a third: the least recent goes
    oldest = min(first + second, key=lambda s: s.recipe.settings["env"]["WHO"])
    assert oldest.recipe.settings["env"]["WHO"] == "a" and oldest.stopped
    assert oldest.process is not None and await asyncio.to_thread(oldest.process.wait, READY_WAIT) == 0
    assert sorted(s.recipe.settings["env"]["WHO"] for s in POOL.standbys()) == ["b", "c"]


@pytest.mark.security("fault", "sessions")
async def test_a_failing_refill_never_breaks_a_launch(
    kernels: list[AsyncKernelManager], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Standbys that cannot start cost cold starts, logged once."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("injected: no connection file for standbys")

    monkeypatch.setattr(standby_module, "write_connection_file", refuse)
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        kernels.append(km := await start(provisioner_config()))
        assert (await run(km, "print('up')"))["stdout"] == "up\n"
        deadline = time.monotonic() + 30
        while POOL.standbys():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    warnings = [r for r in caplog.records if "standby kernel could not be started" in r.getMessage()]
    assert len(warnings) == 1 and "injected" in warnings[0].getMessage()


# -- image rebuilds ------------------------------------------------------------------------------


@pytest.fixture
def rebuilt_image(docker_engine) -> Iterator[tuple[str, Any]]:
    """A tag of the kernel image and a function that 'rebuilds' it (a new id under the same tag).

    Request it before ``kernels``: its images are removed after the kernels and standbys using them.
    """
    tag = f"kernel-sandbox-standby-test:{os.getpid()}"
    docker_engine.images.get(DEFAULT_IMAGE).tag(tag)
    made: list[str] = []

    def rebuild() -> str:
        dockerfile = f"FROM {DEFAULT_IMAGE}\nLABEL kernel-sandbox-standby-test={time.time_ns()}\n"
        image, _ = docker_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, network_mode="none")
        made.append(image.id)
        return str(image.id)

    yield tag, rebuild
    clear_pool(docker_engine)
    try:
        docker_engine.images.remove(tag, noprune=False)
    except docker.errors.APIError:
        pass
    for image_id in made:
        try:
            docker_engine.images.remove(image_id)
        except docker.errors.APIError:
            pass


async def test_an_image_rebuild_replaces_the_standbys(rebuilt_image, kernels: list[AsyncKernelManager], docker_engine) -> None:
    tag, rebuild = rebuilt_image
    config = provisioner_config(image=tag)
    kernels.append(await start(config))
    old = await ready_standby()
    old_container = container_of(old)
    new_id = await asyncio.to_thread(rebuild)
    kernels.append(km := await start(config))
    assert km.provisioner.container_id != old_container  # cold, on the new image
    assert docker_engine.containers.get(km.provisioner.container_id).image.id == new_id
    await asyncio.to_thread(wait_gone, docker_engine, old_container, 120, "the old image's standby")
    new = await ready_standby(exclude=(old,))
    assert docker_engine.containers.get(container_of(new)).image.id == new_id
    kernels.append(adopted := await start(config))
    assert adopted.provisioner.container_id == container_of(new)


# -- removal -------------------------------------------------------------------------------------

OWNER = """
import asyncio, json, sys, time
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config
from kernel_sandbox.privdir import LAUNCHER_STATE
from kernel_sandbox.provisioners.standby import POOL

async def main():
    km = AsyncKernelManager(kernel_name="sandboxed-python",
                            config=Config({"DockerProvisioner": {"orphan_timeout": %(orphan)s}}))
    await km.start_kernel()
    deadline = time.monotonic() + %(wait)s
    while not any(s.started.done() and s.started.result() for s in POOL.standbys()):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    [standby] = POOL.standbys()
    print(json.dumps({"kernel": km.provisioner.container_id, "standby": standby.private.read_json(LAUNCHER_STATE)["container_id"],
                      "private": str(standby.private.path)}), flush=True)
    if sys.argv[1] == "wait":
        await asyncio.sleep(3600)
    await km.shutdown_kernel()

asyncio.run(main())
"""


def run_owner(mode: str, orphan: float) -> tuple[subprocess.Popen[str], dict[str, str]]:
    script = OWNER % {"orphan": orphan, "wait": READY_WAIT}
    process = subprocess.Popen([sys.executable, "-c", script, mode], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"the owner process ended early (code {process.wait()})"
    return process, json.loads(line)


@pytest.mark.security("fault", "sessions")
def test_standbys_are_removed_when_their_process_exits(docker_engine) -> None:
    """A process that exits cleanly takes its standby with it (container and private directory)."""
    process, found = run_owner("exit", orphan=30)
    assert process.wait(timeout=120) == 0
    assert not docker_engine.containers.list(all=True, ignore_removed=True, filters={"id": found["standby"]})  # gone before the exit
    assert not Path(found["private"]).exists()
    assert not docker_engine.containers.list(all=True, ignore_removed=True, filters={"id": found["kernel"]})


@pytest.mark.security("fault", "sessions")
def test_the_orphan_guard_removes_the_standby_of_a_killed_process(docker_engine) -> None:
    """SIGKILL of the process that keeps a standby: its container is gone within orphan_timeout."""
    orphan = 3
    process, found = run_owner("wait", orphan=orphan)
    try:
        assert docker_engine.containers.get(found["standby"]).status == "running"
        killed = time.monotonic()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        wait_gone(docker_engine, found["standby"], orphan + 60, "the killed process's standby")
        # the bound is orphan_timeout plus the launcher's own shutdown; on a busy machine that takes a while
        print(f"standby gone {time.monotonic() - killed:.1f} s after SIGKILL (orphan_timeout {orphan} s)")
        wait_gone(docker_engine, found["kernel"], orphan + 60, "the killed process's kernel")
    finally:
        if process.poll() is None:
            process.kill()


def start_jupyter_server(base: Path, orphan: float) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    """A Jupyter server (its own process) whose sandboxed-python kernelspec has ``orphan_timeout``."""
    prefix, root = base / "prefix", base / "root"
    root.mkdir()
    install("sandboxed-python", prefix=str(prefix), config={"orphan_timeout": orphan})
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JUPYTER", "JPY_"))}
    env.update({"JUPYTER_PATH": str(prefix / "share" / "jupyter"), "JUPYTER_CONFIG_DIR": str(base / "config"),
                "JUPYTER_DATA_DIR": str(base / "data"), "JUPYTER_RUNTIME_DIR": str(base / "runtime")})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token = secrets.token_hex(16)
    with open(base / "server.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", "--KernelSpecManager.ensure_native_kernel=False"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"token {token}"}
    deadline = time.monotonic() + READY_WAIT
    while True:
        assert process.poll() is None, (base / "server.log").read_text()[-3000:]
        try:
            if httpx.get(f"{url}/api/status", headers=headers, timeout=2).status_code == 200:
                return process, url, headers
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"the Jupyter server did not answer:\n{(base / 'server.log').read_text()[-3000:]}"
        time.sleep(0.3)


def ready_standby_of(client: Any, label: str) -> Any:
    """The container of the idle standby with ``label`` (``LABEL=VALUE``) once its kernel answers (through its own
    connection file)."""
    deadline = time.monotonic() + READY_WAIT
    while True:
        mine = client.containers.list(filters={"label": [*OURS, label]}, ignore_removed=True)
        idle = [c for c in mine if kernel_of(c.labels) is None]
        if idle:
            kc = BlockingKernelClient()
            try:
                kc.load_connection_file(str(Path(idle[0].labels[LABEL_PRIVATE_DIR]) / CONNECTION_FILE))
                kc.start_channels()
                kc.wait_for_ready(timeout=max(deadline - time.monotonic(), 1))  # kernel_info only: no state
                return idle[0]
            except (OSError, ValueError, RuntimeError):
                pass
            finally:
                kc.stop_channels()
        assert time.monotonic() < deadline, f"no standby with {label} answered within {READY_WAIT} s"
        time.sleep(0.5)


@pytest.mark.security("fault", "sessions")
def test_a_killed_jupyter_server_leaves_no_standby(docker_engine, tmp_path: Path) -> None:
    """SIGKILL of the Jupyter server: its kernel's and its idle standby's containers and directories go."""
    orphan = 3
    process, url, headers = start_jupyter_server(tmp_path, orphan)
    try:
        started = httpx.post(f"{url}/api/kernels", json={"name": "sandboxed-python"}, headers=headers, timeout=READY_WAIT)
        assert started.status_code == 201, started.text
        standby = ready_standby_of(docker_engine, f"{LABEL_OWNER_PID}={process.pid}")
        [kernel] = [c for c in docker_engine.containers.list(filters={"label": f"{LABEL_OWNER_PID}={process.pid}"})
                    if kernel_of(c.labels) == started.json()["id"]]
        private = Path(standby.labels[LABEL_PRIVATE_DIR])
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        wait_gone(docker_engine, standby.id, orphan + 60, "the killed server's standby")
        wait_gone(docker_engine, kernel.id, orphan + 60, "the killed server's kernel")
        deadline = time.monotonic() + 30
        while private.exists():
            assert time.monotonic() < deadline, "the standby's private directory is left"
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.security("fault", "sessions")
async def test_gc_leaves_a_live_standby_and_a_dead_one_is_never_handed_out(
    kernels: list[AsyncKernelManager], docker_engine
) -> None:
    """``kernel-sandbox gc`` keeps a standby whose process lives; one whose launcher died is gone and skipped."""
    kernels.append(await start(provisioner_config()))
    waiting = await ready_standby()
    idle = container_of(waiting)
    cli = Path(sys.executable).with_name("kernel-sandbox")
    swept = await asyncio.to_thread(subprocess.run, [str(cli), "gc"], capture_output=True, text=True, timeout=120)
    assert swept.returncode == 0, swept.stderr
    assert docker_engine.containers.get(idle).status == "running" and waiting.alive()
    assert waiting.process is not None
    waiting.process.kill()  # the launcher dies: its lifeline ends the kernel, auto-remove the container
    await asyncio.to_thread(waiting.process.wait, 30)
    await asyncio.to_thread(wait_gone, docker_engine, idle, 60, "the dead launcher's standby")
    kernels.append(km := await start(provisioner_config()))
    assert km.provisioner.container_id != idle and waiting not in POOL.standbys()
    assert (await run(km, "print('cold')"))["stdout"] == "cold\n"


async def test_ps_lists_standbys_and_the_kernels_they_became(kernels: list[AsyncKernelManager], docker_engine) -> None:
    kernels.append(await start(provisioner_config()))
    waiting = await ready_standby()
    kernels.append(km := await start(provisioner_config()))
    idle = container_of(await ready_standby(exclude=(waiting,)))
    cli = Path(sys.executable).with_name("kernel-sandbox")
    listed = await asyncio.to_thread(
        subprocess.run, [str(cli), "ps"], capture_output=True, text=True, timeout=120, check=True
    )
    lines = {line.split("\t")[0]: line.split("\t")[2] for line in listed.stdout.splitlines()}
    assert lines[docker_engine.containers.get(km.provisioner.container_id).name] == f"kernel {km.kernel_id}"
    assert lines[docker_engine.containers.get(idle).name] == "standby"
    labels = docker_engine.containers.get(idle).labels
    assert labels[LABEL] == "true" and labels[LABEL_KERNEL_ID].startswith(STANDBY_ID_PREFIX)


GONE_WHILE_STARTING = """
import asyncio, os, time
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config
from kernel_sandbox.provisioners.standby import POOL

async def main():
    km = AsyncKernelManager(kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"orphan_timeout": 120}}))
    await km.start_kernel()
    deadline = time.monotonic() + %(wait)s
    while not any(s.process is not None for s in POOL.standbys()):  # its launcher runs, its kernel not yet
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    [standby] = POOL.standbys()
    assert not standby.started.done()
    print(os.getpid(), standby.process.pid, km.provisioner.launcher_state["pid"], flush=True)
    os._exit(0)  # the process goes while its standby starts: nobody reads the launcher's "ready"

asyncio.run(main())
"""


@pytest.mark.timeout(600)
@pytest.mark.security("fault", "sessions")
def test_a_process_that_ends_while_its_standby_starts_leaves_no_error(docker_engine, tmp_path: Path) -> None:
    """The standby's launcher comes up to report ready to a process that has gone: that is no
    failure (it used to log an ERROR with a BrokenPipe traceback), and it still ends when told."""
    # files, not pipes: the launchers inherit them and outlive the process
    with open(tmp_path / "stdout", "w+") as out, open(tmp_path / "stderr", "w+") as err:
        owner = subprocess.run([sys.executable, "-c", GONE_WHILE_STARTING % {"wait": READY_WAIT}], stdout=out,
                               stderr=err, timeout=READY_WAIT)
        assert owner.returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
        _, *launchers = [int(pid) for pid in (tmp_path / "stdout").read_text().split()]
        try:
            # its kernel answers: the launcher got past its report (its container was made after the process went)
            ready_standby_of(docker_engine, f"{LABEL_LAUNCHER_PID}={launchers[0]}")
        finally:
            for pid in launchers:
                with contextlib.suppress(ProcessLookupError):  # one that failed has ended already
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + READY_WAIT
        while any(_running(pid) for pid in launchers):
            assert time.monotonic() < deadline, "the launchers did not end on SIGTERM"
            time.sleep(0.2)
    said = (tmp_path / "stderr").read_text()
    assert "BrokenPipe" not in said and "Traceback" not in said and "ERROR" not in said, said[-3000:]
    for pid in launchers:
        assert not docker_engine.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_LAUNCHER_PID}={pid}"})


def _running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie its new parent has not reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
