"""The client of the OpenSandbox lifecycle server: it creates, inspects, pauses, renews and
deletes sandboxes (``/v1/sandboxes``), read with the caps of :mod:`.http`. The API key goes only
to the lifecycle server.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

from ..errors import (
    CallDeadlineExceeded,
    OpenSandboxAPIError,
    OpenSandboxConfigError,
    OpenSandboxConnectionError,
    OpenSandboxError,
    OpenSandboxProtocolError,
    SandboxCapacityError,
    SandboxStateError,
    SandboxTimeoutError,
)
from .events import ExecdRun
from .network_policy import policy_of
from .execd import EXECD_PORT, Endpoint, EventCallback, ExecdClient, endpoint_url
from .http import (
    CAPACITY_FIRST_DELAY,
    CAPACITY_MAX_DELAY,
    HTTPClientBase,
    Limits,
    RETRY_STATUSES,
    _error_body,
    as_str_dict,
    json_object,
    log,
    raise_for_status,
    retry_after,
    url_segment,
)

ENV_API_BASE = "OPEN_SANDBOX_API_BASE"
ENV_API_KEY = "OPEN_SANDBOX_API_KEY"
API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
DEFAULT_SANDBOX_IMAGE = "opensandbox/code-interpreter:v1.1.0"
"""The OpenSandbox sandbox image (the Docker backend's kernel image is
``settings.DEFAULT_IMAGE``)."""
DEFAULT_ENTRYPOINT: tuple[str, ...] = ("/opt/code-interpreter/code-interpreter.sh",)
DEFAULT_SANDBOX_TIMEOUT = 300
"""A sandbox's lifetime in seconds (renewed while used); not a per-call deadline."""
DEFAULT_RESOURCE_LIMITS: Mapping[str, str] = MappingProxyType({"cpu": "1", "memory": "2Gi"})
DEFAULT_READY_TIMEOUT = 120.0
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_DELETE_ATTEMPTS = 4
LABELS: Mapping[str, str] = MappingProxyType({"kernel-sandbox": "true"})
TERMINAL_STATES = frozenset({"Failed", "Stopping", "Terminated"})
KNOWN_STATES = frozenset(
    {
        "Pending",
        "Running",
        "Pausing",
        "Paused",
        "Resuming",
        "Stopping",
        "Terminated",
        "Failed",
        "Unknown",
    }
)
"""The states server 1.1.1 documents; any other is waited through like ``Unknown`` (and logged
once)."""
WAITING_STATES = frozenset({"Pending", "Unknown", "Resuming", "Pausing"})
"""States worth waiting through after create (``Unknown``: the runtime could not tell, for now)."""
PAUSED_STATES = frozenset({"Paused"})
CAPACITY_STATUSES = frozenset({429, 503})
"""Answers to ``POST /sandboxes`` that mean "no room now, try later" (pool capacity, an engine
busy)."""


@dataclass
class Sandbox:
    """A sandbox as the lifecycle server described it, with its resolved execd endpoint."""

    id: str
    state: str | None
    info: dict[str, Any] = field(default_factory=dict, repr=False)
    endpoint: Endpoint | None = None


def resolve_api_base(api_base: str | None = None) -> str:
    """Return the API base URL from the argument or ``OPEN_SANDBOX_API_BASE``, without a trailing
    slash."""
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


def sandbox_state(info: Mapping[str, Any] | None) -> str | None:
    """Return ``status.state`` of a sandbox description, or None when it has none."""
    status = info.get("status") if isinstance(info, Mapping) else None
    state = status.get("state") if isinstance(status, Mapping) else None
    return state if isinstance(state, str) else None


def note_unknown_state(sandbox_id: str, state: str | None, seen: set[str | None]) -> None:
    """Log a state the client does not know (the API says to tolerate them), once per state in
    ``seen``."""
    if state not in KNOWN_STATES and state not in seen:
        seen.add(state)
        log.warning(
            "sandbox %s is in state %r, which this client does not know; treating it as not ready "
            "yet",
            sandbox_id,
            state if state is None else state[:64],
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


async def _retrying_delete(
    attempt: Callable[[], Awaitable[bool]], attempts: int, what: str
) -> bool:
    """Run ``attempt`` up to ``attempts`` times with backoff (0.5, 1, 2... s) on transient
    failures."""
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
            raise type(failure)(
                f"{failure} (gave up after {attempts} attempts)", **_error_kwargs(failure)
            ) from failure
        log.warning(
            "%s failed (attempt %d of %d), retrying in %g s: %s",
            what,
            number,
            attempts,
            delay,
            failure,
        )
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
        super().__init__(
            resolve_api_base(api_base),
            {API_KEY_HEADER: key} if key else {},
            http=http,
            limits=limits,
        )
        self.use_server_proxy = use_server_proxy
        self.poll_interval = poll_interval
        self.ready_timeout = ready_timeout
        self.delete_attempts = max(1, delete_attempts)
        self.signed_endpoints = 0.0 if use_server_proxy else float(signed_endpoints)
        """Seconds a signed endpoint (``?expires=``) should stay valid; 0: ask for plain
        endpoints."""

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._call(method, path, **kwargs)
        raise_for_status(response)
        return response

    def _path(self, sandbox_id: str, *rest: str) -> str:
        return "/".join(["/sandboxes", url_segment(sandbox_id, "sandbox id"), *rest])

    async def create(
        self, *, created: Callable[[str], None] | None = None, **options: Any
    ) -> Sandbox:
        """Create a sandbox, wait until it is Running, resolve its execd endpoint and wait for
        execd.

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
            await self.execd(endpoint).wait_ready(
                self.ready_timeout, min(self.poll_interval, 0.1) or 0.1
            )
        except BaseException:
            await asyncio.shield(self._delete_quietly(sandbox_id))
            raise
        return Sandbox(id=sandbox_id, state=sandbox_state(info), info=info, endpoint=endpoint)

    async def _post_create(self, body: dict[str, Any]) -> httpx.Response:
        """``POST /sandboxes``, retried while the server has no capacity (429, 503) until
        ``ready_timeout``; each attempt may take what is left of ``ready_timeout`` (the published
        server answers only once the container exists), at least ``request_timeout``.

        The wait between attempts is the answer's ``Retry-After`` (else 1, 2, 4... s, at most
        :data:`CAPACITY_MAX_DELAY`), cut short at the deadline; when the deadline runs out,
        :class:`SandboxCapacityError` says how often and how long it was tried. 403
        ``QUOTA_EXCEEDED`` raises :class:`SandboxQuotaExceeded` at once (retrying cannot help).
        """
        started = time.monotonic()
        delay, attempts = CAPACITY_FIRST_DELAY, 0
        while True:
            attempts += 1
            left = self.ready_timeout - (time.monotonic() - started)
            longer: dict[str, Any] = {}
            if left > self.limits.request_timeout:
                longer = {"timeout": left, "deadline_is": "what was left of ready_timeout"}
            response = await self._call("POST", "/sandboxes", json=body, **longer)
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
                    + f": the server had no capacity for a new sandbox; tried {attempts} times "
                    f"over {elapsed:.1f} s and the launch deadline (ready_timeout "
                    f"{self.ready_timeout:g} s) ran out. Raise ready_timeout to wait longer, or "
                    "free capacity on the deployment (its pools, its nodes)",
                    response=response,
                    code=code,
                    detail=message,
                )
            (log.warning if attempts == 1 else log.debug)(
                "POST %s/sandboxes answered %d (no capacity now); retrying in %.1f s (attempt %d, "
                "%.1f s of ready_timeout %g s spent)",
                self.url,
                response.status_code,
                wait,
                attempts,
                elapsed,
                self.ready_timeout,
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
        self,
        *,
        metadata: Mapping[str, str] | None = None,
        states: list[str] | None = None,
        max_pages: int = 1000,
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
                raise OpenSandboxProtocolError(
                    f"{what} answered with items or pagination of the wrong type"
                )
            items.extend(item for item in page_items if isinstance(item, dict))
            if not pagination.get("hasNextPage") or not page_items:
                return items
        return items

    async def wait_running(
        self, sandbox_id: str, info: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Poll until the sandbox is Running and return its description.

        ``Pending``, ``Unknown``, ``Pausing``, ``Resuming`` and states the client does not know
        (logged once) are waited through; ``Paused`` and the terminal states raise
        :class:`SandboxStateError`; 404 raises :class:`SandboxNotFound`; the ready timeout raises
        :class:`SandboxTimeoutError` naming the last state.
        """
        return await self.wait_state(sandbox_id, "Running", info, paused_fails=True)

    async def wait_state(
        self,
        sandbox_id: str,
        wanted: str,
        info: dict[str, Any] | None = None,
        *,
        paused_fails: bool = False,
    ) -> dict[str, Any]:
        """Poll until the sandbox is in state ``wanted`` and return its description, as
        :meth:`wait_running` does (``Paused`` raises only with ``paused_fails``)."""
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
                    "it cannot run code while paused; resume it (POST "
                    f"/sandboxes/{sandbox_id}/resume) or delete it",
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
                            raise OpenSandboxProtocolError(
                                f"{what} answered with an endpoint that is not a string"
                            )
                        headers = answer.get("headers") or {}
                        if not isinstance(headers, dict):
                            raise OpenSandboxProtocolError(
                                f"{what} answered with headers that are not an object"
                            )
                        return Endpoint(
                            url=endpoint_url(answer["endpoint"], self.url),
                            headers=as_str_dict(headers),
                        )
                    last = f"{what} answered without an endpoint"
                elif response.status_code in RETRY_STATUSES:
                    last = f"{what} answered {response.status_code}"
                else:
                    raise_for_status(response)
            elapsed = time.monotonic() - started
            if elapsed >= self.ready_timeout:
                raise SandboxTimeoutError(
                    f"execd endpoint (port {port}) of sandbox {sandbox_id} was not ready: tried "
                    f"{attempts} times over {elapsed:.1f} s (ready_timeout {self.ready_timeout:g} "
                    f"s); last: {last}"
                )
            await asyncio.sleep(self.poll_interval)

    async def pause(self, sandbox_id: str, *, wait: bool = True) -> dict[str, Any]:
        """Pause a sandbox (``POST /sandboxes/{id}/pause``); with ``wait``, poll until it is
        ``Paused``.

        Returns the last description. A sandbox that is not running answers 409
        (:class:`OpenSandboxAPIError`); the wait ends with :class:`SandboxTimeoutError` after the
        ready timeout.
        """
        await self._request("POST", self._path(sandbox_id, "pause"))
        return await self.wait_state(sandbox_id, "Paused") if wait else await self.get(sandbox_id)

    async def resume(self, sandbox_id: str, *, wait: bool = True) -> dict[str, Any]:
        """Resume a paused sandbox (``POST /sandboxes/{id}/resume``); with ``wait``, until it is
        ``Running``."""
        await self._request("POST", self._path(sandbox_id, "resume"))
        return await self.wait_state(sandbox_id, "Running") if wait else await self.get(sandbox_id)

    def _endpoint_params(self) -> dict[str, str]:
        """The endpoint lookup's query: ``expires`` (now + ``signed_endpoints`` s) while signing is
        asked for."""
        params = {"use_server_proxy": "true" if self.use_server_proxy else "false"}
        if self.signed_endpoints:
            params["expires"] = str(int(time.time() + self.signed_endpoints))
        return params

    def _signing_refused(self, response: httpx.Response) -> bool:
        """True (and signing off for this client, logged once) when the server does not offer signed
        endpoints: a 400 to ``expires`` (the Docker runtime; Kubernetes without an ingress
        gateway)."""
        if not self.signed_endpoints or response.status_code != 400:
            return False
        code, message = _error_body(response)
        words = f"{code} {message}".lower()
        if "signed route" not in words and "expires" not in words:
            return False
        self.signed_endpoints = 0.0
        log.warning(
            "%s: the server offers no signed endpoints (%s); using plain endpoints",
            self.url,
            message,
        )
        return True

    # -- a sandbox's egress policy (``/sandboxes/{id}/networkpolicy``, held by its sidecar) --

    async def network_policy(self, sandbox_id: str) -> dict[str, Any]:
        """The sandbox's egress policy as ``{"defaultAction"?, "egress": [{"action",
        "target"}...]}``, rebuilt from the answer (anything else in it is dropped; a malformed
        answer raises)."""
        path = self._path(sandbox_id, "networkpolicy")
        what = f"GET {self.url}{path}"
        answer = json_object(await self._request("GET", path), what)
        return policy_of(answer, what)

    async def replace_network_policy(self, sandbox_id: str, policy: Mapping[str, Any]) -> None:
        """Replace the sandbox's egress policy (``PUT``: the sidecar takes the whole policy)."""
        await self._request(
            "PUT", self._path(sandbox_id, "networkpolicy"), json=policy_of(policy, "the policy")
        )

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
        """Return an :class:`ExecdClient` for ``endpoint`` that shares this client's connection
        pool."""
        return ExecdClient(
            endpoint.url, endpoint.headers, http=self._http._http, limits=self.limits
        )

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
        return await self.execd(endpoint).run(
            code, context_id=context_id, language=language, on_event=on_event
        )
