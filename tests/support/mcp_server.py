"""What the ``kernel-sandbox mcp`` tests share: the server as a real process, reached with the SDK's own
client over stdio or streamable HTTP, and the containers each server started."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from kernel_sandbox.docker.containers import LABEL, LABEL_OWNER_PID  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "kernel_sandbox.cli", "mcp"]
TOKEN = "test-token-" + "x" * 20


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a server process: this checkout on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def children() -> set[int]:
    """The pids of this process's children (the stdio servers the SDK's client spawned)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                    found.add(int(entry.name))
    return found


def containers_of(engine, pid: int) -> list:
    """The kernel-sandbox containers the server process ``pid`` started (running or not)."""
    found = engine.containers.list(
        all=True, ignore_removed=True, filters={"label": f"{LABEL_OWNER_PID}={pid}"}
    )
    return [c for c in found if c.labels.get(LABEL) == "true"]


@contextlib.asynccontextmanager
async def stdio_session(*args: str) -> AsyncIterator[ClientSession]:
    """A client session with a fresh ``kernel-sandbox mcp`` over stdio."""
    params = StdioServerParameters(command=SERVER[0], args=[*SERVER[1:], *args], env=server_env())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def http_server_process() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``kernel-sandbox mcp --http`` on a free loopback port, with the token :data:`TOKEN`."""
    port = free_port()
    process = subprocess.Popen(
        [*SERVER, "--http", f"127.0.0.1:{port}", "--set", "orphan_timeout=5"],
        env=server_env(KERNEL_SANDBOX_MCP_TOKEN=TOKEN),
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=1)
            break
        time.sleep(0.2)
    try:
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=60)


@contextlib.asynccontextmanager
async def http_session(url: str, token: str = TOKEN) -> AsyncIterator[ClientSession]:
    """A client session with the HTTP server, with the bearer token."""
    import httpx2

    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    async with client, streamable_http_client(url, http_client=client) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session
