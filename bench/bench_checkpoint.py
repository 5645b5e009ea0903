"""Checkpoint and restore of a 100 MB NumPy array (with 100 small globals) into a new Docker container.

Run: ``python bench/bench_checkpoint.py [--rounds N]`` (needs the Docker engine and the kernel image).
Each round: ``checkpoint()`` of a kernel holding the state, then ``AsyncSandbox(restore=...)`` (a new
container, the blob pushed and loaded), beside a plain start of the same options. Goal (issue 29):
checkpoint + restore under 5 s on this machine. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from kernel_sandbox.execution import AsyncSandbox
from report import Measure, Row

ROUNDS = 3
OPTIONS = {"memory": "2g", "standby": 0, "timeout": 300}
STATE = "import numpy as np\nbig = np.ones(100 * 2**20 // 8)\nfor i in range(100): globals()[f'g{i}'] = [i] * 10\n"
MEASURES = [
    Measure("checkpoint", "Checkpoint and restore of a 100 MB array into a new container", "s",
            "`checkpoint()` of a kernel holding a 100 MB NumPy array and 100 small globals, then "
            "`AsyncSandbox(restore=...)`: a new container, the blob pushed through the helper's channel and "
            "loaded; beside a plain start with the same options (memory 2g). Goal: checkpoint + restore < 5 s."),
]


async def measure(rounds: int) -> dict[str, Any]:
    """Seconds per round: checkpoint, start with restore, plain start; and the blob's size."""
    times: dict[str, list[float]] = {"checkpoint": [], "restore": [], "start": []}
    size = 0
    async with AsyncSandbox(**OPTIONS) as source:
        assert (await source.run(STATE)).error is None
        for _ in range(rounds):
            started = time.perf_counter()
            checkpoint = await source.checkpoint()
            times["checkpoint"].append(time.perf_counter() - started)
            size = checkpoint.size
            started = time.perf_counter()
            async with AsyncSandbox(restore=checkpoint, **OPTIONS) as restored:
                times["restore"].append(time.perf_counter() - started)
                assert (await restored.run("big.sum() == big.size and g99[0] == 99")).text == "True"
            started = time.perf_counter()
            async with AsyncSandbox(**OPTIONS):
                times["start"].append(time.perf_counter() - started)
    return {"median": {key: statistics.median(values) for key, values in times.items()}, "n": rounds, "size": size}


def rows(result: dict[str, Any]) -> list[Row]:
    """Report rows: the plain start is the floor of a restore; the total carries the 5 s goal."""
    median, n = result["median"], result["n"]
    note = f"blob {result['size'] / 2**20:.0f} MiB"
    return [
        Row("checkpoint", "plain start (no restore)", "floor", median["start"], n=n),
        Row("checkpoint", "checkpoint()", "ours", median["checkpoint"], n=n, note=note),
        Row("checkpoint", "start with restore=", "ours", median["restore"], n=n, reference="plain start (no restore)"),
        Row("checkpoint", "checkpoint + restore", "ours", median["checkpoint"] + median["restore"], n=n,
            goal_max=5.0, goal="< 5 s", note=note),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    result = asyncio.run(measure(parser.parse_args().rounds))
    for row in rows(result):
        print(f"{row.what:30} {row.value:7.2f} s  {row.note}")


if __name__ == "__main__":
    main()
