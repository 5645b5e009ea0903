"""The launcher's client side: the five channels a Jupyter client connects to, relayed to a kernel
link.

The front binds the channels named in the client's connection file and relays messages, not
bytes: a client message is checked against the client's key and handed to the link, which signs
it with the kernel's own key; a kernel message, checked by the link against the kernel's key,
passes through the output policy (:class:`OutputPolicy`) on every channel
and is signed with the client's key. Routing identities are kept as ``zmq.proxy`` keeps them, so
replies and ``input_request`` find their client.

The policy sees a message (header, parent header, metadata and content) when
:meth:`OutputPolicy.inspects` says it may change it; each part it leaves untouched goes on as the
kernel's original bytes. Large contents (HTML
tables: nh3 cleans ~10 MB/s) are filtered in a thread, so heartbeats, control replies and the
other channels never wait behind them.

A backend plugs in as a :class:`KernelLink`: the Docker link is one; any other sandbox that can
carry Jupyter messages (an OpenSandbox relay, say) is another. The messages' wire format is
:mod:`.messages`; the client's sockets, :mod:`.sockets`; the delivery of the kernel's messages to
the clients, in order and with bounded holding, :mod:`.delivery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from ..errors import KernelLaunchError
from ..metrics import Usage, usage_reply
from ..policy.output import OutputPolicy
from ..privdir import LAUNCHER_LOCK, PrivateDir
from .delivery import Delivery
from .gate import TcpGate
from .messages import (
    DELIM,
    Signer,
    dumps,
    filter_parts,
    launcher_note,
    msg_type_of,
    parse_part,
    unpack,
)
from .sockets import KINDS, Connection, Reader, client_socket
from .wire import new_header

ERROR_TEXT_BYTES = 4096
"""Bytes of a kernel error's content kept to explain it (see
:func:`kernel_sandbox.metrics.near_misses`)."""
LIMITS_INTERVAL = 0.5
"""Seconds between two readings of the limits the kernel hit (its cgroup, on Docker): however many
errors and idle statuses the kernel publishes, the launcher reads them at most once per interval
(see :meth:`Front._watch_errors`)."""
LISTEN_BACKLOG = 128
"""Connections an IPC channel's listening socket queues (ZMQ's own default, ``ZMQ_BACKLOG``)."""
Answer = dict[str, Any] | Awaitable[dict[str, Any]]
"""What a launcher's own request handler returns: the reply's content, or an awaitable of it."""

log = logging.getLogger("kernel_sandbox.launch")


@dataclass(frozen=True)
class ExitStatus:
    """How a kernel ended: the launcher's exit code, the reason in words, and the error's class
    name."""

    code: int
    reason: str
    error: str = ""


class KernelLink(Protocol):
    """The kernel side of a launcher: starts the kernel and carries its messages.

    ``start`` returns once the kernel answers; from then on the link calls
    :meth:`Front.from_kernel` and :meth:`Front.heartbeat_reply` with what the kernel sends.
    """

    async def start(self, front: Front) -> None:
        """Start the kernel (the sandbox with it) and connect to it; raise with the reason on
        failure."""

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """Send a client message (already verified, unsigned parts) to the kernel."""

    def heartbeat(self, frames: list[Any]) -> None:
        """Pass a heartbeat ping to the kernel; its echo comes back through ``heartbeat_reply``."""

    def pause_reading(self, channel: str, paused: bool) -> None:
        """Stop (and resume) taking the kernel's messages on ``channel``: its clients cannot take
        more."""

    async def interrupt(self) -> None:
        """Interrupt the running cell (SIGINT to the kernel)."""

    async def ended(self) -> ExitStatus:
        """Wait until the kernel has ended, and say how."""

    async def stop(self) -> None:
        """End the kernel and remove its sandbox; safe to call at any time, twice too."""

    def usage(self) -> Usage | None:
        """The sandbox's usage now, read by the host (None where it cannot be)."""

    def limits_hit(self, error_text: str = "") -> list[str]:
        """The limits the kernel ran into since this was last asked, read by the host (say,
        pids_limit); ``error_text`` is the error being explained (see
        :func:`kernel_sandbox.metrics.near_misses`)."""


class Front:
    """Bind the client's channels and relay them to a :class:`KernelLink`."""

    def __init__(self, connection: Connection, policy: OutputPolicy) -> None:
        self.connection = connection
        self.policy = policy
        self._loop = asyncio.get_running_loop()
        self._signer = Signer(connection.key, connection.signature_scheme)
        self._session = uuid.uuid4().hex
        self._context = zmq.Context()
        self._readers: dict[str, Reader] = {}
        self._delivery = Delivery(policy, self._signer, self._readers, self._pause, self._header)
        self._link: KernelLink | None = None
        self._kernel_ready = False
        self._gates: list[TcpGate] = []
        self._listeners: dict[str, socket.socket] = {}
        self._handlers: dict[str, Callable[[list[Any]], None]] = {}
        self.subscriptions = 0
        """IOPub subscriptions received (a client's SUB socket makes one each time it connects)."""
        self._gate_dir: PrivateDir | None = None
        self.requests: dict[str, Callable[[Any], Answer]] = {"usage_request": self._usage}
        """Control messages the launcher answers itself, by ``msg_type`` (``x_request`` →
        ``x_reply``; a handler may answer later, with an awaitable): only a client holding the
        connection key can send them; the kernel never sees them."""
        self.watchers: list[Callable[[str, list[bytes], list[bytes]], bool]] = []
        """Called with each verified kernel message before anything else sees it; one that returns
        True has taken it (the launcher's own exchange with the kernel, :mod:`.sleep`)."""
        self.kernel_requests: dict[str, Callable[[Any, Any], None]] = {}
        """IOPub messages of the kernel's addressed to the launcher, by ``msg_type``
        (:mod:`.checkpoints`): their content and parent header are handed to their handler, never
        to a client."""
        self.client_shell: list[Callable[[list[bytes]], None]] = []
        """Called with the parts of each shell message a client signed, before the kernel has it
        (what a client asked for, so that a kernel's request can be told from its forgery)."""
        self._notice: str | None = None
        self._failed: tuple[bytes, str] | None = None
        """The parent header and text of the last error published, until its request goes idle."""
        self._limits_due: tuple[list[bytes], bytes, str] | None = None
        """The failed request(s) the next reading of the limits explains: identities, parent
        header and error text."""
        self._limits_read = -LIMITS_INTERVAL
        self._limits_timer: asyncio.TimerHandle | None = None
        self._holding_idle = False
        """True while IOPub is held for the timer's reading (see :meth:`_watch_errors`)."""
        self._answering: set[asyncio.Future[None]] = set()

    def bind(self, adopted: dict[str, int] | None = None) -> None:
        """Bind the five channels where the connection file says; raise naming the one that failed.

        Every socket is bounded (:func:`.sockets.client_socket`); past its queue the channel's
        messages are held up to :data:`~.delivery.HELD_BYTES` (:mod:`.delivery`), so the launcher
        holds a bounded amount per channel whatever the kernel sends and however slowly clients
        read. On TCP the ports admit this user's own processes only (:mod:`.gate`); the ZMQ
        sockets then sit in a private directory. The listening sockets are the launcher's own
        (IPC ones given to ZMQ, ``ZMQ_USE_FD``), so that they outlive an exec: ``adopted`` are
        those of the launcher before it (:mod:`.dormant`), by channel.
        """
        if self.connection.transport == "tcp":
            self._gate_dir = PrivateDir.create()
            self._gate_dir.hold(LAUNCHER_LOCK)  # not abandoned while the launcher runs
        handlers = {"iopub": self._subscribed, "hb": self._ping}
        for channel in KINDS:
            sock = client_socket(self._context, channel)
            address = self.connection.address(channel)
            fd = (adopted or {}).get(channel)
            try:
                if self._gate_dir is None:
                    listener = _unix_listener(address, fd)
                    sock.setsockopt(zmq.USE_FD, os.dup(listener.fileno()))
                    self._listeners[channel] = listener
                    sock.bind(address)
                else:
                    sock.bind(self._gate_dir.ipc(channel))
                    gate = TcpGate(
                        channel,
                        self.connection.ip,
                        self.connection.ports[channel],
                        self._gate_dir / channel,
                        None if fd is None else socket.socket(fileno=fd),
                    )
                    self._gates.append(gate)
                    self._listeners[channel] = gate.listener
            except (zmq.ZMQError, KernelLaunchError, OSError) as exc:
                sock.close(linger=0)
                self.close()
                if isinstance(exc, KernelLaunchError):
                    raise
                raise KernelLaunchError(
                    f"cannot listen on {address} for the {channel} channel: {exc}"
                ) from exc
            handler = handlers.get(channel) or self._request_handler(channel)
            self._handlers[channel] = handler
            self._readers[channel] = Reader(f"client {channel}", sock, handler)

    def input_waiting(self) -> bool:
        """Whether a client's message waits in a channel's queue, not read yet."""
        return any(
            int(reader.sock.get(zmq.EVENTS)) & zmq.POLLIN for reader in self._readers.values()
        )

    def answering(self) -> bool:
        """Whether a launcher's own request is being answered (its reply is yet to go), or other
        work given to :meth:`track` is under way."""
        return bool(self._answering)

    def track(self, work: asyncio.Future[None]) -> None:
        """Count ``work`` as an answer under way until it is done (cancelled at :meth:`close`)."""
        self._answering.add(work)
        work.add_done_callback(self._answering.discard)

    def listener_fds(self) -> dict[str, int]:
        """The listening sockets' descriptors, by channel (for :mod:`.dormant`)."""
        return {channel: listener.fileno() for channel, listener in self._listeners.items()}

    def gate_dir(self) -> PrivateDir | None:
        """The private directory of the ZMQ sockets behind the TCP ports (None: IPC)."""
        return self._gate_dir

    async def clients_back(self, subscribers: int, timeout: float) -> None:
        """After an exec (:mod:`.dormant`): wait until ``subscribers`` IOPub subscriptions came
        back (at most ``timeout`` s), and until then hold replies to clients not yet reconnected
        rather than drop them."""
        deadline = self._loop.time() + timeout
        for reader in self._readers.values():
            reader.hold_unreachable_until = deadline
        while self.subscriptions < subscribers and self._loop.time() < deadline:
            await asyncio.sleep(0.02)

    def replay(self, channel: str, frames: list[bytes]) -> None:
        """Handle ``frames`` as if the channel's socket had just received them."""
        self._handlers[channel](frames)

    def attach(self, link: KernelLink) -> None:
        """Relay to ``link`` from now on (client messages before this are dropped)."""
        self._link = link

    def _request_handler(self, channel: str) -> Callable[[list[Any]], None]:
        def handle(frames: list[Any]) -> None:
            message = unpack(frames, self._signer, f"client on {channel}")
            if message is None or self._link is None:
                return
            if channel == "control" and self._answer(*message):
                return
            if channel == "shell":
                for listener in self.client_shell:
                    listener(message[1])
            self._link.send(channel, *message)
            if self._notice is not None and channel == "shell":
                self._tell_first_cell(*message)

        return handle

    def _answer(self, idents: list[bytes], parts: list[bytes]) -> bool:
        """Answer a control request addressed to the launcher (see :attr:`requests`); False for any
        other."""
        msg_type = msg_type_of(parts[0])
        handler = self.requests.get(msg_type or "")
        if handler is None or msg_type is None:
            return False
        try:
            content = handler(parse_part(parts[3]))
        except Exception as exc:  # a bad request is answered, never fatal
            log.exception("the launcher could not answer a %s", msg_type)
            content = {"status": "error", "evalue": str(exc)[:500]}
        if isinstance(content, dict):
            self._reply(idents, parts, msg_type, content)
        else:
            self.track(asyncio.ensure_future(self._reply_later(idents, parts, msg_type, content)))
        return True

    async def _reply_later(
        self,
        idents: list[bytes],
        parts: list[bytes],
        msg_type: str,
        answer: Awaitable[dict[str, Any]],
    ) -> None:
        try:
            content = await answer
        except Exception as exc:  # a bad request is answered, never fatal
            log.exception("the launcher could not answer a %s", msg_type)
            content = {"status": "error", "evalue": str(exc)[:500]}
        if self._readers:
            self._reply(idents, parts, msg_type, content)

    def _reply(
        self, idents: list[bytes], parts: list[bytes], msg_type: str, content: dict[str, Any]
    ) -> None:
        reply_type = msg_type[: -len("_request")] + "_reply"
        reply = [self._header(reply_type), bytes(parts[0]), b"{}", dumps(content)]
        if not self._readers["control"].send([*idents, DELIM, self._signer.sign(reply), *reply]):
            log.warning("dropped a %s: the client does not read its control channel", reply_type)

    def reply(
        self,
        channel: str,
        idents: list[bytes],
        parent: bytes,
        reply_type: str,
        content: dict[str, Any],
    ) -> None:
        """Send a reply of the launcher's own to a client's request (its header ``parent``)."""
        parts = [self._header(reply_type), parent, b"{}", dumps(content)]
        self.from_kernel(channel, idents, parts)

    def reply_content(self, channel: str, reply_type: str, content: dict[str, Any]) -> str:
        """A reply's content as the output policy lets clients see it (JSON text), to be sent
        later without the launcher (:mod:`.dormant`)."""
        parts = [self._header(reply_type), b"{}", b"{}", dumps(content)]
        filtered = filter_parts(self.policy, channel, reply_type, parts)
        return bytes(filtered[3]).decode() if filtered is not None else "{}"

    def publish(self, parent: bytes, msg_type: str, content: dict[str, Any]) -> None:
        """Publish a message of the launcher's own on IOPub (a status, say), child of ``parent``."""
        self.from_kernel("iopub", [], [self._header(msg_type), parent, b"{}", dumps(content)])

    def notice_next_cell(self, text: str) -> None:
        """Show ``text`` (on stderr, marked as the launcher's) in the next cell a client runs."""
        self._notice = text

    def _tell_first_cell(self, idents: list[bytes], parts: list[bytes]) -> None:
        if msg_type_of(parts[0]) != "execute_request" or self._notice is None:
            return
        text, self._notice = self._notice, None
        content = dumps(launcher_note(text))
        self.from_kernel("iopub", [], [self._header("stream"), bytes(parts[0]), b"{}", content])

    def _usage(self, content: Any) -> dict[str, Any]:
        """Answer jupyter-resource-usage's ``usage_request`` from the host's reading of the
        cgroup."""
        assert self._link is not None
        return usage_reply(self._link.usage())

    def _header(self, msg_type: str) -> bytes:
        """The header of a message the launcher itself sends."""
        return dumps(new_header(msg_type, self._session))

    def _watch_errors(self, idents: list[bytes], parts: list[bytes]) -> bool:
        """Note a kernel error; when its request goes idle, a stderr note in the same cell for each
        limit the host saw the kernel hit (:meth:`KernelLink.limits_hit`).

        The limits are read at most once per :data:`LIMITS_INTERVAL`, by a timer, however many
        errors and idle statuses the kernel publishes: a request that fails sooner after the last
        reading waits for the timer, its idle status held (and IOPub behind it) so that the notes
        still come first; requests that fail meanwhile share that reading. True when the idle
        status passed here is held.
        """
        header = parts[0]
        if b'"error"' in header and msg_type_of(header) == "error":
            self._failed = (
                bytes(parts[1]),
                bytes(parts[3][:ERROR_TEXT_BYTES]).decode(errors="replace"),
            )
            return False
        if not (
            self._failed is not None
            and b'"status"' in header
            and msg_type_of(header) == "status"
            and b'"idle"' in bytes(parts[3][:200])
        ):
            return False
        (parent, text), self._failed = self._failed, None
        if self._limits_due is not None:  # a reading is due already: it explains this one too
            first, parent, before = self._limits_due
            self._limits_due = (first, parent, (before + "\n" + text)[-ERROR_TEXT_BYTES:])
            return False
        self._limits_due = (idents, parent, text)
        wait = self._limits_read + LIMITS_INTERVAL - self._loop.time()
        if wait <= 0:
            self._read_limits()
            return False
        self._limits_timer = self._loop.call_later(wait, self._read_limits)
        if self._delivery.waiting("iopub"):  # held for a client already: the notes follow it
            return False
        self._holding_idle = True
        self._delivery.hold_back("iopub", idents, parts)
        return True

    def _read_limits(self) -> None:
        """Read the limits the kernel hit for the failed request(s) waiting, and put the notes
        ahead of what IOPub holds for the timer."""
        self._limits_timer = None
        if self._limits_due is None or self._link is None:
            return
        (idents, parent, text), self._limits_due = self._limits_due, None
        self._limits_read = self._loop.time()
        notes = []
        try:
            hits = self._link.limits_hit(text)
        except Exception:  # the notes are lost, never IOPub
            log.exception("could not read the limits the kernel hit")
            hits = []
        for hit in hits:
            log.warning("the kernel hit a limit: %s", hit)
            content = dumps(launcher_note(hit))
            notes.append([self._header("stream"), parent, b"{}", content])
        if not self._holding_idle:
            for parts in notes:
                self.from_kernel("iopub", idents, parts)
            return
        self._holding_idle = False
        self._delivery.release_after("iopub", [(idents, parts) for parts in notes])

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
        """Send the kernel's heartbeat echo back to the client that pinged (dropped if its queue is
        full)."""
        self._readers["hb"].send(frames)

    def _subscribed(self, frames: list[Any]) -> None:
        """Greet each new IOPub subscription with ``iopub_welcome`` (JEP 65), as ipykernel 7
        does."""
        event = bytes(frames[0])
        if not event or event[0] != 1:
            return
        self.subscriptions += 1
        topic = event[1:]
        parts = [
            self._header("iopub_welcome"),
            b"{}",
            b"{}",
            dumps({"subscription": topic.decode(errors="replace")}),
        ]
        self._readers["iopub"].send(
            [*([topic] if topic else []), DELIM, self._signer.sign(parts), *parts]
        )

    def from_kernel(self, channel: str, idents: list[bytes], parts: list[bytes]) -> None:
        """Pass a kernel message (verified by the link) through the output policy to the clients,
        in order and with bounded holding (:class:`.delivery.Delivery`), once the launcher's own
        watchers, the kernel's requests to the launcher and the limits' notes have seen it."""
        for watcher in self.watchers:
            if watcher(channel, idents, parts):
                return
        if (
            channel == "iopub"
            and self.kernel_requests
            and isinstance(parts[0], bytes)
            and b'"kernel_sandbox_' in parts[0]
        ):
            handler = self.kernel_requests.get(msg_type_of(parts[0]) or "")
            if handler is not None:
                handler(parse_part(bytes(parts[3])), parse_part(bytes(parts[1])))
                return
        if channel == "iopub" and self._link is not None and isinstance(parts[0], bytes):
            try:
                if self._watch_errors(idents, parts):
                    return  # held until the limits are read
            except Exception:  # the note is lost, never the kernel's message
                log.exception("could not read the limits the kernel hit")
        self._delivery.deliver(channel, idents, parts)

    def _pause(self, channel: str, paused: bool) -> None:
        """Stop (resume) reading a request channel from the kernel while its message waits."""
        if self._link is not None:
            self._link.pause_reading(channel, paused)

    def close(self) -> None:
        """Close every channel."""
        if self._limits_timer is not None:
            self._limits_timer.cancel()
        for task in self._answering:
            task.cancel()
        for gate in self._gates:
            gate.close()
        self._gates.clear()
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        self._context.term()
        for listener in self._listeners.values():
            if listener.family == socket.AF_UNIX:
                with contextlib.suppress(OSError):
                    os.unlink(listener.getsockname())
            listener.close()
        self._listeners.clear()
        if self._gate_dir is not None:
            self._gate_dir.remove()
            self._gate_dir = None


def _unix_listener(address: str, fd: int | None) -> socket.socket:
    """The listening socket of an ``ipc://`` address: ``fd``'s, or a new one (a file left at the
    path is replaced, as ZMQ replaces it)."""
    if fd is not None:
        return socket.socket(fileno=fd)
    path = address[len("ipc://") :]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(LISTEN_BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener
