"""Helpers shared by the notebook tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "test-artifacts"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``kernel-sandbox ARGS`` in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli", *args],
        capture_output=True, text=True, env=env or os.environ.copy(), cwd=cwd, input=stdin, timeout=timeout,
    )


IN_CI = bool(os.environ.get("CI"))
