"""The launcher's client side: the five channels a Jupyter client connects to, relayed to a kernel link.

The front binds the channels named in the client's connection file and relays messages, not
bytes: a client message is checked against the client's key and handed to the link, which signs
it with the kernel's own key; a kernel message, checked by the link against the kernel's key,
passes through the :class:`OutputPolicy` and is signed with the client's key. Routing identities
are kept as ``zmq.proxy`` keeps them, so replies and ``input_request`` find their client.

A backend plugs in as a :class:`KernelLink`: the Docker link is one; any other sandbox that can
carry Jupyter messages (an OpenSandbox relay, say) is another.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

import zmq

from ..errors import KernelLaunchError

DELIM = b"<IDS|MSG>"
REQUEST_CHANNELS = ("shell", "control", "stdin")
CHANNELS = (*REQUEST_CHANNELS, "iopub", "hb")
PROTOCOL_VERSION = "5.4"
Frames = Sequence[bytes]
"""A multipart message, one bytes object per frame."""

log = logging.getLogger("kernel_sandbox.launch")


class Signer:
    """HMAC signatures of Jupyter messages with one key (an empty key signs nothing, as in Jupyter)."""

    def __init__(self, key: bytes, scheme: str = "hmac-sha256") -> None:
        algorithm = scheme.partition("hmac-")[2]
        if not scheme.startswith("hmac-") or algorithm not in hashlib.algorithms_available:
            raise KernelLaunchError(f"unsupported signature_scheme {scheme!r}; use hmac-sha256")
        self._hmac = hmac.new(key, digestmod=algorithm) if key else None

    def sign(self, parts: Frames) -> bytes:
        """The hex signature of a message's header, parent header, metadata and content."""
        if self._hmac is None:
            return b""
        digest = self._hmac.copy()
        for part in parts[:4]:
            digest.update(part)
        return digest.hexdigest().encode()

    def verify(self, signature: Any, parts: Frames) -> bool:
        """True when ``signature`` is this key's signature of ``parts``."""
        return self._hmac is None or hmac.compare_digest(bytes(signature), self.sign(parts))


def unpack(frames: Frames, signer: Signer, sender: str) -> tuple[list[bytes], list[bytes]] | None:
    """Routing identities and parts of a message signed by ``signer``; None (logged) for anything else."""
    message = split(frames)
    if message is None:
        return None
    idents, signature, parts = message
    if not signer.verify(signature, parts):
        log.warning("dropped a message with a bad signature from the %s", sender)
        return None
    return idents, parts


def split(frames: Frames) -> tuple[list[bytes], bytes, list[bytes]] | None:
    """Routing identities, signature and the parts after it; None when there is no delimiter."""
    for index, frame in enumerate(frames):
        if frame == DELIM:
            if len(frames) < index + 6:
                return None
            return list(frames[:index]), frames[index + 1], list(frames[index + 2 :])
    return None


class OutputPolicy:
    """What may reach the client from the kernel. This one lets everything through.

    :attr:`message_types` names the message types whose content :meth:`filter` wants to see;
    the front parses the content of those only, so a flood of other messages stays cheap.
    """

    message_types: frozenset[str] = frozenset()

    def filter(
        self, channel: str, msg_type: str, header: dict[str, Any], content: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The content to send on (maybe changed), or None to drop the message."""
        return content


@dataclass(frozen=True)
class ExitStatus:
    """How a kernel ended: the launcher's exit code, the reason in words, and the error's class name."""

    code: int
    reason: str
    error: str = ""


class KernelLink(Protocol):
    """The kernel side of a launcher: starts the kernel and carries its messages.

    ``start`` returns once the kernel answers; from then on the link calls
    :meth:`Front.from_kernel` and :meth:`Front.heartbeat_reply` with what the kernel sends.
    """

    async def start(self, front: Front) -> None:
        """Start the kernel (the sandbox with it) and connect to it; raise with the reason on failure."""

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """Send a client message (already verified, unsigned parts) to the kernel."""

    def heartbeat(self, frames: list[Any]) -> None:
        """Pass a heartbeat ping to the kernel; its echo comes back through ``heartbeat_reply``."""

    async def interrupt(self) -> None:
        """Interrupt the running cell (SIGINT to the kernel)."""

    async def ended(self) -> ExitStatus:
        """Wait until the kernel has ended, and say how."""

    async def stop(self) -> None:
        """End the kernel and remove its sandbox; safe to call at any time, twice too."""


class Reader:
    """Drain a ZMQ socket from the event loop whenever it has messages, a batch at a time."""

    BATCH = 64

    def __init__(self, name: str, sock: zmq.Socket[Any], handle: Callable[[list[Any]], None]) -> None:
        self.name = name
        self.sock = sock
        self._handle = handle
        self._loop = asyncio.get_running_loop()
        self._scheduled = False
        self.paused = False
        self._loop.add_reader(sock.FD, self._drain)
        self.kick()

    def kick(self) -> None:
        """Drain soon: call after sending on the socket, whose file descriptor only signals edges."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def send(self, frames: list[Any]) -> None:
        """Send ``frames`` without blocking (a full queue drops them, as ZMQ's own relays do)."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a message: the %s queue is full", self.name)
        self.kick()

    def pause(self, paused: bool) -> None:
        """Stop taking messages while ``paused`` (they wait in ZMQ's bounded queues), resume after."""
        self.paused = paused
        if not paused:
            self.kick()

    def _drain(self) -> None:
        self._scheduled = False
        if self.sock.closed or self.paused:
            return
        for _ in range(self.BATCH):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(frames)
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
        return cls(
            transport=transport,
            ip=str(info.get("ip", "127.0.0.1")),
            ports=ports,
            key=key.encode() if isinstance(key, str) else bytes(key),
            signature_scheme=str(info.get("signature_scheme", "hmac-sha256")),
        )

    def address(self, channel: str) -> str:
        """The ZMQ address the client expects ``channel`` at."""
        if self.transport == "ipc":
            return f"ipc://{self.ip}-{self.ports[channel]}"
        return f"tcp://{self.ip}:{self.ports[channel]}"


class Front:
    """Bind the client's channels and relay them to a :class:`KernelLink`."""

    def __init__(self, connection: Connection, policy: OutputPolicy | None = None) -> None:
        self.connection = connection
        self.policy = policy or OutputPolicy()
        self._signer = Signer(connection.key, connection.signature_scheme)
        self._session = uuid.uuid4().hex
        self._context = zmq.Context()
        self._readers: dict[str, Reader] = {}
        self._link: KernelLink | None = None
        self._kernel_ready = False

    def bind(self) -> None:
        """Bind the five channels where the connection file says; raise naming the one that failed."""
        kinds = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER, "iopub": zmq.XPUB, "hb": zmq.ROUTER}
        handlers = {"iopub": self._subscribed, "hb": self._ping}
        for channel, kind in kinds.items():
            sock = self._context.socket(kind)
            sock.linger = 1000
            if kind == zmq.XPUB:
                sock.setsockopt(zmq.XPUB_VERBOSE, 1)
            address = self.connection.address(channel)
            try:
                sock.bind(address)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                self.close()
                raise KernelLaunchError(f"cannot listen on {address} for the {channel} channel: {exc}") from exc
            handler = handlers.get(channel) or self._request_handler(channel)
            self._readers[channel] = Reader(f"client {channel}", sock, handler)

    def attach(self, link: KernelLink) -> None:
        """Relay to ``link`` from now on (client messages before this are dropped)."""
        self._link = link

    def _request_handler(self, channel: str) -> Callable[[list[Any]], None]:
        def handle(frames: list[Any]) -> None:
            message = unpack(frames, self._signer, f"client on {channel}")
            if message is not None and self._link is not None:
                self._link.send(channel, *message)

        return handle

    def _ping(self, frames: list[Any]) -> None:
        if self._link is not None and self._kernel_ready:
            self._link.heartbeat(frames)
        else:
            self.heartbeat_reply(frames)

    def kernel_ready(self) -> None:
        """From now on heartbeats go to the kernel, so a hung kernel looks dead.

        Until then the launcher answers them itself: it is alive and starting the kernel, and a
        client that gives up on a silent heartbeat after a second should not give up on a container.
        """
        self._kernel_ready = True

    def throttle(self, channel: str, paused: bool) -> None:
        """Hold the client's messages on ``channel`` while the kernel cannot take more."""
        reader = self._readers.get(channel)
        if reader is not None:
            reader.pause(paused)

    def heartbeat_reply(self, frames: list[Any]) -> None:
        """Send the kernel's heartbeat echo back to the client that pinged."""
        self._readers["hb"].send(frames)

    def _subscribed(self, frames: list[Any]) -> None:
        """Greet each new IOPub subscription with ``iopub_welcome`` (JEP 65), as ipykernel 7 does."""
        event = bytes(frames[0])
        if not event or event[0] != 1:
            return
        topic = event[1:]
        header = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": "iopub_welcome",
            "username": "kernel",
            "session": self._session,
            "date": datetime.now(timezone.utc).isoformat(),
            "version": PROTOCOL_VERSION,
        }
        parts = [_dumps(header), b"{}", b"{}", _dumps({"subscription": topic.decode(errors="replace")})]
        self._readers["iopub"].send([*([topic] if topic else []), DELIM, self._signer.sign(parts), *parts])

    def from_kernel(self, channel: str, idents: list[bytes], parts: list[bytes]) -> None:
        """Pass a kernel message (verified by the link) through the policy to the clients.

        The header is parsed only when the policy looks at some message types, or to recognise the
        kernel's ``iopub_welcome`` to the link's own subscription; the content only for those types.
        """
        if self.policy.message_types or (channel == "iopub" and b"iopub_welcome" in parts[0]):
            header = json.loads(parts[0])
            msg_type = header.get("msg_type", "")
            if channel == "iopub" and msg_type == "iopub_welcome":
                return
            if msg_type in self.policy.message_types:
                content = self.policy.filter(channel, msg_type, header, json.loads(parts[3]))
                if content is None:
                    return
                parts = [*parts[:3], _dumps(content), *parts[4:]]
        self._readers[channel].send([*idents, DELIM, self._signer.sign(parts), *parts])

    def close(self) -> None:
        """Close every channel."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        self._context.term()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
