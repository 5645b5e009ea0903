"""One kernel channel's stream with ZMTP spoken through it: an exec stream running the connector
(demultiplexed, the engine's error text told apart from the connector's :data:`HELLO`), or a
socket in the container's network namespace."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from ..errors import ChannelProtocolError
from ..kernelside.connector import HELLO
from ..launch.front import ExitStatus
from ..launch.messages import REQUEST_CHANNELS
from ..launch.zmtp import READ_SIZE, SUBSCRIBE_ALL, ZmtpPeer
from .exec_stream import Demux

log = logging.getLogger("kernel_sandbox.launch")

ROUTING_ID = b"kernel-sandbox-launcher"
"""One routing id for the shell, control and stdin sockets, so ipykernel's stdin requests reach
us."""
ENGINE_TEXT_BYTES = 1000
"""Bytes of the engine's own error text (an exec that could not start) kept for the log."""


class StreamOwner(Protocol):
    """What a :class:`ChannelStream` tells its link (:class:`.channels.ChannelLink`)."""

    def _channel_open(self, channel: ChannelStream) -> None: ...

    def _channel_lost(self, channel: ChannelStream) -> None: ...

    def _from_kernel(self, channel: str, frames: list[bytes]) -> None: ...

    def _broken(self, status: ExitStatus) -> None: ...

    def _throttle(self, channel: str, paused: bool) -> None: ...


class ChannelStream(asyncio.BufferedProtocol):
    """One kernel channel with ZMTP spoken through it: an exec stream (demultiplexed) or a socket.

    A socket is read straight into the ZMTP peer's buffers; an exec stream into a scratch
    buffer whose payloads the demultiplexer passes on, from the connector's :data:`HELLO` on:
    bytes before it are the engine's error text (the exec could not start), kept for the log.
    """

    def __init__(self, link: StreamOwner, name: str, *, multiplexed: bool = True) -> None:
        self.link = link
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.peer: ZmtpPeer | None = None
        self.opened = 0.0
        self._demux = Demux(self._from_kernel, self._stderr) if multiplexed else None
        self._scratch = memoryview(bytearray(READ_SIZE)) if multiplexed else None
        self._hello: bytearray | None = bytearray() if multiplexed else None
        self.engine_text: bytes | None = None
        """What the engine wrote in place of the connector (it could not start it), if it did."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.opened = time.monotonic()
        kind = b"SUB" if self.name == "iopub" else b"DEALER"
        identity = ROUTING_ID if self.name in REQUEST_CHANNELS else b""
        self.peer = ZmtpPeer(kind, transport.write, self._message, identity=identity)
        if kind == b"SUB":
            self.peer.send([SUBSCRIBE_ALL])
        self.link._channel_open(self)

    def send(self, frames: list[Any]) -> None:
        assert self.peer is not None
        self.peer.send(frames)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._scratch is not None:
            return self._scratch
        assert self.peer is not None
        return self.peer.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        assert self.peer is not None
        try:
            if self._demux is not None:
                assert self._scratch is not None  # made with the demultiplexer
                self._demux.feed(self._scratch[:nbytes])
            else:
                self.peer.buffer_updated(nbytes)
        except ChannelProtocolError as exc:
            self.link._broken(
                ExitStatus(1, f"the kernel broke its {self.name} channel ({exc}); it was stopped")
            )
            if self.transport is not None:
                self.transport.abort()  # the connector's stdin closes: it ends the kernel

    def _from_kernel(self, data: memoryview) -> None:
        assert self.peer is not None
        if self._hello is not None:
            if self.engine_text is not None:
                self.engine_text += bytes(data[: ENGINE_TEXT_BYTES - len(self.engine_text)])
                return
            need = len(HELLO) - len(self._hello)
            self._hello += data[:need]
            if not HELLO.startswith(self._hello):
                self.engine_text, self._hello = bytes(self._hello), bytearray()
                self._from_kernel(data[need:])
                return
            if len(self._hello) < len(HELLO):
                return
            self._hello, data = None, data[need:]
        self.peer.feed(data)

    def _message(self, frames: list[Any]) -> None:
        try:
            self.link._from_kernel(self.name, frames)
        except Exception:  # whatever the kernel sent: one message is lost, never the channel
            log.exception(
                "dropped a message from the kernel's %s channel: relaying it failed", self.name
            )

    def _stderr(self, data: memoryview) -> None:
        log.debug("%s connector: %s", self.name, bytes(data[:500]).decode(errors="replace").strip())

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._channel_lost(self)

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.paused = True
        self.link._throttle(self.name, True)

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.paused = False
        self.link._throttle(self.name, False)
