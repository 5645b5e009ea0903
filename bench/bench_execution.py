"""Benchmark the execution API side by side with a local ipykernel, in one run, as ratios.

Run: ``python bench/bench_execution.py [--rounds N]`` (needs the Docker engine and the kernel
image). Targets are those of DESIGN.md §7.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from kernel_sandbox.execution import AsyncSandbox, AsyncSandboxPool
from kernel_sandbox.execution.backends import kernel_manager, kernel_spec
from report import Row

ROUNDS = 100


def agent_tool(agent_state: dict) -> int:
    """A tool that touches its state (so the state travels both ways)."""
    agent_state["calls"] = agent_state.get("calls", 0) + 1
    return len(agent_state["blob"])


async def medians(rounds: int, *actions: Callable[[], Awaitable[Any]]) -> list[float]:
    """Median wall time of each action in milliseconds, after one warm-up call of each.

    The actions take turns within every round, so drift in the machine's load over the run
    falls on all of them alike and their ratios stay fair.
    """
    for action in actions:
        await action()
    times: list[list[float]] = [[] for _ in actions]
    for _ in range(rounds):
        for action, samples in zip(actions, times):
            started = time.perf_counter()
            await action()
            samples.append((time.perf_counter() - started) * 1000)
    return [statistics.median(samples) for samples in times]


async def cold_start(backend: str) -> None:
    """From nothing to a kernel_info reply, for a bare kernel manager; then shut it down."""
    options = {"env": {}} if backend == "local" else {}
    km = kernel_manager(kernel_spec(backend, options))
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def pool_acquire(rounds: int) -> float:
    """Median milliseconds for ``acquire()`` on a warm pool (a kernel is ready when asked)."""
    times = []
    async with AsyncSandboxPool(2) as pool:
        for _ in range(rounds):
            while not pool._ready:
                await asyncio.sleep(0.05)
            started = time.perf_counter()
            async with pool.acquire() as sb:
                times.append((time.perf_counter() - started) * 1000)
                await sb.run("1")
    return statistics.median(times)


async def rows(rounds: int) -> list[Row]:
    """This script's measures that bench/run.py does not take side by side elsewhere, as report rows."""
    started = time.perf_counter()
    sandbox = await AsyncSandbox().start()
    sandbox_start = (time.perf_counter() - started) * 1000
    await sandbox.close()
    acquire_rounds = max(5, rounds // 10)
    acquire = await pool_acquire(acquire_rounds)
    return [
        Row("cold_start", "AsyncSandbox start (ours, execution API)", "ours", sandbox_start, stat="one start", n=1,
            reference="local ipykernel (floor)", note="not interleaved with the rows above; includes the work-dir probe"),
        Row("pool", "warm pool acquire() (ours, execution API)", "ours", acquire, n=acquire_rounds, goal_max=20.0, goal="p50 ≤ 20 ms"),
    ]


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    """Print ``rows`` as aligned columns under the header what / reference / measured / ratio."""
    header = ("what", "reference", "measured", "ratio")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(4)]
    for row in (header, tuple("-" * width for width in widths), *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))


async def main(rounds: int) -> None:
    """Measure cold start, warm pool acquire, execute and tool round trips and print the table."""
    rows: list[tuple[str, str, str, str]] = []
    local_cold, docker_cold = await medians(
        max(3, rounds // 20), lambda: cold_start("local"), lambda: cold_start("docker")
    )
    rows.append(("cold start to kernel_info", f"{local_cold:.0f} ms local", f"{docker_cold:.0f} ms docker",
                 f"{docker_cold / local_cold:.2f}x (goal <= 1.3x)"))
    started = time.perf_counter()
    async with AsyncSandbox():
        sandbox_cold = (time.perf_counter() - started) * 1000
    rows.append(("AsyncSandbox start (incl. work-dir probe)", "", f"{sandbox_cold:.0f} ms docker",
                 f"{sandbox_cold / local_cold:.2f}x local kernel_info"))
    acquire = await pool_acquire(max(5, rounds // 10))
    rows.append(("warm pool acquire p50", "", f"{acquire:.2f} ms", "goal p50 <= 20 ms"))

    async with AsyncSandbox("local") as local, AsyncSandbox() as docker:
        one_kb, one_mb = {"blob": "s" * 1024}, {"blob": "s" * 1024 * 1024}
        local_exec, docker_exec, tool_kb, tool_mb = await medians(
            rounds,
            lambda: local.run("1"),
            lambda: docker.run("1"),
            lambda: docker.run_tool(agent_tool, agent_state=one_kb),
            lambda: docker.run_tool(agent_tool, agent_state=one_mb),
        )
        rows.append(("execute round trip", f"{local_exec:.2f} ms local", f"{docker_exec:.2f} ms docker",
                     f"{docker_exec / local_exec:.2f}x (goal <= 1.05x)"))
        for label, tool, goal in (("1 KB", tool_kb, "goal <= 1.5x bare"), ("1 MB", tool_mb, "goal p50 <= 25 ms")):
            rows.append((f"tool call, {label} state (both ways)", f"{docker_exec:.2f} ms bare execute",
                         f"{tool:.2f} ms tool", f"{tool / docker_exec:.2f}x bare ({goal})"))

    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="measured calls per round-trip row")
    warnings.simplefilter("ignore")
    asyncio.run(main(parser.parse_args().rounds))
