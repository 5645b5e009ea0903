"""``kernel-sandbox mcp``: a run_code round trip over stdio beside ``AsyncSandbox.run`` of the same code.

Run: ``python bench/bench_mcp.py [--rounds N]`` (needs the Docker engine, the kernel image and the MCP
SDK). The MCP side is the SDK's own client talking to a ``kernel-sandbox mcp`` process over stdio;
the difference is what the protocol, the server and its JSON cost per call. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kernel_sandbox.execution import AsyncSandbox
from report import Measure, Row

ROUNDS = 100
CODE = "x = 6 * 7\nx"
MEASURES = [
    Measure("mcp", "MCP run_code round trip (stdio) vs AsyncSandbox.run", "ms",
            "The SDK's own ClientSession calling `run_code` on a `kernel-sandbox mcp` process over stdio, "
            "beside `AsyncSandbox.run` of the same code in this process; both on a warm Docker kernel."),
]


async def measure(rounds: int) -> dict[str, Any]:
    """Median milliseconds per call, MCP and direct, after a warm-up call each."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    root = str(Path(__file__).resolve().parents[1])
    params = StdioServerParameters(command=sys.executable, args=["-m", "kernel_sandbox.cli", "mcp"],
                                   env={**os.environ, "PYTHONPATH": root})
    times: dict[str, list[float]] = {"mcp": [], "direct": []}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("run_code", {"code": CODE})
        for _ in range(rounds):
            started = time.perf_counter()
            await session.call_tool("run_code", {"code": CODE})
            times["mcp"].append((time.perf_counter() - started) * 1000)
    async with AsyncSandbox(standby=0) as sandbox:
        await sandbox.run(CODE)
        for _ in range(rounds):
            started = time.perf_counter()
            await sandbox.run(CODE)
            times["direct"].append((time.perf_counter() - started) * 1000)
    return {"median": {key: statistics.median(values) for key, values in times.items()}, "n": rounds}


def rows(result: dict[str, Any]) -> list[Row]:
    """The direct run is the floor of the MCP round trip."""
    median, n = result["median"], result["n"]
    return [
        Row("mcp", "AsyncSandbox.run", "floor", median["direct"], n=n),
        Row("mcp", "MCP run_code over stdio", "ours", median["mcp"], n=n, reference="AsyncSandbox.run"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    for row in rows(asyncio.run(measure(parser.parse_args().rounds))):
        print(f"{row.what:28} {row.value:8.2f} ms")


if __name__ == "__main__":
    main()
