"""A minimal ZMTP 3.0 peer (NULL mechanism) for the launcher's side of a kernel channel.

The launcher speaks to the kernel's ZMQ sockets over byte streams that the Docker engine carries
(exec streams) or over a TCP socket made inside the container's network namespace, so the
messages are framed here rather than by a second libzmq socket and a local pipe: one event-loop
wake per read instead of three. Only what a DEALER or SUB peer of ipykernel needs is implemented
(RFC 23/ZMTP 3.0: greeting, READY, frames, PING/PONG); anything else from the peer ends the
connection.

Reading is zero-copy for large frames: :meth:`ZmtpPeer.get_buffer` hands the transport the very
buffer a large frame ends up in (asyncio's ``BufferedProtocol``), so a megabyte of tool state is
copied once, by the kernel's ``recv_into``. Everything read is bounded before it is allocated:
frame and message sizes, frames per message, command sizes (:data:`MAX_MESSAGE_BYTES`,
:data:`MAX_FRAMES`, :data:`MAX_COMMAND_BYTES`); past a bound the connection is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import ChannelProtocolError

SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"
GREETING = SIGNATURE + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
GREETING_SIZE = len(GREETING)
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
MAX_MESSAGE_BYTES = 64 * 2**20
"""The largest message taken from a kernel (frames and their overhead): past it the connection is
refused.

Well above what Jupyter clients receive in one message in practice (the execution API's file
chunks are 4 MiB, streams are flushed every 64 KiB, a figure is a few MB), and what a hostile
kernel can make the launcher hold per message."""
MAX_FRAMES = 1024
"""Frames per message: a Jupyter message has its routing ids, six parts and its buffers."""
MAX_COMMAND_BYTES = 64 * 1024
"""READY, PING and ERROR are a few bytes; nothing legitimate comes near this."""
MAX_PING_CONTEXT = 16
"""A PING's context is echoed in the PONG up to this many bytes (ZMTP 3.1's limit)."""
FRAME_OVERHEAD = 64
"""Bytes each frame counts against :data:`MAX_MESSAGE_BYTES` besides its body (so empty frames count
too)."""
LARGE_FRAME = 64 * 1024
"""Frames from this size on are read straight into a buffer of their own."""
GROW_FROM = 2**20
"""A large frame's buffer starts at this size (or the frame's) and doubles as bytes arrive: a
frame header claiming many megabytes costs nothing until they are sent."""
READ_SIZE = 256 * 1024
"""The scratch buffer headers and small frames are read into (more than a large frame's
threshold)."""
SUBSCRIBE_ALL = b"\x01"
"""A ZMTP 3.0 subscription to every topic, sent as a message by a SUB peer."""
_LONG_SIZE = struct.Struct(">Q")


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
    body = b"".join(
        _short_string(name) + struct.pack(">I", len(value)) + value for name, value in properties
    )
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


def _property(metadata: bytes, wanted: bytes) -> bytes:
    """The value of property ``wanted`` in a READY command's metadata (empty: absent, or the
    metadata is malformed)."""
    at = 0
    while at < len(metadata):
        name_size = metadata[at]
        name = metadata[at + 1 : at + 1 + name_size]
        at += 1 + name_size
        if at + 4 > len(metadata):
            return b""
        (size,) = struct.unpack_from(">I", metadata, at)
        value = metadata[at + 4 : at + 4 + size]
        at += 4 + size
        if name.lower() == wanted.lower():
            return value if len(value) == size else b""
    return b""


class ZmtpPeer:
    """ZMTP framing for one connection: give it the peer's bytes, it calls back with whole messages.

    Bytes arrive either by :meth:`get_buffer` / :meth:`buffer_updated` (a ``BufferedProtocol``
    reads into the peer's own buffers) or by :meth:`feed`. ``write`` sends bytes to the peer. The
    greeting and READY are written at construction; messages passed to :meth:`send` before the
    peer's READY has arrived wait for it (libzmq drops a peer whose first message arrives while
    its own side of the handshake is unfinished). Frames of a delivered message are ``bytes``,
    or ``bytearray`` for large ones.
    """

    def __init__(
        self,
        socket_type: bytes,
        write: Callable[[Any], None],
        on_message: Callable[[list[Any]], None],
        *,
        identity: bytes = b"",
        on_ready: Callable[[], None] | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        read_size: int = READ_SIZE,
        large_frame: int = LARGE_FRAME,
    ) -> None:
        self._max = max_message_bytes
        self._read_size, self._large_frame = read_size, large_frame
        self._message_bytes = 0
        self._write = write
        self._on_message = on_message
        self._on_ready = on_ready
        self._scratch = bytearray(read_size)
        self._view = memoryview(self._scratch)
        self._start = self._end = 0
        self._large: bytearray | None = None
        self._large_size = self._large_filled = 0
        self._large_more = False
        self._frames: list[Any] = []
        self._greeted = False
        self._pending: list[bytes] = []
        self.ready = False
        self.identity = b""
        """The routing identity the peer's READY announced (empty: none)."""
        self.paused = False
        """Set while the transport's write buffer is full: PINGs are then not answered."""
        write(GREETING + ready(socket_type, identity))

    # -- sending -----------------------------------------------------------------------------

    def send(self, frames: Iterable[Any]) -> None:
        """Send one multipart message (after the handshake: until then it waits).

        Small frames go out joined in one write; a large frame's buffer is written as it is.
        """
        chunks = encode(list(frames))
        if not self.ready:
            self._pending.append(b"".join(chunks))
            return
        small: list[Any] = []
        for chunk in chunks:
            if memoryview(chunk).nbytes < LARGE_FRAME:
                small.append(chunk)
                continue
            if small:
                self._write(b"".join(small))
                small = []
            self._write(chunk)
        if small:
            self._write(b"".join(small))

    # -- receiving ---------------------------------------------------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes from the peer go: a large frame's own buffer, or the scratch
        buffer."""
        if self._large is not None:
            if self._large_filled == len(self._large):  # grow (no view of it is held between reads)
                self._large.extend(
                    bytes(min(len(self._large), self._large_size - len(self._large)))
                )
            return memoryview(self._large)[self._large_filled :]
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end > self._read_size - self._large_frame:
            # keep room: move the unparsed tail to the front
            tail = self._end - self._start
            # copied first: the ranges overlap
            self._scratch[:tail] = bytes(self._view[self._start : self._end])
            self._start, self._end = 0, tail
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` more bytes are in the buffer :meth:`get_buffer` gave; raise
        :class:`ChannelProtocolError` when they break ZMTP."""
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled < self._large_size:
                return
            frame, self._large = self._large, None
            self._take(frame, self._large_more)
        else:
            self._end += nbytes
        self._parse()

    def feed(self, data: Any) -> None:
        """Take bytes from the peer (any buffer); raise :class:`ChannelProtocolError` when they
        break ZMTP."""
        view = memoryview(data).cast("B")
        while view:
            with self.get_buffer(len(view)) as target:
                count = min(len(target), len(view))
                target[:count] = view[:count]
            self.buffer_updated(count)
            view = view[count:]

    def _parse(self) -> None:  # noqa: C901
        view = self._view
        while self._large is None:
            start, available = self._start, self._end - self._start
            if not self._greeted:
                if available < GREETING_SIZE:
                    return
                greeting = view[start : start + GREETING_SIZE]
                if (
                    greeting[0] != 0xFF
                    or greeting[9] != 0x7F
                    or greeting[10] < 3
                    or greeting[12:16] != b"NULL"
                ):
                    raise ChannelProtocolError(
                        "the peer did not greet as a ZMTP 3 NULL-mechanism socket"
                    )
                self._greeted = True
                self._start += GREETING_SIZE
                continue
            if available < 2:
                return
            flags = view[start]
            if flags & LONG:
                if available < 9:
                    return
                size = _LONG_SIZE.unpack_from(view, start + 1)[0]
                body = start + 9
            else:
                size = view[start + 1]
                body = start + 2
            if flags & COMMAND:
                if size > MAX_COMMAND_BYTES:
                    raise ChannelProtocolError(f"a command of {size} bytes")
                if self._end < body + size:
                    return
                self._start = body + size
                self._command(bytes(view[body : body + size]))
                continue
            if not self.ready:
                raise ChannelProtocolError("the peer sent a message before READY")
            if len(self._frames) >= MAX_FRAMES:
                raise ChannelProtocolError(f"a message of more than {MAX_FRAMES} frames")
            self._message_bytes += size + FRAME_OVERHEAD
            if self._message_bytes > self._max:
                raise ChannelProtocolError(f"a message over {self._max // 2**20} MiB")
            more = bool(flags & MORE)
            if size >= self._large_frame:
                have = min(self._end - body, size)
                frame = bytearray(max(have, min(size, GROW_FROM)))
                frame[:have] = view[body : body + have]
                self._start = body + have
                if have < size:
                    self._large, self._large_size, self._large_filled, self._large_more = (
                        frame,
                        size,
                        have,
                        more,
                    )
                    return
                self._take(frame, more)
                continue
            if self._end < body + size:
                # counted again once the frame is whole
                self._message_bytes -= size + FRAME_OVERHEAD
                return
            self._start = body + size
            self._take(bytes(view[body : body + size]), more)

    def _take(self, frame: Any, more: bool) -> None:
        self._frames.append(frame)
        if not more:
            frames, self._frames, self._message_bytes = self._frames, [], 0
            self._on_message(frames)

    def _command(self, body: bytes) -> None:
        name = body[1 : 1 + body[0]] if body else b""
        if name == b"READY":
            self.identity = _property(body[1 + body[0] :], b"Identity")
            self.ready = True
            pending, self._pending = self._pending, []
            if pending:
                self._write(b"".join(pending))
            if self._on_ready is not None:
                self._on_ready()
        elif name == b"PING" and not self.paused:  # a peer that does not read gets no PONGs
            context = body[1 + body[0] + 2 :][:MAX_PING_CONTEXT]
            self._write(command(b"PONG", context))
        elif name == b"ERROR":
            reason = body[1 + body[0] + 1 :].decode(errors="replace")
            raise ChannelProtocolError(f"the peer refused the connection: {reason}")
