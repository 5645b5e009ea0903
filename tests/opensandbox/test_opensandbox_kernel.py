"""The OpenSandbox kernelspec end to end: jupyter_client -> provisioner -> relay kernel -> fake
execd (a real ipykernel behind execd's wire format), with the fake lifecycle server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager
from opensandbox_fakes import FakeOpenSandbox
from traitlets.config import Config

from kernel_sandbox.opensandbox.client import OpenSandboxAPIError, OpenSandboxConfigError
from kernel_sandbox.opensandbox.settings import RelaySettings
from kernel_sandbox.provisioners.opensandbox import OpenSandboxProvisioner

FAST = {"poll_interval": 0.05, "state_check_interval": 0.0}


def manager(kernel_name: str, **options: Any) -> AsyncKernelManager:
    return AsyncKernelManager(kernel_name=kernel_name, config=Config({"OpenSandboxProvisioner": {**FAST, **options}}))


@pytest.fixture
async def kernel(opensandbox_kernelspec: str) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    km = manager(opensandbox_kernelspec)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    yield km, kc
    kc.stop_channels()
    await km.shutdown_kernel(now=True)


async def collect(kc: Any, msg_id: str) -> list[dict[str, Any]]:
    """IOPub messages for ``msg_id`` up to its idle status."""
    messages = []
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages


async def execute(kc: Any, code: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    msg_id = kc.execute(code)
    messages = await collect(kc, msg_id)
    return messages, await shell_reply(kc, msg_id)


async def shell_reply(kc: Any, msg_id: str) -> dict[str, Any]:
    """The shell reply to ``msg_id`` (skipping replies to wait_for_ready's extra kernel_info requests)."""
    while True:
        reply = await kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


def of_type(messages: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m["content"] for m in messages if m["msg_type"] == msg_type]


async def test_runs_code_end_to_end_and_removes_the_sandbox(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox
) -> None:
    km, kc = kernel
    sandbox_id = km.provisioner.sandbox_id
    sandbox = fake_opensandbox.lifecycle.sandboxes[sandbox_id]
    assert sandbox.body["metadata"]["kernel-sandbox"] == "true"
    assert sandbox.body["networkPolicy"] == {"defaultAction": "deny", "egress": []}
    assert sandbox.body["timeout"] == 300

    info = await kc.kernel_info(reply=True, timeout=60)
    assert info["content"]["implementation"] == "kernel-sandbox-opensandbox"
    assert info["content"]["language_info"]["name"] == "python"
    assert info["content"]["supported_features"] == []
    request = kc.session.msg("create_subshell_request", {})
    kc.control_channel.send(request)
    refused = await kc.control_channel.get_msg(timeout=60)
    assert refused["msg_type"] == "create_subshell_reply"
    assert refused["content"]["status"] == "error"

    messages, reply = await execute(kc, "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n6 * 7")
    assert [m["msg_type"] for m in messages][:2] == ["status", "execute_input"]
    assert of_type(messages, "execute_input")[0]["execution_count"] == 1
    streams = of_type(messages, "stream")
    assert {"name": "stdout", "text": "hello\n"} in streams
    assert {"name": "stderr", "text": "oops\n"} in streams
    assert of_type(messages, "execute_result") == [{"data": {"text/plain": "42"}, "metadata": {}, "execution_count": 1}]
    assert reply["status"] == "ok" and reply["execution_count"] == 1

    _, reply = await execute(kc, "x = 1")
    assert reply["execution_count"] == 2

    is_complete = await kc.is_complete("for i in range(3):", reply=True, timeout=60)
    assert is_complete["content"]["status"] == "incomplete"

    context_id = km.provisioner.context_id
    assert context_id in fake_opensandbox.execd.contexts
    kc.stop_channels()
    await km.shutdown_kernel()
    assert sandbox_id in fake_opensandbox.lifecycle.deleted
    assert km.provisioner is None or km.provisioner.sandbox_id is None


async def test_output_streams_while_the_code_runs(kernel: tuple[AsyncKernelManager, Any], tmp_path: Path) -> None:
    """The cell waits for a file that the test creates only after it has seen the first output."""
    _, kc = kernel
    go = tmp_path / "go"
    code = (
        "import os, time\n"
        "print('first', flush=True)\n"
        "for _ in range(1200):\n"
        f"    if os.path.exists({str(go)!r}):\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "print('released' if os.path.exists(" + repr(str(go)) + ") else 'never released')\n"
    )
    msg_id = kc.execute(code)
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    assert msg["content"]["text"] == "first\n"
    go.touch()
    messages = await collect(kc, msg_id)
    assert "released\n" in [s["text"] for s in of_type(messages, "stream")]
    assert (await shell_reply(kc, msg_id))["status"] == "ok"


async def test_errors_and_input_are_reported(kernel: tuple[AsyncKernelManager, Any]) -> None:
    _, kc = kernel
    messages, reply = await execute(kc, "print('before')\n1 / 0")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    assert reply["evalue"] == "division by zero"
    errors = of_type(messages, "error")
    assert errors and errors[0]["ename"] == "ZeroDivisionError" and errors[0]["traceback"]
    assert {"name": "stdout", "text": "before\n"} in of_type(messages, "stream")

    messages, reply = await execute(kc, "input('name? ')")
    assert reply["status"] == "error"
    assert reply["evalue"] == "input is not supported in this sandbox"
    assert of_type(messages, "error")[0]["evalue"] == "input is not supported in this sandbox"

    _, reply = await execute(kc, "'still alive'")
    assert reply["status"] == "ok"


async def test_interrupt_stops_a_running_loop(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox
) -> None:
    km, kc = kernel
    msg_id = kc.execute("import time\nfor i in range(100000):\n    print(i, flush=True)\n    time.sleep(0.05)")
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    await km.interrupt_kernel()
    reply = await shell_reply(kc, msg_id)
    assert reply["status"] == "error"
    assert reply["ename"] == "KeyboardInterrupt"
    assert fake_opensandbox.execd.contexts[km.provisioner.context_id].interrupts == 1
    _, reply = await execute(kc, "1 + 1")
    assert reply["status"] == "ok"


async def test_restart_gets_a_fresh_context_in_the_same_sandbox(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox
) -> None:
    km, kc = kernel
    sandbox_id, old_context = km.provisioner.sandbox_id, km.provisioner.context_id
    await execute(kc, "x = 1")
    await km.restart_kernel()
    await kc.wait_for_ready(timeout=120)
    assert km.provisioner.sandbox_id == sandbox_id
    assert km.provisioner.context_id != old_context
    assert old_context not in fake_opensandbox.execd.contexts
    _, reply = await execute(kc, "x")
    assert reply["status"] == "error" and reply["ename"] == "NameError"


async def test_restart_into_a_fresh_sandbox_when_configured(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    km = manager(opensandbox_kernelspec, fresh_sandbox_on_restart=True)
    await km.start_kernel()
    try:
        first = km.provisioner.sandbox_id
        await km.restart_kernel(now=True)
        assert km.provisioner.sandbox_id not in (None, first)
        assert first in fake_opensandbox.lifecycle.deleted
    finally:
        await km.shutdown_kernel(now=True)


async def test_poll_follows_the_sandbox_state(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox
) -> None:
    km, _ = kernel
    assert await km.is_alive()
    fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id].state = "Failed"
    assert not await km.is_alive()
    await asyncio.wait_for(km.provisioner.wait(), 30)


async def test_failed_launch_deletes_the_sandbox(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    """A wrong execd token makes context creation fail after the sandbox exists."""
    deleted_before = len(fake_opensandbox.lifecycle.deleted)
    fake_opensandbox.lifecycle.advertised_token = "wrong"
    with pytest.raises(OpenSandboxAPIError, match="401"):
        await manager(opensandbox_kernelspec).start_kernel()
    assert len(fake_opensandbox.lifecycle.deleted) == deleted_before + 1
    assert not fake_opensandbox.lifecycle.live()


async def test_missing_api_base_is_a_clear_error(opensandbox_kernelspec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE")
    with pytest.raises(OpenSandboxConfigError, match="OPEN_SANDBOX_API_BASE"):
        await manager(opensandbox_kernelspec).start_kernel()


def test_options_come_from_kernelspec_config_and_traitlets() -> None:
    from_config = OpenSandboxProvisioner(config=Config({"OpenSandboxProvisioner": {"image": "img:1", "timeout": 900}}))
    assert (from_config.image, from_config.timeout) == ("img:1", 900)
    from_kwargs = OpenSandboxProvisioner(image="img:2", allow_internet=True, resource_limits={"cpu": "2"})
    assert (from_kwargs.image, from_kwargs.allow_internet, from_kwargs.resource_limits) == ("img:2", True, {"cpu": "2"})
    first, second = OpenSandboxProvisioner(), OpenSandboxProvisioner()
    first.resource_limits["cpu"] = "64"
    assert second.resource_limits == {"cpu": "1", "memory": "2Gi"}


async def test_output_over_the_cap_is_cut_and_the_code_interrupted(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    km = manager(opensandbox_kernelspec, max_output_bytes=4000)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        _, reply = await execute(kc, "import time\nwhile True:\n    print('x' * 100, flush=True)\n    time.sleep(0.01)")
        assert reply["status"] == "error" and reply["ename"] == "OutputLimitExceeded"
        assert "4000 bytes" in reply["evalue"]
        assert fake_opensandbox.execd.contexts[km.provisioner.context_id].interrupts == 1
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def test_relay_keeps_renewing_the_sandbox_expiration(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    km = manager(opensandbox_kernelspec, renew_interval=0.2, timeout=120)
    await km.start_kernel()
    try:
        sandbox = fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id]
        for _ in range(600):
            if len(sandbox.renewals) >= 2:
                break
            await asyncio.sleep(0.1)
        assert len(sandbox.renewals) >= 2
        expires = datetime.strptime(sandbox.renewals[-1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert expires > datetime.now(timezone.utc) + timedelta(seconds=60)
    finally:
        await km.shutdown_kernel(now=True)


def test_relay_settings_travel_through_the_environment() -> None:
    settings = RelaySettings(
        execd_url="http://127.0.0.1:1",
        context_id="ctx",
        execd_headers={"X-EXECD-ACCESS-TOKEN": "t"},
        sandbox_id="sbx",
        api_base="http://127.0.0.1:2/v1",
        api_key="k",
        renew_seconds=300,
        renew_interval=1.5,
        max_output_bytes=10,
        request_timeout=3.0,
    )
    assert RelaySettings.from_env(settings.to_env()) == settings
