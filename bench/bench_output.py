"""50 MB of stdout through a session: the host process's peak memory above its start, and throughput.

Run: ``python bench/bench_output.py [--rounds N]``. The code writes 50 MiB to stdout in 8 KiB
writes; ``AsyncSandbox.run`` keeps its default 4 MiB of it and counts the rest as truncated, so
the whole 50 MiB must cross the host. Resident memory (VmRSS) of this process, and of its child
processes (a launcher, when the provisioner runs one), is sampled every 5 ms during the run;
"above start" is the peak minus the value just before ``run``. The Docker kernel (ours) and a
local kernel through the same API (the floor) take turns. Nothing asserts on time or memory.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import warnings

import psutil

from report import Measure, Row, judge, markdown
from kernel_sandbox.execution import AsyncSandbox

TOTAL = 50 * 1024 * 1024
CHUNK = 8192
CODE = f"import sys\nchunk = ('x' * 1023 + '\\n') * {CHUNK // 1024}\nfor _ in range({TOTAL // CHUNK}):\n    sys.stdout.write(chunk)\n"
MIB = 1024 * 1024

MEASURES = [
    Measure("stdout_memory", "50 MB of stdout through a session: host peak memory above start", "MiB",
            "Peak VmRSS during `AsyncSandbox.run` minus VmRSS just before it (worst round): of the session's "
            "process, and summed over its child processes (the local kernel; the launcher)."),
    Measure("stdout_throughput", "50 MB of stdout through a session: throughput", "MiB/s",
            "50 MiB ÷ wall time of the run (median round).", lower_is_better=False),
]


class PeakRss:
    """Samples VmRSS of this process and, separately, the sum over its descendants."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.me = psutil.Process()
        self.start_self = self.me.memory_info().rss
        self.start_children = self._children()
        self.peak_self, self.peak_children = self.start_self, self.start_children
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _children(self) -> int:
        total = 0
        for child in self.me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_self = max(self.peak_self, self.me.memory_info().rss)
            self.peak_children = max(self.peak_children, self._children())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def through(sb: AsyncSandbox) -> tuple[float, float, float]:
    """Run the 50 MiB cell; return (seconds, MiB above start for this process, for its children)."""
    with PeakRss() as rss:
        started = time.perf_counter()
        execution = await sb.run(CODE, timeout=600)
        elapsed = time.perf_counter() - started
    seen = len("".join(execution.stdout).encode()) + execution.truncated_bytes
    if execution.error or seen < TOTAL:
        raise RuntimeError(f"the 50 MiB did not all arrive ({seen} bytes seen, error {execution.error})")
    return elapsed, (rss.peak_self - rss.start_self) / MIB, (rss.peak_children - rss.start_children) / MIB


async def rows(rounds: int) -> list[Row]:
    """Local kernel and Docker kernel in turn, ``rounds`` times each; the rows of both measures."""
    samples: dict[str, list[tuple[float, float, float]]] = {"local": [], "docker": []}
    async with AsyncSandbox("local") as local, AsyncSandbox() as docker:
        sandboxes = {"local": local, "docker": docker}
        for _ in range(rounds):
            for name, sb in sandboxes.items():
                samples[name].append(await through(sb))
    out: list[Row] = []
    labels = {"local": ("local kernel, same API (floor)", "floor"), "docker": ("Docker kernel (ours)", "ours")}
    children_are = {"local": "the local kernel itself", "docker": "the launcher, when the provisioner runs one"}
    for name, (label, kind) in labels.items():
        times = [s[0] for s in samples[name]]
        goal = {"goal_max": 64.0, "goal": "≤ 64 MiB"} if kind == "ours" else {}
        out.append(Row("stdout_memory", f"{label}: session process", kind, max(s[1] for s in samples[name]),
                       stat="worst", n=len(times), note="the process that runs AsyncSandbox", **goal))
        out.append(Row("stdout_memory", f"{label}: its child processes", kind, max(s[2] for s in samples[name]),
                       stat="worst", n=len(times), note=children_are[name], **goal))
        out.append(Row("stdout_throughput", label, kind, TOTAL / MIB / statistics.median(times), n=len(times),
                       reference=None if kind == "floor" else labels["local"][0],
                       note=f"{statistics.median(times):.2f} s per 50 MiB"))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    warnings.simplefilter("ignore")
    print(markdown(MEASURES, judge(asyncio.run(rows(parser.parse_args().rounds)))))
