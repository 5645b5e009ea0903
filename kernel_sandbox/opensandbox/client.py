"""Async clients for an OpenSandbox deployment: the lifecycle server and a sandbox's execd.

The lifecycle server creates, inspects and deletes sandboxes (``/v1/sandboxes``); ``execd`` runs
inside each sandbox (port 44772) and executes code in Jupyter contexts, answering with a stream of
events (see :mod:`kernel_sandbox.opensandbox.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

from ..errors import (
    OpenSandboxAPIError,
    OpenSandboxConfigError,
    OpenSandboxError,
    OutputLimitExceeded,
    SandboxStateError,
    SandboxTimeoutError,
)
from .events import Event, ExecdRun, parse_event

ENV_API_BASE = "OPEN_SANDBOX_API_BASE"
ENV_API_KEY = "OPEN_SANDBOX_API_KEY"
API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
DEFAULT_IMAGE = "opensandbox/code-interpreter:v1.1.0"
DEFAULT_ENTRYPOINT: tuple[str, ...] = ("/opt/code-interpreter/code-interpreter.sh",)
DEFAULT_TIMEOUT = 300
DEFAULT_RESOURCE_LIMITS: Mapping[str, str] = MappingProxyType({"cpu": "1", "memory": "2Gi"})
DEFAULT_READY_TIMEOUT = 120.0
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024
EXECD_PORT = 44772
LABELS: Mapping[str, str] = MappingProxyType({"kernel-sandbox": "true"})
TERMINAL_STATES = frozenset({"Failed", "Stopping", "Terminated"})

EventCallback = Callable[[Event], Awaitable[None] | None]


@dataclass(frozen=True)
class Endpoint:
    """Where a sandbox's execd answers, and the headers every call to it must carry."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


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
    return base.rstrip("/")


def resolve_api_key(api_key: str | None = None) -> str:
    """Return the API key from the argument (even when empty) or ``OPEN_SANDBOX_API_KEY``."""
    if api_key is not None:
        return api_key
    return os.environ.get(ENV_API_KEY, "")


def endpoint_url(endpoint: str, api_base: str) -> str:
    """Turn an endpoint as the server reports it (``host:port[/path]``) into a URL.

    An endpoint without a scheme takes the API base's scheme.
    """
    endpoint = endpoint.rstrip("/")
    if "://" in endpoint:
        return endpoint
    scheme = urlsplit(api_base).scheme or "http"
    return f"{scheme}://{endpoint}"


def as_str_dict(value: Mapping[str, Any] | None) -> dict[str, str]:
    """Return a fresh ``{str: str}`` copy of a mapping (empty for None)."""
    return {str(k): str(v) for k, v in (value or {}).items()}


def sandbox_state(info: Mapping[str, Any] | None) -> str | None:
    """Return ``status.state`` of a sandbox description, or None when it has none."""
    status = info.get("status") if isinstance(info, Mapping) else None
    state = status.get("state") if isinstance(status, Mapping) else None
    return state if isinstance(state, str) else None


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
) -> dict[str, Any]:
    """Build a ``POST /sandboxes`` body; every call returns fresh objects.

    The sandbox is labelled with :data:`LABELS`. Without ``network_policy`` egress is denied unless
    ``allow_internet`` is true (then the policy is omitted and the sandbox has open egress).
    """
    body: dict[str, Any] = {
        "image": {"uri": image or DEFAULT_IMAGE},
        "entrypoint": list(entrypoint or DEFAULT_ENTRYPOINT),
        "timeout": int(DEFAULT_TIMEOUT if timeout is None else timeout),
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
    return body


def _error_body(response: httpx.Response) -> tuple[str | None, str | None]:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return None, text[:500] or None
    if isinstance(body, dict):
        code, message = body.get("code"), body.get("message") or body.get("detail")
        return (None if code is None else str(code)), (None if message is None else str(message))
    return None, None


def raise_for_status(response: httpx.Response) -> None:
    """Raise :class:`OpenSandboxAPIError` for a non-2xx response (its body must be read)."""
    if response.is_success:
        return
    code, message = _error_body(response)
    request = response.request
    detail = " ".join(part for part in (code and f"{code}:", message) if part)
    raise OpenSandboxAPIError(
        f"{request.method} {request.url} answered {response.status_code}" + (f" ({detail})" if detail else ""),
        response=response,
        code=code,
        detail=message,
    )


async def _emit(callback: EventCallback | None, event: Event) -> None:
    if callback is None:
        return
    result = callback(event)
    if asyncio.iscoroutine(result):
        await result


class ExecdClient:
    """Talks to one sandbox's execd: run code (streamed), manage contexts, interrupt."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = as_str_dict(headers)
        self.max_output_bytes = max_output_bytes
        self._timeout = httpx.Timeout(request_timeout)
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=self._timeout)

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> ExecdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def stream(
        self, code: str, *, context_id: str | None = None, language: str = "python"
    ) -> AsyncIterator[Event]:
        """Run ``code`` and yield its events as they arrive.

        Raises :class:`OutputLimitExceeded` once the stream passes ``max_output_bytes``.
        """
        context: dict[str, str] = {"language": language}
        if context_id:
            context["id"] = context_id
        body = {"code": code, "context": context}
        timeout = httpx.Timeout(self._timeout.connect, read=None)
        async with self._http.stream(
            "POST", f"{self.url}/code", json=body, headers=self.headers, timeout=timeout
        ) as response:
            if not response.is_success:
                await response.aread()
                raise_for_status(response)
            received = 0
            buffer = b""
            async for chunk in response.aiter_bytes():
                received += len(chunk)
                if received > self.max_output_bytes:
                    raise OutputLimitExceeded(
                        f"execd output exceeded {self.max_output_bytes} bytes; the stream was aborted"
                    )
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = parse_event(line)
                    if event is not None:
                        yield event
            event = parse_event(buffer)
            if event is not None:
                yield event

    async def run(
        self,
        code: str,
        *,
        context_id: str | None = None,
        language: str = "python",
        on_event: EventCallback | None = None,
    ) -> ExecdRun:
        """Run ``code`` to completion and return the collected :class:`ExecdRun`."""
        execution = ExecdRun(context_id=context_id)
        async for event in self.stream(code, context_id=context_id, language=language):
            execution.add(event)
            await _emit(on_event, event)
        return execution

    async def create_context(self, language: str = "python") -> str:
        """Create a fresh code context and return its id."""
        response = await self._http.post(f"{self.url}/code/context", json={"language": language}, headers=self.headers)
        raise_for_status(response)
        context_id = response.json().get("id")
        if not context_id:
            raise OpenSandboxError(f"execd created a {language} context without an id")
        return str(context_id)

    async def delete_context(self, context_id: str) -> bool:
        """Delete a code context; False when it was already gone."""
        response = await self._http.delete(f"{self.url}/code/contexts/{context_id}", headers=self.headers)
        if response.status_code == 404:
            return False
        raise_for_status(response)
        return True

    async def interrupt(self, context_id: str) -> None:
        """Interrupt the code running in ``context_id``."""
        response = await self._http.delete(f"{self.url}/code", params={"id": context_id}, headers=self.headers)
        raise_for_status(response)


class OpenSandboxClient:
    """Async client for the OpenSandbox lifecycle API (create, wait, endpoint, delete...).

    ``api_base`` and ``api_key`` default to ``OPEN_SANDBOX_API_BASE`` and ``OPEN_SANDBOX_API_KEY``;
    the key header is left out when the key is empty.
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
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self.api_base = resolve_api_base(api_base)
        self.api_key = resolve_api_key(api_key)
        self.use_server_proxy = use_server_proxy
        self.poll_interval = poll_interval
        self.ready_timeout = ready_timeout
        self.request_timeout = request_timeout
        self.max_output_bytes = max_output_bytes
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=httpx.Timeout(request_timeout))

    @property
    def headers(self) -> dict[str, str]:
        """Headers for lifecycle calls (the API key header only when a key is set)."""
        return {API_KEY_HEADER: self.api_key} if self.api_key else {}

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> OpenSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._http.request(method, f"{self.api_base}{path}", headers=self.headers, **kwargs)
        raise_for_status(response)
        return response

    async def create(
        self,
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
    ) -> Sandbox:
        """Create a sandbox, wait until it is Running and resolve its execd endpoint.

        The sandbox is deleted again when waiting or resolving fails.
        """
        body = build_create_body(
            image=image,
            entrypoint=entrypoint,
            timeout=timeout,
            resource_limits=resource_limits,
            resource_requests=resource_requests,
            env=env,
            metadata=metadata,
            allow_internet=allow_internet,
            network_policy=network_policy,
            secure_access=secure_access,
        )
        info = (await self._request("POST", "/sandboxes", json=body)).json()
        sandbox_id = str(info["id"])
        try:
            info = await self.wait_running(sandbox_id, info)
            endpoint = await self.endpoint(sandbox_id)
        except BaseException:
            await asyncio.shield(self._delete_quietly(sandbox_id))
            raise
        return Sandbox(id=sandbox_id, state=sandbox_state(info), info=info, endpoint=endpoint)

    async def _delete_quietly(self, sandbox_id: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.delete(sandbox_id)

    async def get(self, sandbox_id: str) -> dict[str, Any]:
        """Return the server's description of a sandbox (404 raises :class:`OpenSandboxAPIError`)."""
        return (await self._request("GET", f"/sandboxes/{sandbox_id}")).json()

    async def list_sandboxes(
        self, *, metadata: Mapping[str, str] | None = None, states: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """List sandboxes, optionally filtered by metadata labels and states (all pages)."""
        items: list[dict[str, Any]] = []
        page = 1
        while True:
            params: list[tuple[str, Any]] = [("page", page), ("pageSize", 100)]
            if metadata:
                params.append(("metadata", urlencode(as_str_dict(metadata))))
            params.extend(("state", state) for state in states or [])
            answer = (await self._request("GET", "/sandboxes", params=params)).json()
            items.extend(answer.get("items") or [])
            if not (answer.get("pagination") or {}).get("hasNextPage"):
                return items
            page += 1

    async def wait_running(self, sandbox_id: str, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Poll until the sandbox is Running and return its description.

        A terminal state raises :class:`SandboxStateError`; the ready timeout raises
        :class:`SandboxTimeoutError`.
        """
        deadline = time.monotonic() + self.ready_timeout
        if info is None:
            info = await self.get(sandbox_id)
        while True:
            state = sandbox_state(info)
            if state == "Running":
                return info
            if state in TERMINAL_STATES:
                message = str((info.get("status") or {}).get("message") or "")
                raise SandboxStateError(sandbox_id, state, message)
            if time.monotonic() >= deadline:
                raise SandboxTimeoutError(
                    f"sandbox {sandbox_id} was not Running after {self.ready_timeout:g}s (state {state})"
                )
            await asyncio.sleep(self.poll_interval)
            info = await self.get(sandbox_id)

    async def endpoint(self, sandbox_id: str, port: int = EXECD_PORT) -> Endpoint:
        """Resolve the endpoint of ``port`` in the sandbox, retrying 404 until the ready timeout."""
        deadline = time.monotonic() + self.ready_timeout
        params = {"use_server_proxy": "true" if self.use_server_proxy else "false"}
        while True:
            response = await self._http.get(
                f"{self.api_base}/sandboxes/{sandbox_id}/endpoints/{port}", headers=self.headers, params=params
            )
            if response.status_code != 404:
                raise_for_status(response)
                answer = response.json()
                if isinstance(answer, dict) and answer.get("endpoint"):
                    return Endpoint(
                        url=endpoint_url(str(answer["endpoint"]), self.api_base),
                        headers=as_str_dict(answer.get("headers")),
                    )
            if time.monotonic() >= deadline:
                raise SandboxTimeoutError(
                    f"execd endpoint (port {port}) of sandbox {sandbox_id} was not ready after {self.ready_timeout:g}s"
                )
            await asyncio.sleep(self.poll_interval)

    async def renew(self, sandbox_id: str, seconds: float) -> str:
        """Move the sandbox's expiration to ``seconds`` from now; return the new ``expiresAt``."""
        expires = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        body = {"expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
        answer = (await self._request("POST", f"/sandboxes/{sandbox_id}/renew-expiration", json=body)).json()
        return str(answer.get("expiresAt", body["expiresAt"]))

    async def delete(self, sandbox_id: str) -> bool:
        """Delete a sandbox; False when it was already gone (404), other errors raise."""
        response = await self._http.delete(f"{self.api_base}/sandboxes/{sandbox_id}", headers=self.headers)
        if response.status_code == 404:
            return False
        raise_for_status(response)
        return True

    def execd(self, endpoint: Endpoint) -> ExecdClient:
        """Return an :class:`ExecdClient` for ``endpoint`` that shares this client's connection pool."""
        return ExecdClient(
            endpoint.url,
            endpoint.headers,
            http=self._http,
            request_timeout=self.request_timeout,
            max_output_bytes=self.max_output_bytes,
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
        return await self.execd(endpoint).run(code, context_id=context_id, language=language, on_event=on_event)


async def run_once(
    code: str,
    *,
    api_base: str | None = None,
    api_key: str | None = None,
    http: httpx.AsyncClient | None = None,
    language: str = "python",
    on_event: EventCallback | None = None,
    **create_options: Any,
) -> ExecdRun:
    """Create a sandbox, run ``code`` in it and delete it, also when the run raises."""
    async with OpenSandboxClient(api_base, api_key, http=http) as client:
        sandbox = await client.create(**create_options)
        try:
            return await client.run_code(sandbox, code, language=language, on_event=on_event)
        finally:
            await asyncio.shield(client.delete(sandbox.id))


def run_once_sync(code: str, **options: Any) -> ExecdRun:
    """Blocking wrapper around :func:`run_once` (not for use inside a running event loop)."""
    return asyncio.run(run_once(code, **options))
