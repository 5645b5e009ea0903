"""A sleeping kernel (``suspend_after``): host memory asleep vs awake, and the time to wake it.

Run: ``python bench/bench_sleep.py [--rounds N]`` (needs the Docker engine and the kernel image).
One Docker kernel holds a 100 MB NumPy array. Awake, the host holds its container (the cgroup's
memory, as ``docker stats``) and its launcher (unique memory, USS); asleep, the launcher alone.
Each round: ``suspend()``, then the first call (``run("1")``), which wakes it in a new container with
its variables, beside the same call on a kernel that never slept. Goals (issue 37): a sleeping
kernel costs at most 12 MiB on the host besides its blob on disk (today's launcher is more: it is
measured, not slimmed yet), and the wake of 100 MB takes at most 2 s. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import psutil

from kernel_sandbox.execution import AsyncSandbox
from report import Measure, Row

ROUNDS = 3
OPTIONS = {"memory": "2g", "standby": 0, "timeout": 300, "suspend_after": 86400}
STATE = "import numpy as np\nbig = np.ones(100 * 2**20 // 8)\n"
MEASURES = [
    Measure("sleep_memory", "A sleeping kernel vs an awake one: host memory (100 MB of state)", "MiB",
            "Awake: the container's memory (cgroup, as docker stats) plus the launcher's unique memory (USS); "
            "asleep: the launcher alone (the checkpoint is on disk). Goal: ≤ 12 MiB asleep."),
    Measure("sleep_wake", "Waking a sleeping kernel (100 MB of state)", "s",
            "`suspend()`, then the first `run(\"1\")`: a new container, the blob restored; beside the same "
            "call on a kernel that never slept. Goal: ≤ 2 s."),
]


def _launcher_uss(sandbox: AsyncSandbox) -> float:
    """The unique memory of the sandbox's launcher process, in MiB."""
    pid = sandbox._km.provisioner.pid
    return psutil.Process(pid).memory_full_info().uss / 2**20


async def measure(rounds: int) -> dict[str, Any]:
    """Host memory awake and asleep; seconds to suspend, to wake (first call), and a never-slept call."""
    times: dict[str, list[float]] = {"suspend": [], "wake": [], "awake_call": []}
    memory: dict[str, list[float]] = {"container": [], "launcher_awake": [], "launcher_asleep": []}
    async with AsyncSandbox(**OPTIONS) as sleeper, AsyncSandbox(**OPTIONS) as never:
        for sandbox in (sleeper, never):
            assert (await sandbox.run(STATE)).error is None
        for _ in range(rounds):
            memory["container"].append(((await sleeper.metrics()).memory or 0) / 2**20)
            memory["launcher_awake"].append(_launcher_uss(sleeper))
            started = time.perf_counter()
            await sleeper.suspend()
            times["suspend"].append(time.perf_counter() - started)
            memory["launcher_asleep"].append(_launcher_uss(sleeper))
            started = time.perf_counter()
            assert (await sleeper.run("1")).error is None
            times["wake"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert (await never.run("1")).error is None
            times["awake_call"].append(time.perf_counter() - started)
        check = await sleeper.run("bool(big.sum() == big.size)")
        assert check.text == "True", check
    return {
        "times": {key: statistics.median(values) for key, values in times.items()},
        "memory": {key: statistics.median(values) for key, values in memory.items()},
        "n": rounds,
    }


def rows(result: dict[str, Any]) -> list[Row]:
    """Report rows: memory awake and asleep; the wake beside a call on a kernel that never slept."""
    times, memory, n = result["times"], result["memory"], result["n"]
    awake = memory["container"] + memory["launcher_awake"]
    return [
        Row("sleep_memory", "awake: container + launcher", "floor", awake, n=n,
            note=f"container {memory['container']:.0f} MiB, launcher {memory['launcher_awake']:.0f} MiB"),
        Row("sleep_memory", "asleep: launcher", "ours", memory["launcher_asleep"], n=n,
            reference="awake: container + launcher", goal_max=12.0, goal="≤ 12 MiB"),
        Row("sleep_wake", "call on a kernel that never slept", "floor", times["awake_call"], n=n),
        Row("sleep_wake", "suspend()", "ours", times["suspend"], n=n),
        Row("sleep_wake", "first call after a sleep (wake)", "ours", times["wake"], n=n,
            goal_max=2.0, goal="≤ 2 s"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    result = asyncio.run(measure(parser.parse_args().rounds))
    for row in rows(result):
        print(f"{row.what:36} {row.value:8.2f}  {row.note}")


if __name__ == "__main__":
    main()
