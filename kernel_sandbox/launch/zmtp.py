"""A minimal ZMTP 3.0 peer (NULL mechanism) for the launcher's side of a kernel channel.

The launcher speaks to the kernel's ZMQ sockets over byte streams that the Docker engine carries
(exec streams), so the messages are framed here rather than by a second libzmq socket and a
local pipe: one event-loop wake per message instead of three. Only what a DEALER or SUB peer of
ipykernel needs is implemented (RFC 23/ZMTP 3.0: greeting, READY, frames, PING/PONG); anything
else from the peer ends the connection.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"
GREETING = SIGNATURE + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
GREETING_SIZE = len(GREETING)
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
MAX_MESSAGE_BYTES = 512 * 2**20
"""The largest message taken from a kernel: past it the connection is refused, not buffered."""
SUBSCRIBE_ALL = b"\x01"
"""A ZMTP 3.0 subscription to every topic, sent as a message by a SUB peer."""


class ProtocolError(Exception):
    """The peer broke ZMTP."""


def _short_string(value: bytes) -> bytes:
    return bytes([len(value)]) + value


def command(name: bytes, body: bytes = b"") -> bytes:
    """One encoded ZMTP command frame."""
    payload = _short_string(name) + body
    if len(payload) > 255:
        return bytes([COMMAND | LONG]) + struct.pack(">Q", len(payload)) + payload
    return bytes([COMMAND, len(payload)]) + payload


def ready(socket_type: bytes, identity: bytes = b"") -> bytes:
    """The READY command announcing ``socket_type`` (and a routing identity)."""
    properties = [(b"Socket-Type", socket_type)]
    if identity:
        properties.append((b"Identity", identity))
    body = b"".join(_short_string(name) + struct.pack(">I", len(value)) + value for name, value in properties)
    return command(b"READY", body)


def encode(frames: Sequence[Any]) -> list[Any]:
    """The chunks that carry one multipart message (frames: bytes or buffers)."""
    chunks: list[Any] = []
    last = len(frames) - 1
    for index, frame in enumerate(frames):
        size = memoryview(frame).nbytes
        flags = MORE if index < last else 0
        if size > 255:
            chunks.append(struct.pack(">BQ", flags | LONG, size))
        else:
            chunks.append(bytes([flags, size]))
        chunks.append(frame)
    return chunks


class ZmtpPeer:
    """ZMTP framing for one connection: :meth:`feed` it bytes, it calls back with whole messages.

    ``write`` sends bytes to the peer. The greeting and READY are written at construction; messages
    passed to :meth:`send` before the peer's READY has arrived wait for it (libzmq drops a peer
    whose first message arrives while its own side of the handshake is unfinished).
    """

    def __init__(
        self,
        socket_type: bytes,
        write: Callable[[bytes], None],
        on_message: Callable[[list[bytes]], None],
        *,
        identity: bytes = b"",
        on_ready: Callable[[], None] | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._max = max_message_bytes
        self._message_bytes = 0
        self._write = write
        self._on_message = on_message
        self._on_ready = on_ready
        self._buffer = bytearray()
        self._frames: list[bytes] = []
        self._greeted = False
        self._pending: list[bytes] = []
        self.ready = False
        write(GREETING + ready(socket_type, identity))

    def send(self, frames: Iterable[Any]) -> None:
        """Send one multipart message (after the handshake: until then it waits)."""
        data = b"".join(encode(list(frames)))
        if self.ready:
            self._write(data)
        else:
            self._pending.append(data)

    def feed(self, data: bytes) -> None:
        """Take bytes from the peer; raise :class:`ProtocolError` when they break ZMTP."""
        buffer = self._buffer
        buffer += data
        offset = 0
        if not self._greeted:
            if len(buffer) < GREETING_SIZE:
                return
            if buffer[0] != 0xFF or buffer[9] != 0x7F or buffer[10] < 3 or bytes(buffer[12:16]) != b"NULL":
                raise ProtocolError("the peer did not greet as a ZMTP 3 NULL-mechanism socket")
            self._greeted = True
            offset = GREETING_SIZE
        while True:
            available = len(buffer) - offset
            if available < 2:
                break
            flags = buffer[offset]
            if flags & LONG:
                if available < 9:
                    break
                size = struct.unpack_from(">Q", buffer, offset + 1)[0]
                start = offset + 9
            else:
                size = buffer[offset + 1]
                start = offset + 2
            if self._message_bytes + size > self._max:
                raise ProtocolError(f"a message over {self._max // 2**20} MiB")
            end = start + size
            if len(buffer) < end:
                break
            body = bytes(buffer[start:end])
            offset = end
            if flags & COMMAND:
                self._command(body)
            elif not self.ready:
                raise ProtocolError("the peer sent a message before READY")
            else:
                self._frames.append(body)
                self._message_bytes += size
                if not flags & MORE:
                    frames, self._frames, self._message_bytes = self._frames, [], 0
                    self._on_message(frames)
        del buffer[:offset]

    def _command(self, body: bytes) -> None:
        name = body[1 : 1 + body[0]] if body else b""
        if name == b"READY":
            self.ready = True
            pending, self._pending = self._pending, []
            if pending:
                self._write(b"".join(pending))
            if self._on_ready is not None:
                self._on_ready()
        elif name == b"PING":
            context = body[1 + body[0] + 2 :]
            self._write(command(b"PONG", context))
        elif name == b"ERROR":
            reason = body[1 + body[0] + 1 :].decode(errors="replace")
            raise ProtocolError(f"the peer refused the connection: {reason}")
