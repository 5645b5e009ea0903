"""``kernel-sandbox mcp``: an MCP server whose tools run code in one sandboxed kernel per session.

Built on the official ``mcp`` SDK (``pip install 'kernel-sandbox[mcp]'``) and on the execution
API: each MCP connection gets a kernel from an :class:`AsyncSandboxPool` on its first tool call,
and gives it back (the container is removed) when the connection ends or the server exits. A
server killed outright (SIGKILL; SIGTERM ends the launchers at once, see ``cli/mcp.py``) leaves
its kernels to their launchers, which end them within ``orphan_timeout``. Every refusal and
limit is a tool error (``isError``) whose text says what to do; the server itself keeps running.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import inspect
import posixpath
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .controls import escape_controls
from .errors import KernelSandboxError
from .execution.checkpoint import Checkpoint
from .execution.pool import AsyncSandboxPool
from .execution.sandbox import AsyncSandbox
from .kernelside import variables
from .notebooks import strip_ansi
from .results import Execution

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.transport_security import TransportSecuritySettings
    from mcp.types import (
        BlobResourceContents,
        CallToolResult,
        ContentBlock,
        EmbeddedResource,
        ImageContent,
        TextContent,
    )
except ImportError as exc:  # pragma: no cover - the CLI checks first and says how to install
    raise ImportError(
        "kernel-sandbox mcp needs the MCP SDK: pip install 'kernel-sandbox[mcp]'"
    ) from exc

TOKEN_ENV = "KERNEL_SANDBOX_MCP_TOKEN"
"""The environment variable the HTTP transport's bearer token is read from (else one is made)."""
MAX_DOWNLOAD_BYTES = 8 * 1024 * 1024
"""The largest file ``download_file`` hands to the model, by default."""
MAX_CHECKPOINTS = 8
"""Checkpoints one session keeps on the server; the oldest goes first."""
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
PROGRESS_TEXT = 1000
_SESSION = "kernel-sandbox.session"
TOOL_NAMES = (
    "run_code",
    "upload_file",
    "download_file",
    "install_packages",
    "list_variables",
    "restart",
    "checkpoint",
    "restore",
)


class ToolRefusal(Exception):
    """A tool call refused, with a message the model can act on (sent as a tool error)."""


def clean(text: str) -> str:
    """Kernel text made safe for a model: colour codes dropped, other control characters shown."""
    return escape_controls(strip_ansi(text))


@dataclass
class Session:
    """One MCP connection's kernel and checkpoints; the kernel starts on the first tool call."""

    kernel: Callable[[Checkpoint | None], contextlib.AbstractAsyncContextManager[AsyncSandbox]]
    sandbox: AsyncSandbox | None = None
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    _stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get(self) -> AsyncSandbox:
        """The session's kernel, taken from the pool on first use."""
        async with self._lock:
            if self.sandbox is None:
                self.sandbox = await self._stack.enter_async_context(self.kernel(None))
            return self.sandbox

    async def replace(self, checkpoint: Checkpoint) -> AsyncSandbox:
        """Close the session's kernel and start a fresh one that loads ``checkpoint``."""
        async with self._lock:
            await self._release()
            self.sandbox = await self._stack.enter_async_context(self.kernel(checkpoint))
            return self.sandbox

    async def _release(self) -> None:
        stack, self._stack, self.sandbox = self._stack, contextlib.AsyncExitStack(), None
        await stack.aclose()

    async def close(self) -> None:
        """Give the kernel back (its container is removed) and drop the checkpoints."""
        self.checkpoints.clear()
        await self._release()


def _connection(ctx: Context) -> Any:
    """The MCP connection a request came on (its ``state`` and ``exit_stack`` live as long)."""
    connection = getattr(ctx.request_context.session, "_connection", None)
    if connection is None:
        raise RuntimeError("this mcp SDK does not expose the request's connection (mcp>=2.3 does)")
    return connection


def execution_content(execution: Execution) -> CallToolResult:
    """An :class:`Execution` as tool content: text for the model, images as image content."""
    lines: list[str] = []
    if execution.stdout:
        lines.append(f"[stdout]\n{clean(execution.stdout)}")
    if execution.stderr:
        lines.append(f"[stderr]\n{clean(execution.stderr)}")
    images: list[ContentBlock] = []
    for bundle in execution.results:
        for mime in IMAGE_TYPES:
            if isinstance(bundle.get(mime), str):
                images.append(ImageContent(data=bundle[mime].strip(), mime_type=mime))
                break
    if execution.text is not None:
        lines.append(f"[result]\n{clean(execution.text)}")
    error = execution.error
    if error is not None:
        text = f"[error] {clean(error.name)}: {clean(error.value)}"
        if error.traceback:
            text += f"\n{clean(error.traceback)}"
        if execution.state_lost:
            text += "\n[the kernel was restarted: every variable is gone; run your setup again]"
        lines.append(text)
    lines.append(f"[execution_count] {execution.execution_count}")
    structured = {
        "stdout": clean(execution.stdout),
        "stderr": clean(execution.stderr),
        "result": None if execution.text is None else clean(execution.text),
        "error": None
        if error is None
        else {
            "name": clean(error.name),
            "value": clean(error.value),
            "traceback": clean(error.traceback),
        },
        "images": len(images),
        "execution_count": execution.execution_count,
        "state_lost": execution.state_lost,
        "truncated_bytes": execution.truncated_bytes,
    }
    return CallToolResult(
        content=[TextContent(text="\n".join(lines)), *images],
        structured_content=structured,
        is_error=error is not None,
    )


def refusal(message: str) -> CallToolResult:
    """A tool error the model reads."""
    return CallToolResult(content=[TextContent(text=clean(message))], is_error=True)


class Tools:
    """The MCP tools, on the session of the connection each call comes on."""

    def __init__(self, options: dict[str, Any], pool_size: int, max_download_bytes: int) -> None:
        self.options = options
        self.pool_size = pool_size
        self.max_download_bytes = max_download_bytes
        self.pool = AsyncSandboxPool(pool_size, **options)
        self._pooled = 0
        self._closing: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def _kernel(self, restore: Checkpoint | None = None) -> AsyncIterator[AsyncSandbox]:
        """A session's kernel: a warm one from the pool while it has one for this session; past
        ``pool_size`` sessions at once (the pool refills only on give-back, so waiting for it
        would block this session until another ends), or to load ``restore``, one started for
        the session. Closing it is left to a task the server awaits at exit, so a slow engine
        does not outlast the SDK's bound on a connection's cleanup."""
        if restore is None and self._pooled < self.pool_size:
            self._pooled += 1
            try:
                async with self.pool.acquire() as sandbox:
                    yield sandbox
            finally:
                self._pooled -= 1
            return
        sandbox = await AsyncSandbox(**self.options, restore=restore).start()
        try:
            yield sandbox
        finally:
            task = asyncio.get_running_loop().create_task(sandbox.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close the pool and every kernel started for a session."""
        await self.pool.close()
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    async def _session_of(self, ctx: Context) -> Session:
        connection = _connection(ctx)
        session = connection.state.get(_SESSION)
        if session is None:
            session = Session(self._kernel)
            connection.state[_SESSION] = session
            connection.exit_stack.push_async_callback(session.close)
        return session

    async def _guarded(self, ctx: Context, work: Any) -> CallToolResult:
        """Run ``work(session)``; every failure becomes a tool error the model can act on."""
        try:
            return await work(await self._session_of(ctx))
        except ToolRefusal as exc:
            return refusal(str(exc))
        except KernelSandboxError as exc:
            return refusal(f"{type(exc).__name__}: {exc}")

    async def run_code(self, code: str, ctx: Context, timeout: float = 60) -> CallToolResult:
        """Run Python code in this session's sandboxed Jupyter (IPython) kernel.

        Variables, imports and files persist across calls; the value of the last expression is
        returned as the result, matplotlib figures and other images as image content. An
        exception comes back as an error with its traceback: fix the code and call again. Past
        `timeout` seconds the code is interrupted (the variables are kept); if it cannot be
        interrupted the kernel is restarted and the variables are lost (the result says so).
        IPython magics (%timeit, !ls) work; the network is off unless the server allows it.
        """
        if not timeout > 0:
            return refusal("timeout must be a positive number of seconds")

        async def work(session: Session) -> CallToolResult:
            sandbox = await session.get()
            sent = 0

            async def progress(text: str) -> None:
                nonlocal sent
                sent += 1
                await ctx.report_progress(sent, message=clean(text[-PROGRESS_TEXT:]))

            try:
                execution = await sandbox.run(
                    code, timeout=timeout, on_stdout=progress, on_stderr=progress
                )
            except BaseException:
                # cancelled by the client (or the server ends): stop the code, not just the wait
                with contextlib.suppress(Exception):
                    await asyncio.shield(sandbox.interrupt())
                raise
            return execution_content(execution)

        return await self._guarded(ctx, work)

    async def upload_file(
        self, path: str, content_base64: str, ctx: Context, timeout: float = 120
    ) -> CallToolResult:
        """Write a file (its bytes as base64) at `path`, relative to the kernel's work directory
        (the code's current directory). Paths leaving the work directory are refused."""
        try:
            content = base64.b64decode(content_base64, validate=True)
        except ValueError:
            return refusal("content_base64 is not valid base64: encode the file's bytes as base64")

        async def work(session: Session) -> CallToolResult:
            sandbox = await session.get()
            written = await sandbox.upload({path: content}, timeout=timeout)
            return CallToolResult(
                content=[TextContent(text=f"wrote {clean(written[0])} ({len(content)} bytes)")]
            )

        return await self._guarded(ctx, work)

    async def download_file(self, path: str, ctx: Context, timeout: float = 120) -> CallToolResult:
        """Read a file of the kernel's work directory (`path` relative to it). It comes back as an
        embedded resource (base64 blob), or as image content for images. Files over the server's
        size cap are refused: make them smaller in code (compress, sample, split) first."""

        async def work(session: Session) -> CallToolResult:
            sandbox = await session.get()
            wanted = posixpath.normpath(path)
            folder = await sandbox.list_files(posixpath.dirname(wanted) or ".", timeout=timeout)
            info = {info.path: info for info in folder}.get(wanted)
            if info is not None and info.size > self.max_download_bytes:
                raise ToolRefusal(
                    f"{path} has {info.size} bytes, over the server's cap of "
                    f"{self.max_download_bytes} bytes: make it smaller in run_code first"
                )
            data = await sandbox.download(path, timeout=timeout)
            if len(data) > self.max_download_bytes:
                raise ToolRefusal(
                    f"{path} is over the server's cap of {self.max_download_bytes} bytes: make it "
                    "smaller in run_code first"
                )
            mime = _mime_type(path)
            blob = base64.b64encode(data).decode()
            block: ContentBlock
            if mime in IMAGE_TYPES:
                block = ImageContent(data=blob, mime_type=mime)
            else:
                block = EmbeddedResource(
                    resource=BlobResourceContents(
                        uri=f"sandbox:///{path.lstrip('/')}", blob=blob, mime_type=mime
                    )
                )
            return CallToolResult(
                content=[TextContent(text=f"{clean(path)}: {len(data)} bytes, {mime}"), block]
            )

        return await self._guarded(ctx, work)

    async def install_packages(
        self, packages: list[str], ctx: Context, timeout: float = 300
    ) -> CallToolResult:
        """pip-install packages into this session's kernel (e.g. ["humanize==4.9.0"]); import
        them in run_code afterwards. The package index is opened for this call only."""
        if not packages:
            return refusal("packages is empty: name at least one, e.g. ['humanize']")

        async def work(session: Session) -> CallToolResult:
            sandbox = await session.get()
            return execution_content(await sandbox.install(packages, timeout=timeout))

        return await self._guarded(ctx, work)

    async def list_variables(self, ctx: Context) -> CallToolResult:
        """The variables defined in this session's kernel: name, type and a short repr."""

        async def work(session: Session) -> CallToolResult:
            sandbox = await session.get()
            source = inspect.getsource(variables.list_variables)
            result = await sandbox.run_tool(source, {}, name="list_variables")
            if result.status != "success":
                raise ToolRefusal(f"listing the variables failed: {result.error}")
            found = result.func_return
            text = "\n".join(
                f"{clean(v['name'])}: {clean(v['type'])} = {clean(v['repr'])}" for v in found
            )
            return CallToolResult(
                content=[TextContent(text=text or "(no variables defined)")],
                structured_content={"variables": found},
            )

        return await self._guarded(ctx, work)

    async def restart(self, ctx: Context) -> CallToolResult:
        """Restart the kernel: a fresh interpreter, every variable gone (files stay)."""

        async def work(session: Session) -> CallToolResult:
            sandbox = await session.get()
            await sandbox.restart()
            return CallToolResult(content=[TextContent(text="restarted: no variables are defined")])

        return await self._guarded(ctx, work)

    async def checkpoint(self, ctx: Context) -> CallToolResult:
        """Save the kernel's variables and work directory on the server; returns a checkpoint id
        for `restore`. Values that cannot be saved (open files, sockets...) are listed."""

        async def work(session: Session) -> CallToolResult:
            sandbox = await session.get()
            saved = await sandbox.checkpoint()
            ident = uuid.uuid4().hex[:12]
            session.checkpoints[ident] = saved
            while len(session.checkpoints) > MAX_CHECKPOINTS:
                session.checkpoints.pop(next(iter(session.checkpoints)))
            text = f"checkpoint {ident}: saved {', '.join(saved.saved) or 'no variables'}"
            if saved.not_saved:
                text += "; not saved: " + "; ".join(
                    f"{name} ({why})" for name, why in saved.not_saved.items()
                )
            return CallToolResult(
                content=[TextContent(text=clean(text))],
                structured_content={"checkpoint_id": ident},
            )

        return await self._guarded(ctx, work)

    async def restore(self, checkpoint_id: str, ctx: Context) -> CallToolResult:
        """Go back to a checkpoint of this session: a fresh kernel loads its variables and files
        (whatever was defined since is gone)."""

        async def work(session: Session) -> CallToolResult:
            saved = session.checkpoints.get(checkpoint_id)
            if saved is None:
                known = ", ".join(session.checkpoints) or "none"
                raise ToolRefusal(
                    f"no checkpoint {checkpoint_id!r} in this session (known: {known}); "
                    "make one with checkpoint"
                )
            await session.replace(saved)
            return CallToolResult(content=[TextContent(text=f"restored {checkpoint_id}")])

        return await self._guarded(ctx, work)


def build_server(
    sandbox_options: dict[str, Any],
    *,
    pool_size: int = 1,
    max_download_bytes: int = MAX_DOWNLOAD_BYTES,
) -> MCPServer:
    """The MCP server: its tools, and a pool of kernels (``sandbox_options`` are
    :class:`AsyncSandbox` options) closed with the server."""
    tools = Tools(sandbox_options, pool_size, max_download_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            await tools.close()

    server: MCPServer = MCPServer(
        "kernel-sandbox",
        instructions=(
            "Runs Python in a sandboxed Jupyter kernel (a locked-down container, network off "
            "unless the server allows it). Variables, imports and files persist across calls in "
            "this session. Use run_code for code, upload_file/download_file for files, "
            "install_packages for pip packages, list_variables to see what is defined, "
            "checkpoint/restore to save and go back, restart for a fresh interpreter."
        ),
        lifespan=lifespan,
    )
    for name in TOOL_NAMES:
        server.add_tool(getattr(tools, name), structured_output=False)
    return server


def _mime_type(path: str) -> str:
    import mimetypes

    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def http_security(host: str, port: int, allowed_hosts: list[str]) -> TransportSecuritySettings:
    """The DNS-rebinding guard: only these Host headers (and same-host Origins) are served."""
    hosts = [f"{host}:{port}", f"127.0.0.1:{port}", f"localhost:{port}", *allowed_hosts]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{name}" for name in hosts],
    )


class BearerGuard:
    """ASGI middleware: every request must carry ``Authorization: Bearer <token>``, else 401."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"missing or wrong bearer token (see " + TOKEN_ENV.encode() + b")",
                    }
                )
                return
        await self.app(scope, receive, send)


def new_token() -> str:
    """A bearer token for a server that was given none."""
    return secrets.token_urlsafe(32)


async def serve_http(
    server: MCPServer, host: str, port: int, token: str, allowed_hosts: list[str]
) -> None:
    """Serve streamable HTTP on ``host:port`` behind the bearer token and the Host/Origin guard."""
    import uvicorn

    app = server.streamable_http_app(
        transport_security=http_security(host, port, allowed_hosts), host=host
    )
    config = uvicorn.Config(BearerGuard(app, token), host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()
