"""The benchmarks' one command starts: every module of bench/ imports against today's package (a
module moved in the package breaks `python bench/run.py` before it measures anything)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_bench_command_imports_every_benchmark_and_answers_help() -> None:
    result = subprocess.run([sys.executable, "bench/run.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--quick" in result.stdout and "--only" in result.stdout
