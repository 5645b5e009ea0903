"""Kernels per second against the published OpenSandbox server on this machine (issue 28 item 5).

Starts ``opensandbox-server`` 1.1.1 with its Docker runtime on 127.0.0.1 through the test harness
(tests/opensandbox/server/: its own virtualenv, local stand-in images; the execd stand-in runs a
real ipykernel in each sandbox), then starts kernels of the OpenSandbox kernelspec (execd mode)
through jupyter_client: ``--kernels`` at once, and ``--sequential`` one after another. A kernel
counts once it answered ``kernel_info`` and ran a cell; shutdown (the sandbox's delete) is timed
apart.

Run: python bench/bench_opensandbox_scale.py [--kernels 16] [--sequential 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "opensandbox" / "server"))

from local_server import LocalServer  # noqa: E402
from prepare import prepare  # noqa: E402

from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC, started_client  # noqa: E402

SPEC_DIR = ROOT / "kernelspecs" / OPENSANDBOX_SPEC


def kernelspec(directory: Path, server: LocalServer, image: str) -> None:
    target = directory / "kernels" / OPENSANDBOX_SPEC
    shutil.copytree(SPEC_DIR, target, dirs_exist_ok=True)
    spec = json.loads((target / "kernel.json").read_text())
    spec["metadata"]["kernel_provisioner"]["config"] = {
        "api_base": server.api_base, "image": image, "entrypoint": ["sleep", "infinity"], "mode": "execd",
        "metadata": dict(server.run_label), "resource_limits": {"cpu": "1", "memory": "512Mi"},
        "poll_interval": 0.2, "ready_timeout": 600.0, "state_check_interval": 5.0,
    }
    (target / "kernel.json").write_text(json.dumps(spec))


async def one() -> tuple[float, float]:
    """Start a kernel, run a cell; (seconds to that, seconds to shut it down)."""
    began = time.perf_counter()
    km = AsyncKernelManager(kernel_name=OPENSANDBOX_SPEC)
    async with started_client(km, timeout=600) as kc:
        reply = await kc.execute_interactive("6 * 7", timeout=300)
        assert reply["content"]["status"] == "ok", reply["content"]
        ready = time.perf_counter() - began
        stop = time.perf_counter()
    return ready, time.perf_counter() - stop


async def measure(kernels: int, sequential: int) -> dict[str, Any]:
    prepared = prepare()
    work = Path(tempfile.mkdtemp(prefix="bench-osb-"))
    server = LocalServer(prepared, work).start()
    os.environ["OPEN_SANDBOX_API_KEY"] = server.api_key
    os.environ["JUPYTER_PATH"] = str(work / "jupyter")
    kernelspec(work / "jupyter", server, prepared.sandbox_image)
    try:
        await one()  # the server's first sandbox copies execd out of its image: not timed
        serial = []
        for _ in range(sequential):
            serial.append(await one())
        began = time.perf_counter()
        results = await asyncio.gather(*(one() for _ in range(kernels)), return_exceptions=True)
        wall = time.perf_counter() - began
    finally:
        leftovers = server.stop()
        shutil.rmtree(work, ignore_errors=True)
    together = [r for r in results if not isinstance(r, BaseException)]
    failures = [r for r in results if isinstance(r, BaseException)]
    return {"kernels": kernels, "wall": wall, "together": together, "failures": failures, "serial": serial,
            "leftovers": leftovers, "load": os.getloadavg()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", type=int, default=16)
    parser.add_argument("--sequential", type=int, default=4)
    args = parser.parse_args()
    found = asyncio.run(measure(args.kernels, args.sequential))
    serial_ready = [ready for ready, _ in found["serial"]]
    ready = [ready for ready, _ in found["together"]]
    print(f"load average after: {found['load'][0]:.1f} (1 min), {os.cpu_count()} cores")
    if serial_ready:
        p50 = statistics.median(serial_ready)
        print(f"one at a time: start + a cell p50 {p50:.2f} s -> {1 / p50:.2f} kernels/s; "
              f"shutdown p50 {statistics.median(s for _, s in found['serial']):.2f} s")
    if ready:
        print(f"{found['kernels']} at once: {len(ready)} ran a cell, all done after {found['wall']:.1f} s -> "
              f"{len(ready) / found['wall']:.2f} kernels/s; per kernel p50 {statistics.median(ready):.1f} s, "
              f"max {max(ready):.1f} s")
    for failure in found["failures"][:3]:
        print(f"failed: {failure!r}"[:400])
    if found["leftovers"]:
        print(f"LEFT BEHIND: {found['leftovers']}")
    return 1 if found["leftovers"] or found["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
