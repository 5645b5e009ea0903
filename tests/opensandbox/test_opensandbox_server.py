"""The OpenSandbox backend against the published ``opensandbox-server`` (issue 11 items 3-4).

By default the session starts opensandbox-server 1.1.1 on 127.0.0.1 with its Docker runtime
(tests/opensandbox/server/: its own virtualenv, local images only). Its ``execd_image`` holds
the execd STAND-IN (a Python execd-protocol server over real ipykernels, run inside each
sandbox as ``/execd``), its egress image the egress STAND-IN (answers /healthz and /policy,
enforces nothing). Everything else is real: the server, its Docker runtime, its port
publishing and execd's reverse-proxy endpoint, our kernel image as the sandbox image.

Against your own deployment, with its real execd::

    OPEN_SANDBOX_API_BASE=https://host/v1 OPEN_SANDBOX_API_KEY=... python -m pytest -m opensandbox_server
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from kernel_sandbox.execution import Sandbox
from kernel_sandbox.opensandbox import (
    ExecdClient,
    OpenSandboxAPIError,
    OpenSandboxClient,
    SandboxNotFound,
    run_once,
)

pytestmark = pytest.mark.opensandbox_server


# ---- what the server answers (facts the client relies on) ----------------------------------------


async def test_the_server_as_measured(deployment: Any) -> None:
    """202 Running at once, an endpoint with a path answered at once, execd ready after /ping, 404 after delete."""
    if deployment.local is not None:
        version = httpx.get(deployment.api_base.removesuffix("/v1") + "/version", timeout=10).json()
        assert version == {"version": "1.1.1"}
    async with deployment.client() as client:
        options = deployment.options()
        sandbox = await client.create(
            image=options["image"],
            entrypoint=options["entrypoint"],
            metadata=options["metadata"],
            resource_limits=options["resource_limits"],
            timeout=120,
        )
        try:
            assert sandbox.state == "Running"
            assert sandbox.endpoint is not None
            if deployment.local is not None:
                assert sandbox.endpoint.url.startswith("http://127.0.0.1:") and sandbox.endpoint.url.endswith(
                    "/proxy/44772"
                )
            info = await client.get(sandbox.id)
            assert info["metadata"]["kernel-sandbox"] == "true"
            assert info["metadata"].items() >= deployment.metadata.items()
            async with ExecdClient(sandbox.endpoint.url, sandbox.endpoint.headers) as execd:
                context = await execd.create_context()
                run = await execd.run("import os\nprint(os.getuid())\n1/0", context_id=context)
            assert run.stdout.strip() != "0", "the sandbox runs code as an unprivileged user"
            assert run.error is not None and run.error.name == "ZeroDivisionError" and run.complete
        finally:
            assert await client.delete(sandbox.id) is True
        with pytest.raises(SandboxNotFound):
            await client.get(sandbox.id)
        assert await client.delete(sandbox.id) is False


async def test_a_server_without_egress_refuses_the_default_policy_and_says_how_to_fix_it(
    deployment: Any, tmp_path: Path
) -> None:
    if deployment.local is None:
        pytest.skip("needs a server started without [egress]: only the local harness can")
    from local_server import LocalServer

    server = LocalServer(deployment.local.prepared, tmp_path, egress=False).start()
    try:
        async with OpenSandboxClient(server.api_base, server.api_key) as client:
            with pytest.raises(OpenSandboxAPIError) as info:
                await client.create(
                    image=deployment.image, entrypoint=deployment.entrypoint, metadata=deployment.metadata
                )
        assert info.value.status_code == 400 and info.value.code == "SANDBOX::INVALID_PARAMETER"
        assert "allow_internet=True" in str(info.value) and "[egress] image" in str(info.value)
        async with OpenSandboxClient(server.api_base, server.api_key) as client:
            with pytest.raises(OpenSandboxAPIError) as info:
                await client.create(image=deployment.image, entrypoint=deployment.entrypoint, timeout=5)
        assert info.value.status_code == 422 and "field 'timeout'" in str(info.value)
    finally:
        assert server.stop() == []


async def test_through_the_server_proxy(deployment: Any) -> None:
    options = deployment.options()
    result = await run_once(
        "print(6 * 7)",
        api_base=deployment.api_base,
        api_key=deployment.api_key,
        client_options={"use_server_proxy": True, "poll_interval": 0.2, "ready_timeout": 180},
        image=options["image"],
        entrypoint=options["entrypoint"],
        metadata=options["metadata"],
        resource_limits=options["resource_limits"],
    )
    assert result.stdout == "42\n" and result.cleanup_error is None


async def test_run_once(deployment: Any) -> None:
    options = deployment.options()
    seen: list[str] = []
    result = await run_once(
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\n{'a': 1}",
        api_base=deployment.api_base,
        api_key=deployment.api_key,
        on_event=lambda e: seen.append(e.type),
        client_options={"poll_interval": 0.2, "ready_timeout": 180},
        image=options["image"],
        entrypoint=options["entrypoint"],
        metadata=options["metadata"],
        resource_limits=options["resource_limits"],
    )
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.results == [{"text/plain": "{'a': 1}"}]
    assert seen[0] == "init" and seen[-1] == "execution_complete"


# ---- the kernelspec through jupyter_client ---------------------------------------------------------


def manager(kernel_name: str, **options: Any) -> AsyncKernelManager:
    config = Config({"OpenSandboxProvisioner": {"state_check_interval": 0.0, **options}})
    return AsyncKernelManager(kernel_name=kernel_name, config=config)


@pytest.fixture
async def kernel(deployment_kernelspec: str) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    km = manager(deployment_kernelspec)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=180)
    yield km, kc
    kc.stop_channels()
    await km.shutdown_kernel(now=True)


async def collect(kc: Any, msg_id: str) -> list[dict[str, Any]]:
    messages = []
    while True:
        msg = await kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages


async def shell_reply(kc: Any, msg_id: str) -> dict[str, Any]:
    while True:
        reply = await kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


async def execute(kc: Any, code: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    msg_id = kc.execute(code)
    messages = await collect(kc, msg_id)
    return messages, await shell_reply(kc, msg_id)


def of_type(messages: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m["content"] for m in messages if m["msg_type"] == msg_type]


async def until_stream(kc: Any, msg_id: str) -> dict[str, Any]:
    while True:
        msg = await kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            return msg["content"]


async def in_sandbox(km: AsyncKernelManager, code: str) -> None:
    """Run ``code`` in a second execd context of the kernel's sandbox (not through the kernel)."""
    endpoint = km.provisioner.endpoint
    async with ExecdClient(endpoint.url, endpoint.headers) as execd:
        context = await execd.create_context()
        try:
            run = await execd.run(code, context_id=context)
            assert run.error is None, run.error
        finally:
            await execd.delete_context(context)


async def test_kernel_executes_streams_fails_interrupts_restarts_and_shuts_down(
    kernel: tuple[AsyncKernelManager, Any], deployment: Any
) -> None:
    km, kc = kernel
    sandbox_id = km.provisioner.sandbox_id
    info = await kc.kernel_info(reply=True, timeout=60)
    assert info["content"]["implementation"] == "kernel-sandbox-opensandbox"

    messages, reply = await execute(kc, "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n6 * 7")
    assert {"name": "stdout", "text": "hello\n"} in of_type(messages, "stream")
    assert {"name": "stderr", "text": "oops\n"} in of_type(messages, "stream")
    assert of_type(messages, "execute_result")[0]["data"] == {"text/plain": "42"}
    assert reply["status"] == "ok"

    # streaming: the cell blocks until a file appears that the test creates only after seeing output
    go = f"/tmp/go-{uuid.uuid4().hex}"
    msg_id = kc.execute(
        "import os, time\nprint('first', flush=True)\n"
        f"while not os.path.exists({go!r}):\n    time.sleep(0.05)\nprint('released')"
    )
    assert (await until_stream(kc, msg_id))["text"] == "first\n"
    await in_sandbox(km, f"open({go!r}, 'w').close()")
    rest = await collect(kc, msg_id)
    assert "released\n" in [s["text"] for s in of_type(rest, "stream")]
    assert (await shell_reply(kc, msg_id))["status"] == "ok"

    # an error is terminal upstream: no execution_complete follows it, the reply still comes
    messages, reply = await execute(kc, "print('before')\n1 / 0")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    assert of_type(messages, "error")[0]["traceback"]
    _, reply = await execute(kc, "'still alive'")
    assert reply["status"] == "ok"

    # interrupt (control channel) -> DELETE /code?id=CONTEXT
    msg_id = kc.execute("import time\nfor i in range(100000):\n    print(i, flush=True)\n    time.sleep(0.05)")
    await until_stream(kc, msg_id)
    await km.interrupt_kernel()
    reply = await shell_reply(kc, msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"

    # restart: a fresh context in the same sandbox
    await execute(kc, "x = 1")
    old_context = km.provisioner.context_id
    await km.restart_kernel()
    await kc.wait_for_ready(timeout=180)
    assert km.provisioner.sandbox_id == sandbox_id and km.provisioner.context_id != old_context
    _, reply = await execute(kc, "x")
    assert reply["status"] == "error" and reply["ename"] == "NameError"

    # shutdown deletes the sandbox
    kc.stop_channels()
    await km.shutdown_kernel()
    async with deployment.client() as client:
        with pytest.raises(SandboxNotFound):
            await client.get(sandbox_id)


async def test_output_over_the_cap_is_cut_and_the_code_interrupted(deployment_kernelspec: str) -> None:
    km = manager(deployment_kernelspec, max_output_bytes=4000)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=180)
        _, reply = await execute(kc, "import time\nwhile True:\n    print('x' * 100, flush=True)\n    time.sleep(0.01)")
        assert reply["status"] == "error" and reply["ename"] == "OutputLimitExceeded"
        _, reply = await execute(kc, "'usable after the cap'")
        assert reply["status"] == "ok"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def test_restart_into_a_fresh_sandbox_and_renewals(deployment_kernelspec: str, deployment: Any) -> None:
    km = manager(deployment_kernelspec, fresh_sandbox_on_restart=True, renew_interval=0.5, timeout=120)
    await km.start_kernel()
    try:
        first = km.provisioner.sandbox_id
        async with deployment.client() as client:
            expires = (await client.get(first)).get("expiresAt")
            for _ in range(200):
                await asyncio.sleep(0.1)
                if (await client.get(first)).get("expiresAt") != expires:
                    break
            assert (await client.get(first)).get("expiresAt") != expires, "the relay renewed the expiration"
            await km.restart_kernel(now=True)
            assert km.provisioner.sandbox_id not in (None, first)
            with pytest.raises(SandboxNotFound):
                await client.get(first)
    finally:
        await km.shutdown_kernel(now=True)


async def test_an_expired_sandbox_makes_the_kernel_dead(deployment_kernelspec: str, deployment: Any) -> None:
    """The published server removes an expired sandbox (404, never Terminated); poll() must notice."""
    from datetime import datetime, timedelta, timezone

    km = manager(deployment_kernelspec)
    await km.start_kernel()
    try:
        assert await km.is_alive()
        soon = (datetime.now(timezone.utc) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        async with deployment.client() as client:
            path = f"/sandboxes/{km.provisioner.sandbox_id}/renew-expiration"
            assert (await client._call("POST", path, json={"expiresAt": soon})).status_code == 200
        for _ in range(600):
            if not await km.is_alive():
                break
            await asyncio.sleep(0.1)
        assert not await km.is_alive(), "poll() still reports the kernel alive 60 s after its sandbox expired"
    finally:
        await km.shutdown_kernel(now=True)


async def test_a_paused_sandbox_is_not_dead_and_runs_again_after_resume(
    kernel: tuple[AsyncKernelManager, Any], deployment: Any
) -> None:
    km, kc = kernel
    sandbox_id = km.provisioner.sandbox_id
    async with deployment.client() as client:
        assert (await client._call("POST", f"/sandboxes/{sandbox_id}/pause")).status_code == 202
        for _ in range(300):
            if (await client.get(sandbox_id))["status"]["state"] == "Paused":
                break
            await asyncio.sleep(0.1)
        assert (await client.get(sandbox_id))["status"]["state"] == "Paused"
        assert await km.is_alive(), "a paused sandbox is not a dead kernel"
        assert (await client._call("POST", f"/sandboxes/{sandbox_id}/resume")).status_code == 202
        await client.wait_running(sandbox_id)
    _, reply = await execute(kc, "'after resume'")
    assert reply["status"] == "ok"


# ---- the execution API --------------------------------------------------------------------------------


def test_sandbox_run_files_tools_timeout(deployment: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    options = deployment.options()
    options.pop("resource_limits")
    with Sandbox("opensandbox", memory="1g", cpus=1, state_check_interval=0.0, **options) as sb:
        assert sb.run("print('hi'); 6 * 7").text == "42"
        assert sb.upload({"in/a.txt": b"data"}) == ["in/a.txt"]
        assert sb.download("in/a.txt") == b"data"

        def tool(x: int, agent_state: dict) -> int:
            agent_state["seen"] = x
            return x * 2

        result = sb.run_tool(tool, {"x": 21}, {"seen": None})
        assert (result.func_return, result.agent_state) == (42, {"seen": 21})
        timed_out = sb.run("import time\ntime.sleep(30)", timeout=1)
        assert timed_out.error is not None and timed_out.error.name == "TimeoutError"
        assert sb.run("1 + 2").text == "3"


# ---- the code-interpreter stand-in: a Jupyter server behind execd's /proxy/<port>/ (for issue 11.5) --


async def test_code_interpreter_standin_serves_jupyter_through_the_execd_proxy(deployment: Any) -> None:
    """The later websocket relay mode needs this path: endpoint of 44771 -> execd proxy -> jupyter_server."""
    import json as jsonlib

    import tornado.httpclient
    import tornado.websocket

    if deployment.local is None:
        pytest.skip("the code-interpreter stand-in image exists only with the local server harness")
    token = uuid.uuid4().hex
    options = deployment.options()
    async with deployment.client() as client:
        sandbox = await client.create(
            image=deployment.local.prepared.code_interpreter_image,
            entrypoint=["/opt/code-interpreter/code-interpreter.sh"],
            env={"JUPYTER_TOKEN": token},
            metadata=options["metadata"],
            resource_limits=options["resource_limits"],
        )
        try:
            jupyter = await client.endpoint(sandbox.id, 44771)
            assert jupyter.url.endswith("/proxy/44771")
            headers = {"Authorization": f"token {token}"}
            async with httpx.AsyncClient(timeout=10) as http:
                for _ in range(600):
                    try:
                        if (await http.get(f"{jupyter.url}/api/status", headers=headers)).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
            async with httpx.AsyncClient(timeout=10) as anonymous:  # no cookie from the authenticated client
                assert (await anonymous.get(f"{jupyter.url}/api/kernels")).status_code == 403, "the token is required"
            async with httpx.AsyncClient(timeout=10) as http:
                kernel = (
                    await http.post(f"{jupyter.url}/api/kernels", headers=headers, json={"name": "python3"})
                ).json()
            ws_url = jupyter.url.replace("http://", "ws://") + f"/api/kernels/{kernel['id']}/channels"
            connection = await tornado.websocket.websocket_connect(
                tornado.httpclient.HTTPRequest(ws_url, headers=headers)
            )
            msg_id = uuid.uuid4().hex
            header = {
                "msg_id": msg_id,
                "msg_type": "kernel_info_request",
                "username": "t",
                "session": "s",
                "version": "5.3",
                "date": "",
            }
            connection.write_message(
                jsonlib.dumps(
                    {"header": header, "parent_header": {}, "metadata": {}, "content": {}, "channel": "shell"}
                )
            )
            for _ in range(100):
                message = jsonlib.loads(await asyncio.wait_for(connection.read_message(), 60))
                if message["msg_type"] == "kernel_info_reply" and message["parent_header"].get("msg_id") == msg_id:
                    break
            assert message["content"]["status"] == "ok"
            connection.close()
        finally:
            await client.delete(sandbox.id)
