"""The client of a sandbox's execd (port 44772): it executes code in Jupyter contexts, answering
with a stream of events (see :mod:`kernel_sandbox.opensandbox.events`), read with the caps of
:mod:`.http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from ..errors import (
    CallDeadlineExceeded,
    OpenSandboxAPIError,
    OpenSandboxConnectionError,
    OpenSandboxError,
    OpenSandboxProtocolError,
    OutputLimitExceeded,
)
from .events import Event, ExecdRun, LineSplitter, RunCollector, parse_event
from .http import (
    HTTPClientBase,
    Limits,
    _emit,
    _on_event,
    _read_capped,
    _refuse_encoded,
    _where,
    describe_transport_error,
    json_object,
    raise_for_status,
    url_segment,
)

DRAIN_TIMEOUT = 5.0
DEFAULT_BUSY_WAIT = 10.0
EXECD_PORT = 44772
EventCallback = Callable[[Event], Awaitable[None] | None]
LostCallback = Callable[[str], Awaitable[None] | None]


@dataclass(frozen=True)
class Endpoint:
    """Where a sandbox's execd answers, and the headers every call to it must carry."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


def endpoint_url(endpoint: str, api_base: str) -> str:
    """Turn an endpoint as the server reports it (``host:port[/path]``) into a URL.

    An endpoint without a scheme takes the API base's scheme; only http(s) URLs with a host and
    without user info, query or fragment are accepted.
    """
    endpoint = endpoint.strip().rstrip("/")
    url = endpoint if "://" in endpoint else f"{urlsplit(api_base).scheme or 'http'}://{endpoint}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError as exc:
        raise OpenSandboxProtocolError(
            f"the server returned an unusable execd endpoint {endpoint[:200]!r}: {exc}"
        ) from exc
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or parts.query
        or parts.fragment
    ):
        raise OpenSandboxProtocolError(
            f"the server returned an unusable execd endpoint {endpoint[:200]!r}"
        )
    return url


def _is_busy(error: OpenSandboxError) -> bool:
    """execd's answer to a run on a context that is still running: 500 "session is busy"."""
    return isinstance(error, OpenSandboxAPIError) and "busy" in (error.message or "").lower()


class ExecdClient(HTTPClientBase):
    """Talks to one sandbox's execd: readiness, run code (streamed), contexts, interrupt.

    ``busy_wait``: a run that execd refuses with "session is busy" (the context's previous run,
    e.g. one just interrupted, is still ending) is retried for that many seconds.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        limits: Limits = Limits(),
        busy_wait: float = DEFAULT_BUSY_WAIT,
    ) -> None:
        super().__init__(url, headers, http=http, limits=limits)
        self.busy_wait = busy_wait

    async def wait_ready(self, ready_timeout: float, poll_interval: float = 0.1) -> int:
        """Poll ``GET /ping`` until it answers 200; return the number of attempts.

        Connection resets, refusals, remote disconnects, per-call deadlines and 404/502/503/504
        (proxies in front of a starting execd) are retried until ``ready_timeout``; any other
        status fails at once. The timeout error says what was tried, how often and for how long.
        """
        return await self._poll_ready(
            "/ping",
            ready_timeout,
            poll_interval,
            f"execd at {self.url} did not become ready",
            f" (ready_timeout {ready_timeout:g} s)",
        )

    async def stream(
        self,
        code: str,
        *,
        context_id: str | None = None,
        language: str = "python",
        on_sent: Callable[[], None] | None = None,
    ) -> AsyncIterator[Event]:
        """Run ``code`` and yield its events as they arrive, up to and including the terminal one.

        After the terminal event the generator reads the rest of execd's answer (execd frees the
        context only then) before it ends: iterate it to its end before the next run.

        ``on_sent`` is called when the request has been written (before execd answers), so a caller
        can do its own work while execd runs the code. Raises :class:`OutputLimitExceeded` past
        ``max_output_bytes``, :class:`OpenSandboxConnectionError` when the stream ends (or breaks)
        before a terminal event, :class:`CallDeadlineExceeded` when no event arrives for
        ``stream_idle_timeout``.
        """
        context: dict[str, str] = {"language": language}
        if context_id:
            context["id"] = context_id
        client = self._http._http
        request = client.build_request(
            "POST",
            f"{self.url}/code",
            json={"code": code, "context": context},
            headers={**self.headers, "Accept-Encoding": "identity"},
            timeout=httpx.Timeout(self.limits.request_timeout, read=None),
            extensions={"trace": _on_event("send_request_body.complete", on_sent)}
            if on_sent
            else None,
        )
        what = _where(request)
        busy_until = time.monotonic() + self.busy_wait
        while True:
            response = await self._open_stream(client, request, what)
            if response.is_success:
                break
            try:
                failure = await self._error_answer(response, request, what)
            finally:
                await response.aclose()
            if not _is_busy(failure) or time.monotonic() >= busy_until:
                raise failure
            await asyncio.sleep(0.1)  # the previous run (e.g. just interrupted) is still ending
        try:
            ended = False
            async for event in self._events(response, what):
                ended = ended or event.terminal
                yield event  # the terminal one too, before the rest of the stream is drained
            if ended:
                return
            raise OpenSandboxConnectionError(
                f"{what}: the connection to execd dropped before the run ended (the stream closed "
                "without an execution_complete or error event); the code may still be running in "
                "the sandbox"
            )
        except httpx.TransportError as exc:
            raise OpenSandboxConnectionError(
                f"{what}: the connection to execd dropped while the code ran: "
                f"{describe_transport_error(exc)}"
            ) from exc
        finally:
            await response.aclose()

    async def _open_stream(
        self, client: httpx.AsyncClient, request: httpx.Request, what: str
    ) -> httpx.Response:
        deadline = self.limits.request_timeout
        try:
            return await asyncio.wait_for(
                client.send(request, stream=True, follow_redirects=False), deadline
            )
        except asyncio.TimeoutError:
            raise CallDeadlineExceeded(
                f"{what}: execd did not start answering within {deadline:g} s"
            ) from None
        except httpx.TransportError as exc:
            raise OpenSandboxConnectionError(
                f"{what} failed: {describe_transport_error(exc)}"
            ) from exc

    async def _error_answer(
        self, response: httpx.Response, request: httpx.Request, what: str
    ) -> OpenSandboxError:
        """The error for a non-2xx answer to ``POST /code`` (its body read capped, within the
        deadline)."""
        limits = self.limits
        try:
            body = await asyncio.wait_for(
                _read_capped(response, limits.max_response_bytes, what), limits.request_timeout
            )
        except asyncio.TimeoutError:
            return CallDeadlineExceeded(
                f"{what}: the error answer did not arrive within {limits.request_timeout:g} s"
            )
        except OpenSandboxError as exc:
            return exc
        except httpx.TransportError as exc:
            return OpenSandboxConnectionError(f"{what} failed: {describe_transport_error(exc)}")
        try:
            raise_for_status(
                httpx.Response(
                    response.status_code, headers=response.headers, content=body, request=request
                )
            )
        except OpenSandboxAPIError as exc:
            return exc
        raise AssertionError("unreachable: a non-2xx answer")

    async def _events(self, response: httpx.Response, what: str) -> AsyncIterator[Event]:
        _refuse_encoded(response, what)
        idle, cap = self.limits.stream_idle_timeout, self.limits.max_output_bytes
        received = 0
        lines = LineSplitter()
        chunks = response.aiter_raw().__aiter__()
        last_event = time.monotonic()
        while True:
            wait = last_event + idle - time.monotonic()
            try:
                chunk = await asyncio.wait_for(chunks.__anext__(), max(wait, 0.001))
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise CallDeadlineExceeded(
                    f"{what}: no event from execd for {idle:g} s (stream_idle_timeout); "
                    "execd pings every few seconds while code runs, so it is gone or misbehaving"
                ) from None
            received += len(chunk)
            if received > cap:
                raise OutputLimitExceeded(
                    f"execd output exceeded {cap} bytes (max_output_bytes); the stream was aborted"
                )
            for line in lines.feed(chunk):
                event = parse_event(line)
                if event is None:
                    continue
                last_event = time.monotonic()
                if event.terminal:
                    yield event
                    await self._drain(chunks, cap - received)
                    return
                yield event
        event = parse_event(lines.rest())
        if event is not None:
            yield event

    async def _drain(self, chunks: AsyncIterator[bytes], budget: int) -> None:
        """Read (and ignore) what follows a terminal event until execd closes the stream.

        execd frees the context only when it ends the stream; leaving earlier would make the
        next run meet "session is busy". Bounded by ``DRAIN_TIMEOUT`` and the byte cap.
        """

        async def drain() -> None:
            remaining = budget
            async for chunk in chunks:
                remaining -= len(chunk)
                if remaining < 0:
                    return

        with contextlib.suppress(asyncio.TimeoutError, httpx.TransportError):
            await asyncio.wait_for(drain(), min(DRAIN_TIMEOUT, self.limits.request_timeout))

    async def run(
        self,
        code: str,
        *,
        context_id: str | None = None,
        language: str = "python",
        on_event: EventCallback | None = None,
    ) -> ExecdRun:
        """Run ``code`` to completion and return the collected :class:`ExecdRun`."""
        collector = RunCollector(context_id)
        async for event in self.stream(code, context_id=context_id, language=language):
            collector.add(event)
            await _emit(on_event, event)
        return collector.result()

    async def create_context(
        self, language: str = "python", *, timeout: float | None = None
    ) -> str:
        """Create a fresh code context and return its id.

        execd starts a kernel for it, which takes long on a busy host: ``timeout`` (default
        ``request_timeout``) bounds the call; the launcher gives it ``ready_timeout``.
        """
        what = f"POST {self.url}/code/context"
        response = await self._call(
            "POST", "/code/context", json={"language": language}, timeout=timeout
        )
        raise_for_status(response)
        context_id = json_object(response, what, "id")["id"]
        url_segment(context_id, f"{what}: the context id")
        return str(context_id)

    async def delete_context(self, context_id: str) -> bool:
        """Delete a code context; False when it was already gone."""
        response = await self._call(
            "DELETE", f"/code/contexts/{url_segment(context_id, 'context id')}"
        )
        if response.status_code == 404:
            return False
        raise_for_status(response)
        return True

    async def interrupt(self, context_id: str) -> None:
        """Interrupt the code running in ``context_id``."""
        response = await self._call("DELETE", "/code", params={"id": context_id})
        raise_for_status(response)
