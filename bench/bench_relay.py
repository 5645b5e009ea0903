"""Relay overhead per execute: the OpenSandbox relay kernel vs the same execd called directly.

Run: ``python bench/bench_relay.py [--rounds N]`` (no Docker needed). The protocol-faithful fake
lifecycle server and execd of tests/opensandbox serve on 127.0.0.1; behind execd is a real
ipykernel. Side by side, interleaved round by round: (a) a trivial execute through
jupyter_client and the ``sandboxed-python-opensandbox`` kernelspec (relay kernel -> execd),
(b) the same code in the same execd context with ``ExecdClient.run``, (c) a local ipykernel
as the floor. The relay's overhead is (a) - (b); DESIGN.md §7 asks for at most 2 ms. An empty
execute, which the relay answers without calling execd, shows the cost of the Jupyter message
cycle alone, on the relay and on a local ipykernel.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from bench_execution import print_table
from bench_scale import ShippedSpecs
from report import Row
from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC
from kernel_sandbox.opensandbox import ExecdClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "opensandbox"))
from opensandbox_fakes import FakeOpenSandbox  # noqa: E402

ROUNDS = 200
CODE = "1"


async def execute(kc: Any, code: str) -> None:
    """Execute ``code`` and wait for both its idle status and its execute reply."""
    msg_id = kc.execute(code)
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "idle":
            break
    while (await kc.get_shell_msg(timeout=60))["parent_header"].get("msg_id") != msg_id:
        pass


async def interleaved_medians(rounds: int, actions: dict[str, Callable[[], Awaitable[Any]]]) -> dict[str, float]:
    """Median milliseconds of each action, timed in turn within every round, after one warm-up each."""
    times: dict[str, list[float]] = {name: [] for name in actions}
    for action in actions.values():
        await action()
    for _ in range(rounds):
        for name, action in actions.items():
            started = time.perf_counter()
            await action()
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


async def started(km: AsyncKernelManager) -> Any:
    """Start ``km``'s kernel and return a client whose channels are ready."""
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return kc


async def measure(rounds: int) -> dict[str, float]:
    """Median milliseconds of each path: relay, execd, local, relay empty, local empty."""
    fake = FakeOpenSandbox().start()
    config = Config(
        {
            "OpenSandboxProvisioner": {
                "api_base": fake.api_base,
                "api_key": fake.lifecycle.api_key,
                "poll_interval": 0.05,
            }
        }
    )
    relay_km = AsyncKernelManager(kernel_name=OPENSANDBOX_SPEC, kernel_spec_manager=ShippedSpecs(), config=config)
    local_km = AsyncKernelManager(kernel_name="python3")
    try:
        relay_kc = await started(relay_km)
        local_kc = await started(local_km)
        endpoint, context_id = relay_km.provisioner.endpoint, relay_km.provisioner.context_id
        async with ExecdClient(endpoint.url, endpoint.headers) as execd:
            medians = await interleaved_medians(
                rounds,
                {
                    "relay": lambda: execute(relay_kc, CODE),
                    "execd": lambda: execd.run(CODE, context_id=context_id),
                    "local": lambda: execute(local_kc, CODE),
                    "relay empty": lambda: execute(relay_kc, ""),
                    "local empty": lambda: execute(local_kc, ""),
                },
            )
        relay_kc.stop_channels()
        local_kc.stop_channels()
    finally:
        await asyncio.gather(*(km.shutdown_kernel(now=True) for km in (relay_km, local_km) if km.has_kernel))
        fake.stop()
    return medians


def rows(medians: dict[str, float], rounds: int) -> list[Row]:
    """The relay measure as report rows (for bench/run.py)."""
    m, n = "relay", rounds
    return [
        Row(m, "local ipykernel (floor)", "floor", medians["local"], n=n),
        Row(m, "(b) execd called directly (ExecdClient.run)", "ours", medians["execd"], n=n, reference="local ipykernel (floor)"),
        Row(m, "(a) relay kernel -> execd", "ours", medians["relay"], n=n, reference="(b) execd called directly (ExecdClient.run)"),
        Row(m, "relay overhead (a) - (b)", "ours", medians["relay"] - medians["execd"], stat="difference of p50s",
            goal_max=2.0, goal="≤ 2 ms"),
        Row(m, "empty execute, local ipykernel", "floor", medians["local empty"], n=n),
        Row(m, "empty execute, relay (skips execd)", "ours", medians["relay empty"], n=n,
            reference="empty execute, local ipykernel"),
    ]


async def main(rounds: int) -> None:
    """Measure the three execute paths side by side and print the table."""
    medians = await measure(rounds)
    relay, direct, local = medians["relay"], medians["execd"], medians["local"]
    relay_empty, local_empty = medians["relay empty"], medians["local empty"]
    print_table(
        [
            (f"execute {CODE!r}: relay kernel (a) vs execd (b)", f"{direct:.2f} ms execd direct",
             f"{relay:.2f} ms relay", f"{relay - direct:+.2f} ms overhead a-b (goal <= 2 ms)"),
            (f"execute {CODE!r}: execd (b) vs local (c)", f"{local:.2f} ms local ipykernel",
             f"{direct:.2f} ms execd direct", f"{direct / local:.2f}x local"),
            (f"execute {CODE!r}: relay kernel (a) vs local (c)", f"{local:.2f} ms local ipykernel",
             f"{relay:.2f} ms relay", f"{relay / local:.2f}x local"),
            ("empty execute (relay skips execd)", f"{local_empty:.2f} ms local ipykernel",
             f"{relay_empty:.2f} ms relay", f"{relay_empty / local_empty:.2f}x local"),
        ]
    )

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="measured executes per path")
    warnings.simplefilter("ignore")
    asyncio.run(main(parser.parse_args().rounds))
