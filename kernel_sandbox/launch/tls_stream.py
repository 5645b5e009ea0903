"""TLS over a pair of asyncio streams by memory BIOs, for the egress proxy's interception
(:mod:`.intercept`): the kernel's side (over a socket or the exec-stream relay) and the bound
host's (a socket read straight into the TLS object, :class:`_Feed`)."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from typing import cast

CHUNK = 64 * 1024
"""Plaintext taken from one side before it is sent on: small enough that the kernel decrypts one
chunk while the proxy decrypts the next (a 1 MiB download intercepted: +2.2 ms over the splice,
against +3.5 ms with 256 KiB chunks; bench/README.md)."""
RECEIVE_LIMIT = 128 * 1024
"""The most ciphertext a bound host's connection holds received and not yet decrypted
(:class:`_Feed`; it reads as much at once). The TLS object's BIO grows to about 4/3 of the most it
held, and malloc maps a buffer that large afresh for each connection: with 512 KiB, ~180 page
faults per intercepted MiB (measured), with 128 KiB none; 80 KiB costs more reads (+0.1 ms of CPU
per MiB)."""
MIN_RECEIVE = 4 * 1024
"""The least a socket read by :class:`_Feed` may take (the BIO may then hold this much more)."""
HANDSHAKE_TIMEOUT = 10.0


_received = threading.local()
"""Each thread's buffer that its feeds read sockets into (:meth:`_Feed.get_buffer`)."""


class _Feed(asyncio.BufferedProtocol):
    """A socket read straight into a TLS object's incoming memory BIO, in place of its
    connection's ``asyncio.StreamReader`` (whose protocol still serves the writing side: drain,
    close).

    The stream reader copied every byte twice more (into its buffer, out of it), and its buffer
    and each read's new bytes, hundreds of KiB that came and went with each answer, cost the proxy
    100 to 200 page faults per intercepted MiB in the benchmark (none here). The socket is read
    into the thread's one buffer and copied into the BIO in the same callback. The BIO holds at
    most about :data:`RECEIVE_LIMIT` bytes, so its own buffer stays small too: the socket is no
    longer read while that much waits (the TLS reader is held up by the kernel, which does not
    take what it is sent), and is again once half of it was decrypted."""

    def __init__(
        self, bio: ssl.MemoryBIO, transport: asyncio.Transport, streams: asyncio.Protocol
    ) -> None:
        self._streams, self._bio, self._transport = streams, bio, transport
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.ended = False
        """The connection ended: the BIO has its EOF."""
        transport.set_protocol(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer: memoryview | None = getattr(_received, "buffer", None)
        if buffer is None:
            buffer = _received.buffer = memoryview(bytearray(RECEIVE_LIMIT))
        return buffer[: max(MIN_RECEIVE, RECEIVE_LIMIT - self._bio.pending)]

    def buffer_updated(self, nbytes: int) -> None:
        self._bio.write(_received.buffer[:nbytes])
        waiting = self._waiter is not None and not self._waiter.done()
        if not waiting and not self._paused and self._bio.pending >= RECEIVE_LIMIT:
            # not when a reader waits: it decrypts them all now, and stopping the socket would
            # only cost a resume right after (two epoll_ctl calls per read of a long answer)
            self._paused = True
            self._transport.pause_reading()
        if waiting:
            assert self._waiter is not None
            self._waiter.set_result(None)

    def eof_received(self) -> bool | None:
        self._end()
        return self._streams.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self._streams.connection_lost(exc)  # the writer's drain() and close see it

    def pause_writing(self) -> None:
        self._streams.pause_writing()

    def resume_writing(self) -> None:
        self._streams.resume_writing()

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self._bio.write_eof()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def drained(self) -> None:
        """Read the socket again if it was stopped and half of what stopped it was decrypted."""
        if self._paused and self._bio.pending < RECEIVE_LIMIT // 2:
            self._paused = False
            self._transport.resume_reading()

    async def received(self) -> None:
        """Until more bytes are in the BIO, or its EOF."""
        self.drained()
        if self.ended:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class TlsStream:
    """TLS over a pair of asyncio streams by memory BIOs (so over the exec-stream relay's too).
    ``direct``: a socket's streams that nothing has read from yet, whose bytes then go straight
    to the TLS object (:class:`_Feed`), not through ``reader``."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        touch: Callable[[], None] = lambda: None,
        direct: bool = False,
    ) -> None:
        self.reader, self.writer, self.touch = reader, writer, touch
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._ended = False
        self._feed: _Feed | None = None
        if writer.get_extra_info("socket") is not None:
            # room for a chunk while the next one is decrypted (not the relay's own transport)
            writer.transport.set_write_buffer_limits(high=2 * CHUNK)
            transport = writer.transport
            streams = transport.get_protocol()  # the StreamReaderProtocol of reader and writer
            if direct and isinstance(transport, asyncio.Transport):
                if isinstance(streams, asyncio.Protocol):
                    self._feed = _Feed(self._in, transport, streams)
        self.tls = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def _call(self, op: Callable[..., object], *args: object) -> object:
        while True:
            try:
                result = op(*args)
            except ssl.SSLWantReadError:
                if self._feed is not None:
                    left = self._in.pending
                    await self._flush()
                    if self._in.pending == left:  # nothing came in while it flushed
                        await self._feed.received()
                    self.touch()
                    continue
                await self._flush()
                data = await self.reader.read(CHUNK)
                self.touch()
                if data:
                    self._in.write(data)
                else:
                    self._in.write_eof()
                continue
            await self._flush()
            return result

    async def handshake(self) -> None:
        """Do the TLS handshake (raises ssl.SSLError, e.g. a certificate that did not verify)."""
        await asyncio.wait_for(self._call(self.tls.do_handshake), HANDSHAKE_TIMEOUT)

    async def read(self) -> bytes:
        """Some plaintext: all that the bytes already received hold, up to :data:`CHUNK` (TLS
        gives one record, at most 16 KiB, at a time); b"" at the end (a close, clean or not)."""
        if self._ended:
            return b""
        try:
            data = await self._call(self.tls.read, CHUNK)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return b""
        assert isinstance(data, bytes)
        parts, size = [data], len(data)
        while size < CHUNK and data:
            try:
                data = self.tls.read(CHUNK - size)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._ended = True  # said at the next read, after what came before it
                break
            parts.append(data)
            size += len(data)
        if self._feed is not None:
            self._feed.drained()
        if self._out.pending:
            await self._flush()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_into(self, buffer: memoryview) -> int:
        """Like :meth:`read`, but the plaintext is decrypted straight into ``buffer`` (as much as
        it holds): how many bytes, 0 at the end. The body copy reuses one buffer for a whole
        answer, instead of a new bytes object per record and a join per chunk."""
        if self._ended or not buffer:
            return 0
        try:
            size = await self._call(self.tls.read, len(buffer), buffer)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return 0
        assert isinstance(size, int)
        while 0 < size < len(buffer):
            try:
                # with a buffer, read() returns a count (typeshed says bytes)
                got = cast(int, self.tls.read(len(buffer) - size, buffer[size:]))
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._ended = True  # said at the next read, after what came before it
                break
            if not got:
                break
            size += got
        if self._feed is not None:
            self._feed.drained()
        if self._out.pending:
            await self._flush()
        return size

    async def sent(self) -> None:
        """Until all that was written has left (the proxy cuts a connection once its relay ends,
        and a socket's transport dropped what it still held: the end of a long answer to a kernel
        that reads slower than the host sends)."""
        if self.writer.get_extra_info("socket") is not None:  # the relay's keeps it in order
            self.writer.transport.set_write_buffer_limits(high=0)
            try:
                await self.writer.drain()
            except ConnectionError:
                pass  # it is gone: nothing more to send

    async def write(self, data: bytes | memoryview) -> None:
        """Send ``data`` whole."""
        view = memoryview(data)
        while view:
            sent = await self._call(self.tls.write, view)
            assert isinstance(sent, int)
            view = view[sent:]
