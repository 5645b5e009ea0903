"""The websocket bridge of the OpenSandbox link's ``websocket`` mode: the client's channels relayed
message for message to a kernel of the sandbox's own Jupyter server, over its websocket reached
through execd's ``/proxy/<port>/``.

The v1 wire format passes the client's parts through unparsed, so display data, comms and
widgets, ``input()``, completion and inspection work as on a Docker kernel. Routing identities
are kept by request id, so replies and ``input_request`` reach the client that asked; a lost
websocket is reopened with the same session id (the server replays what the kernel sent).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import OpenSandboxError, SandboxTimeoutError
from ..canonical import PROTOCOL_VERSION
from ..launch.messages import REQUEST_CHANNELS
from ..launch.front import ExitStatus, Front
from .events import REPLY_TRACEBACK_CHARS, capped_error
from .jupyter import JupyterServer, KernelSocket, dumps
from .settings import OpenSandboxSettings

log = logging.getLogger("kernel_sandbox.launch")

WAITING_LIMIT = 1000
"""Client messages kept while the kernel is not connected yet (ZMQ's own default queue size)."""
ROUTES_LIMIT = 4096
"""Requests remembered for routing their replies; the oldest are forgotten first."""
NO_REPLY = frozenset({"comm_open", "comm_msg", "comm_close", "input_reply"})
"""Client messages that get no reply: not remembered for routing."""
RECONNECT_ATTEMPTS = 5
RECONNECT_WINDOW = 60.0
"""More than RECONNECT_ATTEMPTS losses of the websocket within this many seconds end the kernel."""


class WebsocketBridge:
    """Bridge the client's channels to a kernel of the sandbox's Jupyter server, over its
    websocket."""

    def __init__(
        self,
        front: Front,
        jupyter: JupyterServer,
        settings: OpenSandboxSettings,
        end: Callable[[ExitStatus], None],
        running: asyncio.Event | None = None,
    ) -> None:
        self.front = front
        self.running = running or asyncio.Event()
        """Set while the sandbox is not paused: a websocket lost while it is paused is reopened
        after resume."""
        if running is None:
            self.running.set()
        self.jupyter = jupyter
        self.settings = settings
        self._end = end
        self.kernel_id: str | None = None
        self.session_id = uuid.uuid4().hex
        self.socket: KernelSocket | None = None
        self._routes: collections.OrderedDict[str, list[Any]] = collections.OrderedDict()
        self._last: dict[str, list[Any]] = {}
        self._probes: set[str] = set()
        """Ids of the launcher's own kernel_info requests: their replies are not the clients'."""
        self._probed: asyncio.Future[None] | None = None
        self._shutdown_ids: set[str] = set()
        self._closing = False
        self._reconnecting: asyncio.Future[None] | None = None
        self._losses: list[float] = []
        self._held: list[tuple[str, list[Any]]] = []

    @property
    def alive(self) -> bool:
        return self.socket is not None and not self.socket.closed

    async def start(self) -> None:
        """Start a kernel in the sandbox's Jupyter server, connect, and return once it answers."""
        await self.attach(await self.jupyter.start_kernel(self.settings.kernel_name))

    async def attach(self, kernel_id: str) -> None:
        """Connect to the server's kernel ``kernel_id`` and return once it answers."""
        self.kernel_id = kernel_id
        await self._connect()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ready_timeout
        while True:
            self._probed = loop.create_future()
            self._probe()
            try:
                await asyncio.wait_for(
                    asyncio.shield(self._probed), min(2.0, max(0.1, deadline - loop.time()))
                )
                return
            except asyncio.TimeoutError:
                if loop.time() >= deadline:
                    raise SandboxTimeoutError(
                        "the kernel of the sandbox's Jupyter server did not answer kernel_info "
                        f"within {self.settings.ready_timeout:g} s (ready_timeout)"
                    ) from None

    async def _connect(self) -> None:
        assert self.kernel_id is not None
        self.socket = await self.jupyter.connect(
            self.kernel_id,
            self.session_id,
            self._from_kernel,
            self._lost,
            max_message_size=self.settings.max_output_bytes,
        )
        log.debug("kernel websocket open (%s wire format)", self.socket.protocol)

    def _probe(self) -> None:
        assert self.socket is not None
        probe_id = uuid.uuid4().hex
        self._probes.add(probe_id)
        header = {
            "msg_id": probe_id,
            "msg_type": "kernel_info_request",
            "username": "kernel-sandbox",
            "session": self.session_id,
            "date": "",
            "version": PROTOCOL_VERSION,
        }
        self.socket.send("shell", [dumps(header), b"{}", b"{}", b"{}"])

    # -- client to kernel ------------------------------------------------------------------------

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """Remember where the request came from and pass it to the kernel unchanged."""
        if channel in REQUEST_CHANNELS:
            try:
                header = json.loads(parts[0])
                msg_id, msg_type = str(header["msg_id"]), str(header["msg_type"])
            except (ValueError, KeyError, TypeError, RecursionError):
                log.warning("dropped a %s message without a readable header", channel)
                return
            self._last[channel] = idents
            if msg_type not in NO_REPLY:
                self._routes[msg_id] = idents
                if len(self._routes) > ROUTES_LIMIT:
                    self._routes.popitem(last=False)
            if msg_type == "shutdown_request":
                self._shutdown_ids.add(msg_id)
        if self.socket is None or self.socket.closed:
            if self._reconnecting is not None and len(self._held) < WAITING_LIMIT:
                self._held.append((channel, parts))  # sent once the websocket is open again
            else:
                log.warning("dropped a %s message: the kernel websocket is closed", channel)
            return
        self.send_parts(channel, parts)

    def send_parts(self, channel: str, parts: list[Any]) -> None:
        """Write one message to the open websocket (logged and dropped when it closed meanwhile)."""
        assert self.socket is not None
        try:
            self.socket.send(channel, parts)
        except OpenSandboxError as exc:
            log.warning("dropped a %s message: %s", channel, exc)

    # -- kernel to client ------------------------------------------------------------------------

    def _from_kernel(self, channel: str, parts: list[bytes]) -> None:
        if channel == "iopub":
            if b'"error"' in parts[0]:
                parts = self._capped_error(parts)
            self.front.from_kernel("iopub", [], parts)
            return
        try:
            header = json.loads(parts[0])
            parent = json.loads(parts[1])
            msg_type = str(header.get("msg_type"))
            parent_id = str(parent.get("msg_id"))
        except (ValueError, AttributeError, TypeError, RecursionError):
            log.warning("dropped a %s message from the kernel without a readable header", channel)
            return
        if parent_id in self._probes:
            if self._probed is not None and not self._probed.done():
                self._probed.set_result(None)
            return
        if channel == "stdin":
            idents = (
                self._routes.get(parent_id)
                or self._last.get("stdin")
                or self._last.get("shell", [])
            )
        else:
            idents = self._routes.pop(parent_id, []) or self._last.get(channel, [])
        if msg_type == "execute_reply" and b'"error"' in parts[3]:
            parts = self._short_reply(parts)
        self.front.from_kernel(channel, idents, parts)
        if msg_type == "shutdown_reply" and parent_id in self._shutdown_ids:
            self._end(ExitStatus(0, "the kernel shut down"))

    @staticmethod
    def _capped_error(parts: list[bytes]) -> list[bytes]:
        """An IOPub ``error`` within the caps (traceback 64 KiB, its last lines; name and value 8
        KiB)."""
        try:
            if json.loads(parts[0]).get("msg_type") != "error":
                return parts
            content = json.loads(parts[3])
            capped = capped_error(content)
        except (ValueError, AttributeError, TypeError, RecursionError):
            return parts
        return parts if capped is content else [*parts[:3], dumps(capped), *parts[4:]]

    @staticmethod
    def _short_reply(parts: list[bytes]) -> list[bytes]:
        """An error ``execute_reply`` with only the traceback's last 2 KiB (IOPub has the whole)."""
        try:
            content = json.loads(parts[3])
            capped = capped_error(content, REPLY_TRACEBACK_CHARS)
        except (ValueError, AttributeError, TypeError, RecursionError):
            return parts
        return parts if capped is content else [*parts[:3], dumps(capped), *parts[4:]]

    # -- life ------------------------------------------------------------------------------------

    def _lost(self, reason: str) -> None:
        if self._closing or self._reconnecting is not None:
            return  # a reconnect in progress sees the new socket closed itself
        if self.running.is_set() and self._too_many_losses(reason):
            return
        self._reconnecting = asyncio.ensure_future(self._reconnect(reason))

    def _too_many_losses(self, reason: str) -> bool:
        """Count one loss of the websocket; past RECONNECT_ATTEMPTS within RECONNECT_WINDOW, end the
        kernel."""
        now = asyncio.get_running_loop().time()
        self._losses = [when for when in self._losses if now - when < RECONNECT_WINDOW] + [now]
        if len(self._losses) <= RECONNECT_ATTEMPTS:
            return False
        self._end(
            ExitStatus(1, f"{reason} {len(self._losses)} times within {RECONNECT_WINDOW:g} s")
        )
        return True

    async def _reconnect(self, reason: str) -> None:
        """Open the websocket again with the same session id, so the sandbox's Jupyter server
        replays what the kernel sent meanwhile; end the link if it cannot be opened or keeps
        closing."""
        delay = 0.2
        try:
            for attempt in range(1, RECONNECT_ATTEMPTS + 1):
                await asyncio.sleep(delay)
                # a paused sandbox answers nothing: reopen once it is resumed
                await self.running.wait()
                if self._closing:
                    return
                try:
                    await self._connect()
                except OpenSandboxError as exc:
                    log.warning("%s; reconnecting failed (attempt %d): %s", reason, attempt, exc)
                    delay *= 2
                    continue
                assert self.socket is not None
                if not self.socket.closed:
                    log.warning("%s; reconnected (attempt %d)", reason, attempt)
                    held, self._held = self._held, []
                    for channel, parts in held:
                        self.send_parts(channel, parts)
                    return
                if self.running.is_set() and self._too_many_losses(reason):
                    return
            self._end(ExitStatus(1, f"{reason}, and it could not be reopened"))
        finally:
            self._reconnecting = None

    async def interrupt(self) -> None:
        """Interrupt the kernel through the Jupyter server."""
        if self.kernel_id is not None:
            await self.jupyter.interrupt_kernel(self.kernel_id)

    def close(self) -> None:
        """Close the websocket."""
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self.socket is not None:
            self.socket.close()
