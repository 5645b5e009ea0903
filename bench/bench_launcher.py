"""The launcher's two paths side by side with a local ipykernel, in one run, as ratios.

Run: ``python bench/bench_launcher.py [--rounds N] [--runtime runsc]`` (needs the Docker engine
and the kernel image). Three kernels answer the same trivial execute in turn in every round:
(a) the installed kernelspec's argv started by hand, as VS Code starts it (launcher, TCP),
(b) the same kernelspec through jupyter_client's provisioner path (launcher, IPC in a private
directory), (c) a local ipykernel. Cold start is timed the same way, a few times each.
Goals (DESIGN §7, issues 8 and 10): (b) ÷ (c) ≤ 1.05, (a) ÷ (b) ≤ 1.1, cold start ≤ 1.3× the
bind-mount channel this replaced (≈1.1 s here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from bench_execution import medians, print_table
from jupyter_client import AsyncKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.execution.backends import kernel_manager, kernel_spec
from kernel_sandbox.kernelspecs import install

ROUNDS = 200
COLD_STARTS = 3


class ArgvKernel:
    """A kernelspec's argv started by hand with a connection file, as a provisioner-unaware client does."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    async def start(self) -> AsyncKernelClient:
        self.connection_file, _ = write_connection_file()
        cmd = [part.replace("{connection_file}", self.connection_file) for part in self.argv]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = AsyncKernelClient(connection_file=self.connection_file)
        client.load_connection_file()
        client.start_channels()
        await client.wait_for_ready(timeout=120)
        return client

    def stop(self, client: AsyncKernelClient) -> None:
        client.stop_channels()
        self.process.terminate()
        self.process.wait(60)


async def started_manager(km: AsyncKernelManager) -> AsyncKernelClient:
    await km.start_kernel()
    client = km.client()
    client.start_channels()
    await client.wait_for_ready(timeout=120)
    return client


def execute(client: AsyncKernelClient):
    async def action() -> None:
        reply = await client.execute_interactive("1", timeout=60, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"

    return action


async def cold_starts(argv: list[str], options: dict[str, Any]) -> dict[str, float]:
    """Median seconds from nothing to a kernel_info reply, each path in turn."""
    times: dict[str, list[float]] = {"argv": [], "provisioner": [], "local": []}
    for _ in range(COLD_STARTS):
        started = time.perf_counter()
        kernel = ArgvKernel(argv)
        client = await kernel.start()
        times["argv"].append(time.perf_counter() - started)
        kernel.stop(client)
        for name, backend in (("provisioner", "docker"), ("local", "local")):
            km = kernel_manager(kernel_spec(backend, options if backend == "docker" else {"env": {}}))
            started = time.perf_counter()
            client = await started_manager(km)
            times[name].append(time.perf_counter() - started)
            client.stop_channels()
            await km.shutdown_kernel(now=True)
    return {name: statistics.median(values) for name, values in times.items()}


async def main(rounds: int = ROUNDS, runtime: str = "") -> None:
    """Print the round-trip and cold-start tables."""
    options = {"runtime": runtime} if runtime else {}
    with tempfile.TemporaryDirectory() as prefix:
        spec_dir = Path(install("sandboxed-python", prefix=prefix, install_as="bench-launcher", config=options))
        argv = json.loads((spec_dir / "kernel.json").read_text())["argv"]
        argv_kernel = ArgvKernel(argv)
        argv_client = await argv_kernel.start()
        sandboxed = kernel_manager(kernel_spec("docker", options))
        local = kernel_manager(kernel_spec("local", {"env": {}}))
        clients = [argv_client, await started_manager(sandboxed), await started_manager(local)]
        try:
            argv_ms, provisioner_ms, local_ms = await medians(rounds, *(execute(client) for client in clients))
        finally:
            argv_kernel.stop(clients[0])
            for client in clients[1:]:
                client.stop_channels()
            await asyncio.gather(sandboxed.shutdown_kernel(now=True), local.shutdown_kernel(now=True))
        cold = await cold_starts(argv, options)
    label = f" ({runtime})" if runtime else ""
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
    arguments = parser.parse_args()
    warnings.simplefilter("ignore")
    asyncio.run(main(arguments.rounds, arguments.runtime))
