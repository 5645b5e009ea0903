"""The egress proxy over one Docker exec stream, for a launcher that cannot enter the container's
namespace.

The kernel side (:mod:`kernel_sandbox.kernelside.egress_relay`) listens on the container's loopback
and sends each connection's bytes as frames; :class:`RelayStream` turns every connection back into
an asyncio stream pair and hands it to :meth:`.Egress.client`, so both paths decide with the same
code.

What comes over the stream is the kernel's: the relay runs as the kernel's user, which can stop it
and write frames into its output itself. So every byte the launcher takes from it or holds for it
is counted where frames are read and written, whatever the relay does: frames over
:data:`MAX_FRAME`, more than :data:`CONNECTION_BUDGET` bytes received for one connection and not
yet read by the proxy, more than :data:`READ_BUDGET` for all of them together, or more than
:data:`WRITE_BUDGET` bytes written to a relay that does not read them, end the kernel's egress
(:meth:`RelayStream.broken`): the stream closes, the proxy refuses install windows, and the kernel
is told why in its next cell (as when the relay exits). So do frames no relay sends: an id opened
twice, more than :data:`~kernel_sandbox.kernelside.egress_relay.MAX_CLIENTS` connections at once,
bytes after a connection's end, a frame of an unknown kind, a second ``LISTENING``. The first one
(:attr:`RelayStream.listening`) is what the launcher waits for before it calls the kernel ready.
The relay may ask to pause a connection whose client does not read (``PAUSE``/``RESUME`` its
way): the proxy then waits for room as it does when the stream is full.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..kernelside.egress_relay import (
    CHUNK,
    CLOSE,
    DATA,
    EOF,
    HEADER,
    LISTENING,
    MAX_CLIENTS,
    OPEN,
    PAUSE,
    RESUME,
)
from ..parsers import MiB
from .egress_grammar import HEAD_LIMIT
from .egress import Egress

log = logging.getLogger("kernel_sandbox.launch")

MAX_FRAME = CHUNK
"""The longest payload of a frame (the relay reads at most that much at a time)."""
CONNECTION_BUDGET = 4 * MiB
"""Bytes received for one connection and not yet read by the proxy. The launcher pauses a
connection once it holds twice :data:`~.egress_grammar.HEAD_LIMIT` of it, so a relay that obeys
leaves that, one frame and what was in flight on the stream."""
READ_BUDGET = 16 * MiB
"""Bytes received for all connections together and not yet read by the proxy."""
WRITE_BUDGET = 32 * MiB
"""Bytes written to the relay that it has not read yet. The proxy waits for room before it writes
more to a connection, so a relay that reads slowly leaves one chunk per connection
(:data:`~.egress.MAX_CONNECTIONS` times :data:`~.egress_outbound.CHUNK`: 16 MiB) and a few
answers."""


class _Reader(asyncio.StreamReader):
    """A connection's reader that counts what it holds (received, not yet read) against the
    relay's budgets; ``read`` and ``readuntil``, the proxy's only reads, count what they take."""

    def __init__(self, relay: RelayStream) -> None:
        super().__init__(limit=HEAD_LIMIT)
        self.relay = relay
        self.held = 0

    def feed_data(self, data: Any) -> None:
        self.held += len(data)
        self.relay.held += len(data)
        super().feed_data(data)

    async def read(self, n: int = -1) -> bytes:
        data = await super().read(n)
        if n >= 0:  # read(-1) reads through read(limit), counted there
            self.taken(len(data))
        return data

    async def readuntil(self, separator: Any = b"\n") -> bytes:
        try:
            data = await super().readuntil(separator)
        except asyncio.IncompleteReadError as exc:
            self.taken(len(exc.partial))
            raise
        self.taken(len(data))
        return data

    def taken(self, count: int) -> None:
        """``count`` bytes left the reader (read, or dropped with it)."""
        count = min(count, self.held)
        self.held -= count
        self.relay.held -= count


class _Connection(asyncio.Transport):
    """One kernel connection as a transport: writes become frames on the relay's stream."""

    def __init__(self, relay: RelayStream, ident: int) -> None:
        super().__init__()
        self.relay = relay
        self.ident = ident
        self.reader = _Reader(relay)
        self.protocol = asyncio.StreamReaderProtocol(self.reader)
        self.closed = False
        self.paused = False
        self.ended = False
        """The relay said that no more bytes come (EOF)."""
        self.held = False
        """The relay asked for a pause: its client does not take what the proxy sends."""
        self.waiting = False
        """The proxy waits for room before it writes (the relay's stream is full, or held)."""

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
            self.paused = True
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

    def flow(self) -> None:
        """Make the proxy wait for room, or go on, as the stream and the relay say."""
        wait = self.relay.writing_paused or self.held
        if wait != self.waiting and not self.closed:
            self.waiting = wait
            if wait:
                self.protocol.pause_writing()
            else:
                self.protocol.resume_writing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class RelayStream(asyncio.Protocol):
    """The relay's exec stream (Docker-multiplexed): frames in, frames out, one stream pair per
    connection; ``tell`` shows the kernel a line (why its egress ended)."""

    def __init__(self, egress: Egress, demux_factory: Any, tell: Callable[[str], None]) -> None:
        self.egress = egress
        self.tell = tell
        self.connections: dict[int, _Connection] = {}
        self.transport: asyncio.Transport | None = None
        self.held = 0
        """Bytes received for the connections and not yet read by the proxy."""
        self.ended: str | None = None
        """Why the kernel's egress was ended (its relay broke a bound), once it was."""
        self.writing_paused = False
        """The relay's stream is over its high-water mark: every connection waits for room."""
        self.listening: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        """None once the relay said it listens on the kernel's proxy port; why not when its
        stream ended first (with what the relay wrote on stderr)."""
        self._said = ""
        self._pending = bytearray()
        self._demux = demux_factory(self._frames, self._stderr)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._demux.feed(data)

    def send(self, kind: int, ident: int, payload: bytes = b"") -> None:
        """Write one frame to the relay (past :data:`WRITE_BUDGET` unread, the relay is broken)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(HEADER.pack(ident, kind, len(payload)) + payload)
            if self.buffered() > WRITE_BUDGET:
                self.broken(
                    f"it left more than {WRITE_BUDGET // MiB} MiB of the launcher's frames unread"
                )

    def buffered(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def broken(self, what: str) -> None:
        """End the kernel's egress because its relay did ``what`` (logged, and told to the
        kernel)."""
        if self.ended is not None:
            return
        reason = self._end(
            f"was ended: its relay (the process in the container that carries the proxy's "
            f"connections) {what}, so code in the kernel stopped or replaced it"
        )
        log.warning("egress relay: %s", reason)
        self._pending.clear()
        self.close()

    def _end(self, what: str) -> str:
        """End the kernel's egress for good; tell the kernel the sentence about it that ``what``
        ends."""
        self.ended = reason = (
            f"this kernel's egress {what}; restart the kernel to have egress again"
        )
        self.egress.end(reason)
        self.tell(reason)
        return reason

    def _frames(self, data: memoryview) -> None:
        if self.ended is not None:
            return
        self._pending += data
        while len(self._pending) >= HEADER.size and self.ended is None:
            ident, kind, length = HEADER.unpack_from(self._pending)
            if length > MAX_FRAME:
                self.broken(f"sent a frame of {length} bytes (at most {MAX_FRAME})")
                return
            if len(self._pending) < HEADER.size + length:
                return
            payload = bytes(self._pending[HEADER.size : HEADER.size + length])
            del self._pending[: HEADER.size + length]
            self._frame(kind, ident, payload)

    def _frame(self, kind: int, ident: int, payload: bytes) -> None:
        if kind not in (OPEN, DATA, EOF, CLOSE, PAUSE, RESUME, LISTENING):
            self.broken(f"sent a frame of an unknown kind ({kind})")
        elif kind == LISTENING:
            if self.listening.done():
                self.broken("said twice that it listens")
            else:
                self.listening.set_result(None)
        elif kind == OPEN:
            self._open(ident)
        else:
            self._on_connection(kind, ident, payload)

    def _open(self, ident: int) -> None:
        # the relay numbers its connections in turn and holds at most MAX_CLIENTS: the launcher
        # holds none that the relay does not
        if ident in self.connections:
            self.broken(f"opened connection {ident} twice")
            return
        if len(self.connections) >= MAX_CLIENTS:
            self.broken(f"opened more than {MAX_CLIENTS} connections at once")
            return
        opened = self.connections[ident] = _Connection(self, ident)
        opened.protocol.connection_made(opened)
        opened.flow()
        asyncio.ensure_future(self._serve(opened))

    def _on_connection(self, kind: int, ident: int, payload: bytes) -> None:
        connection = self.connections.get(ident)
        if connection is None:
            return
        if kind == DATA:
            if connection.ended:
                self.broken(f"sent bytes on connection {ident} after its end")
                return
            connection.protocol.data_received(payload)
            if connection.reader.held > CONNECTION_BUDGET:
                self.broken(
                    f"sent more than {CONNECTION_BUDGET // MiB} MiB for one connection that the "
                    "proxy had not read (it went on after being paused)"
                )
            elif self.held > READ_BUDGET:
                self.broken(
                    f"sent more than {READ_BUDGET // MiB} MiB for its connections that the proxy "
                    "had not read (it went on after they were paused)"
                )
        elif kind == EOF:
            connection.ended = True
            connection.protocol.eof_received()
        elif kind == CLOSE:
            connection.lost()
        else:
            connection.held = kind == PAUSE
            connection.flow()

    async def _serve(self, connection: _Connection) -> None:
        """Hand ``connection`` to the proxy; what its reader still holds is dropped with it."""
        writer = asyncio.StreamWriter(
            connection, connection.protocol, connection.reader, asyncio.get_running_loop()
        )
        try:
            await self.egress.client(connection.reader, writer)
        finally:
            connection.reader.taken(connection.reader.held)

    def _stderr(self, data: memoryview) -> None:
        self._said = bytes(data[:500]).decode(errors="replace").strip()
        log.debug("egress relay: %s", self._said)

    def pause_writing(self) -> None:
        self.writing_paused = True
        for connection in list(self.connections.values()):
            connection.flow()

    def resume_writing(self) -> None:
        self.writing_paused = False
        for connection in list(self.connections.values()):
            connection.flow()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.listening.done():
            self.listening.set_result(
                f"the relay exited before it listened ({self._said or exc or 'no word'})"
            )
        for connection in list(self.connections.values()):
            connection.lost()
        self.transport = None
        if self.ended is None:  # the relay exited (killed in the kernel), or the kernel ended
            log.debug("egress relay: %s", self._end("ended: its relay in the container exited"))

    def close(self) -> None:
        """End the relay's stream (the relay exits) and every connection over it."""
        if self.transport is not None:
            self.transport.abort()
