"""OpenSandbox kernels that sleep when idle (``suspend_after``, issue 37 item 4), against the published
``opensandbox-server`` 1.1.1 of the harness (its Docker runtime).

There the sleep is the server's pause: the container is paused (asked of the engine by the server's
``opensandbox.io/id`` label), not removed, so execd's context keeps its variables and even its process.
Asleep, the launcher answers kernel_info itself and renews the expiration; the next cell resumes the
sandbox and says so once; ``ps`` and ``metrics()`` say the kernel is suspended.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import docker
import pytest

from kernel_sandbox.errors import SandboxNotFound
from kernel_sandbox.execution import AsyncSandbox
from kernel_sandbox.privdir import SLEEP

from support.kernel import DORMANT_GOAL, dormant, unique_memory

pytestmark = pytest.mark.opensandbox_server

SLEEP_AFTER = 2
RESUMED = "[kernel-sandbox] The sandbox was paused from "


def sandbox_options(deployment: Any, kind: str = "execd", **overrides: Any) -> dict[str, Any]:
    options = deployment.options(kind, **overrides)
    options.pop("resource_limits")
    return {"memory": "512m", "cpus": 1, **options}


def sleep_state(sb: AsyncSandbox) -> dict[str, Any]:
    """What the launcher wrote in the kernel's ``sleep.json`` (empty: nothing)."""
    path = sb._km.provisioner.private / SLEEP
    return json.loads(path.read_text()) if path.exists() else {}


def container_state(deployment: Any, sandbox_id: str) -> str:
    """The engine's status of the sandbox's container (``running``, ``paused``...)."""
    if deployment.local is None:
        pytest.skip("asks the local engine for the sandbox's container: only the local harness has one")
    (container,) = docker.from_env().containers.list(all=True, filters={"label": f"opensandbox.io/id={sandbox_id}"})
    return str(container.status)


async def until(check: Any, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        await asyncio.sleep(0.2)


async def expires_at(deployment: Any, sandbox_id: str) -> str:
    async with deployment.client() as client:
        return str((await client.get(sandbox_id))["expiresAt"])


@pytest.mark.parametrize("kind", ["execd", "websocket"])
async def test_an_idle_sandbox_is_paused_with_its_state_and_resumed_by_the_next_cell(deployment: Any, kind: str) -> None:
    options = sandbox_options(deployment, kind, suspend_after=SLEEP_AFTER, renew_interval=1, timeout=60)
    async with AsyncSandbox("opensandbox", **options) as sb:
        assert (await sb.run("import os\nx = 41\npid = os.getpid()")).error is None
        sandbox_id = sb._km.provisioner.sandbox_id
        await until(lambda: sleep_state(sb).get("state") == "suspended", what="the sandbox to be paused")
        assert sleep_state(sb)["paused"] == sandbox_id
        async with deployment.client() as client:
            assert (await client.get(sandbox_id))["status"]["state"] == "Paused"
        assert container_state(deployment, sandbox_id) == "paused", "paused, not removed"
        assert (await sb.metrics()).state == "suspended"
        listed = subprocess.run([sys.executable, "-m", "kernel_sandbox.cli", "ps"], capture_output=True, text=True, timeout=120)
        assert f"-\tsuspended\tkernel {sb._km.kernel_id}\t0\t" in listed.stdout, listed.stdout + listed.stderr
        assert f"sandbox {sandbox_id} paused" in listed.stdout, listed.stdout

        # asleep, the launcher answers kernel_info and heartbeats, and renews the expiration
        before = await expires_at(deployment, sandbox_id)
        info = await sb._kc.kernel_info(reply=True, timeout=30)
        assert info["content"]["status"] == "ok"
        assert info["content"]["implementation"] == ("ipython" if kind == "websocket" else "kernel-sandbox-opensandbox")
        assert await sb._km.is_alive()
        await asyncio.sleep(3)
        assert await expires_at(deployment, sandbox_id) > before, "renewed while paused"
        assert container_state(deployment, sandbox_id) == "paused", "kernel_info did not resume it"

        stderr: list[str] = []
        result = await sb.run("print(x + 1, os.getpid() == pid)", on_stderr=stderr.append)
        assert result.error is None and result.stdout == "42 True\n", result
        assert sum(text.count(RESUMED) for text in stderr) == 1, stderr
        assert container_state(deployment, sandbox_id) == "running"
        assert sleep_state(sb) == {}
        stderr.clear()
        assert (await sb.run("print(x)", on_stderr=stderr.append)).stdout == "41\n" and stderr == [], "said once"


async def test_suspend_and_wake_pause_and_resume_the_sandbox_on_demand(deployment: Any) -> None:
    options = sandbox_options(deployment, suspend_after=3600)
    async with AsyncSandbox("opensandbox", **options) as sb:
        assert (await sb.run("y = 'kept'")).error is None
        sandbox_id = sb._km.provisioner.sandbox_id
        await sb.suspend()
        await sb.suspend()  # asleep already: nothing to do, and it still says so
        assert container_state(deployment, sandbox_id) == "paused"
        assert sleep_state(sb)["state"] == "suspended"
        await sb.wake()
        assert container_state(deployment, sandbox_id) == "running"
        assert (await sb.run("print(y)")).stdout == "kept\n"


async def test_a_sandbox_shut_down_while_paused_is_deleted(deployment: Any) -> None:
    sb = await AsyncSandbox("opensandbox", **sandbox_options(deployment, suspend_after=3600)).start()
    try:
        sandbox_id = sb._km.provisioner.sandbox_id
        await sb.suspend()
        assert container_state(deployment, sandbox_id) == "paused"
    finally:
        await sb.close()
    async with deployment.client() as client:
        with pytest.raises(SandboxNotFound):
            await client.get(sandbox_id)


@pytest.mark.security("fault", "sessions")
async def test_a_sandbox_deleted_by_someone_while_paused_ends_the_kernel_with_the_reason(deployment: Any) -> None:
    """The next cell does not hang on a sandbox that will never resume: the kernel ends, naming it."""
    async with AsyncSandbox("opensandbox", **sandbox_options(deployment, suspend_after=3600)) as sb:
        assert (await sb.run("x = 1")).error is None
        sandbox_id = sb._km.provisioner.sandbox_id
        await sb.suspend()
        async with deployment.client() as client:
            await client.delete(sandbox_id)
        execution = await sb.run("print(x)")
        assert execution.state_lost and execution.error is not None and execution.error.name == "KernelDied"
        assert sandbox_id in execution.error.value, execution.error.value


@pytest.mark.security("fault", "sessions")
async def test_a_sandbox_resumed_by_someone_else_while_it_sleeps_is_awake_again(deployment: Any) -> None:
    """The launcher notices the resume (its state check) and passes requests on at once again."""
    async with AsyncSandbox("opensandbox", **sandbox_options(deployment, suspend_after=3600)) as sb:
        assert (await sb.run("z = 7")).error is None
        sandbox_id = sb._km.provisioner.sandbox_id
        await sb.suspend()
        assert sleep_state(sb)["state"] == "suspended"
        async with deployment.client() as client:
            await client.resume(sandbox_id)
        await until(lambda: sleep_state(sb) == {}, what="the launcher to see the resume")
        stderr: list[str] = []
        assert (await sb.run("print(z)", on_stderr=stderr.append)).stdout == "7\n"
        assert stderr == [], "the launcher did not pause it: nothing to say"
        await sb.suspend()  # and it sleeps again when asked
        assert container_state(deployment, sandbox_id) == "paused"


@pytest.mark.parametrize("kind", ["execd", "websocket"])
async def test_a_paused_sandboxs_launcher_rests_small_renews_it_and_wakes_the_same_kernel(deployment: Any, kind: str) -> None:
    """While its sandbox is paused the launcher execs the dormant process (a few MiB, not the launcher's
    ~30), which renews the sandbox through a process of its own and stays. The next cell resumes the
    sandbox and connects again to the same kernel (its variables, its process)."""
    options = sandbox_options(deployment, kind, suspend_after=SLEEP_AFTER, renew_interval=2, timeout=60)
    async with AsyncSandbox("opensandbox", **options) as sb:
        assert (await sb.run("import os\nx = 41\npid = os.getpid()")).error is None
        before = (await sb.run("print(pid)")).stdout
        sandbox_id, launcher = sb._km.provisioner.sandbox_id, sb._km.provisioner.process.pid
        await until(lambda: dormant(launcher), what="the dormant process to hold the channels")
        assert unique_memory(launcher) <= DORMANT_GOAL
        first = await expires_at(deployment, sandbox_id)
        deadline = time.monotonic() + 60
        while await expires_at(deployment, sandbox_id) == first:
            assert dormant(launcher) and time.monotonic() < deadline, "renewed by the dormant process"
            await asyncio.sleep(0.5)
        assert dormant(launcher) and container_state(deployment, sandbox_id) == "paused"
        assert (await sb.metrics()).state == "suspended"
        stderr: list[str] = []
        execution = await sb.run("x += 1\nprint(x, pid)", on_stderr=stderr.append)
        assert execution.stdout == f"42 {before.strip()}\n", execution
        assert "".join(stderr).startswith(RESUMED)
        assert container_state(deployment, sandbox_id) == "running"


@pytest.mark.security("fault", "sessions")
async def test_a_sandbox_deleted_while_its_launcher_rests_ends_the_kernel_at_the_next_renewal(deployment: Any) -> None:
    """The dormant process hands back at each renewal: the launcher finds the sandbox gone (404), and the
    kernel ends with the reason rather than sleeping on with nothing behind it."""
    options = sandbox_options(deployment, suspend_after=3600, renew_interval=2, timeout=60)
    async with AsyncSandbox("opensandbox", **options) as sb:
        assert (await sb.run("x = 1")).error is None
        sandbox_id, launcher = sb._km.provisioner.sandbox_id, sb._km.provisioner.process
        await sb.suspend()
        await until(lambda: dormant(launcher.pid), what="the dormant process to hold the channels")
        async with deployment.client() as client:
            await client.delete(sandbox_id)
        await until(lambda: launcher.poll() is not None, what="the kernel to end")
        execution = await sb.run("print(x)")
        assert execution.error is not None and execution.error.name == "KernelDied"
        assert sandbox_id in execution.error.value and "404" in execution.error.value, execution.error.value
