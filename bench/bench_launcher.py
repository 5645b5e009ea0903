"""The launcher's two paths side by side with a local ipykernel, in one run, as ratios.

Run: ``python bench/bench_launcher.py [--rounds N] [--runtime runsc] [--engine podman]`` (needs the
engine and the kernel image in its store). Three kernels answer the same trivial execute in turn in every round:
(a) the installed kernelspec's argv started by hand, as VS Code starts it (launcher, TCP),
(b) the same kernelspec through jupyter_client's provisioner path (launcher, IPC in a private
directory), (c) a local ipykernel. Cold start is timed the same way, a few times each.
Goals (issues 8 and 10): (b) ÷ (c) ≤ 1.05, (a) ÷ (b) ≤ 1.1, cold start ≤ 1.3× the
bind-mount channel this replaced (≈1.1 s here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from bench_execution import medians, print_table
from bench_peers import Launcher
from jupyter_client import AsyncKernelClient

from kernel_sandbox.execution.adapters import kernel_spec
from kernel_sandbox.execution.backend import kernel_manager
from kernel_sandbox.kernelspecs import install, started_client

ROUNDS = 200
COLD_STARTS = 3


def execute(client: AsyncKernelClient):
    async def action() -> None:
        reply = await client.execute_interactive("1", timeout=60, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"

    return action


async def cold_starts(argv: list[str], spec_dir: str, options: dict[str, Any]) -> dict[str, float]:
    """Median seconds from nothing to a kernel_info reply, each path in turn."""
    times: dict[str, list[float]] = {"argv": [], "provisioner": [], "local": []}
    for _ in range(COLD_STARTS):
        kernel = Launcher(spec_dir, argv)
        try:
            times["argv"].append(await kernel.start() / 1000)
        finally:
            await kernel.stop()
        for name, backend in (("provisioner", "docker"), ("local", "local")):
            started = time.perf_counter()
            async with started_client(kernel_manager(kernel_spec(backend, options if backend == "docker" else {"env": {}}))):
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


async def main(rounds: int = ROUNDS, runtime: str = "", engine: str = "") -> None:
    """Print the round-trip and cold-start tables."""
    options = {**({"runtime": runtime} if runtime else {}), **({"engine": engine} if engine else {})}
    with tempfile.TemporaryDirectory() as prefix:
        spec_dir = install("sandboxed-python", prefix=prefix, install_as="bench-launcher", config=options)
        argv = json.loads((Path(spec_dir) / "kernel.json").read_text())["argv"]
        argv_kernel = Launcher(spec_dir, argv)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(argv_kernel.stop)
            await argv_kernel.start()
            assert argv_kernel.kc is not None
            clients = [argv_kernel.kc]
            for backend, backend_options in (("docker", options), ("local", {"env": {}})):
                km = kernel_manager(kernel_spec(backend, backend_options))
                clients.append(await stack.enter_async_context(started_client(km)))
            argv_ms, provisioner_ms, local_ms = await medians(rounds, *(execute(client) for client in clients))
        cold = await cold_starts(argv, spec_dir, options)
    label = f" ({', '.join(filter(None, (engine, runtime)))})" if runtime or engine else ""
    print_table([
        (f"execute round trip, provisioner path{label}", "local ipykernel, ≤ 1.05×",
         f"{provisioner_ms:.2f} ms vs {local_ms:.2f} ms", f"{provisioner_ms / local_ms:.2f}×"),
        (f"execute round trip, argv path{label}", "provisioner path, ≤ 1.1×",
         f"{argv_ms:.2f} ms vs {provisioner_ms:.2f} ms", f"{argv_ms / provisioner_ms:.2f}×"),
        (f"cold start to kernel_info, provisioner path{label}", "local ipykernel",
         f"{cold['provisioner']:.2f} s vs {cold['local']:.2f} s", f"{cold['provisioner'] / cold['local']:.2f}×"),
        (f"cold start to kernel_info, argv path{label}", "provisioner path",
         f"{cold['argv']:.2f} s vs {cold['provisioner']:.2f} s", f"{cold['argv'] / cold['provisioner']:.2f}×"),
    ])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--runtime", default="", help="OCI runtime for the sandboxed kernels, e.g. runsc")
    parser.add_argument("--engine", default="", help="the sandboxed kernels' engine option, e.g. podman")
    arguments = parser.parse_args()
    warnings.simplefilter("ignore")
    asyncio.run(main(arguments.rounds, arguments.runtime, arguments.engine))
