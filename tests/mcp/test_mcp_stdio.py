"""``kernel-sandbox mcp`` over stdio with the SDK's own client, on real Docker kernels."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from pathlib import Path

import anyio

from kernel_sandbox.docker.containers import LABEL_PRIVATE_DIR

from support.mcp_server import children, containers_of, stdio_session

TOOLS = {
    "run_code",
    "upload_file",
    "download_file",
    "install_packages",
    "list_variables",
    "restart",
    "checkpoint",
    "restore",
}


def text(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def test_tools_state_images_errors_and_timeouts(docker_engine):
    async with stdio_session() as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert TOOLS <= set(tools)
        assert "code" in tools["run_code"].input_schema["properties"]
        assert "persist" in tools["run_code"].description

        first = await session.call_tool("run_code", {"code": "x = 41"})
        assert not first.is_error
        second = await session.call_tool("run_code", {"code": "x + 1"})
        assert not second.is_error and "[result]\n42" in text(second)
        assert second.structured_content["result"] == "42"

        figure = await session.call_tool(
            "run_code",
            {
                "code": "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
                "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"
            },
        )
        images = [block for block in figure.content if block.type == "image"]
        assert images and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")

        error = await session.call_tool("run_code", {"code": "1 / 0"})
        assert error.is_error
        assert "[error] ZeroDivisionError: division by zero" in text(error)
        assert "----> 1 1 / 0" in text(error)  # the traceback, colour codes dropped
        assert "\x1b" not in text(error)

        spin = await session.call_tool("run_code", {"code": "while True: pass", "timeout": 2})
        assert spin.is_error and "TimeoutError" in text(spin) and "interrupted" in text(spin)
        after = await session.call_tool("run_code", {"code": "x * 2"})
        assert not after.is_error and "[result]\n82" in text(after)

        listed = await session.call_tool("list_variables", {})
        assert not listed.is_error and "x: int = 41" in text(listed)


async def test_client_cancellation_interrupts_the_kernel(docker_engine):
    async with stdio_session() as session:
        await session.call_tool("run_code", {"code": "import time\nmarks = []"})
        with anyio.move_on_after(3):
            await session.call_tool(
                "run_code",
                {"code": "while True:\n    marks.append(1); time.sleep(0.05)", "timeout": 600},
            )
        # the next call runs (the cancelled loop was interrupted), and the loop no longer grows
        first = await session.call_tool("run_code", {"code": "len(marks)", "timeout": 60})
        assert not first.is_error, text(first)
        await asyncio.sleep(1)
        second = await session.call_tool("run_code", {"code": "len(marks)", "timeout": 60})
        assert first.structured_content["result"] == second.structured_content["result"]


async def test_two_sessions_two_containers_nothing_shared(docker_engine):
    """Each session's kernel is its own, and goes with its session: the server removes it (the
    orphan_timeout of 600 s would keep it otherwise), the pool's refill in flight cut short."""
    before = children()
    long_orphans = ("--set", "orphan_timeout=600")
    async with stdio_session(*long_orphans) as one, stdio_session(*long_orphans) as two:
        await one.call_tool("run_code", {"code": "secret = 'one'"})
        seen = await two.call_tool("run_code", {"code": "secret"})
        assert seen.is_error and "NameError" in text(seen)
        servers = children() - before
        assert len(servers) == 2
        owned = [containers_of(docker_engine, pid) for pid in servers]
        assert all(owned), owned
        assert {c.id for c in owned[0]}.isdisjoint({c.id for c in owned[1]})
    deadline = time.monotonic() + 60
    while any(containers_of(docker_engine, pid) for pid in servers):
        assert time.monotonic() < deadline, "a session's container outlived its session"
        await asyncio.sleep(0.5)


async def test_sigterm_ends_the_server_and_its_kernels_at_once(docker_engine):
    """SIGTERM (an MCP client's next step when the server outlives stdin by 2 s, a service
    manager's stop) ends the server, its stdin still open, and the session's kernel at once, not
    after orphan_timeout (600 s here): its container and its private directory go."""
    before = children()
    async with stdio_session("--set", "orphan_timeout=600") as session:
        await session.call_tool("run_code", {"code": "1"})
        (server,) = children() - before
        (container,) = containers_of(docker_engine, server)
        private = Path(container.labels[LABEL_PRIVATE_DIR])
        assert private.is_dir()
        os.kill(server, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while containers_of(docker_engine, server) or private.exists() or not ended(server):
            assert time.monotonic() < deadline, (
                f"after SIGTERM: server ended {ended(server)}, containers {containers_of(docker_engine, server)}, "
                f"private directory left {private.exists()}")
            await asyncio.sleep(0.5)


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie its parent has not reaped yet included)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_container_gone_after_the_server_is_killed(docker_engine):
    before = children()
    async with stdio_session("--set", "orphan_timeout=3") as session:
        await session.call_tool("run_code", {"code": "1"})
        (server,) = children() - before
        assert containers_of(docker_engine, server)
        os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while containers_of(docker_engine, server):
        assert time.monotonic() < deadline, "the killed server's container outlived orphan_timeout"
        await asyncio.sleep(1)


async def test_files_checkpoints_restart_and_refusals(docker_engine):
    async with stdio_session() as session:
        payload = base64.b64encode(b"a,b\n1,2\n").decode()
        wrote = await session.call_tool("upload_file", {"path": "in.csv", "content_base64": payload})
        assert not wrote.is_error, text(wrote)
        read = await session.call_tool("run_code", {"code": "open('in.csv').read()"})
        assert "a,b" in read.structured_content["result"]
        out = await session.call_tool("download_file", {"path": "in.csv"})
        assert not out.is_error, text(out)
        (blob,) = [block for block in out.content if block.type == "resource"]
        assert base64.b64decode(blob.resource.blob) == b"a,b\n1,2\n"

        escape = await session.call_tool("download_file", {"path": "../../etc/passwd"})
        assert escape.is_error and "PathError" in text(escape)
        bad = await session.call_tool("upload_file", {"path": "x", "content_base64": "%%%"})
        assert bad.is_error and "base64" in text(bad)

        await session.call_tool("run_code", {"code": "y = [1, 2, 3]"})
        saved = await session.call_tool("checkpoint", {})
        assert not saved.is_error, text(saved)
        ident = saved.structured_content["checkpoint_id"]
        await session.call_tool("restart", {})
        gone = await session.call_tool("run_code", {"code": "y"})
        assert gone.is_error and "NameError" in text(gone)
        unknown = await session.call_tool("restore", {"checkpoint_id": "nope"})
        assert unknown.is_error and ident in text(unknown)
        back = await session.call_tool("restore", {"checkpoint_id": ident})
        assert not back.is_error, text(back)
        again = await session.call_tool("run_code", {"code": "sum(y)"})
        assert again.structured_content["result"] == "6"


def test_the_cli_says_how_to_install_the_sdk(monkeypatch, capsys):
    import sys

    from kernel_sandbox.cli import main

    monkeypatch.setitem(sys.modules, "kernel_sandbox.mcpserver", None)
    assert main(["mcp"]) == 1
    assert "pip install 'kernel-sandbox[mcp]'" in capsys.readouterr().err


async def test_long_runs_report_progress(docker_engine):
    seen: list[str] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    async with stdio_session() as session:
        result = await session.call_tool(
            "run_code",
            {"code": "import time\nfor i in range(3):\n    print('step', i, flush=True); time.sleep(0.5)"},
            progress_callback=progress,
        )
        assert not result.is_error
    assert any("step 0" in message for message in seen), seen
    assert any("step 2" in message for message in seen), seen
