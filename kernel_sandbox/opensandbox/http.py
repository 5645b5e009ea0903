"""Capped HTTP for an OpenSandbox deployment: what every call to the lifecycle server or to a
sandbox's execd goes through.

Both are read as untrusted: code in a sandbox can replace execd, so every answer, error bodies
included, is read with a byte cap (``max_response_bytes``, a run's stream with
``max_output_bytes``) and within an overall deadline per call (``request_timeout``: connect, send
and the whole answer, however slowly it trickles). Server-supplied values placed in URLs are
percent-encoded; answers of the wrong shape raise :class:`OpenSandboxProtocolError` naming the
call; transport failures raise :class:`OpenSandboxConnectionError` with a message that says what
was tried. Redirects are never followed.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from ..errors import (
    CallDeadlineExceeded,
    OpenSandboxAPIError,
    OpenSandboxConnectionError,
    OpenSandboxProtocolError,
    ResponseTooLarge,
    SandboxNotFound,
    SandboxQuotaExceeded,
    SandboxTimeoutError,
)

log = logging.getLogger("kernel_sandbox.opensandbox.client")
"""The clients' logger (one name for :mod:`.http`, :mod:`.execd` and :mod:`.lifecycle`, as when they
were one module)."""

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_STREAM_IDLE_TIMEOUT = 60.0
DEFAULT_MAX_STREAM_BYTES = 16 * 1024 * 1024
"""Byte cap on one execd event stream (JSON-encoded output, base64 images, pings), not on kept
output."""
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
CAPACITY_FIRST_DELAY = 1.0
CAPACITY_MAX_DELAY = 30.0
"""Seconds between create attempts when the server gives no ``Retry-After`` (doubling), and the
most."""
RETRY_STATUSES = frozenset({404, 502, 503, 504})
"""Answers a starting sandbox (or a proxy in front of it) gives before it is ready: retried."""
_ID_MAX = 256


@dataclass(frozen=True)
class Limits:
    """What a client lets one call to a sandbox or the server cost.

    ``request_timeout``: seconds for one call: connect, send and the whole answer.
    ``max_response_bytes``: byte cap on one answer, error bodies included.
    ``max_output_bytes``: byte cap on one execd run's event stream.
    ``stream_idle_timeout``: a run's stream fails when no complete event arrived for that long
    (execd pings every ~3 s while code runs); bytes that do not complete an event do not count.
    """

    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_output_bytes: int = DEFAULT_MAX_STREAM_BYTES
    stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT


def url_segment(value: Any, what: str) -> str:
    """Percent-encode one server- or user-supplied value for use as a single URL path segment."""
    if not isinstance(value, str) or not value or len(value) > _ID_MAX:
        raise OpenSandboxProtocolError(
            f"{what} must be a non-empty string of at most {_ID_MAX} characters, got {value!r:.100}"
        )
    segment = quote(value, safe="")
    if segment in (".", ".."):
        raise OpenSandboxProtocolError(f"{what} {value!r} cannot be used in a URL path")
    return segment


def as_str_dict(value: Mapping[str, Any] | None) -> dict[str, str]:
    """Return a fresh ``{str: str}`` copy of a mapping (empty for None)."""
    return {str(k): str(v) for k, v in (value or {}).items()}


_TRANSPORT_WORDS = {
    httpx.ConnectError: "could not connect (refused or unreachable)",
    httpx.ConnectTimeout: "timed out while connecting",
    httpx.ReadError: "the connection was reset or closed while reading the answer",
    httpx.WriteError: "the connection was reset or closed while sending the request",
    httpx.RemoteProtocolError: "the server closed the connection without a complete answer",
    httpx.ReadTimeout: "timed out waiting for the answer",
    httpx.PoolTimeout: "no free connection in the pool",
}


def describe_transport_error(exc: BaseException) -> str:
    """A non-empty description of an httpx transport error (httpx's own text is often empty)."""
    words = next(
        (text for kind, text in _TRANSPORT_WORDS.items() if isinstance(exc, kind)),
        "transport error",
    )
    detail = str(exc) or str(exc.__cause__ or "")
    return f"{words} ({type(exc).__name__}{': ' + detail[:300] if detail else ''})"


def _where(request: httpx.Request) -> str:
    return f"{request.method} {request.url.copy_with(query=None)}"


def _detail_message(detail: Any) -> str | None:
    """FastAPI's ``{"detail": [{"loc", "msg"}...]}`` as "field: problem; ..."; a string detail as
    is."""
    if isinstance(detail, str):
        return detail
    if not isinstance(detail, list):
        return None
    parts = []
    for item in detail[:10]:
        if not isinstance(item, Mapping):
            continue
        loc = (
            [str(p) for p in item.get("loc") or [] if p not in ("body", "query", "path")]
            if isinstance(item.get("loc"), list)
            else []
        )
        field_name = ".".join(loc) or "request"
        parts.append(
            f"field {field_name!r}: {str(item.get('msg') or item.get('type') or 'invalid')[:200]}"
        )
    return "; ".join(parts) or None


_EGRESS_HINT = (
    "This server has no egress sidecar configured, so it refuses any networkPolicy, including the "
    "default-deny policy kernel-sandbox sends. Fix one of: configure `[egress] image` on the "
    "server (then egress is enforced); or set allow_internet=True to send no policy (the sandbox "
    "then has whatever network the server gives it, unrestricted)."
)


def _error_body(response: httpx.Response) -> tuple[str | None, str | None]:
    try:
        body = response.json()
    except (ValueError, RecursionError):
        text = response.content[:500].decode("utf-8", errors="replace").strip()
        return None, text or None
    if not isinstance(body, dict):
        return None, None
    code = body.get("code")
    message = body.get("message")
    if message is None:
        message = _detail_message(body.get("detail"))
    return (None if code is None else str(code)[:200]), (
        None if message is None else str(message)[:2000]
    )


def raise_for_status(response: httpx.Response) -> None:
    """Raise :class:`OpenSandboxAPIError` (:class:`SandboxNotFound` for a sandbox's 404) for a
    non-2xx response."""
    if response.is_success:
        return
    code, message = _error_body(response)
    request = response.request
    detail = " ".join(part for part in (code and f"{code}:", message) if part)
    text = f"{_where(request)} answered {response.status_code}" + (f" ({detail})" if detail else "")
    if (
        response.status_code == 400
        and message
        and "egress" in message
        and "networkPolicy" in message
    ):
        text += ". " + _EGRESS_HINT
    kind = OpenSandboxAPIError
    if (
        response.status_code == 404
        and "/sandboxes/" in request.url.path
        and "/proxy/" not in request.url.path
    ):
        kind = SandboxNotFound
    elif response.status_code == 403 and (code or "").upper().endswith("QUOTA_EXCEEDED"):
        kind = SandboxQuotaExceeded
        text += (
            ". The deployment's quota for sandboxes is used up: delete sandboxes you no longer "
            "need, ask for a larger quota, or ask for smaller resource_limits"
        )
    raise kind(text, response=response, code=code, detail=message)


def retry_after(response: httpx.Response, default: float) -> float:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date), else
    ``default``.

    Whatever the header holds, the answer is finite and from 0 to :data:`CAPACITY_MAX_DELAY`.
    """
    value = response.headers.get("retry-after", "").strip()[:64]
    seconds: float | None = None
    if value.isdigit():
        seconds = float(value[:6])
    elif value:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            when = None
        if when is not None and when.tzinfo is not None:
            seconds = (when - datetime.now(timezone.utc)).total_seconds()
    if seconds is None:
        return default
    return min(max(seconds, 0.0), CAPACITY_MAX_DELAY)


def _refuse_encoded(response: httpx.Response, what: str) -> None:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise OpenSandboxProtocolError(
            f"{what}: the answer is {encoding[:40]}-encoded although identity was asked for; "
            "compressed answers are refused"
        )


async def _read_capped(response: httpx.Response, limit: int, what: str) -> bytes:
    """Read a streamed response's raw body, refusing more than ``limit`` bytes."""
    _refuse_encoded(response, what)
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge(
            f"{what}: the answer declares {declared} bytes, over the cap of {limit} bytes "
            "(max_response_bytes)",
            limit,
        )
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > limit:
            raise ResponseTooLarge(
                f"{what}: the answer exceeded the cap of {limit} bytes (max_response_bytes); it "
                "was not read further",
                limit,
            )
    return bytes(body)


class CappedHTTP:
    """Capped, deadline-bound HTTP calls shared by both clients."""

    def __init__(self, http: httpx.AsyncClient | None, limits: Limits) -> None:
        self.limits = limits
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(limits.request_timeout), follow_redirects=False
        )

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def call(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        json: Any = None,
        params: Any = None,
        timeout: float | None = None,
        deadline_is: str = "request_timeout, per call",
    ) -> httpx.Response:
        """One request, its whole answer read (capped) within ``timeout`` (default:
        request_timeout; ``deadline_is`` names it in the error).

        Returns a response whose body is in memory; raises for transport errors and the deadline,
        never for an HTTP status.
        """
        deadline = self.limits.request_timeout if timeout is None else timeout
        request = self._http.build_request(
            method,
            url,
            headers={**headers, "Accept-Encoding": "identity"},
            json=json,
            params=params,
            timeout=httpx.Timeout(deadline),
        )
        what = _where(request)

        async def send() -> httpx.Response:
            response = await self._http.send(request, stream=True, follow_redirects=False)
            try:
                body = await _read_capped(response, self.limits.max_response_bytes, what)
            finally:
                await response.aclose()
            return httpx.Response(
                response.status_code, headers=response.headers, content=body, request=request
            )

        try:
            return await asyncio.wait_for(send(), deadline)
        except asyncio.TimeoutError:
            raise CallDeadlineExceeded(
                f"{what}: no complete answer within {round(deadline, 1):g} s ({deadline_is})"
            ) from None
        except httpx.TransportError as exc:
            raise OpenSandboxConnectionError(
                f"{what} failed: {describe_transport_error(exc)}"
            ) from exc


async def cancel_until_done(*tasks: asyncio.Future[Any], every: float = 1.0) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again every ``every`` seconds:
    Python 3.11's ``asyncio.wait_for`` swallows a cancel that comes as its call ends, and the task
    then goes on (a launcher polled a sandbox that never ran for 20 minutes after SIGTERM, until it
    was killed). Every call of :meth:`CappedHTTP.call` is such a ``wait_for``; ``asyncio.timeout``,
    which has no such race, is 3.11's and this package supports 3.10."""
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=every)
    await asyncio.gather(*tasks, return_exceptions=True)  # their errors taken, not reported


def _json(response: httpx.Response, what: str) -> Any:
    try:
        return response.json()
    except (ValueError, RecursionError) as exc:
        raise OpenSandboxProtocolError(
            f"{what} answered {response.status_code} with a body that is not JSON "
            f"({type(exc).__name__})"
        ) from None


def json_object(response: httpx.Response, what: str, *required: str) -> dict[str, Any]:
    """The answer as a JSON object having ``required`` keys, or OpenSandboxProtocolError naming the
    call."""
    answer = _json(response, what)
    if not isinstance(answer, dict):
        raise OpenSandboxProtocolError(
            f"{what} answered with a JSON {type(answer).__name__}, expected an object"
        )
    missing = [key for key in required if not answer.get(key)]
    if missing:
        raise OpenSandboxProtocolError(f"{what} answered without {', '.join(missing)}")
    return answer


async def _emit(callback: Callable[[Any], Awaitable[None] | None] | None, value: Any) -> None:
    if callback is None:
        return
    result = callback(value)
    if asyncio.iscoroutine(result):
        await result


def _on_event(
    suffix: str, callback: Callable[[], None]
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore ``trace`` extension that calls ``callback`` on each event whose name ends with
    ``suffix``."""

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name.endswith(suffix):
            callback()

    return trace


_C = TypeVar("_C", bound="HTTPClientBase")


class HTTPClientBase:
    """What the execd, lifecycle and Jupyter server clients share: capped, deadline-bound calls to
    ``url`` carrying ``headers``, polling for readiness, closing, ``async with``."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None,
        *,
        http: httpx.AsyncClient | None,
        limits: Limits,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = as_str_dict(headers)
        self._http = CappedHTTP(http, limits)

    @property
    def limits(self) -> Limits:
        """What one call may cost."""
        return self._http.limits

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        await self._http.aclose()

    async def __aenter__(self: _C) -> _C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self._http.call(method, f"{self.url}{path}", headers=self.headers, **kwargs)

    async def _poll_ready(
        self, path: str, wait: float, poll_interval: float, failure: str, limit: str = ""
    ) -> int:
        """Poll ``GET path`` until it answers 200 and return the number of attempts; connection
        errors, per-call deadlines and 404/502/503/504 are retried for ``wait`` seconds, then
        :class:`SandboxTimeoutError` starts with ``failure``; any other status raises at once."""
        started = time.monotonic()
        attempts, last = 0, "no attempt"
        while True:
            attempts += 1
            remaining = wait - (time.monotonic() - started)
            try:
                deadline = max(0.1, min(self.limits.request_timeout, remaining))
                response = await self._call("GET", path, timeout=deadline)
            except (OpenSandboxConnectionError, CallDeadlineExceeded) as exc:
                last = str(exc)
            else:
                if response.is_success:
                    return attempts
                if response.status_code not in RETRY_STATUSES:
                    raise_for_status(response)
                last = f"GET {self.url}{path} answered {response.status_code}"
            elapsed = time.monotonic() - started
            if elapsed >= wait:
                raise SandboxTimeoutError(
                    f"{failure}: GET {path} tried {attempts} times over {elapsed:.1f} s{limit}; "
                    f"last: {last}"
                )
            await asyncio.sleep(min(poll_interval, max(0.0, wait - elapsed)))
