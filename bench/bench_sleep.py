"""A sleeping kernel (``suspend_after``): host memory asleep vs awake, and the time to wake it; and
a fleet of idle kernels asleep vs awake.

Run: ``python bench/bench_sleep.py [--rounds N] [--fleet K]`` (needs the Docker engine and the kernel
image; ``--fleet 0`` leaves the fleet out).
One Docker kernel holds a 100 MB NumPy array. Awake, the host holds its container (the cgroup's
memory, as ``docker stats``) and its launcher (unique memory, USS); asleep, the launcher alone, once
it has made way for its dormant process (kernel_sandbox/launch/dormant.py).
Each round: ``suspend()``, then the first call (``run("1")``), which wakes it in a new container with
its variables, beside the same call on a kernel that never slept. Goals (issue 37): a sleeping
kernel costs at most 12 MiB on the host besides its blob on disk, and the wake of 100 MB takes at
most 2 s. Nothing asserts on time.

The fleet (issue 37's bench): ``--fleet`` kernels (100) with 50 MB each, started a few at a time
and left idle; the host's memory for them awake (their containers' cgroup memory plus their
launchers' unique memory), then with all asleep (the launchers alone; the blobs are on disk, and the
memory the sleeps report saved is shown beside), and the wake of one of them. Goal: ≤ 1.5 GiB for
100 asleep.
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
FLEET = 100
FLEET_STATE = "import numpy as np\nstate = np.ones(50 * 2**20 // 8)\n"
AT_ONCE = 4
"""Fleet kernels started (or put to sleep) at the same time."""
MEASURES = [
    Measure("sleep_memory", "A sleeping kernel vs an awake one: host memory (100 MB of state)", "MiB",
            "Awake: the container's memory (cgroup, as docker stats) plus the launcher's unique memory (USS); "
            "asleep: the launcher alone (the checkpoint is on disk). Goal: ≤ 12 MiB asleep."),
    Measure("sleep_wake", "Waking a sleeping kernel (100 MB of state)", "s",
            "`suspend()`, then the first `run(\"1\")`: a new container, the blob restored; beside the same "
            "call on a kernel that never slept. Goal: ≤ 2 s."),
    Measure("sleep_fleet", "Idle kernels on one host: all awake vs all asleep (50 MB of state each)", "MiB",
            "The kernels' host memory: awake, their containers (cgroup) plus their launchers (USS); asleep, "
            "the launchers alone (the blobs are on disk). Goal: ≤ 1.5 GiB for 100 asleep."),
]


def _launcher_uss(sandbox: AsyncSandbox) -> float:
    """The unique memory of the sandbox's launcher process, in MiB."""
    pid = sandbox._km.provisioner.pid
    return psutil.Process(pid).memory_full_info().uss / 2**20


async def _dormant(sandbox: AsyncSandbox, timeout: float = 30) -> None:
    """Wait until the sandbox's sleeping kernel's launcher is the dormant process."""
    cmdline = f"/proc/{sandbox._km.provisioner.pid}/cmdline"
    deadline = time.monotonic() + timeout
    while b"kernel_sandbox.launch.dormant" not in open(cmdline, "rb").read():
        assert time.monotonic() < deadline, "the sleeping kernel's launcher did not make way"
        await asyncio.sleep(0.2)


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
            await _dormant(sleeper)
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


async def _in_batches(coros: list[Any]) -> list[Any]:
    results = []
    for start in range(0, len(coros), AT_ONCE):
        results += await asyncio.gather(*coros[start:start + AT_ONCE])
    return results


async def measure_fleet(kernels: int) -> dict[str, Any]:
    """``kernels`` sandboxes with 50 MB each: host memory all awake and all asleep, and one wake."""
    # the host's checkpoints may hold 2 GiB by default: 100 sleeps of 50 MB need more
    fleet = [AsyncSandbox(**OPTIONS, max_checkpoint_bytes="8g") for _ in range(kernels)]
    started = time.perf_counter()
    try:
        await _in_batches([sandbox.__aenter__() for sandbox in fleet])
        for result in await _in_batches([sandbox.run(FLEET_STATE) for sandbox in fleet]):
            assert result.error is None, result
        start_s = time.perf_counter() - started
        containers = sum(usage.memory or 0 for usage in await _in_batches([s.metrics() for s in fleet])) / 2**20
        launchers_awake = sum(_launcher_uss(sandbox) for sandbox in fleet)
        await _in_batches([sandbox.suspend() for sandbox in fleet])
        await asyncio.gather(*(_dormant(sandbox, timeout=120) for sandbox in fleet))
        launchers_asleep = sum(_launcher_uss(sandbox) for sandbox in fleet)
        saved = sum(usage.saved or 0 for usage in await _in_batches([s.metrics() for s in fleet]))
        woke = time.perf_counter()
        check = await fleet[0].run("bool(state.sum() == state.size)")
        wake_s = time.perf_counter() - woke
        assert check.text == "True", check
    finally:
        await asyncio.gather(*(sandbox.__aexit__(None, None, None) for sandbox in fleet),
                             return_exceptions=True)
    return {"kernels": kernels, "containers": containers, "launchers_awake": launchers_awake,
            "launchers_asleep": launchers_asleep, "saved": saved / 2**20, "wake": wake_s,
            "start": start_s}


def fleet_rows(result: dict[str, Any]) -> list[Row]:
    """Report rows: the fleet's host memory awake and asleep."""
    k = result["kernels"]
    awake = result["containers"] + result["launchers_awake"]
    return [
        Row("sleep_fleet", f"{k} kernels awake: containers + launchers", "floor", awake, stat="sum",
            note=f"containers {result['containers']:.0f} MiB, launchers {result['launchers_awake']:.0f} MiB; "
                 f"started with their state in {result['start']:.0f} s"),
        Row("sleep_fleet", f"{k} kernels asleep: launchers", "ours", result["launchers_asleep"], stat="sum",
            reference=f"{k} kernels awake: containers + launchers",
            goal_max=1536.0 * k / FLEET, goal=f"≤ {1.5 * k / FLEET:g} GiB",
            note=f"{result['launchers_asleep'] / k:.1f} MiB per kernel; memory saved as the sleeps report it "
                 f"{result['saved']:.0f} MiB; one woke in {result['wake']:.2f} s"),
    ]


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
    parser.add_argument("--fleet", type=int, default=FLEET, help="kernels in the fleet (0: none)")
    args = parser.parse_args()
    found = rows(asyncio.run(measure(args.rounds)))
    if args.fleet:
        found += fleet_rows(asyncio.run(measure_fleet(args.fleet)))
    for row in found:
        print(f"{row.what:44} {row.value:8.2f}  {row.note}")


if __name__ == "__main__":
    main()
