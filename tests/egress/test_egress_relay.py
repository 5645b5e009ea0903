"""The exec-stream path of the egress proxy: the kernel-side relay as a real process, the launcher's end in process.

The relay (``kernelside/egress_relay.py``) runs as it does in a container, ``python -I -S -c
SOURCE PORT``, its stdin and stdout one end of a socket pair whose other end is the launcher's
:class:`RelayStream` (without Docker's multiplexing here). Clients connect to the relay's port
on 127.0.0.1 as the kernel would; the proxy behind it resolves through a stub and connects
through the loopback guard, which must never fire.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from kernel_sandbox.egress import parse_destinations
from kernel_sandbox.kernelside import source
from kernel_sandbox.kernelside.egress_relay import DATA, HEADER, OPEN
from kernel_sandbox.launch.egress import Egress, guarded, open_outbound
from kernel_sandbox.launch.egress_stream import MAX_FRAME, RelayStream

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


@pytest.fixture
async def relay() -> AsyncIterator:
    fired: list[str] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    egress = Egress(parse_destinations("network", [f"index.test:{upstream_port}@127.0.0.1"]), resolve=resolve,
                    connect=guarded(open_outbound, fired.append), own_addresses=())
    await egress.serve(None)
    ours, theirs = socket.socketpair()
    port = free_port()
    process = subprocess.Popen([sys.executable, "-I", "-S", "-c", source("egress_relay"), str(port)],
                               stdin=theirs, stdout=theirs)
    theirs.close()
    ours.setblocking(False)
    transport, stream = await asyncio.get_running_loop().connect_accepted_socket(
        lambda: RelayStream(egress, Straight), ours
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            await asyncio.sleep(0.02)
    yield port, upstream_port, stream, egress
    transport.close()
    assert await asyncio.to_thread(process.wait, 30) == 0  # the relay ends with its stream
    await egress.close()
    upstream.close()
    assert fired == []


async def _tunnel(port: int, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    return reader, writer, await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)


async def test_connections_through_the_relay_are_decided_by_the_launcher(relay) -> None:
    port, upstream_port, stream, egress = relay
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
    port, upstream_port, stream, egress = relay
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(400)]
    answers = await asyncio.gather(*(asyncio.wait_for(r.read(100), 30) for r, _ in opened[egress.max_connections:]))
    for _, writer in opened:
        writer.close()
    assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in answers)
    assert len(stream.connections) <= 1024


async def test_a_relay_sending_a_huge_frame_loses_its_stream(relay) -> None:
    port, upstream_port, stream, egress = relay
    stream._frames(memoryview(HEADER.pack(7, DATA, MAX_FRAME + 1)))
    await asyncio.sleep(0.1)
    assert stream.transport is None


async def test_a_relay_ignoring_pauses_has_the_connection_closed(relay) -> None:
    port, upstream_port, stream, egress = relay
    stream._frame(OPEN, 99, b"")
    connection = stream.connections[99]
    connection.pause_reading()
    for _ in range(3):
        stream._frame(DATA, 99, b"z" * MAX_FRAME)
    assert connection.closed and 99 not in stream.connections
