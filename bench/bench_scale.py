"""Many sandboxed kernels at once: do all start, are they isolated, what does each cost in memory?

Run: python bench/bench_scale.py [--kernels 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.docker.connect import docker_client
from kernel_sandbox.kernelspecs import DOCKER_SPEC, kernel_manager, shipped_spec
from report import Row


KERNELS = 32
ISOLATION_PROBE = "import os, socket; print(socket.gethostname(), sorted(os.listdir('/sys/class/net')), os.getuid())"


async def start(km: AsyncKernelManager) -> float:
    began = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=300)
    kc.stop_channels()
    return time.perf_counter() - began


async def probe(km: AsyncKernelManager, secret: str) -> str:
    kc = km.client()
    kc.start_channels()
    lines: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            lines.append(msg["content"]["text"])

    await kc.execute_interactive(f"{ISOLATION_PROBE}\nprint('secret' in globals())\nsecret = {secret!r}", output_hook=hook, timeout=120)
    kc.stop_channels()
    return "".join(lines)


def is_isolated(out: str) -> bool:
    """The probe saw hostname ``sandbox``, only ``lo``, a uid other than root's, and no other kernel's state."""
    lines = out.split("\n")
    seen, _, uid = lines[0].rpartition(" ")
    return seen == "sandbox ['lo']" and uid.isdigit() and int(uid) != 0 and lines[1:2] == ["False"]


def host_mib(pids: list[int | None]) -> list[float]:
    """Unique memory (USS) of each kernel's process on the host (its launcher), in MiB."""
    usage = []
    for pid in pids:
        try:
            usage.append(psutil.Process(pid).memory_full_info().uss / 2**20)
        except (psutil.Error, TypeError, ValueError):
            continue
    return usage


def memory_mib(container_ids: list[str]) -> list[float]:
    client = docker_client()
    usage = []
    for cid in container_ids:
        stats = client.containers.get(cid).stats(stream=False)
        mem = stats["memory_stats"]
        cache = mem.get("stats", {}).get("cache", 0) or mem.get("stats", {}).get("inactive_file", 0)
        usage.append((mem["usage"] - cache) / 2**20)
    return usage


async def measure(n: int) -> dict[str, Any]:
    """Start ``n`` kernels at once, probe isolation and memory; return what was found."""
    managers = [kernel_manager(DOCKER_SPEC, spec=shipped_spec(DOCKER_SPEC)) for _ in range(n)]
    began = time.perf_counter()
    results = await asyncio.gather(*(start(km) for km in managers), return_exceptions=True)
    wall = time.perf_counter() - began
    started = [km for km, r in zip(managers, results) if not isinstance(r, BaseException)]
    failures = [r for r in results if isinstance(r, BaseException)]
    isolated, mem, host = 0, [], []
    try:
        outputs = await asyncio.gather(*(probe(km, f"kernel-{i}") for i, km in enumerate(started)))
        isolated = sum(is_isolated(out) for out in outputs)
        mem = memory_mib([km.provisioner.container_id for km in started])
        host = host_mib([getattr(km.provisioner, "pid", None) for km in started])
    finally:
        await asyncio.gather(*(km.shutdown_kernel(now=True) for km in started))
    times = [r for r in results if isinstance(r, float)]
    return {"n": n, "started": len(started), "wall": wall, "times": times, "isolated": isolated, "mem": mem, "host": host, "failures": failures}


def rows(found: dict[str, Any]) -> list[Row]:
    """The scale measures as report rows (for bench/run.py)."""
    n, times, mem = found["n"], found["times"], found["mem"]
    why = f"not available: {found['failures'][0]!r}"[:300] if found["failures"] else "not available: no kernel started"
    return [
        Row("scale_count", "kernels started", "ours", found["started"], stat="count", goal_min=n, goal=f"all {n}",
            note=f"{len(found['failures'])} failed, the first: {found['failures'][0]!r}"[:300] if found["failures"] else ""),
        Row("scale_count", "kernels isolated (hostname, only lo, not root, no shared state)", "ours", found["isolated"],
            stat="count", goal_min=n, goal=f"all {n}"),
        Row("scale_time", "wall time until all answered kernel_info", "ours", found["wall"], stat="wall", n=n),
        Row("scale_time", "start to kernel_info, per kernel", "ours", statistics.median(times) if times else None,
            n=len(times), note=f"max {max(times):.1f} s" if times else why),
        Row("scale_memory", "memory per kernel (container, without page cache)", "ours", statistics.mean(mem) if mem else None,
            stat="mean", n=len(mem), note=f"max {max(mem):.1f} MiB, total {sum(mem):.0f} MiB" if mem else why),
        Row("scale_memory", "host process per kernel (the launcher, unique memory)", "ours",
            statistics.mean(found["host"]) if found["host"] else None, stat="mean", n=len(found["host"]),
            note=f"max {max(found['host']):.1f} MiB" if found["host"] else "not available: no kernel process on the host"),
    ]


async def main(n: int) -> int:
    """Start ``n`` kernels at once, probe isolation and memory, print the results; 0 when all passed."""
    found = await measure(n)
    started, times, mem, failures, isolated = found["started"], found["times"], found["mem"], found["failures"], found["isolated"]
    print(f"kernels started        {started}/{n}  (wall {found['wall']:.1f} s for all)")
    if times:
        print(f"start to kernel_info   p50 {statistics.median(times):.2f} s, max {max(times):.2f} s")
    print(f"isolated (no network, no shared state, non-root)  {isolated}/{started}")
    if mem:
        print(f"memory per kernel      mean {statistics.mean(mem):.1f} MiB, max {max(mem):.1f} MiB, total {sum(mem):.0f} MiB")
    if found["host"]:
        print(f"host process per kernel  mean {statistics.mean(found['host']):.1f} MiB unique (the launcher)")
    for failure in failures[:3]:
        print(f"failure: {failure!r}")
    return 0 if not failures and isolated == started else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernels", type=int, default=KERNELS)
    sys.exit(asyncio.run(main(parser.parse_args().kernels)))
