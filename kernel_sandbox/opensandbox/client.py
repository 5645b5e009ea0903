"""Async clients for an OpenSandbox deployment: the lifecycle server and a sandbox's execd.

The lifecycle server creates, inspects and deletes sandboxes (``/v1/sandboxes``); ``execd`` runs
inside each sandbox (port 44772) and executes code in Jupyter contexts, answering with a stream of
events (see :mod:`kernel_sandbox.opensandbox.events`).

Both are read as untrusted: code in a sandbox can replace execd, so every answer, error bodies
included, is read with a byte cap (``max_response_bytes``, a run's stream with
``max_output_bytes``) and within an overall deadline per call (``request_timeout``: connect, send
and the whole answer, however slowly it trickles). Server-supplied values placed in URLs are
percent-encoded; answers of the wrong shape raise :class:`OpenSandboxProtocolError` naming the
call; transport failures raise :class:`OpenSandboxConnectionError` with a message that says what
was tried. Redirects are never followed, and the API key goes only to the lifecycle server.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import email.utils
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import httpx

from ..errors import (
    CallDeadlineExceeded,
    OpenSandboxAPIError,
    OpenSandboxConfigError,
    OpenSandboxConnectionError,
    OpenSandboxError,
    OpenSandboxProtocolError,
    OutputLimitExceeded,
    ResponseTooLarge,
    SandboxCapacityError,
    SandboxNotFound,
    SandboxQuotaExceeded,
    SandboxStateError,
    SandboxTimeoutError,
)
from .events import Event, ExecdRun, LineSplitter, RunCollector, parse_event

log = logging.getLogger(__name__)

ENV_API_BASE = "OPEN_SANDBOX_API_BASE"
ENV_API_KEY = "OPEN_SANDBOX_API_KEY"
API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
DEFAULT_SANDBOX_IMAGE = "opensandbox/code-interpreter:v1.1.0"
"""The OpenSandbox sandbox image (the Docker backend's kernel image is ``settings.DEFAULT_IMAGE``)."""
DEFAULT_ENTRYPOINT: tuple[str, ...] = ("/opt/code-interpreter/code-interpreter.sh",)
DEFAULT_SANDBOX_TIMEOUT = 300
"""A sandbox's lifetime in seconds (renewed while used); not a per-call deadline."""
DEFAULT_RESOURCE_LIMITS: Mapping[str, str] = MappingProxyType({"cpu": "1", "memory": "2Gi"})
DEFAULT_READY_TIMEOUT = 120.0
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_STREAM_IDLE_TIMEOUT = 60.0
DEFAULT_MAX_STREAM_BYTES = 16 * 1024 * 1024
"""Byte cap on one execd event stream (JSON-encoded output, base64 images, pings), not on kept output."""
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
DEFAULT_DELETE_ATTEMPTS = 4
DRAIN_TIMEOUT = 5.0
DEFAULT_BUSY_WAIT = 10.0
EXECD_PORT = 44772
LABELS: Mapping[str, str] = MappingProxyType({"kernel-sandbox": "true"})
TERMINAL_STATES = frozenset({"Failed", "Stopping", "Terminated"})
KNOWN_STATES = frozenset({"Pending", "Running", "Pausing", "Paused", "Resuming", "Stopping", "Terminated", "Failed", "Unknown"})
"""The states server 1.1.1 documents; any other is waited through like ``Unknown`` (and logged once)."""
WAITING_STATES = frozenset({"Pending", "Unknown", "Resuming", "Pausing"})
"""States worth waiting through after create (``Unknown``: the runtime could not tell, for now)."""
PAUSED_STATES = frozenset({"Paused"})
RETRY_STATUSES = frozenset({404, 502, 503, 504})
"""Answers a starting sandbox (or a proxy in front of it) gives before it is ready: retried."""
CAPACITY_STATUSES = frozenset({429, 503})
"""Answers to ``POST /sandboxes`` that mean "no room now, try later" (pool capacity, an engine busy)."""
CAPACITY_FIRST_DELAY = 1.0
CAPACITY_MAX_DELAY = 30.0
"""Seconds between create attempts when the server gives no ``Retry-After`` (doubling), and the most."""
_ID_MAX = 256

EventCallback = Callable[[Event], Awaitable[None] | None]
LostCallback = Callable[[str], Awaitable[None] | None]


@dataclass(frozen=True)
class Endpoint:
    """Where a sandbox's execd answers, and the headers every call to it must carry."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


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


@dataclass
class Sandbox:
    """A sandbox as the lifecycle server described it, with its resolved execd endpoint."""

    id: str
    state: str | None
    info: dict[str, Any] = field(default_factory=dict, repr=False)
    endpoint: Endpoint | None = None


def resolve_api_base(api_base: str | None = None) -> str:
    """Return the API base URL from the argument or ``OPEN_SANDBOX_API_BASE``, without a trailing slash."""
    base = api_base or os.environ.get(ENV_API_BASE, "")
    if not base:
        raise OpenSandboxConfigError(
            f"the OpenSandbox API base URL is required: pass api_base or set {ENV_API_BASE} "
            "(for example http://localhost:8080/v1)"
        )
    if urlsplit(base).scheme not in ("http", "https"):
        raise OpenSandboxConfigError(f"api_base must be an http:// or https:// URL, got {base!r}")
    return base.rstrip("/")


def resolve_api_key(api_key: str | None = None) -> str:
    """Return the API key from the argument (even when empty) or ``OPEN_SANDBOX_API_KEY``."""
    if api_key is not None:
        return api_key
    return os.environ.get(ENV_API_KEY, "")


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
        raise OpenSandboxProtocolError(f"the server returned an unusable execd endpoint {endpoint[:200]!r}")
    return url


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


def sandbox_state(info: Mapping[str, Any] | None) -> str | None:
    """Return ``status.state`` of a sandbox description, or None when it has none."""
    status = info.get("status") if isinstance(info, Mapping) else None
    state = status.get("state") if isinstance(status, Mapping) else None
    return state if isinstance(state, str) else None


def note_unknown_state(sandbox_id: str, state: str | None, seen: set[str | None]) -> None:
    """Log a state the client does not know (the API says to tolerate them), once per state in ``seen``."""
    if state not in KNOWN_STATES and state not in seen:
        seen.add(state)
        log.warning(
            "sandbox %s is in state %r, which this client does not know; treating it as not ready yet",
            sandbox_id, state if state is None else state[:64],
        )


def _status_message(info: Mapping[str, Any]) -> str:
    status = info.get("status")
    message = status.get("message") if isinstance(status, Mapping) else None
    return str(message)[:500] if message else ""


def build_create_body(
    *,
    image: str | None = None,
    entrypoint: list[str] | None = None,
    timeout: int | None = None,
    resource_limits: Mapping[str, str] | None = None,
    resource_requests: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    allow_internet: bool = False,
    network_policy: Mapping[str, Any] | None = None,
    secure_access: bool = False,
    volumes: list[Mapping[str, Any]] | None = None,
    extensions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build a ``POST /sandboxes`` body; every call returns fresh objects.

    The sandbox is labelled with :data:`LABELS`. Without ``network_policy`` egress is denied unless
    ``allow_internet`` is true (then the policy is omitted and the sandbox has open egress).
    """
    body: dict[str, Any] = {
        "image": {"uri": image or DEFAULT_SANDBOX_IMAGE},
        "entrypoint": list(entrypoint or DEFAULT_ENTRYPOINT),
        "timeout": int(DEFAULT_SANDBOX_TIMEOUT if timeout is None else timeout),
        "resourceLimits": as_str_dict(resource_limits or DEFAULT_RESOURCE_LIMITS),
        "metadata": {**LABELS, **as_str_dict(metadata)},
    }
    if resource_requests:
        body["resourceRequests"] = as_str_dict(resource_requests)
    if env:
        body["env"] = as_str_dict(env)
    if network_policy is not None:
        body["networkPolicy"] = dict(network_policy)
    elif not allow_internet:
        body["networkPolicy"] = {"defaultAction": "deny", "egress": []}
    if secure_access:
        body["secureAccess"] = True
    if volumes:
        body["volumes"] = copy.deepcopy([dict(volume) for volume in volumes])
    if extensions:
        body["extensions"] = as_str_dict(extensions)
    return body


# ---- reading answers ------------------------------------------------------------------------

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
    words = next((text for kind, text in _TRANSPORT_WORDS.items() if isinstance(exc, kind)), "transport error")
    detail = str(exc) or str(exc.__cause__ or "")
    return f"{words} ({type(exc).__name__}{': ' + detail[:300] if detail else ''})"


def _where(request: httpx.Request) -> str:
    return f"{request.method} {request.url.copy_with(query=None)}"


def _detail_message(detail: Any) -> str | None:
    """FastAPI's ``{"detail": [{"loc", "msg"}...]}`` as "field: problem; ..."; a string detail as is."""
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
        parts.append(f"field {field_name!r}: {str(item.get('msg') or item.get('type') or 'invalid')[:200]}")
    return "; ".join(parts) or None


_EGRESS_HINT = (
    "This server has no egress sidecar configured, so it refuses any networkPolicy, including the "
    "default-deny policy kernel-sandbox sends. Fix one of: configure `[egress] image` on the server "
    "(then egress is enforced); or set allow_internet=True to send no policy (the sandbox then has "
    "whatever network the server gives it, unrestricted)."
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
    return (None if code is None else str(code)[:200]), (None if message is None else str(message)[:2000])


def raise_for_status(response: httpx.Response) -> None:
    """Raise :class:`OpenSandboxAPIError` (:class:`SandboxNotFound` for a sandbox's 404) for a non-2xx response."""
    if response.is_success:
        return
    code, message = _error_body(response)
    request = response.request
    detail = " ".join(part for part in (code and f"{code}:", message) if part)
    text = f"{_where(request)} answered {response.status_code}" + (f" ({detail})" if detail else "")
    if response.status_code == 400 and message and "egress" in message and "networkPolicy" in message:
        text += ". " + _EGRESS_HINT
    kind = OpenSandboxAPIError
    if response.status_code == 404 and "/sandboxes/" in request.url.path and "/proxy/" not in request.url.path:
        kind = SandboxNotFound
    elif response.status_code == 403 and (code or "").upper().endswith("QUOTA_EXCEEDED"):
        kind = SandboxQuotaExceeded
        text += (
            ". The deployment's quota for sandboxes is used up: delete sandboxes you no longer need, "
            "ask for a larger quota, or ask for smaller resource_limits"
        )
    raise kind(text, response=response, code=code, detail=message)


def retry_after(response: httpx.Response, default: float) -> float:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date), else ``default``.

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
            f"{what}: the answer declares {declared} bytes, over the cap of {limit} bytes (max_response_bytes)", limit
        )
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > limit:
            raise ResponseTooLarge(
                f"{what}: the answer exceeded the cap of {limit} bytes (max_response_bytes); it was not read further",
                limit,
            )
    return bytes(body)


class CappedHTTP:
    """Capped, deadline-bound HTTP calls shared by both clients."""

    def __init__(self, http: httpx.AsyncClient | None, limits: Limits) -> None:
        self.limits = limits
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=httpx.Timeout(limits.request_timeout), follow_redirects=False)

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
    ) -> httpx.Response:
        """One request, its whole answer read (capped) within ``timeout`` (default: request_timeout).

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
            return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)

        try:
            return await asyncio.wait_for(send(), deadline)
        except asyncio.TimeoutError:
            raise CallDeadlineExceeded(
                f"{what}: no complete answer within {deadline:g} s (request_timeout, per call)"
            ) from None
        except httpx.TransportError as exc:
            raise OpenSandboxConnectionError(f"{what} failed: {describe_transport_error(exc)}") from exc


def _is_busy(error: OpenSandboxError) -> bool:
    """execd's answer to a run on a context that is still running: 500 "session is busy"."""
    return isinstance(error, OpenSandboxAPIError) and "busy" in (error.message or "").lower()


def _json(response: httpx.Response, what: str) -> Any:
    try:
        return response.json()
    except (ValueError, RecursionError) as exc:
        raise OpenSandboxProtocolError(
            f"{what} answered {response.status_code} with a body that is not JSON ({type(exc).__name__})"
        ) from None


MAX_POLICY_RULES = 4096


def policy_of(answer: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A networkPolicy rebuilt from ``answer``: ``defaultAction`` (allow/deny, kept only when given)
    and ``egress`` rules of ``{"action": allow|deny, "target": name}``; anything else raises."""
    default = answer.get("defaultAction")
    rules = answer.get("egress") or []
    if default not in (None, "allow", "deny") or not isinstance(rules, list) or len(rules) > MAX_POLICY_RULES:
        raise OpenSandboxProtocolError(f"{what}: not a networkPolicy (defaultAction allow|deny, egress a list of rules)")
    egress = []
    for rule in rules:
        if (not isinstance(rule, Mapping) or rule.get("action") not in ("allow", "deny")
                or not isinstance(rule.get("target"), str) or not 0 < len(rule["target"]) <= 253):
            raise OpenSandboxProtocolError(
                f"{what}: an egress rule is not {{action: allow|deny, target: name}}: {str(rule)[:200]}"
            )
        egress.append({"action": rule["action"], "target": rule["target"]})
    return {**({"defaultAction": default} if default else {}), "egress": egress}


def json_object(response: httpx.Response, what: str, *required: str) -> dict[str, Any]:
    """The answer as a JSON object having ``required`` keys, or OpenSandboxProtocolError naming the call."""
    answer = _json(response, what)
    if not isinstance(answer, dict):
        raise OpenSandboxProtocolError(f"{what} answered with a JSON {type(answer).__name__}, expected an object")
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


def _on_event(suffix: str, callback: Callable[[], None]) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """An httpcore ``trace`` extension that calls ``callback`` on each event whose name ends with ``suffix``."""

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name.endswith(suffix):
            callback()

    return trace


_C = TypeVar("_C", bound="HTTPClientBase")


class HTTPClientBase:
    """What the execd, lifecycle and Jupyter server clients share: capped, deadline-bound calls to
    ``url`` carrying ``headers``, polling for readiness, closing, ``async with``."""

    def __init__(
        self, url: str, headers: Mapping[str, str] | None, *, http: httpx.AsyncClient | None, limits: Limits
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

    async def _poll_ready(self, path: str, wait: float, poll_interval: float, failure: str, limit: str = "") -> int:
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
                    f"{failure}: GET {path} tried {attempts} times over {elapsed:.1f} s{limit}; last: {last}"
                )
            await asyncio.sleep(min(poll_interval, max(0.0, wait - elapsed)))


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
            "/ping", ready_timeout, poll_interval,
            f"execd at {self.url} did not become ready", f" (ready_timeout {ready_timeout:g} s)",
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

        ``on_sent`` is called when the request has been written (before execd answers), so a
        caller can do its own work while execd runs the code. Raises :class:`OutputLimitExceeded` past ``max_output_bytes``,
        :class:`OpenSandboxConnectionError` when the stream ends (or breaks) before a terminal
        event, :class:`CallDeadlineExceeded` when no event arrives for ``stream_idle_timeout``.
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
            extensions={"trace": _on_event("send_request_body.complete", on_sent)} if on_sent else None,
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
                f"{what}: the connection to execd dropped before the run ended (the stream closed without an "
                "execution_complete or error event); the code may still be running in the sandbox"
            )
        except httpx.TransportError as exc:
            raise OpenSandboxConnectionError(
                f"{what}: the connection to execd dropped while the code ran: {describe_transport_error(exc)}"
            ) from exc
        finally:
            await response.aclose()

    async def _open_stream(self, client: httpx.AsyncClient, request: httpx.Request, what: str) -> httpx.Response:
        deadline = self.limits.request_timeout
        try:
            return await asyncio.wait_for(client.send(request, stream=True, follow_redirects=False), deadline)
        except asyncio.TimeoutError:
            raise CallDeadlineExceeded(f"{what}: execd did not start answering within {deadline:g} s") from None
        except httpx.TransportError as exc:
            raise OpenSandboxConnectionError(f"{what} failed: {describe_transport_error(exc)}") from exc

    async def _error_answer(self, response: httpx.Response, request: httpx.Request, what: str) -> OpenSandboxError:
        """The error for a non-2xx answer to ``POST /code`` (its body read capped, within the deadline)."""
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
                httpx.Response(response.status_code, headers=response.headers, content=body, request=request)
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

    async def create_context(self, language: str = "python", *, timeout: float | None = None) -> str:
        """Create a fresh code context and return its id.

        execd starts a kernel for it, which takes long on a busy host: ``timeout`` (default
        ``request_timeout``) bounds the call; the launcher gives it ``ready_timeout``.
        """
        what = f"POST {self.url}/code/context"
        response = await self._call("POST", "/code/context", json={"language": language}, timeout=timeout)
        raise_for_status(response)
        context_id = json_object(response, what, "id")["id"]
        url_segment(context_id, f"{what}: the context id")
        return str(context_id)

    async def delete_context(self, context_id: str) -> bool:
        """Delete a code context; False when it was already gone."""
        response = await self._call("DELETE", f"/code/contexts/{url_segment(context_id, 'context id')}")
        if response.status_code == 404:
            return False
        raise_for_status(response)
        return True

    async def interrupt(self, context_id: str) -> None:
        """Interrupt the code running in ``context_id``."""
        response = await self._call("DELETE", "/code", params={"id": context_id})
        raise_for_status(response)


async def _retrying_delete(attempt: Callable[[], Awaitable[bool]], attempts: int, what: str) -> bool:
    """Run ``attempt`` up to ``attempts`` times with backoff (0.5, 1, 2... s) on transient failures."""
    delay = 0.5
    for number in range(1, attempts + 1):
        try:
            return await attempt()
        except (OpenSandboxConnectionError, CallDeadlineExceeded) as exc:
            failure: OpenSandboxError = exc
        except OpenSandboxAPIError as exc:
            if exc.status_code < 500 and exc.status_code != 429:
                raise
            failure = exc
        if number == attempts:
            raise type(failure)(f"{failure} (gave up after {attempts} attempts)", **_error_kwargs(failure)) from failure
        log.warning("%s failed (attempt %d of %d), retrying in %g s: %s", what, number, attempts, delay, failure)
        await asyncio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def _error_kwargs(error: OpenSandboxError) -> dict[str, Any]:
    if isinstance(error, OpenSandboxAPIError):
        return {"response": error.response, "code": error.code, "detail": error.message}
    return {}


class OpenSandboxClient(HTTPClientBase):
    """Async client for the OpenSandbox lifecycle API (create, wait, endpoint, delete...).

    ``api_base`` (kept as ``url``) and ``api_key`` default to ``OPEN_SANDBOX_API_BASE`` and
    ``OPEN_SANDBOX_API_KEY``; the key header is left out when the key is empty.
    """

    def __init__(
        self,
        api_base: str | None = None,
        api_key: str | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        use_server_proxy: bool = False,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        limits: Limits = Limits(),
        delete_attempts: int = DEFAULT_DELETE_ATTEMPTS,
        signed_endpoints: float = 0.0,
    ) -> None:
        key = resolve_api_key(api_key)
        super().__init__(resolve_api_base(api_base), {API_KEY_HEADER: key} if key else {}, http=http, limits=limits)
        self.use_server_proxy = use_server_proxy
        self.poll_interval = poll_interval
        self.ready_timeout = ready_timeout
        self.delete_attempts = max(1, delete_attempts)
        self.signed_endpoints = 0.0 if use_server_proxy else float(signed_endpoints)
        """Seconds a signed endpoint (``?expires=``) should stay valid; 0: ask for plain endpoints."""

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._call(method, path, **kwargs)
        raise_for_status(response)
        return response

    def _path(self, sandbox_id: str, *rest: str) -> str:
        return "/".join(["/sandboxes", url_segment(sandbox_id, "sandbox id"), *rest])

    async def create(self, *, created: Callable[[str], None] | None = None, **options: Any) -> Sandbox:
        """Create a sandbox, wait until it is Running, resolve its execd endpoint and wait for execd.

        ``options`` are :func:`build_create_body`'s (image, entrypoint, timeout, resource limits,
        env, metadata, network...). ``created(sandbox_id)`` is called as soon as the server has
        answered the create, so a caller can delete the sandbox even while the rest is still
        waiting. The sandbox is deleted again when any later step fails (or is cancelled).
        """
        body = build_create_body(**options)
        what = f"POST {self.url}/sandboxes"
        info = json_object(await self._post_create(body), what, "id")
        sandbox_id = info["id"]
        url_segment(sandbox_id, f"{what}: the sandbox id")
        try:
            if created is not None:
                created(sandbox_id)
            info = await self.wait_running(sandbox_id, info)
            endpoint = await self.endpoint(sandbox_id)
            await self.execd(endpoint).wait_ready(self.ready_timeout, min(self.poll_interval, 0.1) or 0.1)
        except BaseException:
            await asyncio.shield(self._delete_quietly(sandbox_id))
            raise
        return Sandbox(id=sandbox_id, state=sandbox_state(info), info=info, endpoint=endpoint)

    async def _post_create(self, body: dict[str, Any]) -> httpx.Response:
        """``POST /sandboxes``, retried while the server has no capacity (429, 503) until ``ready_timeout``.

        The wait between attempts is the answer's ``Retry-After`` (else 1, 2, 4... s, at most
        :data:`CAPACITY_MAX_DELAY`), cut short at the deadline; when the deadline runs out,
        :class:`SandboxCapacityError` says how often and how long it was tried. 403
        ``QUOTA_EXCEEDED`` raises :class:`SandboxQuotaExceeded` at once (retrying cannot help).
        """
        started = time.monotonic()
        delay, attempts = CAPACITY_FIRST_DELAY, 0
        while True:
            attempts += 1
            response = await self._call("POST", "/sandboxes", json=body)
            if response.status_code not in CAPACITY_STATUSES:
                raise_for_status(response)
                return response
            wait = retry_after(response, delay)
            delay = min(delay * 2, CAPACITY_MAX_DELAY)
            elapsed = time.monotonic() - started
            if elapsed >= self.ready_timeout:
                code, message = _error_body(response)
                detail = " ".join(part for part in (code and f"{code}:", message) if part)
                raise SandboxCapacityError(
                    f"POST {self.url}/sandboxes answered {response.status_code}"
                    + (f" ({detail})" if detail else "")
                    + f": the server had no capacity for a new sandbox; tried {attempts} times over {elapsed:.1f} s "
                    f"and the launch deadline (ready_timeout {self.ready_timeout:g} s) ran out. Raise ready_timeout "
                    "to wait longer, or free capacity on the deployment (its pools, its nodes)",
                    response=response, code=code, detail=message,
                )
            (log.warning if attempts == 1 else log.debug)(
                "POST %s/sandboxes answered %d (no capacity now); retrying in %.1f s (attempt %d, %.1f s of "
                "ready_timeout %g s spent)", self.url, response.status_code, wait, attempts, elapsed, self.ready_timeout,
            )
            await asyncio.sleep(min(wait, self.ready_timeout - elapsed))

    async def _delete_quietly(self, sandbox_id: str) -> None:
        try:
            await self.delete(sandbox_id)
        except (OpenSandboxError, httpx.HTTPError) as exc:
            log.warning("deleting sandbox %s failed: %s", sandbox_id, exc)

    async def get(self, sandbox_id: str) -> dict[str, Any]:
        """Return the server's description of a sandbox (404 raises :class:`SandboxNotFound`)."""
        path = self._path(sandbox_id)
        return json_object(await self._request("GET", path), f"GET {self.url}{path}")

    async def list_sandboxes(
        self, *, metadata: Mapping[str, str] | None = None, states: list[str] | None = None, max_pages: int = 1000
    ) -> list[dict[str, Any]]:
        """List sandboxes, optionally filtered by metadata labels and states (all pages)."""
        items: list[dict[str, Any]] = []
        what = f"GET {self.url}/sandboxes"
        for page in range(1, max_pages + 1):
            params: list[tuple[str, Any]] = [("page", page), ("pageSize", 100)]
            if metadata:
                params.append(("metadata", urlencode(as_str_dict(metadata))))
            params.extend(("state", state) for state in states or [])
            answer = json_object(await self._request("GET", "/sandboxes", params=params), what)
            page_items = answer.get("items") or []
            pagination = answer.get("pagination") or {}
            if not isinstance(page_items, list) or not isinstance(pagination, dict):
                raise OpenSandboxProtocolError(f"{what} answered with items or pagination of the wrong type")
            items.extend(item for item in page_items if isinstance(item, dict))
            if not pagination.get("hasNextPage") or not page_items:
                return items
        return items

    async def wait_running(self, sandbox_id: str, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Poll until the sandbox is Running and return its description.

        ``Pending``, ``Unknown``, ``Pausing``, ``Resuming`` and states the client does not know
        (logged once) are waited through; ``Paused`` and the terminal states raise
        :class:`SandboxStateError`; 404 raises :class:`SandboxNotFound`; the ready timeout raises
        :class:`SandboxTimeoutError` naming the last state.
        """
        return await self.wait_state(sandbox_id, "Running", info, paused_fails=True)

    async def wait_state(
        self, sandbox_id: str, wanted: str, info: dict[str, Any] | None = None, *, paused_fails: bool = False
    ) -> dict[str, Any]:
        """Poll until the sandbox is in state ``wanted`` and return its description, as :meth:`wait_running`
        does (``Paused`` raises only with ``paused_fails``)."""
        started = time.monotonic()
        if info is None:
            info = await self.get(sandbox_id)
        unknown: set[str | None] = set()
        while True:
            state = sandbox_state(info)
            note_unknown_state(sandbox_id, state, unknown)
            if state == wanted:
                return info
            if state in TERMINAL_STATES:
                raise SandboxStateError(sandbox_id, state, _status_message(info))
            if paused_fails and state in PAUSED_STATES:
                raise SandboxStateError(
                    sandbox_id,
                    state,
                    f"it cannot run code while paused; resume it (POST /sandboxes/{sandbox_id}/resume) or delete it",
                )
            elapsed = time.monotonic() - started
            if elapsed >= self.ready_timeout:
                raise SandboxTimeoutError(
                    f"sandbox {sandbox_id} was not {wanted} after {elapsed:.1f} s (ready_timeout "
                    f"{self.ready_timeout:g} s); last state {state}"
                    + (f": {_status_message(info)}" if _status_message(info) else "")
                )
            await asyncio.sleep(self.poll_interval)
            info = await self.get(sandbox_id)

    async def endpoint(self, sandbox_id: str, port: int = EXECD_PORT) -> Endpoint:
        """Resolve the endpoint of ``port`` in the sandbox.

        404/502/503/504, connection errors and answers without an endpoint are retried until the
        ready timeout (some deployments answer so until the sandbox is ready; the published server
        answers 200 at once, before anything listens).
        """
        started = time.monotonic()
        path = self._path(sandbox_id, "endpoints", str(int(port)))
        what = f"GET {self.url}{path}"
        attempts, last = 0, ""
        while True:
            attempts += 1
            try:
                response = await self._call("GET", path, params=self._endpoint_params())
            except (OpenSandboxConnectionError, CallDeadlineExceeded) as exc:
                last = str(exc)
            else:
                if self._signing_refused(response):
                    continue
                if response.is_success:
                    answer = json_object(response, what)
                    if answer.get("endpoint"):
                        if not isinstance(answer["endpoint"], str):
                            raise OpenSandboxProtocolError(f"{what} answered with an endpoint that is not a string")
                        headers = answer.get("headers") or {}
                        if not isinstance(headers, dict):
                            raise OpenSandboxProtocolError(f"{what} answered with headers that are not an object")
                        return Endpoint(
                            url=endpoint_url(answer["endpoint"], self.url), headers=as_str_dict(headers)
                        )
                    last = f"{what} answered without an endpoint"
                elif response.status_code in RETRY_STATUSES:
                    last = f"{what} answered {response.status_code}"
                else:
                    raise_for_status(response)
            elapsed = time.monotonic() - started
            if elapsed >= self.ready_timeout:
                raise SandboxTimeoutError(
                    f"execd endpoint (port {port}) of sandbox {sandbox_id} was not ready: tried {attempts} times "
                    f"over {elapsed:.1f} s (ready_timeout {self.ready_timeout:g} s); last: {last}"
                )
            await asyncio.sleep(self.poll_interval)

    async def pause(self, sandbox_id: str, *, wait: bool = True) -> dict[str, Any]:
        """Pause a sandbox (``POST /sandboxes/{id}/pause``); with ``wait``, poll until it is ``Paused``.

        Returns the last description. A sandbox that is not running answers 409
        (:class:`OpenSandboxAPIError`); the wait ends with :class:`SandboxTimeoutError` after the ready timeout.
        """
        await self._request("POST", self._path(sandbox_id, "pause"))
        return await self.wait_state(sandbox_id, "Paused") if wait else await self.get(sandbox_id)

    async def resume(self, sandbox_id: str, *, wait: bool = True) -> dict[str, Any]:
        """Resume a paused sandbox (``POST /sandboxes/{id}/resume``); with ``wait``, until it is ``Running``."""
        await self._request("POST", self._path(sandbox_id, "resume"))
        return await self.wait_state(sandbox_id, "Running") if wait else await self.get(sandbox_id)

    def _endpoint_params(self) -> dict[str, str]:
        """The endpoint lookup's query: ``expires`` (now + ``signed_endpoints`` s) while signing is asked for."""
        params = {"use_server_proxy": "true" if self.use_server_proxy else "false"}
        if self.signed_endpoints:
            params["expires"] = str(int(time.time() + self.signed_endpoints))
        return params

    def _signing_refused(self, response: httpx.Response) -> bool:
        """True (and signing off for this client, logged once) when the server does not offer signed
        endpoints: a 400 to ``expires`` (the Docker runtime; Kubernetes without an ingress gateway)."""
        if not self.signed_endpoints or response.status_code != 400:
            return False
        code, message = _error_body(response)
        words = f"{code} {message}".lower()
        if "signed route" not in words and "expires" not in words:
            return False
        self.signed_endpoints = 0.0
        log.warning("%s: the server offers no signed endpoints (%s); using plain endpoints", self.url, message)
        return True

    # -- a running sandbox's egress policy (``/sandboxes/{id}/networkpolicy``, held by its sidecar) --

    async def network_policy(self, sandbox_id: str) -> dict[str, Any]:
        """The sandbox's egress policy as ``{"defaultAction"?, "egress": [{"action", "target"}...]}``,
        rebuilt from the answer (anything else in it is dropped; a malformed answer raises)."""
        path = self._path(sandbox_id, "networkpolicy")
        what = f"GET {self.url}{path}"
        answer = json_object(await self._request("GET", path), what)
        return policy_of(answer, what)

    async def replace_network_policy(self, sandbox_id: str, policy: Mapping[str, Any]) -> None:
        """Replace the sandbox's egress policy (``PUT``: the sidecar takes the whole policy)."""
        await self._request("PUT", self._path(sandbox_id, "networkpolicy"), json=policy_of(policy, "the policy"))

    async def renew(self, sandbox_id: str, seconds: float) -> str:
        """Move the sandbox's expiration to ``seconds`` from now; return the new ``expiresAt``."""
        expires = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        body = {"expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
        path = self._path(sandbox_id, "renew-expiration")
        response = await self._request("POST", path, json=body)
        if not response.content.strip():
            return body["expiresAt"]
        answer = json_object(response, f"POST {self.url}{path}")
        return str(answer.get("expiresAt", body["expiresAt"]))[:64]

    async def delete(self, sandbox_id: str) -> bool:
        """Delete a sandbox; False when it was already gone (404).

        Connection errors, deadlines, 429 and 5xx are retried ``delete_attempts`` times with
        backoff; other errors raise at once.
        """
        path = self._path(sandbox_id)

        async def attempt() -> bool:
            response = await self._call("DELETE", path)
            if response.status_code == 404:
                return False
            raise_for_status(response)
            return True

        return await _retrying_delete(attempt, self.delete_attempts, f"DELETE {self.url}{path}")

    def execd(self, endpoint: Endpoint) -> ExecdClient:
        """Return an :class:`ExecdClient` for ``endpoint`` that shares this client's connection pool."""
        return ExecdClient(endpoint.url, endpoint.headers, http=self._http._http, limits=self.limits)

    async def run_code(
        self,
        sandbox: Sandbox | str,
        code: str,
        *,
        context_id: str | None = None,
        language: str = "python",
        on_event: EventCallback | None = None,
    ) -> ExecdRun:
        """Run ``code`` in a sandbox; a bare sandbox id has its execd endpoint resolved first."""
        if isinstance(sandbox, str):
            endpoint = await self.endpoint(sandbox)
        else:
            endpoint = sandbox.endpoint or await self.endpoint(sandbox.id)
            sandbox.endpoint = endpoint
        return await self.execd(endpoint).run(code, context_id=context_id, language=language, on_event=on_event)


async def keep_alive(
    client: OpenSandboxClient,
    sandbox_id: str,
    seconds: float,
    *,
    interval: float | None = None,
    on_lost: LostCallback | None = None,
) -> None:
    """Renew the sandbox's expiration every ``interval`` s (default ``seconds / 3``) until cancelled.

    Any error but cancellation is logged and survived. ``on_lost(reason)`` is called once when the
    sandbox can no longer be renewed: it is gone (404; the loop then ends), or every renewal has
    failed for longer than ``seconds``, so it has probably expired.
    """
    interval = interval or seconds / 3
    renewed_at = time.monotonic()
    reported = False
    while True:
        await asyncio.sleep(interval)
        try:
            await client.renew(sandbox_id, seconds)
        except asyncio.CancelledError:
            raise
        except SandboxNotFound:
            await _emit(on_lost, f"sandbox {sandbox_id} is gone (404): it expired or was deleted")
            return
        except Exception as exc:  # noqa: BLE001 (the loop must outlive any answer of the server)
            log.warning("renewing sandbox %s failed: %s: %s", sandbox_id, type(exc).__name__, exc)
            if not reported and time.monotonic() - renewed_at > seconds:
                reported = True
                await _emit(
                    on_lost,
                    f"sandbox {sandbox_id} could not be renewed for {time.monotonic() - renewed_at:.0f} s "
                    f"(its timeout is {seconds:g} s); it has probably expired. Last error: {exc}",
                )
        else:
            renewed_at, reported = time.monotonic(), False


async def run_once(
    code: str,
    *,
    api_base: str | None = None,
    api_key: str | None = None,
    http: httpx.AsyncClient | None = None,
    language: str = "python",
    on_event: EventCallback | None = None,
    client_options: Mapping[str, Any] | None = None,
    **create_options: Any,
) -> ExecdRun:
    """Create a sandbox, run ``code`` in it and delete it, also when the run raises.

    A failed delete never hides the outcome: after a run it is kept in the result's
    ``cleanup_error`` (and logged); after a failed run it is logged and the run's error is raised.
    ``client_options`` go to :class:`OpenSandboxClient` (polling, :class:`Limits`...).
    """
    async with OpenSandboxClient(api_base, api_key, http=http, **dict(client_options or {})) as client:
        sandbox = await client.create(**create_options)
        try:
            result = await client.run_code(sandbox, code, language=language, on_event=on_event)
        except BaseException as exc:
            try:
                await asyncio.shield(client.delete(sandbox.id))
            except Exception as cleanup:  # noqa: BLE001
                log.error("deleting sandbox %s after a failed run failed too: %s", sandbox.id, cleanup)
                if sys.version_info >= (3, 11):  # add_note is new in 3.11
                    exc.add_note(f"deleting sandbox {sandbox.id} failed as well: {cleanup}")
            raise
        try:
            await asyncio.shield(client.delete(sandbox.id))
        except Exception as cleanup:  # noqa: BLE001
            log.error("deleting sandbox %s failed; the run's result is kept: %s", sandbox.id, cleanup)
            result.cleanup_error = cleanup
        return result


def run_once_sync(code: str, **options: Any) -> ExecdRun:
    """Blocking wrapper around :func:`run_once` (not for use inside a running event loop)."""
    return asyncio.run(run_once(code, **options))
