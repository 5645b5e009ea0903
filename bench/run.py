"""Run every benchmark in one go and write the report: ``python bench/run.py [--quick]``.

Ours beside the floor (a local ipykernel) and the peers (plain ``docker run``, llm-sandbox, a fresh
interpreter per tool call), each measure timed in interleaved rounds. Writes bench/results/
bench.md, bench.json and bench.png and prints the table. Needs the Docker engine and the kernel
image; llm-sandbox goes into bench/.venv-peers on first use. ``--quick`` lowers rounds and
kernels for a smoke run whose numbers are not worth quoting. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import bench_checkpoint
import bench_egress
import bench_execution
import bench_frames
import bench_mcp
import bench_metrics
import bench_output
import bench_peers
import bench_policy
import bench_relay
import bench_scale
import bench_secrets
import bench_sleep
from report import Measure, Row, markdown, unavailable, write

RESULTS = Path(__file__).resolve().parent / "results"
ROUNDS = {  # quick, full
    "cold": (2, 10), "execute": (20, 200), "tools": (5, 50), "api": (10, 100),
    "output": (1, 3), "relay": (20, 200), "scale": (4, bench_scale.KERNELS), "policy": (30, 300),
    "egress": (10, bench_egress.ROUNDS), "secrets": (10, bench_secrets.ROUNDS),
    "metrics": (20, 300), "checkpoint": (1, bench_checkpoint.ROUNDS), "frames": (50, bench_frames.OUTPUTS),
    "mcp": (10, bench_mcp.ROUNDS), "sleep": (1, bench_sleep.ROUNDS), "fleet": (8, bench_sleep.FLEET),
}
MEASURES = [
    *bench_peers.MEASURES,
    Measure("pool", "Kernel from a warm pool", "ms", "`AsyncSandboxPool.acquire()` when a kernel is ready."),
    *bench_output.MEASURES,
    Measure("relay", "OpenSandbox through the launcher vs the sandbox's endpoints called directly (execute `1`)", "ms",
            "Protocol-faithful fake lifecycle server and execd on 127.0.0.1 in a process of their own, a real "
            "ipykernel behind execd and a real Jupyter server behind its proxy; see bench_relay.py. The relay's "
            "cost is (a) − (b) in execd mode and (w) − (d) in websocket mode."),
    Measure("scale_count", "Many Docker kernels at once: how many", "kernels", lower_is_better=False),
    Measure("scale_time", "Many Docker kernels at once: time", "s"),
    Measure("scale_memory", "Many Docker kernels at once: memory", "MiB"),
    Measure("policy", "Strict output policy: cost per kernel→client message", "µs",
            "What the relay pays per message because of the policy (JSON parse/serialize included when it "
            "inspects); real messages of a local ipykernel.", log=True),
    Measure("egress", "Egress proxy: a 1 MiB download through it vs direct on the host", "ms",
            "A local HTTP server on 127.0.0.1; the launcher's proxy code in process, the name resolved by a stub; "
            "each download on new connections, interleaved (bench_egress.py)."),
    *bench_secrets.MEASURES,
    *bench_metrics.MEASURES,
    *bench_checkpoint.MEASURES,
    *bench_frames.MEASURES,
    *bench_mcp.MEASURES,
    *bench_sleep.MEASURES,
]


def load() -> str:
    """The load averages and how many containers run, as one line."""
    one, five, fifteen = os.getloadavg()
    running = subprocess.run(["docker", "ps", "-q"], capture_output=True, text=True, check=False).stdout.split()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}, {len(running)} containers running"


def engine() -> str:
    out = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or out.stderr.strip()[:200]


async def section(name: str, keys: list[str], produce: Callable[[], Awaitable[list[Row]]]) -> list[Row]:
    """Run one benchmark; if it fails, rows for its measures say so instead."""
    print(f"== {name}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        rows = await produce()
    except Exception as exc:
        traceback.print_exc()
        why = f"{name} failed: {type(exc).__name__}: {str(exc)[:300]}"
        rows = [unavailable(key, name, "ours", why) for key in keys]
    print(f"   {name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return rows


async def measure_all(quick: bool, only: set[str] | None) -> list[Row]:
    """Every benchmark in turn; their rows in report order."""
    pick = {name: rounds[0 if quick else 1] for name, rounds in ROUNDS.items()}
    plan: list[tuple[str, list[str], Callable[[], Awaitable[list[Row]]]]] = [
        ("peers", ["cold_start", "execute", "tool_1kb", "tool_1mb"],
         lambda: bench_peers.measure(pick["cold"], pick["execute"], pick["tools"])),
        ("start", ["cold_start"], lambda: _start(pick["cold"])),
        ("api", ["pool"], lambda: bench_execution.rows(pick["api"])),
        ("output", ["stdout_memory", "stdout_throughput"], lambda: bench_output.rows(pick["output"])),
        ("relay", ["relay"], lambda: _relay(pick["relay"])),
        ("scale", ["scale_count", "scale_time", "scale_memory"], lambda: _scale(pick["scale"])),
        ("policy", ["policy"], lambda: asyncio.to_thread(lambda: bench_policy.rows(bench_policy.measure(pick["policy"])))),
        ("egress", ["egress"], lambda: _egress(pick["egress"])),
        ("secrets", ["secrets"], lambda: _secrets(pick["secrets"])),
        ("metrics", ["metrics"], lambda: _metrics(pick["metrics"])),
        ("checkpoint", ["checkpoint"], lambda: _checkpoint(pick["checkpoint"])),
        ("frames", ["frames_memory"], lambda: asyncio.to_thread(bench_frames.rows, pick["frames"])),
        ("mcp", ["mcp"], lambda: _mcp(pick["mcp"])),
        ("sleep", ["sleep_memory", "sleep_wake"], lambda: _sleep(pick["sleep"])),
        ("fleet", ["sleep_fleet"], lambda: _fleet(pick["fleet"])),
    ]
    selected = only if only is not None else {name for name, _, _ in plan} - {"start"}  # `peers` has the starts
    rows: list[Row] = []
    for name, keys, produce in plan:
        if name in selected:
            rows += await section(name, keys, produce)
    return rows


async def _start(rounds: int) -> list[Row]:
    launcher, why = bench_peers.Launcher.find()
    return await bench_peers.cold_start_rows(rounds, launcher, why)


async def _relay(rounds: int) -> list[Row]:
    return bench_relay.rows(await bench_relay.measure(rounds), rounds)


async def _egress(rounds: int) -> list[Row]:
    return bench_egress.rows(await bench_egress.measure(rounds))


async def _secrets(rounds: int) -> list[Row]:
    return bench_secrets.rows(await bench_secrets.measure(rounds))


async def _metrics(rounds: int) -> list[Row]:
    return bench_metrics.rows(await bench_metrics.measure(rounds))


async def _checkpoint(rounds: int) -> list[Row]:
    return bench_checkpoint.rows(await bench_checkpoint.measure(rounds))


async def _sleep(rounds: int) -> list[Row]:
    return bench_sleep.rows(await bench_sleep.measure(rounds))


async def _fleet(kernels: int) -> list[Row]:
    return bench_sleep.fleet_rows(await bench_sleep.measure_fleet(kernels))


async def _mcp(rounds: int) -> list[Row]:
    return bench_mcp.rows(await bench_mcp.measure(rounds))


async def _scale(kernels: int) -> list[Row]:
    return bench_scale.rows(await bench_scale.measure(kernels))


def main() -> int:
    """Measure everything, write bench/results/bench.{md,json,png}, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds and kernels: a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the report (default bench/results)")
    parser.add_argument("--only", nargs="+", choices=["peers", "start", "api", "output", "relay", "scale", "policy", "egress", "secrets",
                                                      "metrics", "checkpoint", "frames", "mcp", "sleep", "fleet"],
                        help="run only these parts (the report then holds only their rows); `start`: the cold "
                             "starts and the warm standby alone (`peers` includes them)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    atexit.register(bench_peers.remove_leftovers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "mode": "quick (smoke run, not worth quoting)" if args.quick else "full",
        "machine": f"{os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}, Docker {engine()}",
        "before": load(),
    }
    print(f"{meta['date']}: {meta['before']}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        rows = asyncio.run(measure_all(args.quick, set(args.only) if args.only else None))
    finally:
        left = bench_peers.remove_leftovers()
        if left:
            print(f"removed {left} leftover peer container(s) of this run", file=sys.stderr)
    meta["after"] = load()
    meta["duration"] = f"{time.perf_counter() - started:.0f} s"
    paths = write(MEASURES, rows, args.out, meta)
    print(markdown(MEASURES, rows, "\n".join(f"- {key}: {value}" for key, value in meta.items())))
    print("\n".join(f"wrote {path}" for path in paths.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
