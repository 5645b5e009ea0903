"""Relay overhead per execute: the launcher's two OpenSandbox modes vs the same sandbox endpoints called directly.

Run: ``python bench/bench_relay.py [--rounds N]`` (no Docker needed). The protocol-faithful fake
lifecycle server and execd of tests/opensandbox serve on 127.0.0.1 from a process of their own
(as execd runs apart from its clients); behind execd is a real ipykernel, and each fake sandbox
runs a real jupyter_server (reached through execd's ``/proxy/<port>/``, as the code-interpreter
image is). Side by side, interleaved round by round:

* (a) ``1`` executed through jupyter_client and the ``sandboxed-python-opensandbox`` kernelspec in
  execd mode (client -> launcher's execd relay -> execd), (b) the same code in an execd context
  of the same execd with ``ExecdClient.run``: the execd relay's overhead is (a) - (b);
* (w) the kernelspec in websocket mode (client -> launcher -> execd's proxy -> the Jupyter
  server's kernel websocket), (d) the same execute sent over the same proxy straight to a kernel
  of a Jupyter server of the same kind: the bridge's overhead is (w) - (d);
* (c) a local ipykernel as the floor, and an empty execute, which the execd relay answers
  without calling execd (the cost of one Jupyter message cycle through the launcher).

Issue 13 asks for at most 2 ms over the direct call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench_execution import print_table
from report import Row
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session
from traitlets.config import Config

from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC, kernel_manager, shipped_spec, started_client
from kernel_sandbox.opensandbox import ExecdClient
from kernel_sandbox.opensandbox.jupyter import JupyterServer, KernelSocket

FAKES = Path(__file__).resolve().parents[1] / "tests"
ROUNDS = 200
CODE = "1"
SERVE_FAKES = f"""
import json, logging, secrets, sys
sys.path.insert(0, {str(FAKES)!r})
from support.opensandbox_fakes import FakeOpenSandbox, start_jupyter
logging.disable(logging.ERROR)  # the proxy logs every 502 while a Jupyter server starts
fake = FakeOpenSandbox(jupyter=True).start()
token = secrets.token_hex(16)
jupyter, port = start_jupyter(token)
print(json.dumps(dict(api_base=fake.api_base, api_key=fake.lifecycle.api_key, execd_url=fake.execd_url,
                      execd_token=fake.execd.token, jupyter=fake.execd_url.replace("/44772", f"/{{port}}"),
                      jupyter_token=token)), flush=True)
try:
    sys.stdin.read()
finally:
    jupyter.terminate()
    fake.stop()
"""


class Fakes:
    """The fake lifecycle server and execd in a process of their own, and one more Jupyter server behind its proxy."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE_FAKES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.info = json.loads(self.process.stdout.readline())

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(60)


async def execute(kc: Any, code: str) -> None:
    """Execute ``code`` and wait for both its idle status and its execute reply."""
    msg_id = kc.execute(code)
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "idle":
            break
    while (await kc.get_shell_msg(timeout=60))["parent_header"].get("msg_id") != msg_id:
        pass


class DirectWebsocket:
    """A client of a kernel of the sandbox's Jupyter server over its websocket, with no launcher between."""

    def __init__(self) -> None:
        self.session = Session(key=b"")
        self.socket: KernelSocket | None = None
        self._waiting: dict[str, tuple[asyncio.Future[None], asyncio.Future[None]]] = {}

    async def open(self, jupyter: JupyterServer) -> None:
        kernel_id = await jupyter.start_kernel("python3")
        self.socket = await jupyter.connect(
            kernel_id, self.session.session, self._received, lambda reason: None, max_message_size=2**24
        )
        await self.execute("1")

    def _received(self, channel: str, parts: list[bytes]) -> None:
        parent = self.session.unpack(parts[1]).get("msg_id", "")
        futures = self._waiting.get(parent)
        if futures is None:
            return
        header = self.session.unpack(parts[0])
        if channel == "shell" and header["msg_type"] == "execute_reply":
            futures[0].set_result(None)
        elif channel == "iopub" and header["msg_type"] == "status" and b'"idle"' in parts[3]:
            futures[1].set_result(None)

    async def execute(self, code: str) -> None:
        """Execute ``code`` and wait for both its idle status and its execute reply."""
        assert self.socket is not None
        msg = self.session.msg("execute_request", {"code": code, "silent": False})
        loop = asyncio.get_running_loop()
        futures = (loop.create_future(), loop.create_future())
        self._waiting[msg["header"]["msg_id"]] = futures
        parts = [self.session.pack(msg[key]) for key in ("header", "parent_header", "metadata", "content")]
        self.socket.send("shell", parts)
        await asyncio.wait_for(asyncio.gather(*futures), 60)
        del self._waiting[msg["header"]["msg_id"]]


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


def relay_manager(fakes: Fakes, mode: str) -> AsyncKernelManager:
    info = fakes.info
    options = {"api_base": info["api_base"], "api_key": info["api_key"], "poll_interval": 0.05, "mode": mode}
    config = Config({"OpenSandboxProvisioner": options})
    return kernel_manager(OPENSANDBOX_SPEC, spec=shipped_spec(OPENSANDBOX_SPEC), config=config)


async def measure(rounds: int) -> dict[str, float]:
    """Median milliseconds of each path: relay, execd, websocket, websocket direct, local, and two empty executes."""
    fakes = Fakes()
    info = fakes.info
    managers = (relay_manager(fakes, "execd"), relay_manager(fakes, "websocket"), AsyncKernelManager(kernel_name="python3"))
    direct = DirectWebsocket()
    jupyter = JupyterServer(info["jupyter"], info["jupyter_token"])
    try:
        async with contextlib.AsyncExitStack() as kernels:
            execd_kc, ws_kc, local_kc = [await kernels.enter_async_context(started_client(km)) for km in managers]
            await jupyter.wait_ready(120)
            await direct.open(jupyter)
            execd = await kernels.enter_async_context(
                ExecdClient(info["execd_url"], {"X-EXECD-ACCESS-TOKEN": info["execd_token"]}))
            context_id = await execd.create_context()
            medians = await interleaved_medians(
                rounds,
                {
                    "relay": lambda: execute(execd_kc, CODE),
                    "execd": lambda: execd.run(CODE, context_id=context_id),
                    "websocket": lambda: execute(ws_kc, CODE),
                    "websocket direct": lambda: direct.execute(CODE),
                    "local": lambda: execute(local_kc, CODE),
                    "relay empty": lambda: execute(execd_kc, ""),
                    "local empty": lambda: execute(local_kc, ""),
                },
            )
    finally:
        if direct.socket is not None:
            direct.socket.close()
        await jupyter.aclose()
        fakes.stop()
    return medians


def rows(medians: dict[str, float], rounds: int) -> list[Row]:
    """The relay measure as report rows (for bench/run.py)."""
    m, n, local, execd = "relay", rounds, "local ipykernel (floor)", "(b) execd called directly (ExecdClient.run)"
    direct = "(d) Jupyter server websocket called directly"
    return [
        Row(m, local, "floor", medians["local"], n=n),
        Row(m, execd, "ours", medians["execd"], n=n, reference=local),
        Row(m, "(a) launcher, execd mode -> execd", "ours", medians["relay"], n=n, reference=execd),
        Row(m, "execd relay overhead (a) - (b)", "ours", medians["relay"] - medians["execd"], stat="difference of p50s",
            goal_max=2.0, goal="≤ 2 ms"),
        Row(m, direct, "ours", medians["websocket direct"], n=n, reference=local),
        Row(m, "(w) launcher, websocket mode -> Jupyter server", "ours", medians["websocket"], n=n, reference=direct),
        Row(m, "websocket bridge overhead (w) - (d)", "ours", medians["websocket"] - medians["websocket direct"],
            stat="difference of p50s", goal_max=2.0, goal="≤ 2 ms"),
        Row(m, "empty execute, local ipykernel", "floor", medians["local empty"], n=n),
        Row(m, "empty execute, execd relay (skips execd)", "ours", medians["relay empty"], n=n,
            reference="empty execute, local ipykernel"),
    ]


async def main(rounds: int) -> None:
    """Measure the execute paths side by side and print the table, with the load average around the run."""
    before = os.getloadavg()
    medians = await measure(rounds)
    after = os.getloadavg()
    relay, direct, local = medians["relay"], medians["execd"], medians["local"]
    ws, ws_direct = medians["websocket"], medians["websocket direct"]
    relay_empty, local_empty = medians["relay empty"], medians["local empty"]
    print_table(
        [
            (f"execute {CODE!r}: execd relay (a) vs execd (b)", f"{direct:.2f} ms execd direct",
             f"{relay:.2f} ms relay", f"{relay - direct:+.2f} ms overhead a-b (goal <= 2 ms)"),
            (f"execute {CODE!r}: websocket bridge (w) vs direct (d)", f"{ws_direct:.2f} ms websocket direct",
             f"{ws:.2f} ms bridge", f"{ws - ws_direct:+.2f} ms overhead w-d (goal <= 2 ms)"),
            (f"execute {CODE!r}: websocket bridge (w) vs execd (b)", f"{direct:.2f} ms execd direct",
             f"{ws:.2f} ms bridge", f"{ws - direct:+.2f} ms w-b"),
            (f"execute {CODE!r}: execd (b) vs local (c)", f"{local:.2f} ms local ipykernel",
             f"{direct:.2f} ms execd direct", f"{direct / local:.2f}x local"),
            (f"execute {CODE!r}: execd relay (a) vs local (c)", f"{local:.2f} ms local ipykernel",
             f"{relay:.2f} ms relay", f"{relay / local:.2f}x local"),
            ("empty execute (the relay skips execd)", f"{local_empty:.2f} ms local ipykernel",
             f"{relay_empty:.2f} ms relay", f"{relay_empty / local_empty:.2f}x local"),
        ]
    )
    print(f"{rounds} rounds; load average before {' '.join(f'{x:.2f}' for x in before)}, "
          f"after {' '.join(f'{x:.2f}' for x in after)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="measured executes per path")
    warnings.simplefilter("ignore")
    asyncio.run(main(parser.parse_args().rounds))
