"""What the attacker's tests share: host memory sampling, kernel requests, kernel-side tools, other accounts.

Memory is read from ``/proc/PID/status`` (``VmRSS``: the current resident size) by a sampler thread
while an attack runs, so the figures are the peaks the host really saw.
"""

from __future__ import annotations

import asyncio
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.kernelside.boot import PORTS
from support.host_memory import MiB, rss
from support.kernel import ArgvKernel


# ---- memory of host processes -------------------------------------------------------------------

class PeakRSS:
    """Sample the resident memory of some processes every few milliseconds; remember the peaks."""

    def __init__(self, **pids: int) -> None:
        self.pids = pids
        self.before = {name: rss(pid) or 0 for name, pid in pids.items()}
        self.peak = dict(self.before)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for name, pid in self.pids.items():
                value = rss(pid)
                if value is not None and value > self.peak[name]:
                    self.peak[name] = value

    def stop(self) -> PeakRSS:
        self._stop.set()
        self._thread.join()
        return self

    def growth(self, name: str) -> int:
        """Bytes the peak of ``name`` rose above its start."""
        return self.peak[name] - self.before[name]

    def figures(self) -> dict[str, float]:
        """MiB before and at the peak, for ``record_property``."""
        out: dict[str, float] = {}
        for name in self.pids:
            out[f"{name}_rss_before_mib"] = round(self.before[name] / MiB, 1)
            out[f"{name}_rss_peak_mib"] = round(self.peak[name] / MiB, 1)
        return out


# ---- kernels --------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """How a request to the kernel ended: ``ok``/``error`` (its reply), ``died`` or ``timeout``."""

    status: str
    reply: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


async def request(km: AsyncKernelManager, kc: Any, code: str, timeout: float = 120) -> Outcome:
    """Execute ``code`` and wait for its shell reply only (the attack may break IOPub), the kernel's
    death, or ``timeout`` seconds, whichever comes first."""
    start = time.monotonic()
    msg_id = kc.execute(code, allow_stdin=False)
    deadline = start + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply = await kc.get_shell_msg(timeout=min(left, 1.0))
        except queue.Empty:
            if not await km.is_alive():
                return Outcome("died", seconds=time.monotonic() - start)
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            return Outcome(reply["content"]["status"], reply["content"], time.monotonic() - start)
    return Outcome("timeout", seconds=timeout)


async def outputs(kc: Any, code: str, timeout: float = 60) -> str:
    """Execute ``code``; return its stdout (and error, if any) as text."""
    chunks: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            chunks.append(content["text"])
        elif msg["msg_type"] == "error":
            chunks.append(f"{content['ename']}: {content['evalue']}")

    await kc.execute_interactive(code, timeout=timeout, output_hook=hook, allow_stdin=False)
    return "".join(chunks)




async def argv_client(connection_file: str) -> AsyncKernelClient:
    """A client of a kernel started from the kernelspec's argv, once it answers (its heartbeat is
    polled first, as :meth:`ArgvKernel.ready` does)."""
    ArgvKernel.wait_for_heartbeat(connection_file, timeout=120)
    kc = AsyncKernelClient()
    kc.load_connection_file(connection_file)
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return kc


def launcher_pid(km: AsyncKernelManager) -> int:
    """The launcher process that relays this kernel (the provisioner's child)."""
    pid = km.provisioner.pid
    assert pid is not None and rss(pid) is not None, "no launcher process"
    return int(pid)


# Kernel-side helpers the attacks share: find the connector processes (the ``python -I -S -c
# SOURCE PORT WAIT`` processes the launcher runs with ``docker exec``), stop one and write raw
# bytes into the stream it feeds to the launcher (its stdout pipe, reopened through /proc).
KERNEL_TOOLS = f"HB_PORT = {PORTS['hb_port']}\n" + r'''
import os, signal, struct, time
def connectors():
    found = {}
    for pid in os.listdir('/proc'):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
        except OSError:
            continue
        if cmd[1:3] == [b'-I', b'-S'] and len(cmd) > 5 and cmd[-3].isdigit():
            found[int(pid)] = int(cmd[-3])
    return found
def hijack(port=HB_PORT):
    """Stop the connector of ``port``; an fd writing into the launcher's stream in its place."""
    pid = next(p for p, q in connectors().items() if q == port)
    os.kill(pid, signal.SIGSTOP)
    return os.open(f'/proc/{pid}/fd/1', os.O_WRONLY)
def frame(body, more=False, command=False):
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) > 255:
        return struct.pack('>BQ', flags | 2, len(body)) + body
    return bytes([flags, len(body)]) + body
def pour(fd, chunk, total):
    """Write ``chunk`` until ``total`` bytes went out (or the launcher closed the stream)."""
    sent = 0
    try:
        while sent < total:
            sent += os.write(fd, chunk)
    except OSError:
        pass
    return sent
'''


# ---- another host account ------------------------------------------------------------------------

HOST_PYTHON = "/usr/bin/python3"
"""An interpreter any account can run (the test's own may live in a private home)."""


@dataclass
class OtherUser:
    """A second host account made for one test: its name and uid, and a way to run code as it."""

    name: str
    uid: int

    def run(self, *args: str, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command as this account (``runuser``), capturing its output."""
        return subprocess.run(["runuser", "-u", self.name, "--", *args], capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def python(self, source: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``source`` with the system interpreter (standard library only) as this account."""
        return self.run(HOST_PYTHON, "-I", "-c", source, *args, timeout=timeout)




def wait_for(predicate: Any, timeout: float, message: str, interval: float = 0.2) -> None:
    """Poll ``predicate`` until it is true; fail with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(interval)


async def wait_for_async(predicate: Any, timeout: float, message: str, interval: float = 0.2) -> None:
    """:func:`wait_for` on an event loop."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        await asyncio.sleep(interval)
