"""Benchmark the execution API side by side with a local ipykernel, in one run, as ratios.

Run: ``python bench/bench_execution.py [--rounds N]`` (needs the Docker engine and the kernel
image). Targets are those of issue 13.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from kernel_sandbox.execution import AsyncSandbox, AsyncSandboxPool
from kernel_sandbox.execution.adapters import kernel_spec
from kernel_sandbox.execution.backend import kernel_manager
from kernel_sandbox.kernelspecs import started_client
from peer_per_call import per_call_interpreter
from report import Row

ROUNDS = 100


def agent_tool(agent_state: dict) -> int:
    """A tool that touches its state (so the state travels both ways)."""
    agent_state["calls"] = agent_state.get("calls", 0) + 1
    return len(agent_state["blob"])


async def fresh_interpreter(state: dict) -> Any:
    """A tool call the way Letta's local sandbox makes it: a new interpreter, pickles in and out."""
    return await per_call_interpreter(agent_tool, state)


async def samples(rounds: int, *actions: Callable[[], Awaitable[Any]]) -> list[list[float]]:
    """Wall times of each action in milliseconds, after one warm-up call of each.

    The actions take turns within every round, so drift in the machine's load over the run
    falls on all of them alike and their ratios stay fair.
    """
    for action in actions:
        await action()
    times: list[list[float]] = [[] for _ in actions]
    for _ in range(rounds):
        for action, measured in zip(actions, times):
            started = time.perf_counter()
            await action()
            measured.append((time.perf_counter() - started) * 1000)
    return times


async def medians(rounds: int, *actions: Callable[[], Awaitable[Any]]) -> list[float]:
    """Median wall time of each action in milliseconds (see :func:`samples`)."""
    return [statistics.median(measured) for measured in await samples(rounds, *actions)]


def p90(measured: list[float]) -> float:
    """The 90th percentile of ``measured``."""
    return statistics.quantiles(measured, n=10)[-1]


async def cold_start(backend: str) -> None:
    """From nothing to a kernel_info reply, for a bare kernel manager; then shut it down."""
    options = {"env": {}} if backend == "local" else {}
    async with started_client(kernel_manager(kernel_spec(backend, options)), timeout=60):
        pass


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
    """Measure cold start, warm pool acquire, execute and tool round trips and print the table.

    Tool calls are compared with a bare execute of ``1`` on the same kernel and with a fresh
    interpreter per call (pickled state in and out, as Letta's local sandbox does).
    """
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
        fresh_states = ({**one_mb, "round": index} for index in itertools.count())
        local_exec, docker_exec, tool_kb, tool_mb, tool_mb_new, fresh_kb, fresh_mb = await samples(
            rounds,
            lambda: local.run("1"),
            lambda: docker.run("1"),
            lambda: docker.run_tool(agent_tool, agent_state=one_kb),
            lambda: docker.run_tool(agent_tool, agent_state=one_mb),
            lambda: docker.run_tool(agent_tool, agent_state=next(fresh_states)),
            lambda: fresh_interpreter(one_kb),
            lambda: fresh_interpreter(one_mb),
        )
        bare = statistics.median(docker_exec)
        local_bare = statistics.median(local_exec)
        rows.append(("execute round trip", f"{local_bare:.2f} ms local", f"{bare:.2f} ms docker",
                     f"{bare / local_bare:.2f}x (goal <= 1.05x)"))
        kb, mb = statistics.median(tool_kb), statistics.median(tool_mb)
        rows.append(("tool call, 1 KB state (both ways), p50", f"{bare:.2f} ms bare execute `1`",
                     f"{kb:.2f} ms tool (p90 {p90(tool_kb):.2f})", f"{kb / bare:.2f}x bare (goal <= 1.0x)"))
        rows.append(("tool call, 1 MB state (both ways), p50", "goal p50 <= 20 ms",
                     f"{mb:.2f} ms tool (p90 {p90(tool_mb):.2f})", f"{mb / bare:.2f}x bare"))
        new_mb = statistics.median(tool_mb_new)
        rows.append(("tool call, 1 MB state new every call, p50", "the state travels in too",
                     f"{new_mb:.2f} ms tool (p90 {p90(tool_mb_new):.2f})", f"{new_mb / bare:.2f}x bare"))
        for label, fresh, tool in (("1 KB", fresh_kb, kb), ("1 MB", fresh_mb, mb)):
            fresh_p50 = statistics.median(fresh)
            rows.append((f"fresh interpreter per call, {label}", f"{fresh_p50:.2f} ms (Letta's local way)",
                         f"{tool:.2f} ms tool", f"{fresh_p50 / tool:.1f}x faster (goal >= 5x for 1 MB)"))

    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="measured calls per round-trip row")
    warnings.simplefilter("ignore")
    asyncio.run(main(parser.parse_args().rounds))
