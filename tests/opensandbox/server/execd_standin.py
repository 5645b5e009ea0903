#!/opt/venv/bin/python3
"""STAND-IN for OpenSandbox's execd (the real one is a Go program whose image cannot be pulled here).

It speaks the execd protocol as upstream ``components/execd`` does and as measured against the
published server (see shared/opensandbox-server.md), over real ipykernels started with
jupyter_client:

* ``GET /ping`` -> 200, empty body;
* ``POST /code/context {"language"}`` -> ``{"id", "language"}``; ``GET /code/contexts``;
  ``DELETE /code/contexts/{id}``; ``DELETE /code?id=CTX`` interrupts (no id: 400);
* ``POST /code`` -> 200 ``text/event-stream``; every event is a bare JSON object followed by a
  blank line (no ``data:`` prefix): ``init`` (text = context id), ``ping`` every
  ``EXECD_PING_INTERVAL`` seconds (3 upstream), ``stdout``/``stderr``, ``execution_count``,
  ``result`` (``text/plain`` renamed ``text``), then ``execution_complete`` on success or
  ``error`` on failure (terminal: nothing follows it). ``display_data`` is dropped, as upstream;
* errors before the stream starts: ``{"code", "message"}`` with 400/404/500; a busy context
  answers 500 "session is busy";
* ``/proxy/<port>/<path>``: execd's reverse proxy to ``127.0.0.1:<port>`` inside the sandbox
  (HTTP, streamed, and websocket upgrades). The bridge-mode endpoint the server hands out is
  ``host:port/proxy/44772``, i.e. this proxy in front of execd itself.

Inside a sandbox the server copies this file to ``/opt/opensandbox/execd`` and the stand-in
``bootstrap.sh`` starts it; tests import it to run the same protocol in-process.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import tornado.httpclient
import tornado.httpserver
import tornado.ioloop
import tornado.netutil
import tornado.web
import tornado.websocket
from jupyter_client.manager import AsyncKernelManager

TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
EXECD_PORT = 44772
PROXY_MAX_MESSAGE = 256 * 2**20
"""The real proxy copies websocket bytes without looking; this one has to pick a message cap."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Context:
    """One code context: a real ipykernel."""

    id: str
    language: str
    km: AsyncKernelManager
    kc: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    interrupts: int = 0


class Execd:
    """State of one execd: contexts backed by real ipykernels, and a log of requests."""

    def __init__(self, token: str | None = None, ping_interval: float = 3.0, kernel_name: str = "python3") -> None:
        self.token = token
        self.ping_interval = ping_interval
        self.kernel_name = kernel_name
        self.contexts: dict[str, Context] = {}
        self.default_context: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        self.port = 0

    async def new_context(self, language: str) -> Context:
        km = AsyncKernelManager(kernel_name=self.kernel_name)
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        ctx = Context(id=uuid.uuid4().hex, language=language, km=km, kc=kc)
        self.contexts[ctx.id] = ctx
        return ctx

    async def drop_context(self, ctx: Context) -> None:
        self.contexts.pop(ctx.id, None)
        ctx.kc.stop_channels()
        await ctx.km.shutdown_kernel(now=True)

    async def close(self) -> None:
        for ctx in list(self.contexts.values()):
            await self.drop_context(ctx)

    def app(self) -> tornado.web.Application:
        """The tornado application: execd's routes, bare and behind ``/proxy/44772``."""
        e = {"execd": self}
        routes: list[Any] = []
        for prefix in ("", f"/proxy/{EXECD_PORT}"):
            routes += [
                (prefix + r"/ping", PingHandler, e),
                (prefix + r"/code", CodeHandler, e),
                (prefix + r"/code/context", CodeContextHandler, e),
                (prefix + r"/code/contexts", CodeContextsHandler, e),
                (prefix + r"/code/contexts/([^/]+)", CodeContextItemHandler, e),
            ]
        routes.append((r"/proxy/(\d+)(/.*)?", ProxyHandler, e))
        return tornado.web.Application(routes, websocket_max_message_size=PROXY_MAX_MESSAGE)


class _Handler(tornado.web.RequestHandler):
    def initialize(self, execd: Execd) -> None:
        self.execd = execd

    def prepare(self) -> None:
        # Go's net package (execd) sets TCP_NODELAY on every connection; tornado turns Nagle's algorithm
        # back on between requests, and with it each streamed event could wait for a delayed ACK (40 ms).
        stream = getattr(self.request.connection, "stream", None)
        if stream is not None:
            stream.set_nodelay(True)
        self.execd.requests.append((self.request.method or "", self.request.uri or ""))
        if self.execd.token is not None and self.request.headers.get(TOKEN_HEADER) != self.execd.token:
            self.fail(401, "UNAUTHORIZED", "missing or wrong access token")

    def fail(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.finish({"code": code, "message": message})

    def body(self) -> dict[str, Any]:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}


class PingHandler(_Handler):
    def get(self) -> None:
        self.finish()


class CodeContextHandler(_Handler):
    async def post(self) -> None:
        ctx = await self.execd.new_context(self.body().get("language") or "python")
        self.finish({"id": ctx.id, "language": ctx.language})


class CodeContextsHandler(_Handler):
    def get(self) -> None:
        language = self.get_query_argument("language", None)
        items = [
            {"id": c.id, "language": c.language}
            for c in self.execd.contexts.values()
            if language is None or c.language == language
        ]
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(items))


class CodeContextItemHandler(_Handler):
    def get(self, context_id: str) -> None:
        ctx = self.execd.contexts.get(context_id)
        if ctx is None:
            self.fail(404, "CONTEXT_NOT_FOUND", f"context {context_id} not found")
            return
        self.finish({"id": ctx.id, "language": ctx.language})

    async def delete(self, context_id: str) -> None:
        ctx = self.execd.contexts.get(context_id)
        if ctx is None:
            self.fail(404, "CONTEXT_NOT_FOUND", f"context {context_id} not found")
            return
        await self.execd.drop_context(ctx)
        self.finish()


class CodeHandler(_Handler):
    async def delete(self) -> None:
        context_id = self.get_query_argument("id", "")
        if not context_id:
            self.fail(400, "MISSING_QUERY", "missing query parameter 'id'")
            return
        ctx = self.execd.contexts.get(context_id)
        if ctx is None:
            self.fail(404, "CONTEXT_NOT_FOUND", "context not found")
            return
        ctx.interrupts += 1
        await ctx.km.interrupt_kernel()
        self.finish()

    async def emit(self, event: dict[str, Any]) -> None:
        event.setdefault("timestamp", _now_ms())
        self.write(json.dumps(event) + "\n\n")
        await self.flush()

    async def post(self) -> None:
        body = self.body()
        context = body.get("context") if isinstance(body.get("context"), dict) else {}
        language = context.get("language") or "python"
        context_id = context.get("id")
        if not context_id:
            if language not in self.execd.default_context:
                self.execd.default_context[language] = (await self.execd.new_context(language)).id
            context_id = self.execd.default_context[language]
        ctx = self.execd.contexts.get(context_id)
        if ctx is None:
            self.fail(404, "CONTEXT_NOT_FOUND", f"context {context_id} not found")
            return
        if ctx.lock.locked():
            self.fail(500, "RUNTIME_ERROR", "session is busy")
            return
        async with ctx.lock:
            self.set_header("Content-Type", "text/event-stream")
            await self.emit({"type": "init", "text": ctx.id})
            await self.relay(ctx, str(body.get("code", "")))

    async def relay(self, ctx: Context, code: str) -> None:
        started = time.monotonic()
        msg_id = ctx.kc.execute(code, allow_stdin=False, stop_on_error=False)
        failed = False
        while True:
            try:
                msg = await ctx.kc.get_iopub_msg(timeout=self.execd.ping_interval)
            except queue.Empty:
                await self.emit({"type": "ping", "text": "pong"})
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                await self.emit({"type": content["name"], "text": content["text"]})
            elif kind == "execute_input":
                await self.emit({"type": "execution_count", "execution_count": content["execution_count"]})
            elif kind == "execute_result":
                results = dict(content["data"])
                if "text/plain" in results:
                    results["text"] = results.pop("text/plain")
                await self.emit({"type": "result", "results": results, "execution_count": content["execution_count"]})
            elif kind == "error":
                failed = True
                error = {k: content[k] for k in ("ename", "evalue", "traceback")}
                await self.emit({"type": "error", "error": error})
            elif kind == "status" and content["execution_state"] == "idle":
                if not failed:
                    elapsed = int((time.monotonic() - started) * 1000)
                    await self.emit({"type": "execution_complete", "execution_time": elapsed})
                return


_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)


class ProxyHandler(tornado.websocket.WebSocketHandler):
    """execd's ``/proxy/<port>/<path>``: HTTP (streamed) and websocket to 127.0.0.1:<port>.

    Like Go's ``httputil.ReverseProxy`` upstream, a websocket upgrade is passed on with its
    offered subprotocols, and the upstream's choice is answered to the client.
    """

    def initialize(self, execd: Execd) -> None:
        self.execd = execd
        self.upstream: tornado.websocket.WebSocketClientConnection | None = None
        self._opened = False
        self._early: list[str | bytes | None] = []

    def check_origin(self, origin: str) -> bool:
        return True

    def _target(self, scheme: str) -> str:
        match = re.match(r"/proxy/(\d+)(/.*)?$", self.request.path)
        assert match is not None
        port, path = match.group(1), match.group(2) or "/"
        query = f"?{self.request.query}" if self.request.query else ""
        return f"{scheme}://127.0.0.1:{port}{path}{query}"

    async def get(self, *args: Any) -> None:
        if self.request.headers.get("Upgrade", "").lower() == "websocket":
            offered = [p.strip() for p in self.request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
            headers = {
                k: v
                for k, v in self.request.headers.get_all()
                if k.lower() not in _HOP_HEADERS and not k.lower().startswith("sec-websocket")
            }
            try:
                self.upstream = await tornado.websocket.websocket_connect(
                    tornado.httpclient.HTTPRequest(self._target("ws"), headers=headers),
                    on_message_callback=self._from_upstream,
                    subprotocols=offered or None,
                    max_message_size=PROXY_MAX_MESSAGE,
                )
            except tornado.httpclient.HTTPClientError as exc:
                self.set_status(exc.code)
                self.finish()
                return
            except OSError:
                self.set_status(502)
                self.finish()
                return
            await super().get(*args)
            return
        await self._forward()

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return self.upstream.selected_subprotocol if self.upstream is not None else None

    async def _forward(self, *args: Any) -> None:
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in _HOP_HEADERS}
        body = self.request.body if self.request.method not in ("GET", "HEAD") else None

        def on_header(line: str) -> None:
            line = line.strip()
            if line.startswith("HTTP/"):
                self.set_status(int(line.split()[1]))
            elif ":" in line:
                name, _, value = line.partition(":")
                if name.strip().lower() not in _HOP_HEADERS:
                    self.set_header(name.strip(), value.strip())

        def on_chunk(chunk: bytes) -> None:
            self.write(chunk)
            self.flush()

        request = tornado.httpclient.HTTPRequest(
            self._target("http"),
            method=self.request.method,
            headers=headers,
            body=body,
            header_callback=on_header,
            streaming_callback=on_chunk,
            request_timeout=0,
            allow_nonstandard_methods=True,
            follow_redirects=False,
            decompress_response=False,
        )
        try:
            await tornado.httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError:
            self.set_status(502)
        self.finish()

    post = put = patch = delete = head = options = _forward  # type: ignore[assignment]

    def open(self, *args: Any) -> None:
        self.set_nodelay(True)  # as Go's proxy: no Nagle delay on either side of it
        if self.upstream is not None:
            self.upstream.protocol.set_nodelay(True)
        self._opened = True
        early, self._early = self._early, []
        for message in early:
            self._from_upstream(message)

    def _from_upstream(self, message: str | bytes | None) -> None:
        if not self._opened:
            self._early.append(message)
        elif message is None:
            self.close()
        else:
            try:
                self.write_message(message, binary=isinstance(message, bytes))
            except tornado.websocket.WebSocketClosedError:
                pass

    async def on_message(self, message: str | bytes) -> None:
        if self.upstream is not None:
            await self.upstream.write_message(message, binary=isinstance(message, bytes))

    def on_close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()


def main() -> None:
    """Serve on 0.0.0.0:44772 inside the sandbox until killed."""
    token = os.environ.get("EXECD_ACCESS_TOKEN") or None
    execd = Execd(token=token, ping_interval=float(os.environ.get("EXECD_PING_INTERVAL", "3")))
    server = tornado.httpserver.HTTPServer(execd.app())
    server.add_sockets(tornado.netutil.bind_sockets(EXECD_PORT, "0.0.0.0"))
    tornado.ioloop.IOLoop.current().start()


if __name__ == "__main__":
    main()
