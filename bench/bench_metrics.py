"""What reading a sandbox's usage costs: an execute round trip with metrics sampling on vs off.

Run: ``python bench/bench_metrics.py [--rounds N]`` (needs the Docker engine and the kernel image).
One Docker sandbox; rounds alternate between sampling off and sampling on (``metrics()`` in a
task of the same event loop every :data:`INTERVAL` s, as ``kernel-sandbox top`` does, and every
:data:`STRESS_INTERVAL` s as a stress), so load drift falls on both alike. Also the cost of one
sample (:meth:`CgroupProbe.read`) and of an answer to ``usage_request`` is measured by itself.
Goal: sampling makes the round trip at most 2 % slower.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from kernel_sandbox.execution import AsyncSandbox
from report import Measure, Row

INTERVAL = 1.0
STRESS_INTERVAL = 0.05
ROUNDS = 300
MEASURES = [
    Measure("metrics", "Execute round trip with usage sampling on vs off", "ms",
            "`AsyncSandbox.run('1')`, rounds alternating with a task calling `metrics()` every 1 s (as `top`) "
            "and every 50 ms (stress) on the same event loop; goal ≤ 1.02× off. Also one cgroup sample alone."),
]


async def _sampler(sandbox: AsyncSandbox, interval: float, active: dict[str, str], mode: str) -> None:
    """Call ``metrics()`` every ``interval`` s while rounds of ``mode`` run (a steady rhythm, as top's)."""
    while True:
        await asyncio.sleep(interval)
        if active["mode"] == mode:
            await sandbox.metrics()


async def measure(rounds: int) -> dict[str, Any]:
    """Median round trips (ms) off / on / stressed, and one sample's cost (µs)."""
    times: dict[str, list[float]] = {"off": [], "on": [], "stress": []}
    active = {"mode": "off"}
    async with AsyncSandbox() as sandbox:
        for _ in range(5):
            await sandbox.run("1")
        usage = await sandbox.metrics()
        samplers = [asyncio.ensure_future(_sampler(sandbox, INTERVAL, active, "on")),
                    asyncio.ensure_future(_sampler(sandbox, STRESS_INTERVAL, active, "stress"))]
        try:
            modes = list(times)
            for round_ in range(rounds):
                for mode in modes[round_ % 3:] + modes[:round_ % 3]:  # each mode in each position alike
                    measured = times[mode]
                    active["mode"] = mode
                    started = time.perf_counter()
                    await sandbox.run("1")
                    measured.append((time.perf_counter() - started) * 1000)
        finally:
            for task in samplers:
                task.cancel()
        probe = sandbox._probe
        assert probe is not None
        reads = []
        for _ in range(1000):
            started = time.perf_counter()
            probe.read()
            reads.append((time.perf_counter() - started) * 1e6)
    return {
        "median": {mode: statistics.median(values) for mode, values in times.items()},
        "n": rounds, "sample_us": statistics.median(reads), "usage": repr(usage),
    }


def rows(result: dict[str, Any]) -> list[Row]:
    """Report rows: off is the reference; on (1 s) carries the 2 % goal."""
    median, n = result["median"], result["n"]
    return [
        Row("metrics", "sampling off", "ours", median["off"], n=n),
        Row("metrics", "sampling every 1 s (top)", "ours", median["on"], n=n, reference="sampling off",
            goal_ratio=1.02, goal="≤ 1.02× off"),
        Row("metrics", "sampling every 50 ms (stress)", "ours", median["stress"], n=n, reference="sampling off"),
        Row("metrics", "one cgroup sample alone (µs)", "ours", result["sample_us"] / 1000, n=1000, chart=False,
            note=f"{result['sample_us']:.0f} µs per sample"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    result = asyncio.run(measure(parser.parse_args().rounds))
    off = result["median"]["off"]
    for mode, value in result["median"].items():
        print(f"{mode:>7}: {value:7.2f} ms  ({value / off:.3f}× off)")
    print(f"one sample: {result['sample_us']:.0f} µs; {result['usage']}")


if __name__ == "__main__":
    main()
