"""Fixtures for the ``kernel-sandbox mcp`` tests (helpers in mcp_kit.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

pytest.importorskip("mcp", reason="the MCP SDK: pip install 'kernel-sandbox[mcp]'")

from mcp_kit import http_server_process  # noqa: E402


@pytest.fixture(scope="module")
def http_server(docker_engine) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``kernel-sandbox mcp --http`` on a free loopback port with the token ``mcp_kit.TOKEN``."""
    with http_server_process() as served:
        yield served
