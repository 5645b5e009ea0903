"""The Jupyter server inside a sandbox: its REST API and its kernel websocket, read as untrusted.

The code-interpreter image runs jupyter_server on 127.0.0.1:``JUPYTER_PORT`` (44771) with the
token ``JUPYTER_TOKEN``; from outside it is reached through execd's ``/proxy/<port>/`` reverse
proxy, which passes websocket upgrades. :class:`JupyterServer` starts a kernel there and opens
its channels websocket (``/api/kernels/{id}/channels``), which speaks one of two wire formats
(jupyter_server ``services/kernels/connection/base.py``):

* ``v1.kernel.websocket.jupyter.org`` (binary): little-endian u64 count of offsets, the offsets,
  then the channel name and the message's parts (header, parent header, metadata, content,
  buffers) as the kernel sent them, so nothing is parsed or re-serialised in between;
* legacy (no subprotocol): a JSON text frame ``{header, parent_header, metadata, content,
  channel}``, or, with buffers, a binary frame of big-endian u32 count and offsets, the JSON and
  the buffers.

Everything from the sandbox is capped: REST answers at ``max_response_bytes`` within an overall
deadline per call, websocket messages at ``max_message_size`` (tornado closes the connection past
it); frames whose layout does not add up are refused with :class:`OpenSandboxProtocolError`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import tornado.httpclient
import tornado.websocket

from ..errors import CallDeadlineExceeded, OpenSandboxConnectionError, OpenSandboxProtocolError
from .http import as_str_dict, HTTPClientBase, json_object, Limits, raise_for_status

log = logging.getLogger(__name__)

V1 = "v1.kernel.websocket.jupyter.org"
CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})
MAX_PARTS = 4 + 256
"""Most parts in one message: header, parent, metadata, content and up to 256 buffers."""

OnMessage = Callable[[str, list[bytes]], None]


# ---- wire formats ------------------------------------------------------------------------------


def encode_v1(channel: str, parts: Sequence[bytes]) -> bytes:
    """One message in the v1 format: ``parts`` are header, parent, metadata, content, buffers."""
    name = channel.encode()
    offsets = [8 * (len(parts) + 3)]
    offsets.append(offsets[-1] + len(name))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    return b"".join([struct.pack(f"<{len(offsets) + 1}Q", len(offsets), *offsets), name, *parts])


def decode_v1(data: bytes | str) -> tuple[str, list[bytes]]:
    """The channel and parts of a v1 frame; refuse any layout that does not add up."""
    if not isinstance(data, bytes):
        raise OpenSandboxProtocolError("a kernel websocket frame (v1) came as text")
    if len(data) < 8:
        raise OpenSandboxProtocolError("a kernel websocket frame (v1) is shorter than its header")
    (count,) = struct.unpack_from("<Q", data)
    if not 6 <= count <= MAX_PARTS + 2 or len(data) < 8 * (count + 1):
        raise OpenSandboxProtocolError(f"a kernel websocket frame (v1) declares {count} offsets")
    offsets = struct.unpack_from(f"<{count}Q", data, 8)
    if (
        offsets[0] != 8 * (count + 1)
        or offsets[-1] != len(data)
        or any(b < a for a, b in itertools.pairwise(offsets))
    ):
        raise OpenSandboxProtocolError(
            "a kernel websocket frame (v1) has offsets outside the frame"
        )
    channel = data[offsets[0] : offsets[1]].decode("ascii", errors="replace")
    if channel not in CHANNELS:
        raise OpenSandboxProtocolError(
            f"a kernel websocket frame names no channel of a kernel: {channel[:40]!r}"
        )
    return channel, [data[offsets[i] : offsets[i + 1]] for i in range(1, count - 1)]


def dumps(value: Any) -> bytes:
    """A JSON part of a Jupyter message: compact, UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def encode_legacy(channel: str, parts: Sequence[bytes]) -> str | bytes:
    """One message in the legacy format (JSON text, or the binary layout when it has buffers)."""
    message = {
        "header": json.loads(parts[0]),
        "parent_header": json.loads(parts[1]),
        "metadata": json.loads(parts[2]),
        "content": json.loads(parts[3]),
        "channel": channel,
    }
    buffers = list(parts[4:])
    if not buffers:
        return json.dumps(message, ensure_ascii=False)
    message["buffers"] = []
    blobs = [json.dumps(message, ensure_ascii=False).encode(), *buffers]
    offsets = [4 * (len(blobs) + 1)]
    for blob in blobs[:-1]:
        offsets.append(offsets[-1] + len(blob))
    return struct.pack(f"!{len(blobs) + 1}I", len(blobs), *offsets) + b"".join(blobs)


def decode_legacy(data: str | bytes) -> tuple[str, list[bytes]]:
    """The channel and parts of a legacy frame, each part re-serialised as JSON."""
    buffers: list[bytes] = []
    if isinstance(data, bytes):
        if len(data) < 4:
            raise OpenSandboxProtocolError(
                "a kernel websocket frame (legacy binary) is shorter than its header"
            )
        (count,) = struct.unpack_from("!I", data)
        if not 1 <= count <= MAX_PARTS or len(data) < 4 * (count + 1):
            raise OpenSandboxProtocolError(
                f"a kernel websocket frame (legacy binary) declares {count} parts"
            )
        offsets = [*struct.unpack_from(f"!{count}I", data, 4), len(data)]
        if offsets[0] < 4 * (count + 1) or any(b < a for a, b in itertools.pairwise(offsets)):
            raise OpenSandboxProtocolError(
                "a kernel websocket frame (legacy binary) has offsets outside the frame"
            )
        text: str | bytes = data[offsets[0] : offsets[1]]
        buffers = [data[offsets[i] : offsets[i + 1]] for i in range(1, count)]
    else:
        text = data
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        raise OpenSandboxProtocolError("a kernel websocket frame (legacy) is not JSON") from None
    if not isinstance(message, dict):
        raise OpenSandboxProtocolError("a kernel websocket frame (legacy) is not a JSON object")
    channel = message.get("channel")
    if channel not in CHANNELS:
        raise OpenSandboxProtocolError(
            f"a kernel websocket frame names no channel of a kernel: {str(channel)[:40]!r}"
        )
    fields = [message.get(name) for name in ("header", "parent_header", "metadata", "content")]
    if not all(isinstance(value, dict) for value in fields):
        raise OpenSandboxProtocolError(
            "a kernel websocket frame (legacy) lacks a header, parent, metadata or content"
        )
    try:
        return channel, [*(dumps(value) for value in fields), *buffers]
    except (ValueError, RecursionError):
        raise OpenSandboxProtocolError(
            "a kernel websocket frame (legacy) holds JSON nested too deeply"
        ) from None


# ---- the server --------------------------------------------------------------------------------


class JupyterServer(HTTPClientBase):
    """The Jupyter server of one sandbox at ``url`` (execd's proxy for its port), with its token."""

    def __init__(
        self,
        url: str,
        token: str,
        headers: Mapping[str, str] | None = None,
        *,
        limits: Limits = Limits(),
    ) -> None:
        super().__init__(
            url,
            {**as_str_dict(headers), "Authorization": f"token {token}"},
            http=None,
            limits=limits,
        )

    async def wait_ready(self, wait: float, poll_interval: float = 0.1) -> None:
        """Poll ``GET /api/status`` until it answers 200 (404/502/503/504 and connection errors
        retried).

        Raises :class:`SandboxTimeoutError` after ``wait`` seconds, saying what was tried, and
        :class:`OpenSandboxAPIError` at once for any other answer (403: the token was refused).
        """
        await self._poll_ready(
            "/api/status",
            wait,
            poll_interval,
            f"the sandbox's Jupyter server at {self.url} did not answer",
        )

    async def start_kernel(self, name: str) -> str:
        """Start a kernel of kernelspec ``name``; return its id."""
        what = f"POST {self.url}/api/kernels"
        response = await self._call("POST", "/api/kernels", json={"name": name})
        raise_for_status(response)
        kernel_id = str(json_object(response, what, "id")["id"])
        if len(kernel_id) > 256 or quote(kernel_id, safe="-") != kernel_id:
            raise OpenSandboxProtocolError(
                f"{what} answered with a kernel id that cannot be used in a URL"
            )
        return kernel_id

    async def interrupt_kernel(self, kernel_id: str) -> None:
        """Interrupt the kernel (the server signals it)."""
        raise_for_status(await self._call("POST", f"/api/kernels/{kernel_id}/interrupt"))

    async def connect(
        self,
        kernel_id: str,
        session_id: str,
        on_message: OnMessage,
        on_close: Callable[[str], None],
        *,
        max_message_size: int,
    ) -> KernelSocket:
        """Open the kernel's channels websocket, v1 wire format when the server offers it.

        Pings every ``request_timeout`` seconds close a connection whose peer stopped answering.
        """
        url = (
            self.url.replace("http", "ws", 1)
            + f"/api/kernels/{kernel_id}/channels?session_id={session_id}"
        )
        deadline = self.limits.request_timeout
        request = tornado.httpclient.HTTPRequest(
            url, headers=self.headers, connect_timeout=deadline, request_timeout=deadline
        )
        socket = KernelSocket(on_message, on_close)
        try:
            connection = await asyncio.wait_for(
                tornado.websocket.websocket_connect(
                    request,
                    on_message_callback=socket._received,
                    ping_interval=deadline,
                    ping_timeout=deadline,
                    max_message_size=max_message_size,
                    subprotocols=[V1],
                ),
                deadline,
            )
        except asyncio.TimeoutError:
            raise CallDeadlineExceeded(
                f"websocket {url}: no connection within {deadline:g} s"
            ) from None
        except tornado.httpclient.HTTPClientError as exc:
            raise OpenSandboxConnectionError(
                f"websocket {url} was refused: {exc.code} {exc.message}"
            ) from exc
        except (OSError, tornado.websocket.WebSocketError) as exc:
            raise OpenSandboxConnectionError(
                f"websocket {url} failed: {type(exc).__name__}: {exc}"
            ) from exc
        # a message right behind another must not wait for a delayed ACK
        if connection.protocol is not None:
            connection.protocol.set_nodelay(True)
        socket._attach(connection)
        return socket


class KernelSocket:
    """An open kernel websocket: :meth:`send` client messages; kernel messages go to
    ``on_message``."""

    def __init__(self, on_message: OnMessage, on_close: Callable[[str], None]) -> None:
        self._on_message = on_message
        self._on_close = on_close
        self._connection: tornado.websocket.WebSocketClientConnection | None = None
        self._early: list[str | bytes] = []
        self.v1 = False
        self.closed = False

    def _attach(self, connection: tornado.websocket.WebSocketClientConnection) -> None:
        self._connection = connection
        self.v1 = connection.selected_subprotocol == V1
        early, self._early = self._early, []
        for data in early:
            self._received(data)

    @property
    def protocol(self) -> str:
        """The wire format in use: ``v1`` or ``legacy``."""
        return "v1" if self.v1 else "legacy"

    def _received(self, data: str | bytes | None) -> None:
        if data is None:
            self._closed("the sandbox's Jupyter server closed the kernel websocket")
            return
        if self._connection is None:  # arrived before websocket_connect returned: decoded on attach
            self._early.append(data)
            return
        try:
            channel, parts = decode_v1(data) if self.v1 else decode_legacy(data)
        except OpenSandboxProtocolError as exc:
            log.warning("dropped a message from the sandbox's kernel websocket: %s", exc)
            return
        if len(parts) < 4:
            log.warning(
                "dropped a message of %d parts from the sandbox's kernel websocket", len(parts)
            )
            return
        self._dispatch(channel, parts)

    def _dispatch(self, channel: str, parts: list[bytes]) -> None:
        try:
            self._on_message(channel, parts)
        except Exception:
            log.exception("handling a message from the sandbox's kernel websocket failed")

    def _closed(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self._on_close(reason)

    def send(self, channel: str, parts: Sequence[bytes]) -> Any:
        """Send a client message (unsigned parts); returns tornado's write future."""
        if self._connection is None or self.closed:
            raise OpenSandboxConnectionError("the kernel websocket is closed")
        frame = encode_v1(channel, parts) if self.v1 else encode_legacy(channel, parts)
        try:
            return self._connection.write_message(frame, binary=isinstance(frame, bytes))
        except tornado.websocket.WebSocketClosedError:
            self._closed("the kernel websocket closed while sending")
            raise OpenSandboxConnectionError("the kernel websocket is closed") from None

    def close(self) -> None:
        """Close the websocket (``on_close`` is not called for a close asked for here)."""
        self.closed = True
        if self._connection is not None:
            self._connection.close()


__all__ = [
    "CHANNELS",
    "V1",
    "JupyterServer",
    "KernelSocket",
    "decode_legacy",
    "decode_v1",
    "encode_legacy",
    "encode_v1",
]
