"""The exec-stream path of the egress proxy: the kernel-side relay as a real process, the launcher's end in process.

The relay (``kernelside/egress_relay.py``) runs as it does in a container, ``python -I -S -c
SOURCE PORT``, its stdin and stdout one end of a socket pair whose other end is the launcher's
:class:`RelayStream` (without Docker's multiplexing here). Clients connect to the relay's port
on 127.0.0.1 as the kernel would; the proxy behind it resolves through a stub and connects
through the loopback guard, which must never fire. Then the relay's end of the stream in the
attacker's hands: forged frames, nothing read, and the launcher's budgets (the test process's
memory is the launcher's here).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from kernel_sandbox.egress import parse_destinations
from kernel_sandbox.kernelside import source
from kernel_sandbox.kernelside.egress_relay import CLOSE, DATA, EOF, HEADER, LISTENING, MAX_CLIENTS, OPEN
from kernel_sandbox.launch.egress import Egress
from kernel_sandbox.launch.egress_outbound import open_outbound
from support.launcher_hooks import guarded
from kernel_sandbox.launch import egress_stream
from kernel_sandbox.launch.egress_stream import CONNECTION_BUDGET, MAX_FRAME, READ_BUDGET, WRITE_BUDGET, RelayStream
from kernel_sandbox.parsers import MiB

from support.host_memory import RssPeak

pytestmark = pytest.mark.security("attack", "egress")


class Straight:
    """A stand-in for Docker's demultiplexer: the stream carries the relay's stdout alone."""

    def __init__(self, stdout, stderr) -> None:
        self.stdout = stdout

    def feed(self, data) -> None:
        self.stdout(memoryview(data))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Proxy:
    """The launcher's end: the proxy, the ports of its loopback upstreams, and what the kernel was told."""

    egress: Egress
    echo: int
    """An upstream that sends back what it gets."""
    endless: int
    """An upstream that sends without end and reads nothing."""
    sink: int
    """An upstream that reads nothing and sends nothing."""
    told: list[str]


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    fired: list[str] = []
    held: list[asyncio.StreamWriter] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunk = b"e" * 65536
        try:
            while True:
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            writer.close()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # open, never read

    servers = [await asyncio.start_server(serve, "127.0.0.1", 0) for serve in (echo, endless, sink)]
    ports = [server.sockets[0].getsockname()[1] for server in servers]

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    allowed = [f"{name}.test:{port}@127.0.0.1" for name, port in zip(("index", "endless", "sink"), ports)]
    egress = Egress(parse_destinations("network", allowed), resolve=resolve,
                    connect=guarded(open_outbound, fired.append), own_addresses=())
    await egress.serve(None)
    yield Proxy(egress, *ports, told=[])
    await egress.close()
    for writer in held:
        writer.transport.abort()
    for server in servers:
        server.close()
    assert fired == []


@pytest.fixture
async def relay(proxy: Proxy) -> AsyncIterator:
    """The real relay process on a free port, its stream read by a :class:`RelayStream`."""
    ours, theirs = socket.socketpair()
    port = free_port()
    process = subprocess.Popen([sys.executable, "-I", "-S", "-c", source("egress_relay"), str(port)],
                               stdin=theirs, stdout=theirs)
    theirs.close()
    ours.setblocking(False)
    transport, stream = await asyncio.get_running_loop().connect_accepted_socket(
        lambda: RelayStream(proxy.egress, Straight, proxy.told.append), ours
    )
    assert await asyncio.wait_for(stream.listening, 30) is None  # the port is open from here on
    yield port, proxy.echo, stream, proxy.egress, process
    if process.poll() is None:
        assert proxy.told == [] and stream.ended is None, "an honest relay broke a budget"
        transport.close()
        assert await asyncio.to_thread(process.wait, 30) == 0  # the relay ends with its stream


async def _tunnel(port: int, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    return reader, writer, await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)


async def test_connections_through_the_relay_are_decided_by_the_launcher(relay) -> None:
    port, upstream_port, stream, egress, _ = relay
    reader, writer, head = await _tunnel(port, f"index.test:{upstream_port}")
    assert head.startswith(b"HTTP/1.1 200")
    payload = b"y" * 3_000_000  # more than any buffer on the way: flow control end to end
    writer.write(payload)
    received = await asyncio.wait_for(reader.readexactly(len(payload)), 60)
    assert received == payload
    writer.close()
    refused_reader, refused_writer, refused = await _tunnel(port, "elsewhere.test:443")
    assert refused.startswith(b"HTTP/1.1 403 ")
    refused_writer.close()


async def test_many_connections_through_the_relay_stay_bounded(relay) -> None:
    port, upstream_port, stream, egress, _ = relay
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(400)]
    answers = await asyncio.gather(*(asyncio.wait_for(r.read(100), 30) for r, _ in opened[egress.max_connections:]))
    for _, writer in opened:
        writer.close()
    assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in answers)
    assert len(stream.connections) <= 1024


async def test_a_client_that_stops_reading_holds_up_no_other(relay) -> None:
    """A download the kernel's client stops reading: the relay pauses it alone, the others go on."""
    port, upstream_port, stream, egress, _ = relay
    endless = next(d.port for d in egress.allowed if d.host == "endless.test")
    reader, writer, head = await _tunnel(port, f"endless.test:{endless}")
    assert head.startswith(b"HTTP/1.1 200")
    for _ in range(100):  # until the relay asked the launcher to pause it
        if any(connection.held for connection in stream.connections.values()):
            break
        await asyncio.sleep(0.1)
    assert [connection.held for connection in stream.connections.values()] == [True]
    other_reader, other_writer, other_head = await _tunnel(port, f"index.test:{upstream_port}")
    assert other_head.startswith(b"HTTP/1.1 200")
    payload = b"o" * 1_000_000
    other_writer.write(payload)
    assert await asyncio.wait_for(other_reader.readexactly(len(payload)), 60) == payload
    other_writer.close()
    assert stream.buffered() < WRITE_BUDGET // 4
    received = 0
    while received < 8 * MiB:  # the stalled download goes on once read
        received += len(await asyncio.wait_for(reader.read(1 << 20), 30))
    writer.close()


async def test_a_slow_client_gets_every_byte_of_an_answer_the_upstream_ended(relay) -> None:
    """The upstream sends its last bytes and closes while the relay still holds some for a client
    that reads slowly: the relay hands them over before it closes that client (the proxy's close
    is a socket's close, not an abort)."""
    port, upstream_port, stream, egress, _ = relay
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the relay's outbox fills
    client.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=client)
    writer.write(f"CONNECT index.test:{upstream_port} HTTP/1.1\r\n\r\n".encode())
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)).startswith(b"HTTP/1.1 200")
    payload = bytes(range(256)) * 4096  # 1 MiB, echoed, then the echo closes
    writer.write(payload)
    writer.write_eof()
    received = bytearray()
    while data := await asyncio.wait_for(reader.read(16384), 30):
        received += data
        await asyncio.sleep(0.002)
    writer.close()
    assert len(received) == len(payload) and received == payload


def test_the_relay_hands_a_slow_client_its_bytes_before_the_close_the_launcher_sent() -> None:
    """The launcher's CLOSE comes while the relay holds bytes its client has not taken: the client
    gets each of them, then the end (a close drops nothing that was sent)."""
    ours, theirs = socket.socketpair()
    port = free_port()
    process = subprocess.Popen([sys.executable, "-I", "-S", "-c", source("egress_relay"), str(port)],
                               stdin=theirs, stdout=theirs)
    theirs.close()
    ours.settimeout(30)

    def next_frame() -> tuple[int, int]:
        head = b""
        while len(head) < HEADER.size:
            head += ours.recv(HEADER.size - len(head))
        ident, kind, length = HEADER.unpack(head)
        assert length == 0
        return kind, ident

    try:
        assert next_frame() == (LISTENING, 0)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.settimeout(30)
        assert next_frame() == (OPEN, 1)
        payload = bytes(range(256)) * 32768  # 8 MiB: more than the sockets on the way hold
        ours.sendall(b"".join(frame(DATA, 1, payload[i:i + 65536]) for i in range(0, len(payload), 65536)))
        ours.sendall(frame(CLOSE, 1))
        received = bytearray()
        while data := client.recv(8192):
            received += data
            time.sleep(0.001)
        assert len(received) == len(payload) and received == payload
        client.close()
    finally:
        ours.close()
        assert process.wait(30) == 0


async def test_a_relay_killed_in_the_kernel_ends_egress_with_a_reason(relay) -> None:
    """The kernel kills its relay: egress ends, install windows are refused, the kernel is told why."""
    port, upstream_port, stream, egress, process = relay
    process.kill()
    await asyncio.to_thread(process.wait, 30)
    for _ in range(100):
        if stream.ended is not None:
            break
        await asyncio.sleep(0.1)
    assert stream.ended == "this kernel's egress ended: its relay in the container exited; restart the kernel to have egress again"
    assert egress.answer({"open": 60}) == {"status": "error", "evalue": stream.ended}


async def test_a_relay_that_cannot_listen_says_why_before_the_kernel_is_ready(proxy: Proxy) -> None:
    """Its port taken, the relay exits: the launcher's wait for it ends with the relay's reason
    (the Docker link then fails the launch with it), never with a kernel whose proxy is missing."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ours, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-I", "-S", "-c", source("egress_relay"), str(taken.getsockname()[1])],
                               stdin=theirs, stdout=theirs, stderr=subprocess.PIPE)
    theirs.close()
    ours.setblocking(False)
    try:
        _, stream = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: RelayStream(proxy.egress, Straight, proxy.told.append), ours
        )
        assert await asyncio.to_thread(process.wait, 30) == 1
        assert "cannot listen on port" in process.stderr.read().decode()
        assert (await asyncio.wait_for(stream.listening, 30) or "").startswith("the relay exited before it listened")
    finally:
        taken.close()


# ---- a relay in the attacker's hands --------------------------------------------------------------
# The kernel runs as the relay's user: it can stop the relay and write frames into its output
# itself. Here the test holds the relay's end of the stream: it writes forged frames and never
# reads what the launcher writes back.


def frame(kind: int, ident: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(ident, kind, len(payload)) + payload


def connect_frames(ident: int, target: str) -> bytes:
    return frame(OPEN, ident) + frame(DATA, ident, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())


@dataclass
class Forged:
    """The relay's end of the stream, written by the attacker and never read."""

    sock: socket.socket
    stream: RelayStream
    proxy: Proxy

    def target(self, name: str) -> str:
        return f"{name}.test:{getattr(self.proxy, name)}"

    async def send(self, data: bytes) -> bool:
        """Write ``data``; False once the launcher closed the stream."""
        try:
            await asyncio.to_thread(self.sock.sendall, data)
        except OSError:
            return False
        return True

    async def pour(self, data: bytes, most: int) -> int:
        """Write ``data`` again and again, up to ``most`` bytes or until the launcher ended the
        relay's stream; the bytes written."""
        sent = 0
        while sent < most and self.stream.ended is None and await self.send(data):
            sent += len(data)
        return sent

    async def ended(self) -> str:
        """The line the kernel was told, once the launcher ended its egress (60 s at most)."""
        for _ in range(600):
            if self.proxy.told and self.stream.transport is None:
                break
            await asyncio.sleep(0.1)
        assert self.proxy.told, "the launcher went on holding what the relay sent"
        assert self.stream.transport is None and self.stream.connections == {}
        return self.proxy.told[0]


@pytest.fixture
async def forged(proxy: Proxy) -> AsyncIterator[Forged]:
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the kernel's buffers take in little
    ours.setblocking(False)
    _, stream = await asyncio.get_running_loop().connect_accepted_socket(
        lambda: RelayStream(proxy.egress, Straight, proxy.told.append), ours
    )
    yield Forged(theirs, stream, proxy)
    stream.close()
    theirs.close()


BOUND = 48 * MiB
"""What the test process may grow by besides the budget an attack breaks: the proxy's buffers from
its upstreams (at most 512 KiB a connection) and the allocator's slack."""


async def test_a_relay_that_stops_reading_cannot_grow_the_launcher(forged: Forged) -> None:
    """A stopped relay's pipe gets new connections after the pause, each to an endless download."""
    assert await forged.send(connect_frames(1, forged.target("endless")))
    with RssPeak() as rss:
        for _ in range(400):  # until the launcher's frames to the relay pass the high-water mark
            if forged.stream.writing_paused:
                break
            await asyncio.sleep(0.05)
        assert forged.stream.writing_paused
        # connections opened after the pause wait for room as the first does
        assert await forged.send(b"".join(connect_frames(i, forged.target("endless")) for i in range(2, 34)))
        for _ in range(30):
            await asyncio.sleep(0.1)
            assert forged.stream.buffered() < WRITE_BUDGET
    assert len(forged.stream.connections) == 33
    assert forged.proxy.told == []  # waiting for room is not a breach: the kernel stopped its own relay
    assert rss.growth < BOUND, f"the launcher grew by {rss.growth / MiB:.0f} MiB"


async def test_a_relay_that_ignores_pauses_ends_egress(forged: Forged) -> None:
    """Endless frames for one connection whose upstream reads nothing: the relay ignores PAUSE."""
    assert await forged.send(connect_frames(1, forged.target("sink")))
    data = frame(DATA, 1, b"z" * MAX_FRAME)
    with RssPeak() as rss:
        sent = await forged.pour(data, 1 << 30)
        told = await forged.ended()
    assert f"more than {CONNECTION_BUDGET // MiB} MiB for one connection" in told
    assert told.startswith("this kernel's egress was ended: its relay") and "restart the kernel" in told
    assert sent < 1 << 30 and rss.growth < CONNECTION_BUDGET + BOUND
    assert forged.proxy.egress.answer({"open": 60}) == {"status": "error", "evalue": told}


async def test_many_connections_share_one_budget(forged: Forged) -> None:
    """Many connections, each below its own budget, together past the relay's."""
    count = 2 * READ_BUDGET // CONNECTION_BUDGET + 2
    assert await forged.send(b"".join(connect_frames(i, forged.target("sink")) for i in range(count)))
    round_robin = b"".join(frame(DATA, i, b"m" * MAX_FRAME) for i in range(count))
    with RssPeak() as rss:
        await forged.pour(round_robin, 1 << 30)
        told = await forged.ended()
    assert f"more than {READ_BUDGET // MiB} MiB for its connections" in told
    assert rss.growth < READ_BUDGET + BOUND


async def test_a_huge_frame_ends_egress(forged: Forged) -> None:
    """One frame declaring 4 GiB, then its body."""
    assert await forged.send(HEADER.pack(7, DATA, 0xFFFFFFFF))
    with RssPeak() as rss:
        await forged.pour(b"h" * MAX_FRAME, 256 * MiB)
        told = await forged.ended()
    assert f"sent a frame of {0xFFFFFFFF} bytes" in told and rss.growth < BOUND


async def test_answers_to_forged_openings_are_bounded(forged: Forged, monkeypatch) -> None:
    """A network-off kernel's attack: refused requests on fresh connections, answered into a pipe no one reads.

    Each is answered (a 403, past 64 connections a 503) and the stopped relay reads none; the budget
    is made small here so that it is reached before the number of connections is (at 32 MiB it
    takes some minutes)."""
    monkeypatch.setattr(egress_stream, "WRITE_BUDGET", 96 * 1024)
    refused = b"".join(
        frame(OPEN, i) + frame(DATA, i, b"GET http://elsewhere.test/ HTTP/1.1\r\n\r\n") for i in range(1, 1000)
    )
    with RssPeak() as rss:
        assert await forged.send(refused)
        told = await forged.ended()
    assert "of the launcher's frames unread" in told and rss.growth < BOUND


@pytest.mark.parametrize(("frames", "breach"), [
    (frame(OPEN, 5) * 2, "opened connection 5 twice"),
    (b"".join(frame(OPEN, i) for i in range(MAX_CLIENTS + 1)), f"opened more than {MAX_CLIENTS} connections at once"),
    (frame(OPEN, 5) + frame(EOF, 5) + frame(DATA, 5, b"x"), "sent bytes on connection 5 after its end"),
    (frame(200, 5), "sent a frame of an unknown kind (200)"),
    (frame(LISTENING, 0) * 2, "said twice that it listens"),
])
async def test_frames_no_relay_sends_end_egress(forged: Forged, frames: bytes, breach: str) -> None:
    """An id opened twice; more connections than the relay holds; bytes after a connection's end; a
    kind unknown; a second word that it listens."""
    assert await forged.send(frames)
    assert breach in await forged.ended()
