"""Lifecycle and execd client rules, on httpx.MockTransport (no network at all)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kernel_sandbox.errors import KernelSandboxError

from kernel_sandbox.opensandbox import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_IMAGE,
    ExecdClient,
    OpenSandboxAPIError,
    OpenSandboxClient,
    OpenSandboxConfigError,
    OutputLimitExceeded,
    Sandbox,
    SandboxStateError,
    SandboxTimeoutError,
    build_create_body,
    run_once,
)
from kernel_sandbox.opensandbox import client as client_module

API = "http://sandbox.test/v1"
ENDPOINT = {"endpoint": "execd.test:44772", "headers": {"X-EXECD-ACCESS-TOKEN": "execd-token"}}

Answer = httpx.Response | Callable[[httpx.Request], httpx.Response] | Exception


class Router:
    """A MockTransport handler: answers by (method, path) from queues, records every request."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.routes: dict[tuple[str, str], list[Answer]] = {}

    def add(self, method: str, path: str, *answers: Answer) -> Router:
        self.routes.setdefault((method, path), []).extend(answers)
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        queue = self.routes.get((request.method, request.url.path))
        if not queue:
            raise AssertionError(f"unexpected {request.method} {request.url}")
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.url.path) for r in self.requests]

    def body(self, index: int) -> Any:
        return json.loads(self.requests[index].content)


def sandbox_json(state: str, sandbox_id: str = "osb_1") -> httpx.Response:
    return httpx.Response(200, json={"id": sandbox_id, "status": {"state": state}, "createdAt": "2026-01-01T00:00:00Z"})


def events(*items: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, content="".join(json.dumps(e) + "\n\n" for e in items).encode())


def lifecycle(router: Router, **kwargs: Any) -> OpenSandboxClient:
    kwargs.setdefault("poll_interval", 0)
    kwargs.setdefault("api_key", "")
    return OpenSandboxClient(kwargs.pop("api_base", API), http=router.http(), **kwargs)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    recorded: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(client_module.asyncio, "sleep", fake_sleep)
    return recorded


def running_router() -> Router:
    return (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Running"))
        .add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json=ENDPOINT))
    )


# ---- create ---------------------------------------------------------------------------


async def test_create_posts_defaults_labels_and_omits_empty_key() -> None:
    router = running_router()
    sandbox = await lifecycle(router).create()
    request = router.requests[0]
    assert request.url == f"{API}/sandboxes"
    assert "OPEN-SANDBOX-API-KEY" not in request.headers
    assert router.body(0) == {
        "image": {"uri": DEFAULT_IMAGE},
        "entrypoint": list(DEFAULT_ENTRYPOINT),
        "timeout": 300,
        "resourceLimits": {"cpu": "1", "memory": "2Gi"},
        "metadata": {"kernel-sandbox": "true"},
        "networkPolicy": {"defaultAction": "deny", "egress": []},
    }
    assert sandbox.id == "osb_1" and sandbox.state == "Running"
    assert sandbox.endpoint is not None
    assert sandbox.endpoint.url == "http://execd.test:44772"
    assert sandbox.endpoint.headers == {"X-EXECD-ACCESS-TOKEN": "execd-token"}


async def test_create_with_internet_omits_network_policy() -> None:
    router = running_router()
    await lifecycle(router).create(allow_internet=True)
    assert "networkPolicy" not in router.body(0)


async def test_create_custom_options() -> None:
    router = running_router()
    await lifecycle(router, api_key="osb-key", use_server_proxy=True).create(
        image="custom/image:1",
        entrypoint=["/bin/sh", "-lc", "sleep 3600"],
        timeout=600,
        resource_limits={"cpu": "500m", "memory": "512Mi"},
        resource_requests={"cpu": "250m", "memory": "256Mi"},
        env={"PYTHONUNBUFFERED": 1},
        metadata={"suite": "unit"},
        network_policy={"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]},
        secure_access=True,
    )
    body = router.body(0)
    assert body["image"] == {"uri": "custom/image:1"}
    assert body["entrypoint"] == ["/bin/sh", "-lc", "sleep 3600"]
    assert body["timeout"] == 600
    assert body["resourceLimits"] == {"cpu": "500m", "memory": "512Mi"}
    assert body["resourceRequests"] == {"cpu": "250m", "memory": "256Mi"}
    assert body["env"] == {"PYTHONUNBUFFERED": "1"}
    assert body["metadata"] == {"kernel-sandbox": "true", "suite": "unit"}
    assert body["networkPolicy"] == {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}
    assert body["secureAccess"] is True
    for request in router.requests:
        assert request.headers["OPEN-SANDBOX-API-KEY"] == "osb-key"
    assert router.requests[1].url.params["use_server_proxy"] == "true"


def test_calls_do_not_share_mutable_defaults() -> None:
    first, second = build_create_body(), build_create_body()
    first["resourceLimits"]["cpu"] = "8"
    first["entrypoint"].append("--evil")
    first["metadata"]["x"] = "y"
    first["networkPolicy"]["egress"].append({"action": "allow", "target": "*"})
    assert second == build_create_body()
    assert second["resourceLimits"] == {"cpu": "1", "memory": "2Gi"}


async def test_create_waits_across_pending_with_poll_interval(sleeps: list[float]) -> None:
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Pending"))
        .add("GET", "/v1/sandboxes/osb_1", sandbox_json("Pending"), sandbox_json("Running"))
        .add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json=ENDPOINT))
    )
    sandbox = await lifecycle(router, poll_interval=0.25, ready_timeout=60).create()
    assert sandbox.state == "Running"
    assert sleeps == [0.25, 0.25]
    assert router.calls() == [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/osb_1"),
        ("GET", "/v1/sandboxes/osb_1"),
        ("GET", "/v1/sandboxes/osb_1/endpoints/44772"),
    ]


@pytest.mark.parametrize("state", ["Failed", "Terminated", "Stopping"])
async def test_terminal_state_raises_naming_it_and_deletes(state: str) -> None:
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Pending"))
        .add("GET", "/v1/sandboxes/osb_1", sandbox_json(state))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    with pytest.raises(SandboxStateError, match=f"entered {state}") as info:
        await lifecycle(router).create()
    assert info.value.state == state
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


async def test_not_running_in_time_raises_timeout_and_deletes() -> None:
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Pending"))
        .add("GET", "/v1/sandboxes/osb_1", sandbox_json("Pending"))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    with pytest.raises(TimeoutError, match="was not Running"):
        await lifecycle(router, ready_timeout=0).create()
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


# ---- endpoint -------------------------------------------------------------------------


async def test_endpoint_retries_404_until_ready(sleeps: list[float]) -> None:
    router = Router().add(
        "GET",
        "/v1/sandboxes/osb_1/endpoints/44772",
        httpx.Response(404, json={"code": "NOT_FOUND", "message": "not yet"}),
        httpx.Response(200, json=ENDPOINT),
    )
    endpoint = await lifecycle(router, poll_interval=0.5, ready_timeout=60).endpoint("osb_1")
    assert endpoint.url == "http://execd.test:44772"
    assert sleeps == [0.5]
    assert len(router.requests) == 2
    assert router.requests[0].url.params["use_server_proxy"] == "false"


async def test_endpoint_other_errors_raise() -> None:
    router = Router().add(
        "GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(500, json={"code": "INTERNAL", "message": "boom"})
    )
    with pytest.raises(OpenSandboxAPIError) as info:
        await lifecycle(router).endpoint("osb_1")
    assert isinstance(info.value, KernelSandboxError) and info.value.status_code == 500
    assert info.value.code == "INTERNAL" and info.value.message == "boom"
    assert "500" in str(info.value) and "boom" in str(info.value)


async def test_endpoint_missing_in_answer_is_a_timeout() -> None:
    router = Router().add(
        "GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json={"headers": {"X": "y"}})
    )
    with pytest.raises(SandboxTimeoutError, match=r"execd endpoint.*not ready"):
        await lifecycle(router, ready_timeout=0).endpoint("osb_1")


async def test_endpoint_404_past_ready_timeout_is_a_timeout() -> None:
    router = Router().add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(404))
    with pytest.raises(TimeoutError):
        await lifecycle(router, ready_timeout=0).endpoint("osb_1")


# ---- run code -------------------------------------------------------------------------


async def test_run_code_on_bare_id_resolves_endpoint_and_sends_headers() -> None:
    router = (
        Router()
        .add("GET", "/v1/sandboxes/osb_bare/endpoints/44772", httpx.Response(200, json=ENDPOINT))
        .add("POST", "/code", events({"type": "init", "text": "ctx"}, {"type": "stdout", "text": "42\n"}))
    )
    execution = await lifecycle(router).run_code("osb_bare", "print(6*7)")
    assert router.calls() == [("GET", "/v1/sandboxes/osb_bare/endpoints/44772"), ("POST", "/code")]
    run = router.requests[1]
    assert str(run.url) == "http://execd.test:44772/code"
    assert run.headers["X-EXECD-ACCESS-TOKEN"] == "execd-token"
    assert json.loads(run.content) == {"code": "print(6*7)", "context": {"language": "python"}}
    assert execution.stdout == "42\n"


async def test_scheme_less_endpoint_takes_the_api_base_scheme() -> None:
    router = (
        Router()
        .add(
            "GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json={"endpoint": "gw.test/route/44772"})
        )
        .add("POST", "/route/44772/code", events({"type": "stdout", "text": "1\n"}))
    )
    client = lifecycle(router, api_base="https://sandbox.test/v1")
    await client.run_code(Sandbox(id="osb_1", state="Running"), "print(1)", context_id="ctx-9")
    run = router.requests[1]
    assert str(run.url) == "https://gw.test/route/44772/code"
    assert json.loads(run.content)["context"] == {"language": "python", "id": "ctx-9"}


async def test_stream_over_byte_cap_aborts() -> None:
    router = Router().add("POST", "/code", events({"type": "stdout", "text": "x" * 5000}))
    execd = ExecdClient("http://execd.test:44772", http=router.http(), max_output_bytes=1000)
    with pytest.raises(OutputLimitExceeded, match="exceeded 1000 bytes"):
        await execd.run("print('x' * 5000)")


async def test_execd_busy_context_raises_with_its_message() -> None:
    router = Router().add(
        "POST", "/code", httpx.Response(500, json={"code": "RUNTIME_ERROR", "message": "session is busy"})
    )
    with pytest.raises(OpenSandboxAPIError, match="session is busy"):
        await ExecdClient("http://execd.test", http=router.http()).run("1")


async def test_execd_contexts_and_interrupt() -> None:
    router = (
        Router()
        .add("POST", "/code/context", httpx.Response(200, json={"id": "ctx-1", "language": "python"}))
        .add("DELETE", "/code", httpx.Response(200))
        .add("DELETE", "/code/contexts/ctx-1", httpx.Response(200), httpx.Response(404))
    )
    execd = ExecdClient("http://execd.test/", {"X-EXECD-ACCESS-TOKEN": "t"}, http=router.http())
    assert await execd.create_context() == "ctx-1"
    await execd.interrupt("ctx-1")
    assert router.requests[1].url.params["id"] == "ctx-1"
    assert await execd.delete_context("ctx-1") is True
    assert await execd.delete_context("ctx-1") is False
    assert all(r.headers["X-EXECD-ACCESS-TOKEN"] == "t" for r in router.requests)


async def test_on_event_callback_sees_events_in_order() -> None:
    router = Router().add(
        "POST", "/code", events({"type": "stdout", "text": "a"}, {"type": "ping"}, {"type": "stdout", "text": "b"})
    )
    seen: list[str] = []

    async def on_event(event: Any) -> None:
        seen.append(event.type)

    await ExecdClient("http://execd.test", http=router.http()).run("x", on_event=on_event)
    assert seen == ["stdout", "ping", "stdout"]


# ---- delete, list, renew --------------------------------------------------------------


async def test_delete_404_is_false_and_other_errors_raise() -> None:
    router = (
        Router()
        .add("DELETE", "/v1/sandboxes/gone", httpx.Response(404))
        .add("DELETE", "/v1/sandboxes/err", httpx.Response(500))
        .add("DELETE", "/v1/sandboxes/ok", httpx.Response(204))
    )
    client = lifecycle(router)
    assert await client.delete("gone") is False
    assert await client.delete("ok") is True
    with pytest.raises(OpenSandboxAPIError):
        await client.delete("err")


async def test_list_filters_by_label_and_follows_pages() -> None:
    router = Router().add(
        "GET",
        "/v1/sandboxes",
        httpx.Response(200, json={"items": [{"id": "a"}], "pagination": {"hasNextPage": True}}),
        httpx.Response(200, json={"items": [{"id": "b"}], "pagination": {"hasNextPage": False}}),
    )
    items = await lifecycle(router).list_sandboxes(metadata={"kernel-sandbox": "true"}, states=["Running"])
    assert [i["id"] for i in items] == ["a", "b"]
    params = router.requests[0].url.params
    assert params["metadata"] == "kernel-sandbox=true" and params["state"] == "Running"
    assert router.requests[1].url.params["page"] == "2"


async def test_renew_posts_a_future_expiry() -> None:
    router = Router().add(
        "POST", "/v1/sandboxes/osb_1/renew-expiration", lambda r: httpx.Response(200, json=json.loads(r.content))
    )
    expires = await lifecycle(router).renew("osb_1", 300)
    assert expires.endswith("Z") and router.body(0) == {"expiresAt": expires}


# ---- configuration --------------------------------------------------------------------


def test_api_base_and_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", "https://env.test/v1/")
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "env-key")
    client = OpenSandboxClient()
    assert client.api_base == "https://env.test/v1"
    assert client.headers == {"OPEN-SANDBOX-API-KEY": "env-key"}
    assert OpenSandboxClient("https://arg.test/v1", "arg-key").headers == {"OPEN-SANDBOX-API-KEY": "arg-key"}
    assert OpenSandboxClient(api_key="").headers == {}


def test_api_base_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE", raising=False)
    with pytest.raises(OpenSandboxConfigError, match="OPEN_SANDBOX_API_BASE"):
        OpenSandboxClient()


# ---- one-shot helper ------------------------------------------------------------------


async def test_run_once_creates_runs_and_deletes() -> None:
    router = (
        running_router()
        .add("POST", "/code", events({"type": "stdout", "text": "42\n"}))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    execution = await run_once("print(6*7)", api_base=API, api_key="", http=router.http())
    assert execution.stdout == "42\n"
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


async def test_run_once_deletes_even_when_the_run_raises() -> None:
    router = (
        running_router()
        .add("POST", "/code", RuntimeError("boom"))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    with pytest.raises(RuntimeError, match="boom"):
        await run_once("1/0", api_base=API, api_key="", http=router.http())
    assert router.calls() == [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/osb_1/endpoints/44772"),
        ("POST", "/code"),
        ("DELETE", "/v1/sandboxes/osb_1"),
    ]
