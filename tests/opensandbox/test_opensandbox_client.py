"""Lifecycle and execd client rules, on httpx.MockTransport (no network at all).

The answers follow what the published server (opensandbox-server 1.1.1) and upstream execd were
measured to send (shared/opensandbox-server.md): 202 with ``Running`` at once, an endpoint
``127.0.0.1:PORT/proxy/44772`` answered before execd listens, connection resets until execd is
up, ``error`` as a terminal event, FastAPI 422 ``detail`` lists, 404 for an expired sandbox.
Error paths the real server cannot produce on demand are here too; tests/opensandbox/
test_opensandbox_server.py runs the same clients against the real server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from kernel_sandbox.errors import (
    CallDeadlineExceeded,
    ConfigError,
    KernelSandboxError,
    OpenSandboxAPIError,
    OpenSandboxConfigError,
    OpenSandboxConnectionError,
    OpenSandboxProtocolError,
    OutputLimitExceeded,
    ResponseTooLarge,
    SandboxNotFound,
    SandboxStateError,
    SandboxTimeoutError,
)
from kernel_sandbox.opensandbox import ExecdClient, Limits, OpenSandboxClient, Sandbox, keep_alive, run_once
from kernel_sandbox.opensandbox import client as client_module
from kernel_sandbox.opensandbox.lifecycle import build_create_body, DEFAULT_ENTRYPOINT, DEFAULT_SANDBOX_IMAGE

API = "http://sandbox.test/v1"
EXECD = "http://127.0.0.1:40123/proxy/44772"
ENDPOINT = {"endpoint": "127.0.0.1:40123/proxy/44772"}

Answer = httpx.Response | Callable[[httpx.Request], httpx.Response] | Exception


class Body(httpx.AsyncByteStream):
    """A response body delivered in chunks, as from a socket (never pre-read)."""

    def __init__(self, content: bytes, chunk: int = 65536) -> None:
        self.content, self.chunk = content, chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.content), self.chunk):
            yield self.content[start : start + self.chunk]


def fresh(answer: httpx.Response) -> httpx.Response:
    """A new, unread copy of ``answer`` (a queued answer may be served many times)."""
    return httpx.Response(answer.status_code, headers=answer.headers, stream=Body(answer.content))


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
        queue = self.routes.get((request.method, request.url.raw_path.decode().split("?")[0]))
        if not queue:
            raise AssertionError(f"unexpected {request.method} {request.url}")
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return fresh(answer(request) if callable(answer) else answer)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.url.raw_path.decode().split("?")[0]) for r in self.requests]

    def body(self, index: int) -> Any:
        return json.loads(self.requests[index].content)


def sandbox_json(state: str, sandbox_id: str = "osb_1", status: int = 200, **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"id": sandbox_id, "status": {"state": state}, **extra})


def events(*items: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, content="".join(json.dumps(e) + "\n\n" for e in items).encode())


COMPLETE = {"type": "execution_complete", "execution_time": 3}


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


def created_router(*pings: Answer) -> Router:
    """The published server's answers: 202 Running at once, endpoint at once, execd up after ``pings``."""
    return (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Running", status=202))
        .add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json=ENDPOINT))
        .add("GET", "/proxy/44772/ping", *pings, httpx.Response(200))
    )


# ---- create, as the published server answers ----------------------------------------------


async def test_create_posts_defaults_labels_and_omits_empty_key() -> None:
    router = created_router()
    sandbox = await lifecycle(router).create()
    request = router.requests[0]
    assert request.url == f"{API}/sandboxes"
    assert "OPEN-SANDBOX-API-KEY" not in request.headers
    assert router.body(0) == {
        "image": {"uri": DEFAULT_SANDBOX_IMAGE},
        "entrypoint": list(DEFAULT_ENTRYPOINT),
        "timeout": 300,
        "resourceLimits": {"cpu": "1", "memory": "2Gi"},
        "metadata": {"kernel-sandbox": "true"},
        "networkPolicy": {"defaultAction": "deny", "egress": []},
    }
    assert sandbox.id == "osb_1" and sandbox.state == "Running"
    assert sandbox.endpoint is not None and sandbox.endpoint.url == EXECD


async def test_202_running_at_once_goes_straight_to_endpoint_and_ping() -> None:
    router = created_router()
    await lifecycle(router).create()
    assert router.calls() == [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/osb_1/endpoints/44772"),
        ("GET", "/proxy/44772/ping"),
    ]
    assert str(router.requests[2].url) == f"{EXECD}/ping"


async def test_readiness_polls_ping_through_resets_refusals_disconnects_and_proxy_errors() -> None:
    """The published server's endpoint answers before execd listens: the first pings fail at the connection."""
    router = created_router(
        httpx.ReadError(""),
        httpx.ConnectError(""),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.Response(502),
        httpx.Response(503),
        httpx.Response(404),
    )
    sandbox = await lifecycle(router, ready_timeout=60).create()
    assert sandbox.endpoint is not None
    assert router.calls().count(("GET", "/proxy/44772/ping")) == 7


async def test_readiness_timeout_says_what_was_tried_and_deletes() -> None:
    router = created_router(httpx.ReadError("")).add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    router.routes[("GET", "/proxy/44772/ping")] = [httpx.ReadError("")]
    with pytest.raises(SandboxTimeoutError) as info:
        await lifecycle(router, ready_timeout=0.3).create()
    message = str(info.value)
    assert f"execd at {EXECD} did not become ready: GET /ping tried" in message
    assert "ready_timeout 0.3 s" in message
    assert "the connection was reset or closed while reading the answer (ReadError" in message
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


async def test_ping_refused_with_401_fails_at_once() -> None:
    router = created_router(httpx.Response(401, json={"code": "UNAUTHORIZED", "message": "bad token"})).add(
        "DELETE", "/v1/sandboxes/osb_1", httpx.Response(204)
    )
    with pytest.raises(OpenSandboxAPIError, match="401.*bad token"):
        await lifecycle(router, ready_timeout=60).create()
    assert router.calls().count(("GET", "/proxy/44772/ping")) == 1


async def test_create_with_internet_omits_network_policy() -> None:
    router = created_router()
    await lifecycle(router).create(allow_internet=True)
    assert "networkPolicy" not in router.body(0)


async def test_create_custom_options_and_server_proxy_endpoint() -> None:
    server_proxy = {"endpoint": "sandbox.test/v1/sandboxes/osb_1/proxy/44772"}
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Running", status=202))
        .add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json=server_proxy))
        .add("GET", "/v1/sandboxes/osb_1/proxy/44772/ping", httpx.Response(200))
    )
    sandbox = await lifecycle(router, api_key="osb-key", use_server_proxy=True).create(
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
    assert router.requests[1].url.params["use_server_proxy"] == "true"
    assert sandbox.endpoint is not None and sandbox.endpoint.url == "http://sandbox.test/v1/sandboxes/osb_1/proxy/44772"
    lifecycle_calls, execd_calls = router.requests[:2], router.requests[2:]
    assert all(r.headers["OPEN-SANDBOX-API-KEY"] == "osb-key" for r in lifecycle_calls)
    assert all("OPEN-SANDBOX-API-KEY" not in r.headers for r in execd_calls)


def test_calls_do_not_share_mutable_defaults() -> None:
    first, second = build_create_body(), build_create_body()
    first["resourceLimits"]["cpu"] = "8"
    first["entrypoint"].append("--evil")
    first["metadata"]["x"] = "y"
    first["networkPolicy"]["egress"].append({"action": "allow", "target": "*"})
    assert second == build_create_body()
    assert second["resourceLimits"] == {"cpu": "1", "memory": "2Gi"}


async def test_pending_and_unknown_are_waited_through(sleeps: list[float]) -> None:
    router = created_router()
    router.routes[("POST", "/v1/sandboxes")] = [sandbox_json("Pending", status=202)]
    router.add("GET", "/v1/sandboxes/osb_1", sandbox_json("Unknown"), sandbox_json("Pending"), sandbox_json("Running"))
    sandbox = await lifecycle(router, poll_interval=0.25, ready_timeout=60).create()
    assert sandbox.state == "Running"
    assert sleeps[:3] == [0.25, 0.25, 0.25]
    assert router.calls()[:4] == [("POST", "/v1/sandboxes")] + [("GET", "/v1/sandboxes/osb_1")] * 3


@pytest.mark.parametrize("state", ["Failed", "Terminated", "Stopping", "Paused"])
async def test_unusable_state_raises_naming_it_and_deletes(state: str) -> None:
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Pending", status=202))
        .add("GET", "/v1/sandboxes/osb_1", sandbox_json(state))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    with pytest.raises(SandboxStateError, match=f"entered {state}") as info:
        await lifecycle(router).create()
    assert info.value.state == state
    if state == "Paused":
        assert "resume it" in str(info.value)
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


async def test_failed_state_carries_the_server_message() -> None:
    failed = httpx.Response(
        200, json={"id": "osb_1", "status": {"state": "Failed", "message": "Sandbox container exited with code 3."}}
    )
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Pending", status=202))
        .add("GET", "/v1/sandboxes/osb_1", failed)
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    with pytest.raises(SandboxStateError, match="exited with code 3"):
        await lifecycle(router).create()


async def test_not_running_in_time_names_the_last_state_and_deletes() -> None:
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Pending", status=202))
        .add("GET", "/v1/sandboxes/osb_1", sandbox_json("Pending"))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    with pytest.raises(TimeoutError, match="was not Running after .* last state Pending"):
        await lifecycle(router, ready_timeout=0).create()
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


# ---- error answers as the published server writes them ----------------------------------------


async def test_fastapi_422_names_the_field() -> None:
    detail = {
        "detail": [
            {
                "type": "greater_than_equal",
                "loc": ["body", "timeout"],
                "msg": "Input should be greater than or equal to 60",
                "input": 5,
            },
            {"type": "missing", "loc": ["body", "image", "uri"], "msg": "Field required"},
        ]
    }
    router = Router().add("POST", "/v1/sandboxes", httpx.Response(422, json=detail))
    with pytest.raises(OpenSandboxAPIError) as info:
        await lifecycle(router).create(timeout=5)
    error = info.value
    assert error.status_code == 422 and error.code is None
    assert "field 'timeout': Input should be greater than or equal to 60" in str(error)
    assert "field 'image.uri': Field required" in str(error)
    assert error.message is not None and "timeout" in error.message


async def test_network_policy_without_egress_says_how_to_fix_it() -> None:
    refused = {
        "code": "SANDBOX::INVALID_PARAMETER",
        "message": "egress.image must be configured when networkPolicy is provided.",
    }
    router = Router().add("POST", "/v1/sandboxes", httpx.Response(400, json=refused))
    with pytest.raises(OpenSandboxAPIError) as info:
        await lifecycle(router).create()
    message = str(info.value)
    assert info.value.code == "SANDBOX::INVALID_PARAMETER"
    assert "allow_internet=True" in message and "[egress] image" in message


async def test_expired_sandbox_is_a_404_not_terminated() -> None:
    gone = {"code": "DOCKER::SANDBOX_NOT_FOUND", "message": "Sandbox osb_1 not found."}
    router = Router().add("GET", "/v1/sandboxes/osb_1", httpx.Response(404, json=gone))
    with pytest.raises(SandboxNotFound) as info:
        await lifecycle(router).get("osb_1")
    assert isinstance(info.value, OpenSandboxAPIError) and info.value.code == "DOCKER::SANDBOX_NOT_FOUND"


async def test_image_labels_in_metadata_are_kept_and_do_not_confuse_the_label_filter() -> None:
    item = {
        "id": "a",
        "status": {"state": "Running"},
        "metadata": {"kernel-sandbox": "true", "maintainer": "image label"},
    }
    router = Router().add(
        "GET", "/v1/sandboxes", httpx.Response(200, json={"items": [item], "pagination": {"hasNextPage": False}})
    )
    items = await lifecycle(router).list_sandboxes(metadata={"kernel-sandbox": "true"})
    assert items == [item]
    assert router.requests[0].url.params["metadata"] == "kernel-sandbox=true"


async def test_api_error_is_not_an_httpx_error_and_has_its_fields() -> None:
    router = Router().add(
        "GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(500, json={"code": "INTERNAL", "message": "boom"})
    )
    with pytest.raises(OpenSandboxAPIError) as info:
        await lifecycle(router).endpoint("osb_1")
    error = info.value
    assert isinstance(error, KernelSandboxError) and not isinstance(error, httpx.HTTPError)
    assert (error.status_code, error.code, error.message) == (500, "INTERNAL", "boom")
    assert error.response.status_code == 500
    assert str(error) == f"GET {API}/sandboxes/osb_1/endpoints/44772 answered 500 (INTERNAL: boom)"


@pytest.mark.parametrize(
    "exc", [httpx.ReadError(""), httpx.ConnectError(""), httpx.RemoteProtocolError(""), httpx.WriteError("")]
)
async def test_transport_errors_never_have_an_empty_message(exc: Exception) -> None:
    router = Router().add("GET", "/v1/sandboxes/osb_1", exc)
    with pytest.raises(OpenSandboxConnectionError) as info:
        await lifecycle(router).get("osb_1")
    assert str(info.value).startswith(f"GET {API}/sandboxes/osb_1 failed: ")
    assert type(exc).__name__ in str(info.value)


# ---- endpoint -------------------------------------------------------------------------------


async def test_endpoint_retries_404_and_502_until_ready(sleeps: list[float]) -> None:
    router = Router().add(
        "GET",
        "/v1/sandboxes/osb_1/endpoints/44772",
        httpx.Response(404, json={"code": "NOT_FOUND", "message": "not yet"}),
        httpx.Response(502),
        httpx.Response(200, json=ENDPOINT),
    )
    endpoint = await lifecycle(router, poll_interval=0.5, ready_timeout=60).endpoint("osb_1")
    assert endpoint.url == EXECD
    assert sleeps == [0.5, 0.5]
    assert router.requests[0].url.params["use_server_proxy"] == "false"


async def test_endpoint_missing_in_answer_is_a_timeout_saying_so() -> None:
    router = Router().add(
        "GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json={"headers": {"X": "y"}})
    )
    with pytest.raises(SandboxTimeoutError, match=r"execd endpoint.*not ready.*answered without an endpoint"):
        await lifecycle(router, ready_timeout=0).endpoint("osb_1")


@pytest.mark.parametrize(
    "answer",
    [
        {"endpoint": ["127.0.0.1:1"]},
        {"endpoint": "user:pw@127.0.0.1:1"},
        {"endpoint": "ftp://127.0.0.1:1"},
        {"endpoint": "127.0.0.1:99999999"},
        {"endpoint": "127.0.0.1:1", "headers": ["X"]},
    ],
)
async def test_endpoint_of_the_wrong_shape_is_refused(answer: dict[str, Any]) -> None:
    router = Router().add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json=answer))
    with pytest.raises(OpenSandboxProtocolError):
        await lifecycle(router, ready_timeout=0).endpoint("osb_1")


# ---- ids and shapes ---------------------------------------------------------------------------


async def test_ids_are_encoded_and_cannot_change_the_path() -> None:
    evil = "../../../admin/kill-all"
    router = (
        Router()
        .add("DELETE", "/v1/sandboxes/..%2F..%2F..%2Fadmin%2Fkill-all", httpx.Response(204))
        .add("GET", "/v1/sandboxes/..%2F..%2F..%2Fadmin%2Fkill-all", sandbox_json("Running"))
    )
    client = lifecycle(router, api_key="k")
    assert await client.delete(evil) is True
    await client.get(evil)
    assert all(r.url.raw_path.startswith(b"/v1/sandboxes/..%2F") for r in router.requests)
    for bad in ("..", ".", "", "x" * 300):
        with pytest.raises(OpenSandboxProtocolError):
            await client.delete(bad)
    assert len(router.requests) == 2


async def test_a_created_id_that_would_change_the_path_is_refused_before_use() -> None:
    router = Router().add(
        "POST", "/v1/sandboxes", httpx.Response(202, json={"id": "..", "status": {"state": "Running"}})
    )
    with pytest.raises(OpenSandboxProtocolError, match="sandbox id"):
        await lifecycle(router).create()
    assert router.calls() == [("POST", "/v1/sandboxes")]


async def test_context_ids_are_encoded_in_paths_and_queries() -> None:
    router = (
        Router()
        .add("POST", "/code/context", httpx.Response(200, json={"id": "a/b?c", "language": "python"}))
        .add("DELETE", "/code/contexts/a%2Fb%3Fc", httpx.Response(200))
        .add("DELETE", "/code", httpx.Response(200))
    )
    execd = ExecdClient("http://execd.test", http=router.http())
    context = await execd.create_context()
    assert await execd.delete_context(context) is True
    await execd.interrupt(context)
    assert router.requests[2].url.params["id"] == "a/b?c"


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (httpx.Response(202, json=[{"id": "osb_1"}]), "JSON list, expected an object"),
        (httpx.Response(202, content=b"<html>"), "not JSON"),
        (httpx.Response(202, json={"status": {}}), "without id"),
        (httpx.Response(202, json={"id": 7}), "sandbox id must be a non-empty string"),
        (httpx.Response(202, content=b"[" * 100000), "not JSON"),
    ],
)
async def test_create_answers_of_the_wrong_shape_name_the_call(answer: httpx.Response, match: str) -> None:
    router = Router().add("POST", "/v1/sandboxes", answer)
    with pytest.raises(OpenSandboxProtocolError, match=match) as info:
        await lifecycle(router).create()
    assert f"POST {API}/sandboxes" in str(info.value)


async def test_other_wrong_shapes_raise_the_clients_error() -> None:
    router = (
        Router()
        .add("GET", "/v1/sandboxes/osb_1", httpx.Response(200, json=["x"]))
        .add("GET", "/v1/sandboxes", httpx.Response(200, json={"items": "x", "pagination": {}}))
        .add("POST", "/code/context", httpx.Response(200, json={"language": "python"}))
    )
    with pytest.raises(OpenSandboxProtocolError, match="GET .*/sandboxes/osb_1"):
        await lifecycle(router).get("osb_1")
    with pytest.raises(OpenSandboxProtocolError, match="items or pagination"):
        await lifecycle(router).list_sandboxes()
    with pytest.raises(OpenSandboxProtocolError, match="POST .*/code/context answered without id"):
        await ExecdClient("http://execd.test", http=router.http()).create_context()


async def test_answers_over_the_cap_are_refused_naming_it() -> None:
    router = Router().add("GET", "/v1/sandboxes/osb_1", httpx.Response(500, content=b"x" * 5000))
    with pytest.raises(ResponseTooLarge, match="cap of 1000 bytes") as info:
        await lifecycle(router, limits=Limits(max_response_bytes=1000)).get("osb_1")
    assert info.value.limit == 1000


async def test_compressed_answers_are_refused() -> None:
    router = Router().add(
        "GET", "/v1/sandboxes/osb_1", httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=b"\x1f\x8b")
    )
    with pytest.raises(OpenSandboxProtocolError, match="gzip-encoded"):
        await lifecycle(router).get("osb_1")
    assert router.requests[0].headers["accept-encoding"] == "identity"


# ---- run code ----------------------------------------------------------------------------------


async def test_run_code_on_bare_id_resolves_endpoint_with_path_and_sends_headers() -> None:
    router = (
        Router()
        .add(
            "GET",
            "/v1/sandboxes/osb_bare/endpoints/44772",
            httpx.Response(200, json={**ENDPOINT, "headers": {"X-EXECD-ACCESS-TOKEN": "t"}}),
        )
        .add(
            "POST",
            "/proxy/44772/code",
            events({"type": "init", "text": "ctx"}, {"type": "stdout", "text": "42\n"}, COMPLETE),
        )
    )
    execution = await lifecycle(router).run_code("osb_bare", "print(6*7)")
    run = router.requests[1]
    assert str(run.url) == f"{EXECD}/code"
    assert run.headers["X-EXECD-ACCESS-TOKEN"] == "t"
    assert json.loads(run.content) == {"code": "print(6*7)", "context": {"language": "python"}}
    assert execution.stdout == "42\n" and execution.complete


async def test_scheme_less_endpoint_takes_the_api_base_scheme() -> None:
    router = (
        Router()
        .add(
            "GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json={"endpoint": "gw.test/route/44772"})
        )
        .add("POST", "/route/44772/code", events({"type": "stdout", "text": "1\n"}, COMPLETE))
    )
    client = lifecycle(router, api_base="https://sandbox.test/v1")
    await client.run_code(Sandbox(id="osb_1", state="Running"), "print(1)", context_id="ctx-9")
    run = router.requests[1]
    assert str(run.url) == "https://gw.test/route/44772/code"
    assert json.loads(run.content)["context"] == {"language": "python", "id": "ctx-9"}


async def test_error_is_terminal_and_nothing_after_it_counts() -> None:
    error = {
        "type": "error",
        "error": {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["tb"]},
    }
    router = Router().add(
        "POST", "/code", events({"type": "stdout", "text": "a"}, error, {"type": "stdout", "text": "late"}, COMPLETE)
    )
    seen: list[str] = []
    execution = await ExecdClient("http://execd.test", http=router.http()).run(
        "1/0", on_event=lambda e: seen.append(e.type)
    )
    assert seen == ["stdout", "error"]
    assert execution.stdout == "a" and execution.error is not None and execution.error.name == "ZeroDivisionError"


async def test_events_after_execution_complete_are_ignored() -> None:
    late_error = {"type": "error", "error": {"ename": "Late", "evalue": "x"}}
    router = Router().add("POST", "/code", events({"type": "stdout", "text": "ok"}, COMPLETE, late_error))
    execution = await ExecdClient("http://execd.test", http=router.http()).run("1")
    assert execution.error is None and execution.stdout == "ok"


async def test_a_stream_without_a_terminal_event_is_a_dropped_connection() -> None:
    router = Router().add("POST", "/code", events({"type": "stdout", "text": "partial"}))
    with pytest.raises(OpenSandboxConnectionError, match="dropped before the run ended"):
        await ExecdClient("http://execd.test", http=router.http()).run("1")


async def test_stream_over_byte_cap_aborts() -> None:
    router = Router().add("POST", "/code", events({"type": "stdout", "text": "x" * 5000}))
    execd = ExecdClient("http://execd.test", http=router.http(), limits=Limits(max_output_bytes=1000))
    with pytest.raises(OutputLimitExceeded, match="exceeded 1000 bytes"):
        await execd.run("print('x' * 5000)")


async def test_a_busy_context_is_retried_while_the_previous_run_ends(sleeps: list[float]) -> None:
    busy = httpx.Response(500, json={"code": "RUNTIME_ERROR", "message": "session is busy"})
    router = Router().add("POST", "/code", busy, busy, events({"type": "stdout", "text": "1"}, COMPLETE))
    run = await ExecdClient("http://execd.test", http=router.http()).run("1")
    assert run.stdout == "1" and sleeps == [0.1, 0.1] and len(router.requests) == 3


async def test_execd_busy_context_raises_with_its_message_after_busy_wait() -> None:
    router = Router().add(
        "POST", "/code", httpx.Response(500, json={"code": "RUNTIME_ERROR", "message": "session is busy"})
    )
    with pytest.raises(OpenSandboxAPIError, match="session is busy"):
        await ExecdClient("http://execd.test", http=router.http(), busy_wait=0).run("1")
    assert len(router.requests) == 1


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


# ---- delete, list, renew ------------------------------------------------------------------------


async def test_delete_404_is_false_and_4xx_raise_without_retry(sleeps: list[float]) -> None:
    router = (
        Router()
        .add("DELETE", "/v1/sandboxes/gone", httpx.Response(404))
        .add("DELETE", "/v1/sandboxes/denied", httpx.Response(401, json={"code": "INVALID_API_KEY", "message": "no"}))
        .add("DELETE", "/v1/sandboxes/ok", httpx.Response(204))
    )
    client = lifecycle(router)
    assert await client.delete("gone") is False
    assert await client.delete("ok") is True
    with pytest.raises(OpenSandboxAPIError, match="INVALID_API_KEY"):
        await client.delete("denied")
    assert sleeps == [] and len(router.requests) == 3


async def test_delete_retries_transient_failures_with_backoff(sleeps: list[float]) -> None:
    router = Router().add(
        "DELETE",
        "/v1/sandboxes/osb_1",
        httpx.Response(500),
        httpx.ReadError(""),
        httpx.Response(503),
        httpx.Response(204),
    )
    assert await lifecycle(router).delete("osb_1") is True
    assert sleeps == [0.5, 1.0, 2.0]
    assert len(router.requests) == 4


async def test_delete_gives_up_after_its_attempts_saying_so(sleeps: list[float]) -> None:
    router = Router().add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(500, json={"code": "E", "message": "down"}))
    with pytest.raises(OpenSandboxAPIError, match="gave up after 3 attempts") as info:
        await lifecycle(router, delete_attempts=3).delete("osb_1")
    assert info.value.status_code == 500 and len(router.requests) == 3


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


async def test_keep_alive_survives_any_error_and_reports_a_gone_sandbox(sleeps: list[float]) -> None:
    router = Router().add(
        "POST",
        "/v1/sandboxes/osb_1/renew-expiration",
        httpx.Response(200, content=b"not json"),
        httpx.Response(200, json=["wrong", "shape"]),
        httpx.Response(500),
        httpx.ReadError(""),
        httpx.Response(200, json={"expiresAt": "2030-01-01T00:00:00Z"}),
        httpx.Response(404, json={"code": "DOCKER::SANDBOX_NOT_FOUND", "message": "gone"}),
    )
    lost: list[str] = []
    await asyncio.wait_for(keep_alive(lifecycle(router), "osb_1", 300, interval=7, on_lost=lost.append), 10)
    assert len(router.requests) == 6 and sleeps == [7] * 6
    assert lost == ["sandbox osb_1 is gone (404): it expired or was deleted"]


async def test_keep_alive_reports_once_when_renewal_fails_past_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    calls: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        clock[0] += seconds
        calls.append(seconds)
        if len(calls) > 8:
            raise asyncio.CancelledError

    monkeypatch.setattr(client_module.asyncio, "sleep", fake_sleep)
    router = Router().add("POST", "/v1/sandboxes/osb_1/renew-expiration", httpx.Response(503))
    lost: list[str] = []
    with pytest.raises(asyncio.CancelledError):
        await keep_alive(lifecycle(router), "osb_1", 60, interval=20, on_lost=lost.append)
    assert len(lost) == 1 and "could not be renewed for 80 s" in lost[0]


# ---- configuration -------------------------------------------------------------------------------


def test_api_base_and_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", "https://env.test/v1/")
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "env-key")
    client = OpenSandboxClient()
    assert client.url == "https://env.test/v1"
    assert client.headers == {"OPEN-SANDBOX-API-KEY": "env-key"}
    assert OpenSandboxClient("https://arg.test/v1", "arg-key").headers == {"OPEN-SANDBOX-API-KEY": "arg-key"}
    assert OpenSandboxClient(api_key="").headers == {}


def test_api_base_required_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE", raising=False)
    with pytest.raises(OpenSandboxConfigError, match="OPEN_SANDBOX_API_BASE"):
        OpenSandboxClient()
    with pytest.raises(OpenSandboxConfigError, match="http:// or https://"):
        OpenSandboxClient("localhost:8080/v1")
    with pytest.raises(ConfigError):  # one idea of "the configuration is wrong" for callers to catch
        OpenSandboxClient("localhost:8080/v1")


# ---- one-shot helper -------------------------------------------------------------------------------


async def test_run_once_creates_runs_and_deletes() -> None:
    router = (
        created_router()
        .add("POST", "/proxy/44772/code", events({"type": "stdout", "text": "42\n"}, COMPLETE))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    execution = await run_once("print(6*7)", api_base=API, api_key="", http=router.http())
    assert execution.stdout == "42\n" and execution.cleanup_error is None
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


async def test_run_once_keeps_its_result_when_delete_fails(sleeps: list[float]) -> None:
    router = (
        created_router()
        .add("POST", "/proxy/44772/code", events({"type": "stdout", "text": "42\n"}, COMPLETE))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(500, json={"code": "E", "message": "down"}))
    )
    execution = await run_once("print(6*7)", api_base=API, api_key="", http=router.http())
    assert execution.stdout == "42\n"
    assert isinstance(execution.cleanup_error, OpenSandboxAPIError)
    assert "gave up after 4 attempts" in str(execution.cleanup_error)
    assert router.calls().count(("DELETE", "/v1/sandboxes/osb_1")) == 4


async def test_run_once_deletes_even_when_the_run_raises(sleeps: list[float]) -> None:
    router = (
        created_router()
        .add("POST", "/proxy/44772/code", RuntimeError("boom"))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(500))
    )
    with pytest.raises(RuntimeError, match="boom") as info:
        await run_once("1/0", api_base=API, api_key="", http=router.http())
    assert any("deleting sandbox osb_1 failed as well" in note for note in getattr(info.value, "__notes__", []))
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


async def test_a_create_slower_than_a_call_is_awaited_within_the_launch_deadline() -> None:
    """The published server answers POST /sandboxes once the container exists: under load, or with an image to
    pull, that takes longer than request_timeout, and still counts against ready_timeout alone."""
    router = created_router()

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            await asyncio.sleep(0.6)
        return router(request)

    def client(ready_timeout: float) -> OpenSandboxClient:
        return OpenSandboxClient(API, "", http=httpx.AsyncClient(transport=httpx.MockTransport(slow)), poll_interval=0,
                                 limits=Limits(request_timeout=0.2), ready_timeout=ready_timeout)

    assert (await client(5).create()).id == "osb_1"
    with pytest.raises(CallDeadlineExceeded, match=r"POST .*/sandboxes: no complete answer within 0.4 s \(what was left of ready_timeout\)"):
        await client(0.4).create()


async def test_call_deadline_is_per_call_not_per_read() -> None:
    """A body trickled slowly: each read is quick, the whole answer is not."""

    class Trickle(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for _ in range(1000):
                await asyncio.sleep(0.05)
                yield b" "

    transport = httpx.MockTransport(lambda r: httpx.Response(200, stream=Trickle()))
    client = OpenSandboxClient(API, "", http=httpx.AsyncClient(transport=transport), limits=Limits(request_timeout=0.3))
    with pytest.raises(CallDeadlineExceeded, match=r"no complete answer within 0.3 s"):
        await client.get("osb_1")


# ---- fuzzing the client's response handling (issue 12 item 6) ------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from support.security_figures import examples  # noqa: E402

from kernel_sandbox.errors import OpenSandboxError  # noqa: E402

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=12,
)
shaped = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values | st.sampled_from(["osb_1", "..", "../x", ""]),
        "status": json_values
        | st.fixed_dictionaries(
            {"state": st.sampled_from(["Running", "Pending", "Failed", "Paused", "Unknown"]) | json_values}
        ),
        "endpoint": json_values | st.sampled_from(["127.0.0.1:1/proxy/44772", "x@y:1", "http://h:99999"]),
        "headers": json_values,
        "items": json_values,
        "pagination": json_values,
        "expiresAt": json_values,
        "code": json_values,
        "message": json_values,
        "detail": json_values,
    },
)
bodies = st.builds(lambda v: json.dumps(v).encode(), json_values | shaped) | st.binary(max_size=64)
answers = st.tuples(st.sampled_from([200, 201, 202, 204, 400, 401, 404, 409, 422, 429, 500, 502, 503]), bodies)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(answers, min_size=1, max_size=6),
    st.sampled_from(["create", "get", "list", "endpoint", "renew", "delete", "context", "run"]),
)
def test_fuzz_any_answer_gives_a_result_or_the_clients_own_error(answers: list[tuple[int, bytes]], call: str) -> None:
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        status, body = queue.pop(0) if len(queue) > 1 else queue[0]
        return httpx.Response(status, stream=Body(body))

    async def main() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        client = OpenSandboxClient(API, "", http=http, poll_interval=0, ready_timeout=0, delete_attempts=2)
        execd = ExecdClient("http://execd.test", http=http)
        calls = {
            "create": lambda: client.create(),
            "get": lambda: client.get("osb_1"),
            "list": lambda: client.list_sandboxes(max_pages=3),
            "endpoint": lambda: client.endpoint("osb_1"),
            "renew": lambda: client.renew("osb_1", 60),
            "delete": lambda: client.delete("osb_1"),
            "context": lambda: execd.create_context(),
            "run": lambda: execd.run("1"),
        }
        try:
            await calls[call]()
        except OpenSandboxError as exc:
            assert str(exc), "an error message is never empty"

    async def no_sleep(seconds: float) -> None:
        return None

    original = client_module.asyncio.sleep
    client_module.asyncio.sleep = no_sleep  # type: ignore[assignment]
    try:
        asyncio.run(main())
    finally:
        client_module.asyncio.sleep = original  # type: ignore[assignment]


async def test_a_cancel_that_wait_for_swallows_is_sent_again() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns its result when the call ends as the cancel comes,
    and the task goes on (a launcher polled a sandbox that never ran for an hour after SIGTERM):
    ``cancel_until_done`` cancels until the task has ended."""
    from kernel_sandbox.opensandbox.http import cancel_until_done

    loop = asyncio.get_running_loop()
    answered: asyncio.Future[int] = loop.create_future()

    async def polling() -> None:
        await asyncio.wait_for(answered, 10)
        await asyncio.sleep(3600)  # the next poll

    task = asyncio.ensure_future(polling())
    await asyncio.sleep(0.01)
    answered.set_result(1)
    await asyncio.wait_for(cancel_until_done(task, every=0.05), 10)
    assert task.cancelled()
