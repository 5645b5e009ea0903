"""The egress proxy over one Docker exec stream, for a launcher that cannot enter the container's
namespace.

The kernel side (:mod:`kernel_sandbox.kernelside.egress_relay`) listens on the container's loopback
and sends each connection's bytes as frames; :class:`RelayStream` turns every connection back into
an asyncio stream pair and hands it to :meth:`.Egress.client`, so both paths decide with the same
code. What comes over the stream is the kernel's: frames over :data:`MAX_FRAME` end the stream, a
connection that receives more than :data:`MAX_UNREAD` bytes after a pause (the relay ignored it) is
closed, and at most :data:`~.egress.BACKLOG` connections are held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..kernelside.egress_relay import CLOSE, DATA, EOF, HEADER, OPEN, PAUSE, RESUME
from .egress import BACKLOG, HEAD_LIMIT, Egress

log = logging.getLogger("kernel_sandbox.launch")

MAX_FRAME = 1024 * 1024
MAX_UNREAD = 2 * MAX_FRAME
"""Bytes a connection may still receive after it was paused (those in flight) before it is
closed."""


class _Connection(asyncio.Transport):
    """One kernel connection as a transport: writes become frames on the relay's stream."""

    def __init__(
        self, relay: RelayStream, ident: int, protocol: asyncio.StreamReaderProtocol
    ) -> None:
        super().__init__()
        self.relay = relay
        self.ident = ident
        self.protocol = protocol
        self.closed = False
        self.paused = False
        self.unread = 0
        """Bytes received since the last pause (the relay should have stopped sending)."""

    def write(self, data: Any) -> None:
        if not self.closed and data:
            self.relay.send(DATA, self.ident, bytes(data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if not self.closed:
            self.relay.send(EOF, self.ident)

    def pause_reading(self) -> None:
        if not self.closed and not self.paused:
            self.paused, self.unread = True, 0
            self.relay.send(PAUSE, self.ident)

    def resume_reading(self) -> None:
        if not self.closed and self.paused:
            self.paused = False
            self.relay.send(RESUME, self.ident)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        if not self.closed:
            self.relay.send(CLOSE, self.ident)
            self.lost()

    def lost(self) -> None:
        """The connection ended (either side): tell its protocol once."""
        if not self.closed:
            self.closed = True
            self.relay.connections.pop(self.ident, None)
            self.protocol.connection_lost(None)

    def get_write_buffer_size(self) -> int:
        return self.relay.buffered()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class RelayStream(asyncio.Protocol):
    """The relay's exec stream (Docker-multiplexed): frames in, frames out, one stream pair per
    connection."""

    def __init__(self, egress: Egress, demux_factory: Any) -> None:
        self.egress = egress
        self.connections: dict[int, _Connection] = {}
        self.transport: asyncio.Transport | None = None
        self._pending = bytearray()
        self._demux = demux_factory(self._frames, self._stderr)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._demux.feed(data)

    def send(self, kind: int, ident: int, payload: bytes = b"") -> None:
        """Write one frame to the relay."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(HEADER.pack(ident, kind, len(payload)) + payload)

    def buffered(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def _frames(self, data: memoryview) -> None:
        self._pending += data
        while len(self._pending) >= HEADER.size:
            ident, kind, length = HEADER.unpack_from(self._pending)
            if length > MAX_FRAME:
                log.warning(
                    "egress relay: a frame of %d bytes; the relay's stream is closed", length
                )
                self.close()
                return
            if len(self._pending) < HEADER.size + length:
                return
            payload = bytes(self._pending[HEADER.size : HEADER.size + length])
            del self._pending[: HEADER.size + length]
            self._frame(kind, ident, payload)

    def _frame(self, kind: int, ident: int, payload: bytes) -> None:
        if kind == OPEN:
            if ident in self.connections or len(self.connections) >= BACKLOG:
                self.send(CLOSE, ident)
                return
            reader = asyncio.StreamReader(limit=HEAD_LIMIT)
            protocol = asyncio.StreamReaderProtocol(reader)
            opened = self.connections[ident] = _Connection(self, ident, protocol)
            protocol.connection_made(opened)
            writer = asyncio.StreamWriter(opened, protocol, reader, asyncio.get_running_loop())
            asyncio.ensure_future(self.egress.client(reader, writer))
            return
        connection = self.connections.get(ident)
        if connection is None:
            return
        if kind == DATA:
            if connection.paused:
                connection.unread += len(payload)
                if connection.unread > MAX_UNREAD:
                    connection.abort()  # the relay went on sending long after a pause
                    return
            connection.protocol.data_received(payload)
        elif kind == EOF:
            connection.protocol.eof_received()
        elif kind == CLOSE:
            connection.lost()

    def _stderr(self, data: memoryview) -> None:
        log.debug("egress relay: %s", bytes(data[:500]).decode(errors="replace").strip())

    def pause_writing(self) -> None:
        for connection in list(self.connections.values()):
            connection.protocol.pause_writing()

    def resume_writing(self) -> None:
        for connection in list(self.connections.values()):
            connection.protocol.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        for connection in list(self.connections.values()):
            connection.lost()
        self.transport = None

    def close(self) -> None:
        """End the relay's stream (the relay exits) and every connection over it."""
        if self.transport is not None:
            self.transport.abort()
