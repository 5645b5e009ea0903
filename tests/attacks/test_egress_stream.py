"""The egress relay attacked from inside the kernel: forged frames into the launcher, on runc and gVisor.

On the relay path (gVisor, and every launcher that is not root; forced here with
``KERNEL_SANDBOX_TEST_EXEC_STREAMS``) the proxy's connections come over one exec stream from a
relay in the container that runs as the kernel's user. The kernel stops the relay and writes
frames into the pipe that carries its stdout to the launcher (``/proc/PID/fd/1``): connections
opened after the launcher paused, endless data a paused connection never should get, many
connections, a frame of 4 GiB, and a flood of openings on a kernel with the network off, whose
answers the stopped relay never reads.

Whatever the kernel writes, the launcher's resident memory may not rise by more than
:data:`LAUNCHER_BOUND` (its budgets for the relay's stream plus a constant); an attack that breaks
a budget ends the kernel's egress, the next cell says why, and the launcher and kernel go on.
The launcher resolves ``endless.test`` and ``sink.test`` to two servers on 127.0.0.1 (one sends
without end, one reads nothing) through the test's resolver map, and connects to loopback only.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from support.launcher_hooks import EXEC_STREAMS_ENV
from kernel_sandbox.kernelside.egress_relay import DATA, HEADER, MAX_CLIENTS, OPEN
from kernel_sandbox.kernelspecs import started_client
from kernel_sandbox.launch.egress import PROXY_PORT
from support.launcher_hooks import TEST_RESOLVER_ENV
from kernel_sandbox.launch.egress_stream import CONNECTION_BUDGET, MAX_FRAME, READ_BUDGET, WRITE_BUDGET

from support.attacks import MiB, PeakRSS, launcher_pid, outputs, request
from support.kernel import RUNTIMES, runtime_option

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

LAUNCHER_BOUND = READ_BUDGET + WRITE_BUDGET + 64 * MiB
"""How far the launcher's resident memory may rise while the kernel attacks its relay's stream:
what its budgets let it hold, its buffers from the upstreams (512 KiB a connection) and the
allocator's slack."""

# Kernel-side tools: find the relay (``python -I -S -c SOURCE PROXY_PORT``), stop it and write into the
# pipe that carries its stdout to the launcher; frames in the relay's own format.
RELAY_TOOLS = f'''
import os, signal, struct, time
HEADER = struct.Struct({HEADER.format!r})
OPEN, DATA = {OPEN}, {DATA}
def relay():
    for pid in os.listdir('/proc'):  # it listens before the kernel answers
        try:
            cmd = open(f'/proc/{{pid}}/cmdline', 'rb').read().split(b'\\0')
        except OSError:
            continue
        if cmd[1:4] == [b'-I', b'-S', b'-c'] and cmd[-2:] == [b'{PROXY_PORT}', b'']:
            return int(pid)
    raise LookupError('no egress relay in the container')
def hijack():
    """Stop the relay; a non-blocking fd writing into the launcher's stream in its place."""
    pid = relay()
    os.kill(pid, signal.SIGSTOP)
    fd = os.open(f'/proc/{{pid}}/fd/1', os.O_WRONLY | os.O_NONBLOCK)
    return pid, fd
def frame(kind, ident, payload=b''):
    return HEADER.pack(ident, kind, len(payload)) + payload
def connect(ident, target):
    return frame(OPEN, ident) + frame(DATA, ident, f'CONNECT {{target}} HTTP/1.1\\r\\n\\r\\n'.encode())
def pour(fd, chunk, total, stuck=5.0):
    """Write ``chunk`` until ``total`` bytes went out, or nothing could be written for ``stuck`` s
    (the launcher stopped reading: it closed the stream)."""
    sent, view, last = 0, memoryview(chunk), time.monotonic()
    while sent < total and time.monotonic() - last < stuck:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        except OSError:
            break
        sent, last = sent + n, time.monotonic()
        view = view[n:] or memoryview(chunk)
    return sent
def send(fd, data):
    assert pour(fd, data, len(data)) >= len(data), 'the launcher stopped reading'
'''

ATTACKS = {
    # The finding: a download fills the stopped relay's pipe, the launcher pauses; then 32 new
    # connections, each to an endless download. They must wait for room as the first does.
    "new connections after a pause": (
        "pid, fd = hijack()\nsend(fd, connect(1 << 20, ENDLESS))\ntime.sleep(2)\n"
        "send(fd, b''.join(connect((1 << 20) + i, ENDLESS) for i in range(1, 33)))\n"
        "time.sleep(5)\nos.kill(pid, signal.SIGKILL)",
        None,
    ),
    # One connection to a server that reads nothing, then endless data the launcher paused.
    "endless frames after a pause": (
        f"pid, fd = hijack()\nsend(fd, connect(1 << 20, SINK))\n"
        f"pour(fd, frame(DATA, 1 << 20, b'z' * {MAX_FRAME}), {8 * CONNECTION_BUDGET})\nos.kill(pid, signal.SIGKILL)",
        f"more than {CONNECTION_BUDGET // MiB} MiB for one connection",
    ),
    # Ten connections to a server that reads nothing, fed in turn: each below its own budget.
    "many connections": (
        f"pid, fd = hijack()\nsend(fd, b''.join(connect((1 << 20) + i, SINK) for i in range(10)))\n"
        f"pour(fd, b''.join(frame(DATA, (1 << 20) + i, b'm' * {MAX_FRAME}) for i in range(10)), {3 * READ_BUDGET})\n"
        "os.kill(pid, signal.SIGKILL)",
        "that the proxy had not read",
    ),
    # One frame declaring 4 GiB, then 8 MiB of its body.
    "a frame of 4 GiB": (
        "pid, fd = hijack()\npour(fd, HEADER.pack(1 << 20, DATA, 0xFFFFFFFF) + b'h' * 65536, 8 << 20)\n"
        "os.kill(pid, signal.SIGKILL)",
        "sent a frame of 4294967295 bytes",
    ),
}

OPENINGS = (
    # Refused requests on fresh connections, then openings alone: the stopped relay reads none of
    # the answers, and connections pile up (the leak of a kernel with the network off).
    "pid, fd = hijack()\n"
    "send(fd, b''.join(frame(OPEN, i) + frame(DATA, i, b'GET http://pypi.org/ HTTP/1.1\\r\\n\\r\\n') for i in range(1, 500)))\n"
    "send(fd, b''.join(frame(OPEN, i) for i in range(500, 5000)))\ntime.sleep(1)\nos.kill(pid, signal.SIGKILL)"
)


@dataclass
class Upstreams:
    """Servers on 127.0.0.1 the kernel may reach by name: one sends without end, one reads nothing."""

    endless: int
    sink: int

    @property
    def network(self) -> list[str]:
        return [f"endless.test:{self.endless}@127.0.0.1", f"sink.test:{self.sink}@127.0.0.1"]


def _serve(listener: socket.socket, handle: Any) -> None:
    held = []
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            break
        held.append(conn)
        threading.Thread(target=handle, args=(conn,), daemon=True).start()
    for conn in held:
        conn.close()


def _endless(conn: socket.socket) -> None:
    chunk = b"e" * 65536
    try:
        while True:
            conn.sendall(chunk)
    except OSError:
        pass


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    listeners = []
    for handle in (_endless, lambda conn: None):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the sink takes in little
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        threading.Thread(target=_serve, args=(listener, handle), daemon=True).start()
        listeners.append(listener)
    resolver = tmp_path_factory.mktemp("relay-attack") / "resolver.json"
    resolver.write_text(json.dumps({"endless.test": ["127.0.0.1"], "sink.test": ["127.0.0.1"]}))
    resolver.chmod(0o600)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(TEST_RESOLVER_ENV, str(resolver))
        yield Upstreams(*(listener.getsockname()[1] for listener in listeners))
    for listener in listeners:
        listener.close()
    guard = Path(f"{resolver}.guard")
    assert not guard.exists(), f"the launcher tried to connect outside 127.0.0.0/8: {guard.read_text()}"


@pytest.fixture
def kernels(docker_engine, jupyter_prefix, monkeypatch) -> None:
    """The Docker engine, the shipped kernelspecs (the provisioner's path, launcher included), and
    the relay path on runc too (the tests run as root, which would listen in the namespace)."""
    monkeypatch.setenv(EXEC_STREAMS_ENV, "1")


@asynccontextmanager
async def relay_kernel(runtime: str, network: Any) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    options = {**runtime_option(runtime), "network": network, "standby": 0}
    km = AsyncKernelManager(kernel_name="sandboxed-python", config=Config({"DockerProvisioner": options}))
    async with started_client(km, timeout=120) as kc:
        yield km, kc


async def attack(km: AsyncKernelManager, kc: Any, code: str, record_property: Any) -> PeakRSS:
    """Run ``code`` (with the relay tools) in the kernel while the launcher's memory is sampled."""
    peak = PeakRSS(launcher=launcher_pid(km))
    try:
        outcome = await request(km, kc, RELAY_TOOLS + code, timeout=300)
    finally:
        peak.stop()
    for name, value in peak.figures().items():
        record_property(name, value)
    assert outcome.status == "ok", outcome
    assert peak.growth("launcher") <= LAUNCHER_BOUND, (
        f"the launcher's memory rose by {peak.growth('launcher') / MiB:.0f} MiB (bound "
        f"{LAUNCHER_BOUND // MiB} MiB): it holds what the relay's stream carries without a budget"
    )
    return peak


async def told(kc: Any) -> str:
    """The output of the first cell that shows the launcher's notice (cells are run until one does,
    30 at most: the end of the relay's stream may reach the launcher after the attack's cell)."""
    for _ in range(30):
        after = await outputs(kc, "import time; time.sleep(0.5); print('alive')")
        if "[kernel-sandbox]" in after:
            break
    return after


@pytest.mark.security("attack", "egress")
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", list(ATTACKS))
async def test_forged_relay_frames_do_not_grow_the_launcher(kernels, upstreams: Upstreams, runtime: str, name: str,
                                                            record_property) -> None:
    """The kernel stops its egress relay and writes frames to the launcher in its place."""
    code, breach = ATTACKS[name]
    async with relay_kernel(runtime, upstreams.network) as (km, kc):
        targets = f"ENDLESS = 'endless.test:{upstreams.endless}'\nSINK = 'sink.test:{upstreams.sink}'\n"
        await attack(km, kc, targets + code, record_property)
        after = await told(kc)
        assert after.endswith("alive\n") and await km.is_alive()
        if breach is None:  # waiting for a relay that reads nothing is no breach: the kernel's own loss
            # the kernel still holds the killed relay's pipe: the engine's exec_die ends the stream
            assert "[kernel-sandbox] this kernel's egress ended: its relay in the container exited" in after, after
        else:
            assert "[kernel-sandbox] this kernel's egress was ended: its relay" in after, after
            assert breach in after and "restart the kernel to have egress again" in after, after


@pytest.mark.security("attack", "egress")
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_answers_a_stopped_relay_never_reads_are_bounded(kernels, runtime: str, record_property) -> None:
    """A kernel with the network off floods the launcher with openings, each answered into a pipe no one reads."""
    async with relay_kernel(runtime, False) as (km, kc):
        await attack(km, kc, OPENINGS, record_property)
        after = await told(kc)
        assert f"opened more than {MAX_CLIENTS} connections at once" in after, after
        assert after.endswith("alive\n") and await km.is_alive()
