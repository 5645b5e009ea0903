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
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jupyter_client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from kernel_sandbox.errors import OpenSandboxAPIError, SandboxNotFound
from kernel_sandbox.execution import Sandbox
from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC as KERNEL_NAME
from kernel_sandbox.kernelspecs import install, started_client
from kernel_sandbox.opensandbox import ExecdClient, OpenSandboxClient, run_once

from support.kernel import ArgvKernel, reply_to, until_idle

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


async def test_an_execd_run_gives_the_last_expressions_text(deployment: Any) -> None:
    """execd's ``result`` event is the cell's execute_result: folded as the execution API folds it, it is ``text``."""
    options = deployment.options()
    result = await run_once(
        "print('hi')\n2+2",
        api_base=deployment.api_base,
        api_key=deployment.api_key,
        client_options={"poll_interval": 0.2, "ready_timeout": 180},
        image=options["image"],
        entrypoint=options["entrypoint"],
        metadata=options["metadata"],
        resource_limits=options["resource_limits"],
    )
    assert (result.text, result.stdout, result.error) == ("4", "hi\n", None)


# ---- the kernelspec through jupyter_client (provisioner -> launcher -> sandbox), both modes -------------

MODES = ["execd", "websocket"]


def manager(kernel_name: str = KERNEL_NAME) -> AsyncKernelManager:
    return AsyncKernelManager(kernel_name=kernel_name)


@pytest.fixture
async def kernel(
    deployment: Any, deployment_jupyter_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """A kernel of the OpenSandbox kernelspec in the mode the test is parametrised with."""
    deployment.kernelspec(deployment_jupyter_path, getattr(request, "param", "execd"))
    km = manager()
    async with started_client(km, timeout=300) as kc:
        yield km, kc


async def shell_reply(kc: Any, msg_id: str) -> dict[str, Any]:
    return (await reply_to(kc.shell_channel, msg_id))["content"]


async def execute(kc: Any, code: str, **options: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    msg_id = kc.execute(code, **options)
    messages = await until_idle(kc, msg_id)
    return messages, await shell_reply(kc, msg_id)


def of_type(messages: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m["content"] for m in messages if m["msg_type"] == msg_type]


async def until_stream(kc: Any, msg_id: str) -> dict[str, Any]:
    while True:
        msg = await kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            return msg["content"]


async def in_sandbox(deployment: Any, sandbox_id: str, code: str) -> None:
    """Run ``code`` in a second execd context of the sandbox (beside the kernel, not through it)."""
    async with deployment.client() as client:
        endpoint = await client.endpoint(sandbox_id)
    async with ExecdClient(endpoint.url, endpoint.headers) as execd:
        context = await execd.create_context()
        try:
            run = await execd.run(code, context_id=context)
            assert run.error is None, run.error
        finally:
            await execd.delete_context(context)


async def gone(deployment: Any, sandbox_id: str) -> bool:
    async with deployment.client() as client:
        try:
            await client.get(sandbox_id)
        except SandboxNotFound:
            return True
    return False


@pytest.mark.parametrize("kernel", MODES, indirect=True)
async def test_kernel_executes_streams_fails_interrupts_restarts_and_shuts_down(
    kernel: tuple[AsyncKernelManager, Any], deployment: Any
) -> None:
    km, kc = kernel
    sandbox_id = km.provisioner.sandbox_id
    assert sandbox_id

    messages, reply = await execute(kc, "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n6 * 7")
    assert {"name": "stdout", "text": "hello\n"} in of_type(messages, "stream")
    assert {"name": "stderr", "text": "oops\n"} in of_type(messages, "stream")
    assert of_type(messages, "execute_result")[0]["data"]["text/plain"] == "42"
    assert reply["status"] == "ok"

    # streaming: the cell blocks until a file appears that the test creates only after seeing output
    go = f"/tmp/go-{uuid.uuid4().hex}"
    msg_id = kc.execute(
        "import os, time\nprint('first', flush=True)\n"
        f"while not os.path.exists({go!r}):\n    time.sleep(0.05)\nprint('released')"
    )
    assert (await until_stream(kc, msg_id))["text"] == "first\n"
    await in_sandbox(deployment, sandbox_id, f"open({go!r}, 'w').close()")
    rest = await until_idle(kc, msg_id)
    assert "released\n" in "".join(s["text"] for s in of_type(rest, "stream"))
    assert (await shell_reply(kc, msg_id))["status"] == "ok"

    # an error: the whole traceback once on IOPub, the reply with its name, value and a short tail
    messages, reply = await execute(kc, "def deep(n):\n    return deep(n - 1) if n else 1 / 0\ndeep(400)")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    (error,) = of_type(messages, "error")
    assert "ZeroDivisionError" in error["traceback"][-1] and sum(map(len, error["traceback"])) > 2048
    assert sum(map(len, reply["traceback"])) <= 2048 and "ZeroDivisionError" in reply["traceback"][-1]
    _, reply = await execute(kc, "'still alive'")
    assert reply["status"] == "ok"

    # interrupt: SIGINT to the launcher (interrupt_mode signal), which interrupts the sandbox's kernel
    msg_id = kc.execute("import time\nfor i in range(100000):\n    print(i, flush=True)\n    time.sleep(0.05)")
    await until_stream(kc, msg_id)
    await km.interrupt_kernel()
    reply = await shell_reply(kc, msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"

    # restart: a fresh sandbox, as a restart of a Docker kernel is a fresh container
    await execute(kc, "x = 1")
    await km.restart_kernel()
    await kc.wait_for_ready(timeout=300)
    assert km.provisioner.sandbox_id not in (None, sandbox_id)
    assert await gone(deployment, sandbox_id)
    _, reply = await execute(kc, "x")
    assert reply["status"] == "error" and reply["ename"] == "NameError"

    # shutdown deletes the sandbox
    sandbox_id = km.provisioner.sandbox_id
    kc.stop_channels()
    await km.shutdown_kernel()
    assert await gone(deployment, sandbox_id)


@pytest.mark.parametrize("kernel", ["execd"], indirect=True)
async def test_execd_mode_says_what_it_cannot_do(kernel: tuple[AsyncKernelManager, Any]) -> None:
    _, kc = kernel
    info = (await kc.kernel_info(reply=True, timeout=60))["content"]
    assert info["implementation"] == "kernel-sandbox-opensandbox"
    messages, reply = await execute(kc, "from IPython.display import display\ndisplay('shown?')\n'result'")
    assert of_type(messages, "display_data") == [], "execd drops display_data"
    assert of_type(messages, "execute_result")[0]["data"]["text/plain"] == "'result'"
    _, reply = await execute(kc, "input('name? ')", allow_stdin=True)
    assert reply["status"] == "error" and "input is not supported" in reply["evalue"]
    assert (await kc.complete("impo", reply=True, timeout=60))["content"]["matches"] == []


@pytest.mark.parametrize("kernel", ["websocket"], indirect=True)
async def test_websocket_mode_is_a_full_jupyter_kernel(kernel: tuple[AsyncKernelManager, Any]) -> None:
    """Figures, display(), input(), completion, inspection and a widget's comm, as on a Docker kernel."""
    km, kc = kernel
    info = (await kc.kernel_info(reply=True, timeout=60))["content"]
    assert info["implementation"] == "ipython" and info["status"] == "ok"

    messages, reply = await execute(
        kc,
        "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"
        "from IPython.display import display, Markdown\ndisplay(Markdown('**bold**'))",
    )
    assert reply["status"] == "ok"
    bundles = of_type(messages, "display_data")
    assert any(b["data"].get("image/png", "").startswith("iVBOR") for b in bundles), "the figure arrives as PNG"
    assert any(b["data"].get("text/markdown") == "**bold**" for b in bundles)

    # input(): the input_request reaches this client (routed by request), the answer reaches the kernel
    msg_id = kc.execute("answer = input('name? ')\nprint('hello', answer)", allow_stdin=True)
    request = await kc.get_stdin_msg(timeout=120)
    assert request["msg_type"] == "input_request" and request["content"]["prompt"] == "name? "
    kc.input("sandbox")
    rest = await until_idle(kc, msg_id)
    assert "hello sandbox\n" in "".join(s["text"] for s in of_type(rest, "stream"))
    assert (await shell_reply(kc, msg_id))["status"] == "ok"

    # a second client (its own session, so its own ZMQ identity) gets its own input_request
    other = AsyncKernelClient()
    other.load_connection_info(km.get_connection_info(session=True))
    other.session = Session(key=km.session.key, signature_scheme=km.session.signature_scheme)
    other.start_channels()
    try:
        await other.wait_for_ready(timeout=60)
        other_id = other.execute("second = input('other? ')", allow_stdin=True)
        request = await other.get_stdin_msg(timeout=120)
        assert request["parent_header"]["msg_id"] == other_id
        with pytest.raises(Exception):  # noqa: B017 (queue.Empty: the first client is not asked)
            await kc.get_stdin_msg(timeout=1)
        other.input("two")
        while (await other.get_shell_msg(timeout=120))["parent_header"].get("msg_id") != other_id:
            pass
    finally:
        other.stop_channels()

    # an error far over the caps reaches the client cut: value 8 KiB, traceback 64 KiB, the reply's 2 KiB
    messages, reply = await execute(kc, "raise ValueError('v' * 100_000 + '\\n' * 50_000)")
    (error,) = of_type(messages, "error")
    assert len(error["evalue"]) < 9 * 1024 and sum(map(len, error["traceback"])) <= 64 * 1024
    assert len(reply["evalue"]) < 9 * 1024 and sum(map(len, reply["traceback"])) <= 2 * 1024

    # a message over max_output_bytes (16 MiB) closes the websocket; the launcher reopens it and goes on
    # (what the kernel sent right after the big message, on the closing connection, is lost)
    kc.execute("from IPython.display import display\ndisplay({'text/plain': 'x' * 17_000_000}, raw=True)")
    await asyncio.sleep(5)
    messages, reply = await execute(kc, "'after the big one'")
    assert reply["status"] == "ok"
    while True:
        try:
            messages.append(await kc.get_iopub_msg(timeout=1))
        except Exception:  # noqa: BLE001 (queue.Empty: nothing more)
            break
    assert not [m for m in messages if m["msg_type"] == "display_data"], "the over-cap message reached the client"

    completion = (await kc.complete("import matpl", reply=True, timeout=60))["content"]
    assert "matplotlib" in completion["matches"]
    inspection = (await kc.inspect("print", reply=True, timeout=60))["content"]
    assert inspection["found"] is True and "text/plain" in inspection["data"]

    # a widget: its comm opens on IOPub, and a value the client sends reaches the kernel
    messages, reply = await execute(kc, "import ipywidgets\nslider = ipywidgets.IntSlider(3)\ndisplay(slider)")
    assert reply["status"] == "ok"
    opens = [m for m in of_type(messages, "comm_open") if m["data"]["state"].get("_model_name") == "IntSliderModel"]
    assert len(opens) == 1
    comm_id = opens[0]["comm_id"]
    update = {"method": "update", "state": {"value": 7}, "buffer_paths": []}
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": update}))
    for _ in range(50):
        _, reply = await execute(kc, "slider.value")
        if reply["status"] == "ok":
            messages, _ = await execute(kc, "slider.value")
            if of_type(messages, "execute_result")[0]["data"]["text/plain"] == "7":
                break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the slider's new value did not reach the kernel")


async def test_auto_mode_falls_back_to_execd_without_a_jupyter_server(
    deployment: Any, deployment_jupyter_path: Path
) -> None:
    if deployment.local is None:
        pytest.skip("needs an image without a Jupyter server: only the local harness has one")
    deployment.kernelspec(deployment_jupyter_path, "execd", mode="auto", jupyter_wait=2.0)
    async with started_client(manager(), timeout=300) as kc:
        info = (await kc.kernel_info(reply=True, timeout=60))["content"]
        assert info["implementation"] == "kernel-sandbox-opensandbox"
        _, reply = await execute(kc, "6 * 7")
        assert reply["status"] == "ok"


async def test_output_over_the_cap_is_cut_and_the_code_interrupted(
    deployment: Any, deployment_jupyter_path: Path
) -> None:
    deployment.kernelspec(deployment_jupyter_path, "execd", max_output_bytes=4000)
    async with started_client(manager(), timeout=180) as kc:
        _, reply = await execute(kc, "import time\nwhile True:\n    print('x' * 100, flush=True)\n    time.sleep(0.01)")
        assert reply["status"] == "error" and reply["ename"] == "OutputLimitExceeded"
        _, reply = await execute(kc, "'usable after the cap'")
        assert reply["status"] == "ok"


@pytest.mark.security("fault", "sessions")
async def test_an_expired_sandbox_makes_the_kernel_dead(deployment: Any, deployment_jupyter_path: Path) -> None:
    """The published server removes an expired sandbox (404, never Terminated); the launcher must notice."""
    from datetime import datetime, timedelta, timezone

    deployment.kernelspec(deployment_jupyter_path, "execd", state_check_interval=0.5)
    km = manager()
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
        assert not await km.is_alive(), "the kernel still counts as alive 60 s after its sandbox expired"
        reason = km.provisioner.exit_reason or ""
        # mostly a 404; under load the server was once seen reporting the expiring sandbox Failed first
        assert "is gone (404" in reason or reason.endswith(" is Failed"), reason
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
        await asyncio.sleep(2)  # two state checks of the launcher
        assert await km.is_alive(), "a paused sandbox is not a dead kernel"
        assert (await client._call("POST", f"/sandboxes/{sandbox_id}/resume")).status_code == 202
        await client.wait_running(sandbox_id)
    _, reply = await execute(kc, "'after resume'")
    assert reply["status"] == "ok"


# ---- the kernelspec's argv, run as a client that ignores provisioners runs it (VS Code) ----------------


def sandboxes_of(kernel: ArgvKernel, deployment: Any) -> list[dict[str, Any]]:
    """The sandboxes the server knows for ``kernel``."""

    async def listing() -> list[dict[str, Any]]:
        async with deployment.client() as client:
            return await client.list_sandboxes(metadata={"kernel-sandbox-kernel-id": kernel.kernel_id})

    return asyncio.run(listing())


@pytest.fixture
def argv_kernel(deployment: Any, tmp_path: Path) -> Iterator[ArgvKernel]:
    """The argv of the OpenSandbox kernelspec installed as `kernel-sandbox install` does (API base and key in
    the env), started and ready; at the end stopped, and any sandbox of it left deleted."""
    config = deployment.options("websocket", renew_interval=1.0, timeout=60)
    for name in ("api_base", "api_key"):
        config.pop(name)
    spec_dir = Path(install(KERNEL_NAME, prefix=str(tmp_path / "prefix"), config=config))
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": deployment.api_base, "OPEN_SANDBOX_API_KEY": deployment.api_key}
    kernel = ArgvKernel(spec_dir, tmp_path, env, kernel_id=uuid.uuid4().hex)
    try:
        kernel.ready(300)  # the heartbeat first: jupyter_client's wait alone gives up on a launcher still starting
        yield kernel
    finally:
        kernel.stop(60)
        for left in sandboxes_of(kernel, deployment):
            asyncio.run(_delete(deployment, left["id"]))


@pytest.mark.security("fault", "sessions")
def test_the_argv_kernel_runs_in_the_sandbox_streams_interrupts_and_sigterm_leaves_no_sandbox(
    argv_kernel: ArgvKernel, deployment: Any
) -> None:
    (sandbox,) = sandboxes_of(argv_kernel, deployment)
    out, reply = argv_kernel.run("import os, socket\nprint(os.path.exists('/opt/opensandbox/execd'), socket.gethostname())", timeout=120)
    assert reply["status"] == "ok"
    in_sandbox_flag, hostname = out.split()
    assert in_sandbox_flag == "True" and hostname != __import__("socket").gethostname()

    go = f"/tmp/go-{uuid.uuid4().hex}"
    msg_id = argv_kernel.client.execute(
        f"import os, time\nprint('first', flush=True)\nwhile not os.path.exists({go!r}):\n    time.sleep(0.05)"
    )
    while True:
        msg = argv_kernel.client.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    assert msg["content"]["text"] == "first\n", "output streams while the cell runs"
    asyncio.run(in_sandbox(deployment, sandbox["id"], f"open({go!r}, 'w').close()"))
    assert argv_kernel.client.get_shell_msg(timeout=120)["content"]["status"] == "ok"

    # stop_on_error=False: ipykernel would otherwise abort a request that reaches it before its
    # abort window after the KeyboardInterrupt closes (a race of its own, wider under load)
    msg_id = argv_kernel.client.execute("while True: pass", stop_on_error=False)
    time.sleep(1)
    argv_kernel.process.send_signal(signal.SIGINT)
    reply = argv_kernel.client.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    assert argv_kernel.run("'alive'", timeout=120)[1]["status"] == "ok"

    argv_kernel.process.send_signal(signal.SIGTERM)
    assert argv_kernel.process.wait(60) == 0
    assert sandboxes_of(argv_kernel, deployment) == [], "SIGTERM deletes the sandbox before the launcher exits"


@pytest.mark.security("fault", "sessions")
def test_sigkill_of_the_argv_launcher_stops_renewals_and_the_server_expires_the_sandbox(
    argv_kernel: ArgvKernel, deployment: Any
) -> None:
    """The one slow test (~60 s): timeout is 60 s, the server's minimum; renewals every second until the kill."""
    (sandbox,) = sandboxes_of(argv_kernel, deployment)
    first = sandbox["expiresAt"]
    deadline = time.monotonic() + 30
    while sandboxes_of(argv_kernel, deployment)[0]["expiresAt"] == first:
        assert time.monotonic() < deadline, "the launcher does not renew the sandbox"
        time.sleep(0.5)
    argv_kernel.process.kill()
    argv_kernel.process.wait(30)
    killed = time.time()
    expires = sandboxes_of(argv_kernel, deployment)[0]["expiresAt"]
    time.sleep(3)
    assert sandboxes_of(argv_kernel, deployment)[0]["expiresAt"] == expires, "renewals stop with the launcher"
    from datetime import datetime

    assert datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() <= killed + 62
    deadline = time.monotonic() + 120
    while sandboxes_of(argv_kernel, deployment):
        assert time.monotonic() < deadline, "the orphaned sandbox did not expire"
        time.sleep(1)


async def _delete(deployment: Any, sandbox_id: str) -> None:
    async with deployment.client() as client:
        await client.delete(sandbox_id)


# ---- the execution API ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_sandbox_run_files_tools_timeout(
    deployment: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.chdir(tmp_path)
    options = deployment.options(mode)
    options.pop("resource_limits")
    with Sandbox("opensandbox", memory="1g", cpus=1, **options) as sb:
        assert sb._async._comms is (mode == "websocket"), "comm tool calls exactly where the kernel has comms"
        assert sb.run("print('hi'); 6 * 7").text == "42"
        assert sb.run("import os; print(os.environ['TOOL_KEY'])", env={"TOOL_KEY": "k-1"}).stdout == "k-1\n"
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


# ---- kernel-sandbox gc ------------------------------------------------------------------------------------


@pytest.mark.security("fault", "sessions")
async def test_gc_deletes_this_hosts_sandboxes_whose_launcher_is_dead(deployment: Any) -> None:
    """Only sandboxes of this host whose launcher is gone; a live launcher's and another host's stay."""
    from kernel_sandbox.opensandbox.gc import LABEL_LAUNCHER_PID, LABEL_OWNER_HOST, host_label

    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    options = deployment.options()
    owners = {
        "dead": {LABEL_OWNER_HOST: host_label(), LABEL_LAUNCHER_PID: str(gone.pid)},
        "live": {LABEL_OWNER_HOST: host_label(), LABEL_LAUNCHER_PID: str(os.getpid())},
        "other host": {LABEL_OWNER_HOST: "another-host", LABEL_LAUNCHER_PID: str(gone.pid)},
    }
    async with deployment.client() as client:
        made = {}
        try:
            for name, owner in owners.items():
                sandbox = await client.create(
                    image=options["image"], entrypoint=options["entrypoint"], timeout=120,
                    metadata={**options["metadata"], **owner}, resource_limits=options["resource_limits"],
                )
                made[name] = sandbox.id
            no_engine = "unix:///nonexistent/engine.sock"  # neither Docker nor Podman: no container is checked
            env = {**os.environ, "OPEN_SANDBOX_API_KEY": deployment.api_key, "DOCKER_HOST": no_engine, "CONTAINER_HOST": no_engine}
            result = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "kernel_sandbox.cli", "gc", "--api-base", deployment.api_base],
                env=env, capture_output=True, text=True, timeout=120,
            )
            assert result.returncode == 0, result.stderr
            assert f"removed sandbox {made['dead']}" in result.stdout and "no containers checked" in result.stdout
            with pytest.raises(SandboxNotFound):
                await client.get(made["dead"])
            for name in ("live", "other host"):
                assert (await client.get(made[name]))["status"]["state"] == "Running", name
        finally:
            for sandbox_id in made.values():
                await client.delete(sandbox_id)


# ---- egress by name ---------------------------------------------------------------------------------


async def test_a_network_list_reaches_the_server_as_default_deny_egress_rules(deployment: Any) -> None:
    """A kernel with ``network=[...]`` is created with the list as networkPolicy allow rules: the
    server hands them to its egress sidecar (here the stand-in, which enforces nothing but says what it got)."""
    import json

    options = deployment.options()
    options.pop("resource_limits")
    names = ["pypi.org", "*.pythonhosted.org"]
    with Sandbox("opensandbox", network=names, **options) as sb:
        assert sb.run("6 * 7").text == "42"
        async with deployment.client() as client:
            live = [s for s in await client.list_sandboxes(metadata=deployment.metadata)
                    if s.get("status", {}).get("state") == "Running"]
            policies = []
            for sandbox in live:
                endpoint = await client.endpoint(sandbox["id"], 18080)
                async with httpx.AsyncClient(timeout=30) as http:
                    answer = await http.get(endpoint.url + "/policy", headers=endpoint.headers)
                policies.append(json.loads(answer.text))
    expected = [{"action": "allow", "target": name} for name in names]
    assert any(policy.get("defaultAction") == "deny" and policy.get("egress") == expected for policy in policies), policies
