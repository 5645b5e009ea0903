"""The client's side of the wire: where a client's connection file says to bind
(:class:`Connection`), and a ZMQ socket drained from the event loop (:class:`Reader`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from ..errors import ConfigError, KernelLaunchError
from .messages import CHANNELS
from .zmtp import LARGE_FRAME, MAX_MESSAGE_BYTES

log = logging.getLogger("kernel_sandbox.launch")

KINDS = {
    "shell": zmq.ROUTER,
    "control": zmq.ROUTER,
    "stdin": zmq.ROUTER,
    "iopub": zmq.XPUB,
    "hb": zmq.ROUTER,
}
"""The ZMQ socket type of each channel, as a kernel binds them (IOPub an XPUB, to see
subscriptions)."""

CLIENT_QUEUE = 16
"""Messages ZMQ queues per client and channel, each way (its default is 1000, of any size)."""
CLIENT_MAX_BYTES = MAX_MESSAGE_BYTES
"""The largest message a client may send (``ZMQ_MAXMSGSIZE``): libzmq drops the connection of a
client that announces more, before reading it (it would otherwise assemble it, unsigned, in
memory)."""


class Reader:
    """Drain a ZMQ socket from the event loop whenever it has messages, a batch at a time."""

    BATCH = 64

    def __init__(
        self, name: str, sock: zmq.Socket[Any], handle: Callable[[list[Any]], None]
    ) -> None:
        self.name = name
        self.sock = sock
        self._handle = handle
        self._loop = asyncio.get_running_loop()
        self._scheduled = False
        self.paused = False
        self.hold_unreachable_until = 0.0
        """Until then (loop time) a message for a client that is not connected waits for it
        (:meth:`.front.Front.clients_back`) instead of being dropped."""
        self._loop.add_reader(sock.FD, self._drain)
        self.kick()

    def kick(self) -> None:
        """Drain soon: call after sending on the socket, whose file descriptor only signals
        edges."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def send(self, frames: list[Any]) -> bool:
        """Send ``frames`` without blocking; False when the queue to the client is full (nothing
        sent).

        A message for a client that is gone is dropped (True). Large frames are not copied: ZMQ
        keeps a reference until they are sent.
        """
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            if self._loop.time() < self.hold_unreachable_until:
                return False
            log.debug("dropped a message for a client that is gone from %s", self.name)
        self.kick()
        return True

    def send_lossy(self, frames: list[Any]) -> None:
        """Send ``frames`` to the IOPub clients that have room, dropping it for those whose queue
        is full (libzmq's own way, ``XPUB_NODROP`` off for this one message)."""
        self.sock.setsockopt(zmq.XPUB_NODROP, 0)
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        finally:
            self.sock.setsockopt(zmq.XPUB_NODROP, 1)
        self.kick()

    def pause(self, paused: bool) -> None:
        """Stop taking messages while ``paused`` (they wait in ZMQ's bounded queues), resume
        after."""
        self.paused = paused
        if not paused:
            self.kick()

    def _drain(self) -> None:
        self._scheduled = False
        if self.sock.closed or self.paused:
            return
        for _ in range(self.BATCH):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._handle(
                [frame.buffer if len(frame) >= LARGE_FRAME else frame.bytes for frame in frames]
            )
        self.kick()

    def close(self) -> None:
        """Stop watching and close the socket."""
        if not self.sock.closed:
            self._loop.remove_reader(self.sock.FD)
            self.sock.close(linger=0)


@dataclass(frozen=True)
class Connection:
    """What a client's connection file says: where to bind and the client's key."""

    transport: str
    ip: str
    ports: dict[str, int]
    key: bytes
    signature_scheme: str

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Connection:
        """Read a connection file's content; refuse what a client could not have meant."""
        transport = info.get("transport", "tcp")
        if transport not in ("tcp", "ipc"):
            raise KernelLaunchError(f"connection file: transport {transport!r} is not tcp or ipc")
        try:
            ports = {name: int(info[f"{name}_port"]) for name in CHANNELS}
        except (KeyError, TypeError, ValueError) as exc:
            raise KernelLaunchError(f"connection file: missing or bad port ({exc})") from None
        key = info.get("key", "")
        key = (
            key.encode()
            if isinstance(key, str)
            else bytes(key)
            if isinstance(key, bytes | bytearray)
            else b""
        )
        if not key:
            raise ConfigError(
                "connection file: the key is empty, so the client would not sign its messages and "
                "any process that reaches a port could run code in the kernel; the launcher "
                "refuses unsigned channels. Let the client write a key (jupyter_client does by "
                "default: do not set Session.key to '')"
            )
        return cls(
            transport=transport,
            ip=str(info.get("ip", "127.0.0.1")),
            ports=ports,
            key=key,
            signature_scheme=str(info.get("signature_scheme", "hmac-sha256")),
        )

    def info(self) -> dict[str, Any]:
        """The connection file's content that :meth:`from_info` reads back to this connection."""
        return {
            "transport": self.transport,
            "ip": self.ip,
            **{f"{name}_port": port for name, port in self.ports.items()},
            "key": self.key.decode(),
            "signature_scheme": self.signature_scheme,
        }

    def address(self, channel: str) -> str:
        """The ZMQ address the client expects ``channel`` at."""
        if self.transport == "ipc":
            return f"ipc://{self.ip}-{self.ports[channel]}"
        return f"tcp://{self.ip}:{self.ports[channel]}"


def client_socket(context: zmq.Context[Any], channel: str) -> zmq.Socket[Any]:
    """A socket for ``channel``'s clients: it refuses messages over :data:`CLIENT_MAX_BYTES` and
    queues at most :data:`CLIENT_QUEUE` messages per client, each way.

    A ROUTER hands a client's routing id over to the newest connection that claims it
    (``ROUTER_HANDOVER``, as ipykernel sets it): jupyter_client names a client's shell, stdin and
    control sockets by its session, which a manager's clients share. Without it a client that
    connects before the ROUTER has seen its predecessor with that id go would be ignored: its
    requests never read, its kernel never answering.
    """
    kind = KINDS[channel]
    sock = context.socket(kind)
    sock.linger = 1000
    sock.setsockopt(zmq.MAXMSGSIZE, CLIENT_MAX_BYTES)
    sock.setsockopt(zmq.SNDHWM, CLIENT_QUEUE)
    sock.setsockopt(zmq.RCVHWM, CLIENT_QUEUE)
    if kind == zmq.XPUB:
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        sock.setsockopt(zmq.XPUB_NODROP, 1)
    else:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    return sock
