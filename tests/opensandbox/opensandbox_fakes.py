"""Local stand-ins for an OpenSandbox deployment, listening on 127.0.0.1 only.

``FakeExecd`` speaks execd's code API the way the real server does: every event is a bare JSON
object followed by a blank line, the stream opens with ``init`` (the context id), keeps alive
with ``ping``, renames ``text/plain`` to ``text`` in result bundles, drops ``display_data`` and
ends with ``execution_complete`` (also after an error); a second run on a busy context answers
500. Each context is a real ipykernel started through jupyter_client.

``FakeLifecycle`` is the sandbox lifecycle API: create (Pending for a few polls, then Running),
get, list, endpoints (404 a few times first), renew-expiration and delete, with API-key checks.

Both run on one tornado IOLoop in a background thread, so sync and async tests can use them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import tornado.httpserver
import tornado.ioloop
import tornado.netutil
import tornado.web
from jupyter_client.manager import AsyncKernelManager

TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
logging.getLogger("tornado.access").setLevel(logging.ERROR)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Context:
    id: str
    language: str
    km: AsyncKernelManager
    kc: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    interrupts: int = 0


class FakeExecd:
    """State of the fake execd: contexts backed by real ipykernels, and a log of requests."""

    def __init__(self, token: str = "execd-token", ping_interval: float = 0.5) -> None:
        self.token = token
        self.ping_interval = ping_interval
        self.contexts: dict[str, Context] = {}
        self.default_context: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        self.port = 0

    async def new_context(self, language: str) -> Context:
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        ctx = Context(id=f"ctx-{uuid.uuid4().hex[:12]}", language=language, km=km, kc=kc)
        self.contexts[ctx.id] = ctx
        return ctx

    async def drop_context(self, ctx: Context) -> None:
        self.contexts.pop(ctx.id, None)
        ctx.kc.stop_channels()
        await ctx.km.shutdown_kernel(now=True)

    async def close(self) -> None:
        for ctx in list(self.contexts.values()):
            await self.drop_context(ctx)


class _ExecdHandler(tornado.web.RequestHandler):
    def initialize(self, execd: FakeExecd) -> None:
        self.execd = execd

    def prepare(self) -> None:
        self.execd.requests.append((self.request.method or "", self.request.uri or ""))
        if self.request.headers.get(TOKEN_HEADER) != self.execd.token:
            self.fail(401, "UNAUTHORIZED", "missing or wrong access token")

    def fail(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.finish({"code": code, "message": message})

    def body(self) -> dict[str, Any]:
        return json.loads(self.request.body or b"{}")


class CodeContextHandler(_ExecdHandler):
    async def post(self) -> None:
        ctx = await self.execd.new_context(self.body().get("language", "python"))
        self.finish({"id": ctx.id, "language": ctx.language})


class CodeContextsHandler(_ExecdHandler):
    def get(self) -> None:
        language = self.get_query_argument("language", "python")
        items = [{"id": c.id, "language": c.language} for c in self.execd.contexts.values() if c.language == language]
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(items))


class CodeContextHandler1(_ExecdHandler):
    async def delete(self, context_id: str) -> None:
        ctx = self.execd.contexts.get(context_id)
        if ctx is None:
            self.fail(404, "CONTEXT_NOT_FOUND", f"context {context_id} not found")
            return
        await self.execd.drop_context(ctx)
        self.finish({})


class CodeHandler(_ExecdHandler):
    async def delete(self) -> None:
        ctx = self.execd.contexts.get(self.get_query_argument("id", ""))
        if ctx is None:
            self.fail(404, "CONTEXT_NOT_FOUND", "context not found")
            return
        ctx.interrupts += 1
        await ctx.km.interrupt_kernel()
        self.finish({})

    async def emit(self, event: dict[str, Any]) -> None:
        event.setdefault("timestamp", _now_ms())
        self.write(json.dumps(event) + "\n\n")
        await self.flush()

    async def post(self) -> None:
        body = self.body()
        context = body.get("context") or {}
        language = context.get("language", "python")
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
            await self.relay(ctx, body.get("code", ""))

    async def relay(self, ctx: Context, code: str) -> None:
        started = time.monotonic()
        msg_id = ctx.kc.execute(code, allow_stdin=False, stop_on_error=False)
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
                await self.emit({"type": "error", "error": {k: content[k] for k in ("ename", "evalue", "traceback")}})
            elif kind == "status" and content["execution_state"] == "idle":
                elapsed = int((time.monotonic() - started) * 1000)
                await self.emit({"type": "execution_complete", "execution_time": elapsed})
                return


@dataclass
class FakeSandbox:
    id: str
    body: dict[str, Any]
    state: str = "Pending"
    polls_until_running: int = 1
    endpoint_404s: int = 1
    renewals: list[str] = field(default_factory=list)


class FakeLifecycle:
    """State of the fake lifecycle server."""

    def __init__(self, execd: FakeExecd, api_key: str = "test-key") -> None:
        self.execd = execd
        self.api_key = api_key
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.deleted: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.polls_until_running = 1
        self.endpoint_404s = 1
        self.advertised_token: str | None = None
        self._ids = itertools.count(1)
        self.port = 0

    def live(self) -> list[FakeSandbox]:
        """Sandboxes that were created and not deleted."""
        return list(self.sandboxes.values())


class _LifecycleHandler(tornado.web.RequestHandler):
    def initialize(self, lifecycle: FakeLifecycle) -> None:
        self.lifecycle = lifecycle

    def prepare(self) -> None:
        self.lifecycle.requests.append((self.request.method or "", self.request.uri or ""))
        if self.request.headers.get("OPEN-SANDBOX-API-KEY") != self.lifecycle.api_key:
            self.fail(401, "UNAUTHORIZED", "missing or wrong API key")

    def fail(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.finish({"code": code, "message": message})

    def sandbox(self, sandbox_id: str) -> FakeSandbox | None:
        sandbox = self.lifecycle.sandboxes.get(sandbox_id)
        if sandbox is None:
            self.fail(404, "NOT_FOUND", f"sandbox {sandbox_id} not found")
        return sandbox

    @staticmethod
    def describe(sandbox: FakeSandbox) -> dict[str, Any]:
        return {
            "id": sandbox.id,
            "status": {"state": sandbox.state},
            "metadata": sandbox.body.get("metadata", {}),
            "entrypoint": sandbox.body.get("entrypoint"),
            "image": sandbox.body.get("image"),
            "createdAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2026-01-01T00:05:00Z",
        }


class SandboxesHandler(_LifecycleHandler):
    def post(self) -> None:
        body = json.loads(self.request.body)
        sandbox = FakeSandbox(
            id=f"sbx-{next(self.lifecycle._ids)}",
            body=body,
            polls_until_running=self.lifecycle.polls_until_running,
            endpoint_404s=self.lifecycle.endpoint_404s,
        )
        if sandbox.polls_until_running <= 0:
            sandbox.state = "Running"
        self.lifecycle.sandboxes[sandbox.id] = sandbox
        self.set_status(202)
        self.finish(self.describe(sandbox))

    def get(self) -> None:
        wanted = dict(parse_qsl(self.get_query_argument("metadata", "")))
        items = [
            self.describe(s)
            for s in self.lifecycle.sandboxes.values()
            if all(s.body.get("metadata", {}).get(k) == v for k, v in wanted.items())
        ]
        self.finish(
            {
                "items": items,
                "pagination": {
                    "page": 1,
                    "pageSize": 100,
                    "totalItems": len(items),
                    "totalPages": 1,
                    "hasNextPage": False,
                },
            }
        )


class SandboxHandler(_LifecycleHandler):
    def get(self, sandbox_id: str) -> None:
        sandbox = self.sandbox(sandbox_id)
        if sandbox is None:
            return
        if sandbox.state == "Pending":
            sandbox.polls_until_running -= 1
            if sandbox.polls_until_running <= 0:
                sandbox.state = "Running"
        self.finish(self.describe(sandbox))

    def delete(self, sandbox_id: str) -> None:
        if self.sandbox(sandbox_id) is None:
            return
        del self.lifecycle.sandboxes[sandbox_id]
        self.lifecycle.deleted.append(sandbox_id)
        self.set_status(204)
        self.finish()


class EndpointHandler(_LifecycleHandler):
    def get(self, sandbox_id: str, port: str) -> None:
        sandbox = self.sandbox(sandbox_id)
        if sandbox is None:
            return
        if port != "44772" or sandbox.state != "Running" or sandbox.endpoint_404s > 0:
            sandbox.endpoint_404s -= 1
            self.fail(404, "NOT_FOUND", "endpoint not ready")
            return
        token = self.lifecycle.advertised_token or self.lifecycle.execd.token
        self.finish({"endpoint": f"127.0.0.1:{self.lifecycle.execd.port}", "headers": {TOKEN_HEADER: token}})


class RenewHandler(_LifecycleHandler):
    def post(self, sandbox_id: str) -> None:
        sandbox = self.sandbox(sandbox_id)
        if sandbox is None:
            return
        expires = json.loads(self.request.body)["expiresAt"]
        sandbox.renewals.append(expires)
        self.finish({"expiresAt": expires})


class FakeOpenSandbox:
    """Both fake servers on one IOLoop in a daemon thread; ``api_base`` is the lifecycle URL."""

    def __init__(self, api_key: str = "test-key", ping_interval: float = 0.5) -> None:
        self.execd = FakeExecd(ping_interval=ping_interval)
        self.lifecycle = FakeLifecycle(self.execd, api_key=api_key)
        self._loop: tornado.ioloop.IOLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-opensandbox", daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.lifecycle.port}/v1"

    @property
    def execd_url(self) -> str:
        return f"http://127.0.0.1:{self.execd.port}"

    def _serve(self, app: tornado.web.Application) -> int:
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server = tornado.httpserver.HTTPServer(app)
        server.add_sockets(sockets)
        return sockets[0].getsockname()[1]

    def _run(self) -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        self._loop = tornado.ioloop.IOLoop.current()
        e = {"execd": self.execd}
        self.execd.port = self._serve(
            tornado.web.Application(
                [
                    (r"/code", CodeHandler, e),
                    (r"/code/context", CodeContextHandler, e),
                    (r"/code/contexts", CodeContextsHandler, e),
                    (r"/code/contexts/([^/]+)", CodeContextHandler1, e),
                ]
            )
        )
        lc = {"lifecycle": self.lifecycle}
        self.lifecycle.port = self._serve(
            tornado.web.Application(
                [
                    (r"/v1/sandboxes", SandboxesHandler, lc),
                    (r"/v1/sandboxes/([^/]+)", SandboxHandler, lc),
                    (r"/v1/sandboxes/([^/]+)/endpoints/(\d+)", EndpointHandler, lc),
                    (r"/v1/sandboxes/([^/]+)/renew-expiration", RenewHandler, lc),
                ]
            )
        )
        self._ready.set()
        self._loop.start()

    def start(self) -> FakeOpenSandbox:
        """Start serving and return self."""
        self._thread.start()
        self._ready.wait(30)
        return self

    def call(self, coro_fn: Any, timeout: float = 60) -> Any:
        """Run ``coro_fn()`` on the servers' loop and return its result."""
        assert self._loop is not None
        done: queue.Queue[tuple[bool, Any]] = queue.Queue()

        async def runner() -> None:
            try:
                done.put((True, await coro_fn()))
            except BaseException as exc:
                done.put((False, exc))

        self._loop.add_callback(runner)
        ok, value = done.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """Shut down every context kernel and stop the loop."""
        if self._loop is None:
            return
        self.call(self.execd.close)
        self._loop.add_callback(self._loop.stop)
        self._thread.join(10)
