"""The kernel's filtering HTTP(S) proxy: egress by name for a container that has no network.

The launcher listens on the container's own loopback (:data:`PROXY_PORT`): from a thread in the
container's network namespace where it may (root, runc), else through a relay in the container over
one exec stream (:mod:`.egress_stream`); the kernel's environment points ``HTTP(S)_PROXY`` there, so
pip, requests, httpx and urllib use it unchanged. Each connection carries one request
(:mod:`.egress_grammar`): ``CONNECT host:port`` (a tunnel, TLS inside it is not inspected unless a
secret is bound to the host: :mod:`.intercept`) or a plain-HTTP request with an absolute URI.
The launcher decides on the host (:meth:`Egress.decide`): the destination must be on the kernel's
``network`` list or in an open install window (:meth:`Egress.open_window`); the name is resolved
once on the host (:data:`~.egress_outbound.Resolver`), refused when any address is not global or
is the host's own unless the entry allows it, and the connection goes to the address that was
resolved, never to a second lookup's. Everything else is answered ``403`` with the option to
change.

Every outbound connection is made by :func:`~.egress_outbound.open_outbound`, the one function
that connects. Bounds: :data:`MAX_CONNECTIONS` per kernel, :data:`~.egress_grammar.HEAD_LIMIT`
bytes and :data:`HEAD_TIMEOUT` seconds for a request's head, :data:`IDLE_TIMEOUT` for a quiet
connection; a refused name is logged at most once per :data:`~.egress_grammar.LOG_EVERY` seconds
(:class:`~.egress_grammar.RefusalLog`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..egress import DEFAULT_PORTS, Address, Destination, literal_address
from .egress_grammar import HEAD_LIMIT, Refusal, RefusalLog, Request, parse_head
from .egress_outbound import (
    CHUNK,
    CONNECT_TIMEOUT,
    Connector,
    Resolver,
    host_addresses,
    open_outbound,
    refused_address,
    system_resolve,
)

if TYPE_CHECKING:
    from .intercept import SecretTable

log = logging.getLogger("kernel_sandbox.launch")

PROXY_PORT = 10080
"""The proxy's port on the container's loopback: below the ephemeral range, like the kernel's."""
MAX_CONNECTIONS = 64
BACKLOG = 1024
"""Connections the kernel may have waiting to be accepted (each then answered, refused past
:data:`MAX_CONNECTIONS`)."""
HEAD_TIMEOUT = 10.0
"""Seconds a client has to send its whole request head (a slow client is cut off)."""
IDLE_TIMEOUT = 120.0
"""Seconds a spliced connection may carry nothing either way before it is closed."""
LINGER_SECONDS = 2.0
LINGER_BYTES = 4 * 2**20


@dataclass
class Window:
    """Destinations opened for a while (an install call); its connections close with it."""

    destinations: tuple[Destination, ...]
    connections: set[asyncio.StreamWriter] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None
    closed: bool = False
    secrets: SecretTable | None = None
    """One tool call's secrets (:meth:`Egress.bind`): bound while the window is open."""


class Egress:
    """One kernel's filtering proxy: the decision (:meth:`decide`) and the connections
    (:meth:`serve`)."""

    def __init__(
        self,
        allowed: Sequence[Destination],
        *,
        package_index: Sequence[Destination] = (),
        resolve: Resolver | None = None,
        connect: Connector | None = None,
        own_addresses: Iterable[Address] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        secrets: SecretTable | None = None,
    ) -> None:
        self.secrets = secrets
        """The kernel's secrets (:mod:`.intercept`): their destinations are allowed and
        intercepted."""
        self.allowed = tuple(dict.fromkeys([*allowed, *(secrets.destinations if secrets else ())]))
        self.package_index = tuple(package_index)
        self.resolve = resolve or system_resolve
        self.connect = connect or open_outbound
        self.own = frozenset(own_addresses) if own_addresses is not None else host_addresses()
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.head_timeout = head_timeout
        self.refusals = RefusalLog()
        self.windows: dict[str, Window] = {}
        self._clients: dict[asyncio.StreamWriter, float] = {}
        self._upstreams: dict[asyncio.StreamWriter, asyncio.StreamWriter] = {}
        """Each connection from the kernel's outbound one, closed with it."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._serial = 0
        self._upstream: ssl.SSLContext | None = None
        """How bound hosts are verified (:func:`.intercept.upstream_context`), made once."""
        self.ended: str | None = None
        """Why the kernel's egress was ended for good (see :meth:`end`), once it was."""
        self.on_secret_use: Callable[[dict[str, int]], object] = lambda uses: None
        """Called with :meth:`secret_uses` when a secret is bound, used or unbound (the launcher
        keeps them for ``ps`` and ``metrics()``)."""
        self._call_uses: Counter[str] = Counter()
        """The tool calls' secrets whose windows closed, with the requests that used each."""
        if secrets is not None:
            secrets.on_use = self._secrets_changed

    # -- install windows -------------------------------------------------------------------

    def answer(self, content: Any) -> dict[str, Any]:
        """Answer a client's :data:`WINDOW_REQUEST`: ``{"open": SECONDS}`` opens the package index
        for at most that long (and says its id), ``{"close": ID}`` closes it."""
        if not isinstance(content, dict):
            return {"status": "error", "evalue": "the request's content must be an object"}
        if self.ended is not None and "open" in content:
            return {"status": "error", "evalue": self.ended}
        if "open" in content:
            seconds = content["open"]
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, (int, float))
                or not 0 < seconds <= 86400
            ):
                return {
                    "status": "error",
                    "evalue": "'open' must be a number of seconds from 0 to 86400",
                }
            token = self.open_window(self.package_index, float(seconds))
            return {
                "status": "ok",
                "window": token,
                "destinations": [str(d) for d in self.package_index],
            }
        if "close" in content:
            return {"status": "ok", "closed": self.close_window(str(content["close"]))}
        if "bind" in content:
            return self.bind(content["bind"], content.get("seconds"))
        return {"status": "error", "evalue": "the request must hold 'open', 'close' or 'bind'"}

    def bind(self, entries: Any, seconds: Any) -> dict[str, Any]:
        """Bind one tool call's secrets (``[{"binding": "NAME@HOST", "value": ...}]``) for at most
        ``seconds``: their hosts are allowed and their placeholders filled in until the window
        closes (the call's end). Answers the window's id and the call's variables (placeholders and
        the call's CA); an error never quotes a value."""
        from .intercept import SecretTable

        if self.ended is not None:
            return {"status": "error", "evalue": self.ended}
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            return {"status": "error", "evalue": "'seconds' must be a number"}
        if not 0 < seconds <= 86400:
            return {"status": "error", "evalue": "'seconds' must be from 0 to 86400"}
        try:
            table = SecretTable.for_call(entries)
        except ConfigError as exc:
            return {"status": "error", "evalue": str(exc)}
        token = self.open_window(table.destinations, float(seconds), table)
        table.on_use = self._secrets_changed
        self._secrets_changed()
        return {"status": "ok", "window": token, "env": table.call_env()}

    def secret_uses(self) -> dict[str, int]:
        """Each secret's name (never its value) with the requests that used it: the kernel's own,
        and the tool calls' summed over every call, those bound now included."""
        uses: Counter[str] = Counter(self.secrets.uses if self.secrets else {})
        uses.update(self._call_uses)
        for window in self.windows.values():
            if window.secrets is not None:
                uses.update(window.secrets.uses)
        return dict(uses)

    def _secrets_changed(self) -> None:
        try:
            self.on_secret_use(self.secret_uses())
        except Exception:  # a report that fails never fails a request
            log.debug("could not report the secrets' use", exc_info=True)

    def open_window(
        self,
        destinations: Sequence[Destination],
        seconds: float,
        secrets: SecretTable | None = None,
    ) -> str:
        """Allow ``destinations`` (with ``secrets`` bound) for at most ``seconds`` (or until
        :meth:`close_window`); return its id."""
        self._serial += 1
        token = f"w{self._serial}"
        window = self.windows[token] = Window(tuple(destinations), secrets=secrets)
        window.timer = asyncio.get_running_loop().call_later(seconds, self.close_window, token)
        log.info("egress: opened %s for %g s", ", ".join(map(str, window.destinations)), seconds)
        return token

    def close_window(self, token: str) -> bool:
        """Close a window and every connection it let through; False when it was not open."""
        window = self.windows.pop(token, None)
        if window is None:
            return False
        window.closed = True
        if window.timer is not None:
            window.timer.cancel()
        for writer in window.connections:
            self._abort(writer)
        if window.secrets is not None:
            self._call_uses.update(window.secrets.uses)
            self._secrets_changed()
        log.info("egress: closed %s", ", ".join(map(str, window.destinations)))
        return True

    # -- the decision ----------------------------------------------------------------------

    def hint(self, host: str, port: int) -> str:
        """What to change so that ``host:port`` is reachable, in one sentence."""
        if any(d.matches(host, port) for d in self.package_index):
            return (
                "; for packages, use Sandbox.install(), or allow the index in the kernel's "
                "'network' option (kernel-sandbox install --allow-package-index)"
            )
        entry = host if port in (80, 443) else f"{host}:{port}"
        return (
            f"; to allow it, add {entry!r} to the kernel's 'network' option "
            f"(kernel-sandbox install --allow {entry}, or Sandbox(network=[{entry!r}]))"
        )

    async def decide(self, host: str, port: int) -> tuple[str, Window | None]:
        """The address to connect to for ``host:port``, and the window that allows it (None: the
        list).

        Raises :class:`Refusal` when the destination is not allowed or resolves where it may not go.
        """
        name = f"{host}:{port}"
        grants: list[tuple[Destination, Window | None]] = [
            (d, None) for d in self.allowed if d.matches(host, port)
        ]
        for open_window in self.windows.values():
            grants += [(d, open_window) for d in open_window.destinations if d.matches(host, port)]
        if not grants:
            reason = (
                "the kernel's network is off"
                if not self.allowed
                else "it is not on the kernel's network list"
            )
            raise Refusal(
                403, f"kernel-sandbox refused {name}: {reason}{self.hint(host, port)}", name
            )
        literal = literal_address(host)
        if literal is not None:
            return str(literal), grants[0][1]
        try:
            answers = await asyncio.wait_for(self.resolve(host, port), CONNECT_TIMEOUT)
            found = [literal_address(answer) for answer in answers]
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            raise Refusal(
                502, f"kernel-sandbox: {host} could not be resolved on the host ({exc})", name
            ) from None
        addresses = [address for address in found if address is not None]
        if not addresses or len(addresses) < len(found):
            raise Refusal(502, f"kernel-sandbox: {host} did not resolve to an address", name)
        for destination, window in grants:
            bad = [
                (a, why)
                for a in addresses
                if (why := refused_address(a, self.own)) and not destination.permits(a)
            ]
            if not bad:
                return str(addresses[0]), window
        address, why = bad[0]
        entry = f"{host}@{address}" if port in DEFAULT_PORTS else f"{host}:{port}@{address}"
        where = "the kernel's 'network' option"
        if any(d.matches(host, port) for d in self.package_index):
            where = (
                "the kernel's 'package_index' option (and to its 'network' option for %pip: "
                "kernel-sandbox install --allow-package-index adds the index's entries)"
            )
        raise Refusal(
            403,
            f"kernel-sandbox refused {name}: it resolves to {address}, which {why}, and a listed "
            "name may lead there only if its entry names the address after '@'; to allow it, add "
            f"'{entry}' to {where}",
            name,
        )

    # -- the connections -------------------------------------------------------------------

    async def serve(self, sock: socket.socket | None) -> None:
        """Serve the proxy until :meth:`close`: on the listening socket ``sock``, or (None) only the
        connections handed to :meth:`client` (the exec-stream relay's)."""
        if sock is not None:
            self._server = await asyncio.start_server(
                self.client, sock=sock, limit=HEAD_LIMIT, backlog=BACKLOG
            )
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle_timeout / 4, 5.0))
            now = time.monotonic()
            for writer, last in list(self._clients.items()):
                if now - last > self.idle_timeout:
                    self._abort(writer)

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        """End a connection from the kernel and the one it opened, whichever side a task waits
        on."""
        writer.transport.abort()
        upstream = self._upstreams.get(writer)
        if upstream is not None:
            upstream.transport.abort()

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection from the kernel: refused past :attr:`max_connections`, else one
        request."""
        if len(self._clients) >= self.max_connections:
            await self._answer(
                writer,
                Refusal(
                    503,
                    f"kernel-sandbox: more than {self.max_connections} proxy connections at once",
                ),
            )
            return
        self._clients[writer] = time.monotonic()
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets no TCP_NODELAY on a socket made with proto 0, as the listening one is:
            # without it a small answer after another small write waits for a delayed ACK (40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await self._handle(reader, writer)
        except Exception:  # whatever the kernel sent: this connection ends, never the proxy
            log.debug("egress connection failed", exc_info=True)
        finally:
            self._clients.pop(writer, None)
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout)
        except asyncio.LimitOverrunError:
            await self._answer(
                writer,
                Refusal(431, f"kernel-sandbox proxy: request head over {HEAD_LIMIT} bytes"),
                reader,
            )
            return
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return
        try:
            request = parse_head(raw)
            address, window = await self.decide(request.host, request.port)
            try:
                upstream_reader, upstream = await self.connect(address, request.port)
            except (OSError, asyncio.TimeoutError) as exc:
                raise Refusal(
                    502,
                    f"kernel-sandbox: could not connect to {request.host}:{request.port} ({exc})",
                ) from None
        except Refusal as refusal:
            if refusal.name:
                self.refusals.refused(refusal.name, refusal.reason)
            await self._answer(writer, refusal, reader)
            return
        if window is not None:
            if window.closed:  # while the name was resolved
                upstream.transport.abort()
                return
            window.connections.add(writer)
        self._upstreams[writer] = upstream
        try:
            table = self._bound(request.host, request.port) if request.connect else None
            if table is not None:
                await self._intercept(request, table, reader, writer, upstream_reader, upstream)
                return
            if request.connect:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.write(request.head)
            await asyncio.gather(
                self._pipe(reader, upstream, writer), self._pipe(upstream_reader, writer, writer)
            )
        finally:
            if window is not None:
                window.connections.discard(writer)
            self._upstreams.pop(writer, None)
            upstream.transport.abort()

    def _tables(self) -> list[SecretTable]:
        """The secrets bound now: the kernel's, and those of the tool calls under way."""
        calls = [window.secrets for window in self.windows.values() if window.secrets]
        return [self.secrets, *calls] if self.secrets else calls

    def _bound(self, host: str, port: int) -> SecretTable | None:
        """The table whose CA answers a CONNECT to ``host:port`` (the kernel's first: the kernel
        always trusts its CA), or None: the connection is spliced."""
        return next((t for t in self._tables() if t.bound(host, port)), None)

    def fill(
        self, host: str, port: int, headers: list[tuple[bytes, bytes]], target: bytes
    ) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """A request's headers and target with the placeholders of every secret bound to
        ``host:port`` now filled in (a call's, only while the call runs)."""
        for table in self._tables():
            headers, target = table.fill(host, port, headers, target)
        return headers, target

    async def _intercept(
        self,
        request: Request,
        table: SecretTable,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
    ) -> None:
        """Carry a CONNECT to a destination with a secret through :func:`.egress_tls.intercept`."""
        from .egress_tls import intercept
        from .intercept import upstream_context

        def touch() -> None:
            self._clients[writer] = time.monotonic()

        if self._upstream is None:
            self._upstream = upstream_context()
        streams = (reader, writer, upstream_reader, upstream)
        refused = self.refusals.refused
        # a call's secret goes with its call, and so does the connection it is filled in on,
        # whatever let the destination through (the kernel's list, another window)
        call = next((w for w in self.windows.values() if w.secrets is table), None)
        if call is not None:
            call.connections.add(writer)
        try:
            await intercept(request, table, streams, self._upstream, touch, refused, self.fill)
        finally:
            if call is not None:
                call.connections.discard(writer)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, client: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await source.read(CHUNK):
                self._clients[client] = time.monotonic()
                sink.write(data)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()
            if sink.get_extra_info("socket") is not None:  # the relay's keeps its frames in order
                # all of it leaves before the connection is cut (an abort drops what a socket's
                # transport holds); the sweeper's idle timeout bounds the wait
                sink.transport.set_write_buffer_limits(high=0)
                await sink.drain()
        except (ConnectionError, OSError):
            sink.transport.abort()

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        refusal: Refusal,
        reader: asyncio.StreamReader | None = None,
    ) -> None:
        """Answer ``refusal`` and close; what the client still sends is read and dropped for a
        moment (:data:`LINGER_SECONDS`, :data:`LINGER_BYTES`), so that closing does not reset the
        answer away."""
        reason = refusal.reason.replace("\r", " ").replace("\n", " ")[:400]
        body = (reason + "\n").encode("ascii", "replace")
        writer.write(
            f"HTTP/1.1 {refusal.status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: "
            f"{len(body)}\r\nConnection: close\r\n\r\n".encode("ascii", "replace")
            + body
        )
        try:
            await asyncio.wait_for(writer.drain(), LINGER_SECONDS)
            if reader is not None and writer.can_write_eof():
                writer.write_eof()
                await asyncio.wait_for(self._discard(reader), LINGER_SECONDS)
        except (asyncio.TimeoutError, ConnectionError):
            pass
        writer.close()

    @staticmethod
    async def _discard(reader: asyncio.StreamReader) -> None:
        left = LINGER_BYTES
        while left > 0 and (data := await reader.read(CHUNK)):
            left -= len(data)

    def end(self, reason: str) -> None:
        """End the kernel's egress for good (its relay broke the launcher's bounds): every window
        and connection closes, and a window asked for later is refused with ``reason``."""
        self.ended = reason
        self._cut()

    def _cut(self) -> None:
        for token in list(self.windows):
            self.close_window(token)
        for writer in list(self._clients):
            self._abort(writer)

    async def close(self) -> None:
        """Stop listening and end every connection and window."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        self._cut()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
