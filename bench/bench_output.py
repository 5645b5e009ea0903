"""50 MB of stdout through a session: the host processes' peak memory above their start, and throughput.

Run: ``python bench/bench_output.py [--rounds N]``. The cell writes 50 MiB to stdout in 8 KiB
writes. ``AsyncSandbox.run`` keeps its default 4 MiB of it and counts the rest as truncated, so
the whole 50 MiB must cross the host. Resident memory (VmRSS) of this process, and summed over
its child processes (the local kernel; the launcher), is sampled every 5 ms during the run;
"above start" is the peak minus the value just before the cell. Three paths take turns: a
local kernel through the same API (the floor), the Docker kernel through ``AsyncSandbox`` (ours,
issue 13 item 4), and the Sandboxed Python kernelspec read by a bare jupyter_client, as a
Jupyter server reads it (no session helper in the kernel). Nothing asserts on time or memory.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import psutil

from report import Measure, Row, judge, markdown
from kernel_sandbox.execution import AsyncSandbox
from kernel_sandbox.execution.adapters import kernel_spec
from kernel_sandbox.execution.backend import kernel_manager
from kernel_sandbox.kernelspecs import started_client

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


async def through(run: Callable[[], Awaitable[int]]) -> tuple[float, float, float]:
    """Run the 50 MiB cell; return (seconds, MiB above start for this process, for its children)."""
    with PeakRss() as rss:
        started = time.perf_counter()
        seen = await run()
        elapsed = time.perf_counter() - started
    if seen < TOTAL:
        raise RuntimeError(f"the 50 MiB did not all arrive ({seen} bytes seen)")
    return elapsed, (rss.peak_self - rss.start_self) / MIB, (rss.peak_children - rss.start_children) / MIB


async def session_run(sb: AsyncSandbox) -> int:
    """The cell through ``AsyncSandbox.run``; the bytes of stdout that reached the host."""
    execution = await sb.run(CODE, timeout=600)
    if execution.error:
        raise RuntimeError(f"the cell failed: {execution.error}")
    return len("".join(execution.stdout).encode()) + execution.truncated_bytes


async def client_run(kc: Any) -> int:
    """The cell through a bare jupyter_client, reading every iopub message as JupyterLab's server does."""
    msg_id, seen = kc.execute(CODE), 0
    while True:
        msg = await kc.get_iopub_msg(timeout=600)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            seen += len(msg["content"]["text"].encode())
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return seen


async def rows(rounds: int) -> list[Row]:
    """The three paths in turn, ``rounds`` times each; the rows of both measures."""
    samples: dict[str, list[tuple[float, float, float]]] = {"local": [], "docker": [], "client": []}
    km = kernel_manager(kernel_spec("docker", {}))
    async with AsyncSandbox("local") as local, AsyncSandbox() as docker:
        async with started_client(km) as kc:
            runs = {"local": lambda: session_run(local), "docker": lambda: session_run(docker), "client": lambda: client_run(kc)}
            for _ in range(rounds):
                for name, run in runs.items():
                    samples[name].append(await through(run))
    out: list[Row] = []
    labels = {
        "local": ("local kernel, same API (floor)", "floor", "the local kernel itself"),
        "docker": ("Docker kernel (ours)", "ours", "the launcher"),
        "client": ("Sandboxed Python kernelspec, bare jupyter_client (ours)", "ours", "the launcher"),
    }
    for name, (label, kind, children_are) in labels.items():
        times = [s[0] for s in samples[name]]
        goal = {"goal_max": 64.0, "goal": "≤ 64 MiB"} if name == "docker" else {}
        about = "the process that runs AsyncSandbox" if name != "client" else (
            "like a Jupyter server (no goal: item 4 is about sessions, which flush output by size)")
        out.append(Row("stdout_memory", f"{label}: client process", kind, max(s[1] for s in samples[name]),
                       stat="worst", n=len(times), note=about, **goal))
        out.append(Row("stdout_memory", f"{label}: its child processes", kind, max(s[2] for s in samples[name]),
                       stat="worst", n=len(times), note=children_are, **goal))
        out.append(Row("stdout_throughput", label, kind, TOTAL / MIB / statistics.median(times), n=len(times),
                       reference=None if kind == "floor" else labels["local"][0],
                       note=f"{statistics.median(times):.2f} s per 50 MiB"))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    warnings.simplefilter("ignore")
    print(markdown(MEASURES, judge(asyncio.run(rows(parser.parse_args().rounds)))))
