"""Helpers shared by the notebook tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``kernel-sandbox ARGS`` in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli", *args],
        capture_output=True, text=True, env=env or os.environ.copy(), cwd=cwd, input=stdin, timeout=timeout,
    )


IN_CI = bool(os.environ.get("CI"))
