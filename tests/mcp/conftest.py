"""Fixtures for the ``kernel-sandbox mcp`` tests (helpers in tests/support/mcp_server.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

pytest.importorskip("mcp", reason="the MCP SDK: pip install 'kernel-sandbox[mcp]'")

from support.mcp_server import http_server_process  # noqa: E402


@pytest.fixture(scope="module")
def http_server(docker_engine) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``kernel-sandbox mcp --http`` on a free loopback port with the token ``support.mcp_server.TOKEN``."""
    with http_server_process() as served:
        yield served
