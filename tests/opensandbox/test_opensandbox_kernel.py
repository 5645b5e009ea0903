"""The OpenSandbox kernelspec through the launcher, on the in-process fakes (tests/support/opensandbox_fakes.py).

Everything the published server can show runs against it in test_opensandbox_server.py; here
stay what it cannot produce on demand: a sandbox that fails or turns Unknown under a live
kernel, an execd that refuses the advertised token, renewals on a sub-second schedule, a
launcher killed before it could clean up, and configuration errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.connect import write_connection_file
from jupyter_client.manager import AsyncKernelManager
from support.opensandbox_fakes import FakeOpenSandbox
from traitlets import TraitError
from traitlets.config import Config

from kernel_sandbox.errors import ConfigError, KernelLaunchError, OpenSandboxConfigError
from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC, install, started_client
from kernel_sandbox.opensandbox.relay import IMPLEMENTATION
from kernel_sandbox.opensandbox.gc import host_label
from kernel_sandbox.opensandbox.provisioner import OpenSandboxProvisioner
from kernel_sandbox.provisioners.process import pid_alive

FAST = {"poll_interval": 0.05, "state_check_interval": 0.2, "mode": "execd"}


def manager(kernel_name: str, kernel_id: str | None = None, **options: Any) -> AsyncKernelManager:
    config = Config({"OpenSandboxProvisioner": {**FAST, **options}})
    return AsyncKernelManager(kernel_name=kernel_name, kernel_id=kernel_id, config=config)


async def until(predicate: Any, what: str, seconds: float = 30) -> None:
    for _ in range(int(seconds * 20)):
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} (waited {seconds:g} s)")


@pytest.fixture
async def kernel(opensandbox_kernelspec: str) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    km = manager(opensandbox_kernelspec)
    async with started_client(km, timeout=120) as kc:
        yield km, kc


async def test_the_execd_relay_answers_what_a_client_asks(kernel: tuple[AsyncKernelManager, Any]) -> None:
    _, kc = kernel
    info = await kc.kernel_info(reply=True, timeout=60)
    assert info["content"]["implementation"] == IMPLEMENTATION
    assert info["content"]["supported_features"] == [] and info["content"]["language_info"]["name"] == "python"
    assert (await kc.is_complete("for i in range(3):", reply=True, timeout=60))["content"]["status"] == "incomplete"
    assert (await kc.is_complete("x = 1", reply=True, timeout=60))["content"]["status"] == "complete"
    assert (await kc.comm_info(reply=True, timeout=60))["content"] == {"status": "ok", "comms": {}}
    completion = await kc.complete("impo", reply=True, timeout=60)
    assert completion["content"]["matches"] == [] and completion["content"]["cursor_end"] == 4
    assert (await kc.inspect("print", reply=True, timeout=60))["content"]["found"] is False
    msg_id = kc.execute("print(6 * 7)")
    reply = await kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"


async def test_cells_after_an_error_are_aborted_as_ipykernel_does(kernel: tuple[AsyncKernelManager, Any]) -> None:
    _, kc = kernel
    first = kc.execute("import time; time.sleep(0.5); 1 / 0")
    second = kc.execute("print('never')")
    third = kc.execute("print('not either')", stop_on_error=False)
    replies = {}
    while len(replies) < 3:
        reply = await kc.get_shell_msg(timeout=60)
        replies[reply["parent_header"]["msg_id"]] = reply["content"]["status"]
    assert replies == {first: "error", second: "aborted", third: "aborted"}
    assert (await kc.execute_interactive("print('after')", timeout=60))["content"]["status"] == "ok"


async def _iopub_of(kc: Any, msg_id: str) -> list[tuple[str, Any]]:
    """The IOPub messages of one request, up to its idle status: (msg_type, state or execution_count or name)."""
    seen: list[tuple[str, Any]] = []
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        seen.append((msg["msg_type"], content.get("execution_state", content.get("execution_count", content.get("ename")))))
        if msg["msg_type"] == "status" and content["execution_state"] == "idle":
            return seen


async def test_a_cell_is_announced_before_its_output_whatever_execd_answers(
    kernel: tuple[AsyncKernelManager, Any],
) -> None:
    """busy and execute_input go out while execd runs the cell: still before any output, the reply and idle."""
    _, kc = kernel
    count = (await kc.execute_interactive("0", timeout=60))["content"]["execution_count"]
    for code, output in (("6 * 7", ("execute_result", count + 1)), ("1 / 0", ("error", "ZeroDivisionError")), ("", None)):
        msg_id = kc.execute(code)
        reply = await kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id
        expected = [("status", "busy"), ("execute_input", reply["content"]["execution_count"])]
        expected += [output] if output else []
        seen = await _iopub_of(kc, msg_id)
        assert seen == [*expected, ("status", "idle")], (code, seen)
    silent = kc.execute("6 * 7", silent=True)
    assert await _iopub_of(kc, silent) == [("status", "busy"), ("status", "idle")]


@pytest.mark.security("fault", "sessions")
@pytest.mark.parametrize("state", ["Failed", "Terminated"])
async def test_a_sandbox_that_ends_ends_the_kernel(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox, state: str
) -> None:
    km, _ = kernel
    assert await km.is_alive()
    fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id].state = state
    await until(lambda: _dead(km), "the kernel outlived its sandbox")
    assert f"is {state}" in (km.provisioner.exit_reason or "")


async def _dead(km: AsyncKernelManager) -> bool:
    return not await km.is_alive()


async def test_an_unknown_state_is_not_declared_dead(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox
) -> None:
    km, _ = kernel
    sandbox = fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id]
    sandbox.state = "Unknown"
    await asyncio.sleep(1.0)  # five state checks
    assert await km.is_alive()
    sandbox.state = "Running"


@pytest.mark.security("fault", "sessions")
async def test_failed_launch_deletes_the_sandbox(opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox) -> None:
    """A wrong execd token makes readiness fail after the sandbox exists."""
    fake_opensandbox.lifecycle.advertised_token = "wrong"
    with pytest.raises(KernelLaunchError, match="401"):
        await manager(opensandbox_kernelspec).start_kernel()
    assert len(fake_opensandbox.lifecycle.deleted) >= 1 and not fake_opensandbox.lifecycle.live()


@pytest.mark.security("fault", "opensandbox")
async def test_a_start_given_up_stops_its_launcher_and_deletes_its_sandbox(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    fake_opensandbox.lifecycle.polls_until_running = 10**6  # the sandbox never runs
    km = manager(opensandbox_kernelspec, ready_timeout=3600.0)

    async def start() -> None:
        async with started_client(km, timeout=15):
            raise AssertionError("a sandbox that never runs gave a kernel")

    starting = asyncio.ensure_future(start())

    async def created() -> bool:
        return bool(fake_opensandbox.lifecycle.live()) and km.provisioner is not None and km.provisioner.pid is not None

    await until(created, "the launcher never asked for its sandbox")
    assert km.provisioner is not None
    launcher = km.provisioner.pid
    with pytest.raises(KernelLaunchError, match=r"did not start within started_client's timeout \(15 s\)"):
        await starting
    assert launcher is not None and not pid_alive(launcher), "the launcher of the given-up start still runs"
    assert not fake_opensandbox.lifecycle.live(), "the given-up start left its sandbox"
    assert km.provisioner is None or km.provisioner.private is None, "its private directory was kept"


@pytest.mark.security("fault", "sessions")
async def test_renewals_run_while_the_launcher_lives_and_its_sandbox_is_deleted_when_it_is_killed(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    km = manager(opensandbox_kernelspec, renew_interval=0.1, timeout=60)
    await km.start_kernel()
    sandbox = fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id]
    assert sandbox.body["timeout"] == 60 and sandbox.body["networkPolicy"] == {"defaultAction": "deny", "egress": []}
    assert sandbox.body["metadata"]["kernel-sandbox"] == "true"
    assert sandbox.body["metadata"]["kernel-sandbox-kernel-id"] == km.kernel_id
    assert sandbox.body["metadata"]["kernel-sandbox-launcher-pid"] == str(km.provisioner.pid)
    assert sandbox.body["metadata"]["kernel-sandbox-owner-host"] == host_label()
    assert len(sandbox.body["env"]["JUPYTER_TOKEN"]) == 64
    await until(lambda: _renewed(sandbox, 3), "three renewals")
    os.kill(km.provisioner.pid, signal.SIGKILL)  # no clean-up by the launcher itself
    await until(lambda: _dead(km), "the killed launcher still counts as alive")
    renewed = len(sandbox.renewals)
    await asyncio.sleep(0.5)
    assert len(sandbox.renewals) == renewed, "renewals stop with the launcher, so the sandbox expires"
    await km.shutdown_kernel(now=True)  # the provisioner deletes what the launcher left
    assert sandbox.id in fake_opensandbox.lifecycle.deleted and not fake_opensandbox.lifecycle.live()


async def _renewed(sandbox: Any, count: int) -> bool:
    return len(sandbox.renewals) >= count


@pytest.mark.security("fault", "options")
async def test_missing_api_base_is_a_clear_error(opensandbox_kernelspec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE")
    with pytest.raises(OpenSandboxConfigError, match="OPEN_SANDBOX_API_BASE"):
        await manager(opensandbox_kernelspec).start_kernel()


def test_options_come_from_kernelspec_config_and_traitlets() -> None:
    traits = {"api_base": "http://127.0.0.1:1/v1", "image": "img:1", "timeout": 900}
    from_config = OpenSandboxProvisioner(config=Config({"OpenSandboxProvisioner": traits})).settings()
    assert (from_config.api_base, from_config.image, from_config.timeout) == ("http://127.0.0.1:1/v1", "img:1", 900)
    from_kwargs = OpenSandboxProvisioner(image="img:2", allow_internet=True, resource_limits={"cpu": "2"})
    assert (from_kwargs.image, from_kwargs.allow_internet, from_kwargs.resource_limits) == ("img:2", True, {"cpu": "2"})
    first, second = OpenSandboxProvisioner(), OpenSandboxProvisioner()
    first.resource_limits["cpu"] = "64"
    assert second.resource_limits == {"cpu": "1", "memory": "2Gi"}
    with pytest.raises(ConfigError, match="did you mean 'timeout'"):
        OpenSandboxProvisioner(config=Config({"OpenSandboxProvisioner": {"timout": 900}}))
    with pytest.raises(ConfigError, match="timeout=5"):
        OpenSandboxProvisioner(api_base="http://127.0.0.1:1/v1", timeout=5).settings()
    policy = {"output_policy": "Trusted", "allow_mime_types": ["application/x-mine"], "allow_widget_modules": ["w"]}
    chosen = OpenSandboxProvisioner(api_base="http://127.0.0.1:1/v1", **policy).settings()
    assert (chosen.output_policy, chosen.allow_mime_types, chosen.allow_widget_modules) == (
        "trusted", ("application/x-mine",), ("w",)
    )
    with pytest.raises(TraitError, match="output_policy"):
        OpenSandboxProvisioner(output_policy="lax")


@pytest.mark.security("fault", "options")
def test_the_argv_without_an_api_base_fails_closed_naming_the_variable(tmp_path: Path) -> None:
    """A client that ignores provisioners (VS Code) runs argv: no API base, no kernel, never a local one."""
    spec_dir = Path(install(OPENSANDBOX_SPEC, prefix=str(tmp_path / "prefix")))
    argv = json.loads((spec_dir / "kernel.json").read_text())["argv"]
    assert Path(argv[0]).is_absolute() and argv[1:4] == ["-I", "-m", "kernel_sandbox.launch"]
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-argv.json"), key=secrets.token_hex(16).encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    cmd = [part.replace("{connection_file}", connection_file) for part in argv]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "OPEN_SANDBOX_API_BASE" in result.stderr and result.stderr.startswith("kernel-sandbox: ")


@pytest.mark.security("fault", "sessions")
async def test_the_argv_launcher_deletes_its_sandbox_when_its_client_is_gone(
    fake_opensandbox: FakeOpenSandbox, tmp_path: Path
) -> None:
    """A client that ran argv and died (VS Code killed): the launcher notices its parent is gone."""
    spec_dir = Path(install(OPENSANDBOX_SPEC, prefix=str(tmp_path / "prefix"), config={**FAST, "poll_interval": 0.05}))
    argv = json.loads((spec_dir / "kernel.json").read_text())["argv"]
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-orphan.json"), key=secrets.token_hex(16).encode())
    cmd = [part.replace("{connection_file}", connection_file) for part in argv]
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": fake_opensandbox.api_base,
           "OPEN_SANDBOX_API_KEY": fake_opensandbox.lifecycle.api_key}
    client = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(3)", *cmd], env=env)

    async def created() -> bool:
        return any(s.body["metadata"].get("kernel-sandbox-kernel-id") == "orphan" for s in fake_opensandbox.lifecycle.live())

    await until(created, "the launcher created no sandbox")
    client.wait(30)
    await until(_all_deleted(fake_opensandbox), "the sandbox outlived the client that started its kernel")


def _all_deleted(fake: FakeOpenSandbox) -> Any:
    async def check() -> bool:
        return not fake.lifecycle.live()

    return check


async def test_reattach_after_server_restart(opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox) -> None:
    """A restarted Jupyter server finds the launcher (within orphan_timeout) and its sandbox again."""
    from jupyter_client.provisioning import KernelProvisionerFactory

    first = manager(opensandbox_kernelspec)
    await first.start_kernel()
    kc = first.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    assert (await kc.execute_interactive("kept = 'state survives'", timeout=60))["content"]["status"] == "ok"
    kc.stop_channels()
    info = await first.provisioner.get_provisioner_info()
    sandbox_id = first.provisioner.sandbox_id

    second = manager(opensandbox_kernelspec, kernel_id=first.kernel_id)
    second.provisioner = KernelProvisionerFactory.instance().create_provisioner_instance(
        first.kernel_id, second.kernel_spec, parent=second
    )
    await second.provisioner.load_provisioner_info(info)
    second.load_connection_info(info["connection_info"])
    assert second.provisioner.sandbox_id == sandbox_id
    kc = second.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        outputs: list[str] = []
        reply = await kc.execute_interactive(
            "print(kept)", timeout=60, output_hook=lambda m: outputs.append(m["content"].get("text", ""))
        )
        assert reply["content"]["status"] == "ok" and "state survives\n" in outputs
    finally:
        kc.stop_channels()
    await second.shutdown_kernel()
    assert sandbox_id in fake_opensandbox.lifecycle.deleted and not fake_opensandbox.lifecycle.live()
    await asyncio.wait_for(first.provisioner.wait(), 30)


@pytest.mark.security("fault", "sessions")
async def test_a_server_that_cannot_pause_leaves_the_kernel_running_and_says_why(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    """``suspend_after`` on a server without pause (the fakes have no such route: 404): the sandbox runs
    on, its kernel answers, and ``sleep.json`` (``ps``) says why it was not paused."""
    from kernel_sandbox.privdir import SLEEP

    km = manager(opensandbox_kernelspec, suspend_after=1)
    async with started_client(km, timeout=120) as kc:
        path = km.provisioner.private / SLEEP

        async def refused() -> bool:
            return path.exists() and json.loads(path.read_text()).get("state") == "awake"

        await until(refused, "a refused pause")
        why = json.loads(path.read_text())["why"]
        assert f"the server did not pause sandbox {km.provisioner.sandbox_id}" in why and "404" in why, why
        reply = await kc.execute("6 * 7", reply=True, timeout=60)
        assert reply["content"]["status"] == "ok"
