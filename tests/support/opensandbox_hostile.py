"""A HOSTILE execd, lifecycle server and kernel websocket on 127.0.0.1 (tornado), for issue 18's attacks.

They stand for what code inside a sandbox can do (kill execd and serve port 44772 itself) and
for a misbehaving or compromised lifecycle server: answers of any size, trickled a byte at a
time, of the wrong shape, events nested 100 000 deep, lone surrogates, events after the end,
streams that stop without an end. Each test sets ``behaviour[route] = callable`` and reads
``requests`` (method, raw path with query) to assert exactly what the client sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.httpserver
import tornado.ioloop
import tornado.iostream
import tornado.netutil
import tornado.web
import tornado.websocket
from support.opensandbox_fakes import ServedInThread

Behaviour = Callable[["HostileHandler"], Awaitable[None]]
KernelBehaviour = Callable[["HostileKernelSocket", str, list[bytes]], Awaitable[None]]
MiB = 1024 * 1024
V1 = "v1.kernel.websocket.jupyter.org"


class HostileHandler(tornado.web.RequestHandler):
    def initialize(self, server: HostileServer) -> None:
        self.server = server

    async def _any(self, *args: Any) -> None:
        self.server.requests.append((self.request.method or "", self.request.uri or ""))
        self.server.headers.append(dict(self.request.headers))
        key = f"{self.request.method} {self.request.path}"
        behaviour = self.server.behaviour.get(key) or self.server.behaviour.get(self.request.method or "")
        if behaviour is None:
            self.set_status(404)
            self.finish({"code": "NOT_FOUND", "message": key})
            return
        try:
            await behaviour(self)
        except tornado.iostream.StreamClosedError:
            pass

    get = post = delete = put = _any  # type: ignore[assignment]

    # ---- building blocks for behaviours ------------------------------------------------------

    async def huge(
        self, total: int, status: int = 200, chunk: bytes = b"x" * MiB, content_type: str = "application/json"
    ) -> None:
        """Send ``total`` bytes (chunked, no length) unless the client hangs up first."""
        self.set_status(status)
        self.set_header("Content-Type", content_type)
        sent = 0
        while sent < total and not self.request.connection.stream.closed():  # type: ignore[union-attr]
            self.write(chunk)
            await self.flush()
            sent += len(chunk)
        self.server.sent_bytes.append(sent)
        self.finish()

    async def trickle(self, data: bytes = b" " * 10_000, interval: float = 0.2, status: int = 200) -> None:
        """One byte every ``interval`` seconds."""
        self.set_status(status)
        for i in range(len(data)):
            if self.request.connection.stream.closed():  # type: ignore[union-attr]
                return
            self.write(data[i : i + 1])
            await self.flush()
            await asyncio.sleep(interval)
        self.finish()

    async def events(self, *items: dict[str, Any] | bytes, finish: bool = True) -> None:
        """Stream events as execd does (bare JSON and a blank line); raw bytes are sent as given."""
        self.set_header("Content-Type", "text/event-stream")
        for item in items:
            self.write(item if isinstance(item, bytes) else json.dumps(item).encode() + b"\n\n")
            await self.flush()
        if finish:
            self.finish()


def v1_frame(channel: str, parts: list[bytes]) -> bytes:
    """A message in the v1 kernel websocket format (jupyter_server's ``serialize_msg_to_ws_v1``)."""
    name = channel.encode()
    offsets = [8 * (len(parts) + 3), 8 * (len(parts) + 3) + len(name)]
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    return b"".join([len(offsets).to_bytes(8, "little"), *(o.to_bytes(8, "little") for o in offsets), name, *parts])


def kernel_message(msg_type: str, parent: dict[str, Any], content: dict[str, Any]) -> list[bytes]:
    header = {"msg_id": f"k-{msg_type}-{id(content)}", "msg_type": msg_type, "session": "hostile", "username": "k",
              "date": "", "version": "5.4"}
    return [json.dumps(header).encode(), json.dumps(parent).encode(), b"{}", json.dumps(content).encode()]


class HostileKernelSocket(tornado.websocket.WebSocketHandler):
    """A HOSTILE kernel websocket (``/jupyter/api/kernels/ID/channels``): answers kernel_info like a
    kernel, then whatever ``server.kernel_behaviour(socket, channel, parts)`` sends for other requests."""

    def initialize(self, server: HostileServer) -> None:
        self.server = server

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return V1 if V1 in subprotocols else None

    async def open(self, *args: Any) -> None:
        self.server.kernel_connections += 1
        if self.server.kernel_on_open is not None:
            await self.server.kernel_on_open(self)

    async def on_message(self, message: str | bytes) -> None:
        assert isinstance(message, bytes)
        count = int.from_bytes(message[:8], "little")
        offsets = [int.from_bytes(message[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
        channel = message[offsets[0] : offsets[1]].decode()
        parts = [message[offsets[i] : offsets[i + 1]] for i in range(1, count - 1)]
        header = json.loads(parts[0])
        self.server.kernel_requests.append((channel, header["msg_type"]))
        if header["msg_type"] == "kernel_info_request" and self.server.kernel_behaviour is None:
            info = {"status": "ok", "implementation": "hostile", "protocol_version": "5.4"}
            reply = kernel_message("kernel_info_reply", header, info)
            await self.send("shell", reply)
            return
        if self.server.kernel_behaviour is not None:
            await self.server.kernel_behaviour(self, channel, parts)

    async def send(self, channel: str, parts: list[bytes]) -> None:
        await self.raw(v1_frame(channel, parts))

    async def raw(self, frame: str | bytes) -> None:
        try:
            await self.write_message(frame, binary=isinstance(frame, bytes))
        except tornado.websocket.WebSocketClosedError:
            pass


class HostileServer(ServedInThread):
    """One tornado server on 127.0.0.1 in a daemon thread, answering per ``behaviour``."""

    def __init__(self) -> None:
        super().__init__("hostile-server")
        self.behaviour: dict[str, Behaviour] = {}
        self.kernel_behaviour: KernelBehaviour | None = None
        self.kernel_on_open: Callable[[HostileKernelSocket], Awaitable[None]] | None = None
        self.kernel_requests: list[tuple[str, str]] = []
        self.kernel_connections = 0
        self.requests: list[tuple[str, str]] = []
        self.headers: list[dict[str, str]] = []
        self.sent_bytes: list[int] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self) -> None:
        self.port = self.listen(tornado.web.Application(
            [
                (r"/jupyter/api/kernels/[^/]+/channels", HostileKernelSocket, {"server": self}),
                (r"/.*", HostileHandler, {"server": self}),
            ],
            websocket_max_message_size=1024 * MiB,
        ))

    def reset(self) -> None:
        self.behaviour.clear()
        self.kernel_behaviour = None
        self.kernel_on_open = None
        self.kernel_requests.clear()
        self.kernel_connections = 0
        self.requests.clear()
        self.headers.clear()
        self.sent_bytes.clear()
