"""Issue 18's attacks, replayed against the clients and the launcher's execd relay over real sockets.

A hostile execd and a hostile lifecycle server (tests/support/opensandbox_hostile.py, tornado on
127.0.0.1) answer with huge bodies, trickles, deep nesting, lone surrogates, late events and
broken streams. Every case checks what the user gets (a clean error naming the cap, deadline
or call; one reply per cell), the exact requests sent, and memory measured on the process
(VmRSS sampled from /proc while the call runs, never a lifetime peak).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from support.opensandbox_hostile import HostileHandler, HostileKernelSocket, HostileServer, MiB, kernel_message
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.errors import (
    CallDeadlineExceeded,
    OpenSandboxConnectionError,
    OpenSandboxError,
    OpenSandboxProtocolError,
    OutputLimitExceeded,
    ResponseTooLarge,
    SandboxTimeoutError,
)
from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC, shipped_kernelspecs, started_client
from kernel_sandbox.opensandbox import ExecdClient, Limits, OpenSandboxClient, run_once
from kernel_sandbox.opensandbox.jupyter import JupyterServer
from kernel_sandbox.policy.output import OutputPolicy

from support.host_memory import RssPeak
from support.kernel import reply_to, until_idle

MEMORY_BOUND = 64 * MiB
COMPLETE = {"type": "execution_complete", "execution_time": 1}


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[HostileServer]:
    server = HostileServer().start()
    yield server
    server.stop()


@pytest.fixture
def hostile(hostile_server: HostileServer) -> HostileServer:
    hostile_server.reset()
    return hostile_server


def huge(total: int, status: int = 200) -> Any:
    async def behaviour(h: HostileHandler) -> None:
        await h.huge(total, status)

    return behaviour


def trickle(**kwargs: Any) -> Any:
    async def behaviour(h: HostileHandler) -> None:
        await h.trickle(**kwargs)

    return behaviour


def answer(status: int, body: Any = None, raw: bytes | None = None) -> Any:
    async def behaviour(h: HostileHandler) -> None:
        h.set_status(status)
        if raw is not None:
            h.finish(raw)
        elif body is None:
            h.finish()
        else:
            h.set_header("Content-Type", "application/json")
            h.finish(json.dumps(body))

    return behaviour


def stream(*items: dict[str, Any] | bytes, finish: bool = True) -> Any:
    async def behaviour(h: HostileHandler) -> None:
        await h.events(*items, finish=finish)

    return behaviour


async def within(awaitable: Any, seconds: float, what: str) -> Any:
    """A deadline with a message (not a timing assert: far above the expected time)."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError as exc:
        if isinstance(exc, OpenSandboxError):  # the client's own deadline errors are TimeoutErrors too
            raise
        pytest.fail(f"{what} did not end within {seconds} s")


# ---- 1. unbounded reads: every answer, error bodies included, is capped --------------------------


@pytest.mark.parametrize(
    ("route", "call"),
    [
        ("POST /code", lambda e: e.run("1")),
        ("DELETE /code", lambda e: e.interrupt("ctx")),
        ("POST /code/context", lambda e: e.create_context()),
        ("DELETE /code/contexts/ctx", lambda e: e.delete_context("ctx")),
        ("GET /ping", lambda e: e.wait_ready(30)),
    ],
)
@pytest.mark.parametrize("status", [200, 500])
async def test_huge_execd_answers_are_capped(hostile: HostileServer, route: str, call: Any, status: int) -> None:
    hostile.behaviour[route] = huge(400 * MiB, status)
    execd = ExecdClient(hostile.url)
    with RssPeak() as rss, pytest.raises((ResponseTooLarge, SandboxTimeoutError, OutputLimitExceeded)) as info:
        await within(call(execd), 60, route)
    await execd.aclose()
    if route == "POST /code" and status == 200:
        assert "exceeded 16777216 bytes (max_output_bytes)" in str(info.value)
    else:
        assert "cap of 4194304 bytes (max_response_bytes)" in str(info.value)
    assert rss.growth < MEMORY_BOUND, f"client RSS grew by {rss.growth / MiB:.0f} MiB"
    assert sum(hostile.sent_bytes) < 64 * MiB


async def test_huge_lifecycle_answer_is_capped(hostile: HostileServer) -> None:
    hostile.behaviour["GET /v1/sandboxes/sbx"] = huge(100 * MiB)
    client = OpenSandboxClient(f"{hostile.url}/v1", "key")
    with RssPeak() as rss, pytest.raises(ResponseTooLarge, match="cap of 4194304 bytes"):
        await within(client.get("sbx"), 60, "GET")
    await client.aclose()
    assert rss.growth < MEMORY_BOUND


JUPYTER_CALLS = [
    ("GET /jupyter/api/status", lambda j: j.wait_ready(30)),
    ("POST /jupyter/api/kernels", lambda j: j.start_kernel("python3")),
    ("POST /jupyter/api/kernels/k1/interrupt", lambda j: j.interrupt_kernel("k1")),
]


@pytest.mark.parametrize(("route", "call"), JUPYTER_CALLS)
@pytest.mark.parametrize("status", [200, 500])
async def test_huge_answers_of_the_sandboxs_jupyter_server_are_capped(
    hostile: HostileServer, route: str, call: Any, status: int
) -> None:
    """Websocket mode: the sandbox's Jupyter server (code in the sandbox can replace it) is read capped too."""
    hostile.behaviour[route] = huge(400 * MiB, status)
    jupyter = JupyterServer(f"{hostile.url}/jupyter", "token")
    with RssPeak() as rss, pytest.raises(ResponseTooLarge, match=r"cap of 4194304 bytes \(max_response_bytes\)"):
        await within(call(jupyter), 60, route)
    await jupyter.aclose()
    assert rss.growth < MEMORY_BOUND, f"client RSS grew by {rss.growth / MiB:.0f} MiB"
    assert sum(hostile.sent_bytes) < 64 * MiB


# ---- 2. deadlines per call, not per read ---------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "call"),
    [
        ("POST /code/context", lambda e: e.create_context()),
        ("DELETE /code", lambda e: e.interrupt("ctx")),
        ("POST /code", lambda e: e.run("1")),
    ],
)
async def test_a_trickling_execd_cannot_hold_a_call_past_its_deadline(
    hostile: HostileServer, route: str, call: Any
) -> None:
    hostile.behaviour[route] = trickle(status=500 if route == "POST /code" else 200)
    execd = ExecdClient(hostile.url, limits=Limits(request_timeout=1))
    with pytest.raises(CallDeadlineExceeded, match="within 1 s"):
        await within(call(execd), 30, route)
    await execd.aclose()


async def test_a_trickling_ping_cannot_defeat_the_ready_timeout(hostile: HostileServer) -> None:
    hostile.behaviour["GET /ping"] = trickle()
    execd = ExecdClient(hostile.url, limits=Limits(request_timeout=3))
    with pytest.raises(SandboxTimeoutError, match=r"GET /ping tried \d+ times over .* \(ready_timeout 1.5 s\)"):
        await within(execd.wait_ready(1.5), 30, "wait_ready")
    await execd.aclose()


async def test_a_stream_that_trickles_bytes_but_no_events_ends(hostile: HostileServer) -> None:
    hostile.behaviour["POST /code"] = trickle(data=b"{" * 10_000, interval=0.05)
    execd = ExecdClient(hostile.url, limits=Limits(stream_idle_timeout=1))
    with pytest.raises(CallDeadlineExceeded, match="no event from execd for 1 s"):
        await within(execd.run("1"), 30, "run")
    await execd.aclose()


async def test_a_trickling_lifecycle_server_cannot_hold_a_call(hostile: HostileServer) -> None:
    hostile.behaviour["POST /v1/sandboxes"] = trickle(data=b'{"id": "' + b"a" * 1000)
    client = OpenSandboxClient(f"{hostile.url}/v1", "key", limits=Limits(request_timeout=1), ready_timeout=2)
    with pytest.raises(CallDeadlineExceeded, match=r"POST .*/v1/sandboxes: no complete answer within 2 s \(what was left of ready_timeout\)"):
        await within(client.create(image="img"), 30, "create")
    await client.aclose()


@pytest.mark.parametrize(("route", "call"), JUPYTER_CALLS[1:])
async def test_a_trickling_jupyter_server_cannot_hold_a_call_past_its_deadline(
    hostile: HostileServer, route: str, call: Any
) -> None:
    hostile.behaviour[route] = trickle()
    jupyter = JupyterServer(f"{hostile.url}/jupyter", "token", limits=Limits(request_timeout=1))
    with pytest.raises(CallDeadlineExceeded, match="within 1 s"):
        await within(call(jupyter), 30, route)
    await jupyter.aclose()


async def test_a_trickling_jupyter_status_cannot_defeat_the_wait(hostile: HostileServer) -> None:
    hostile.behaviour["GET /jupyter/api/status"] = trickle()
    jupyter = JupyterServer(f"{hostile.url}/jupyter", "token", limits=Limits(request_timeout=3))
    with pytest.raises(SandboxTimeoutError, match=r"GET /api/status tried \d+ times over"):
        await within(jupyter.wait_ready(1.5), 30, "wait_ready")
    await jupyter.aclose()


# ---- 3. cost per byte: linear accumulation --------------------------------------------------------


async def test_80k_events_are_collected_in_linear_time(hostile: HostileServer) -> None:
    one = json.dumps({"type": "stdout", "text": "x"}).encode() + b"\n\n"
    hostile.behaviour["POST /code"] = stream(one * 80_000, COMPLETE)
    async with ExecdClient(hostile.url) as execd:
        run = await within(execd.run("1"), 120, "80 000 events (quadratic before: 40 s)")
    assert run.stdout == "x" * 80_000


# ---- 4. ids, shapes, the API key, DELETE ---------------------------------------------------------


async def test_server_supplied_ids_cannot_change_the_path(hostile: HostileServer) -> None:
    evil = "../../../admin/kill-all"
    encoded = "..%2F..%2F..%2Fadmin%2Fkill-all"
    hostile.behaviour["POST /v1/sandboxes"] = answer(202, {"id": evil, "status": {"state": "Running"}})
    hostile.behaviour[f"GET /v1/sandboxes/{encoded}/endpoints/44772"] = answer(500, {"code": "E", "message": "no"})
    hostile.behaviour[f"DELETE /v1/sandboxes/{encoded}"] = answer(204)
    hostile.behaviour["DELETE"] = answer(204)
    client = OpenSandboxClient(f"{hostile.url}/v1", "secret-key")
    with pytest.raises(Exception, match="answered 500"):
        await client.create(image="img")
    await client.aclose()
    assert hostile.requests == [
        ("POST", "/v1/sandboxes"),
        ("GET", f"/v1/sandboxes/{encoded}/endpoints/44772?use_server_proxy=false"),
        ("DELETE", f"/v1/sandboxes/{encoded}"),
    ]


async def test_a_json_array_from_create_is_the_clients_own_error(hostile: HostileServer) -> None:
    hostile.behaviour["POST /v1/sandboxes"] = answer(202, [{"id": "x"}])
    async with OpenSandboxClient(f"{hostile.url}/v1", "key") as client:
        with pytest.raises(OpenSandboxProtocolError, match=r"POST .*/v1/sandboxes answered with a JSON list"):
            await client.create(image="img")
    assert hostile.requests == [("POST", "/v1/sandboxes")]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"id": "../../api/terminals"}, "kernel id that cannot be used in a URL"),
        ({"id": "k1?x=1#"}, "kernel id that cannot be used in a URL"),
        ([{"id": "k1"}], "JSON list"),
        ({"name": "python3"}, "id"),
    ],
)
async def test_a_kernel_id_from_the_jupyter_server_cannot_change_the_path(
    hostile: HostileServer, body: Any, named: str
) -> None:
    hostile.behaviour["POST /jupyter/api/kernels"] = answer(201, body)
    jupyter = JupyterServer(f"{hostile.url}/jupyter", "token")
    with pytest.raises(OpenSandboxProtocolError, match=r"POST .*/jupyter/api/kernels") as info:
        await jupyter.start_kernel("python3")
    await jupyter.aclose()
    assert named in str(info.value)
    assert hostile.requests == [("POST", "/jupyter/api/kernels")]


async def test_run_once_keeps_the_result_when_delete_fails_and_never_sends_the_key_to_execd(
    hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    execd = HostileServer().start()
    try:
        hostile.behaviour["POST /v1/sandboxes"] = answer(202, {"id": "sbx", "status": {"state": "Running"}})
        hostile.behaviour["GET /v1/sandboxes/sbx/endpoints/44772"] = answer(
            200, {"endpoint": f"127.0.0.1:{execd.port}/proxy/44772"}
        )
        hostile.behaviour["DELETE /v1/sandboxes/sbx"] = answer(500, {"code": "E", "message": "down"})
        execd.behaviour["GET /proxy/44772/ping"] = answer(200)
        execd.behaviour["POST /proxy/44772/code"] = stream({"type": "stdout", "text": "42\n"}, COMPLETE)
        result = await run_once(
            "print(42)",
            api_base=f"{hostile.url}/v1",
            api_key="secret-key",
            client_options={"delete_attempts": 2},
            image="img",
        )
        assert result.stdout == "42\n"
        assert result.cleanup_error is not None and "gave up after 2 attempts" in str(result.cleanup_error)
        assert hostile.requests.count(("DELETE", "/v1/sandboxes/sbx")) == 2
        assert all(h.get("Open-Sandbox-Api-Key") == "secret-key" for h in hostile.headers)
        assert execd.requests == [("GET", "/proxy/44772/ping"), ("POST", "/proxy/44772/code")]
        assert all("Open-Sandbox-Api-Key" not in h for h in execd.headers)
    finally:
        execd.stop()


# ---- 5. the launcher's execd relay: one reply for every cell, bounded memory and messages -------------


def sandbox_behaviours(hostile: HostileServer) -> dict[str, Any]:
    """A lifecycle server with one Running sandbox whose execd endpoint is the hostile server itself,
    and whose Jupyter server (port 44771) is the hostile server under /jupyter."""
    running = {"id": "sbx", "status": {"state": "Running"}}
    return {
        "GET /v1/sandboxes/sbx/endpoints/44771": answer(200, {"endpoint": f"127.0.0.1:{hostile.port}/jupyter"}),
        "GET /jupyter/api/status": answer(200, {}),
        "POST /jupyter/api/kernels": answer(201, {"id": "k1", "name": "python3"}),
        "POST /jupyter/api/kernels/k1/interrupt": answer(204),
        "POST /v1/sandboxes": answer(202, running),
        "GET /v1/sandboxes/sbx": answer(200, running),
        "GET /v1/sandboxes/sbx/endpoints/44772": answer(200, {"endpoint": f"127.0.0.1:{hostile.port}"}),
        "POST /v1/sandboxes/sbx/renew-expiration": answer(200, {"expiresAt": "2030-01-01T00:00:00Z"}),
        "DELETE /v1/sandboxes/sbx": answer(204),
        "GET /ping": answer(200),
        "POST /code/context": answer(200, {"id": "ctx", "language": "python"}),
        "DELETE /code": answer(200),
    }


@asynccontextmanager
async def launched(
    hostile: HostileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: Any
) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """The OpenSandbox kernelspec's launcher as a real process, its sandbox the hostile server."""
    hostile.behaviour.update(sandbox_behaviours(hostile))
    spec_dir = tmp_path / "jupyter" / "kernels" / OPENSANDBOX_SPEC
    shutil.copytree(shipped_kernelspecs()[OPENSANDBOX_SPEC], spec_dir, dirs_exist_ok=True)
    spec = json.loads((spec_dir / "kernel.json").read_text())
    spec["metadata"]["kernel_provisioner"]["config"] = {
        "api_base": f"{hostile.url}/v1",
        "api_key": "secret-key",
        "interrupt_grace": 1.0,
        "poll_interval": 0.05,
        **config,
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    km = AsyncKernelManager(kernel_name=OPENSANDBOX_SPEC)
    async with started_client(km, timeout=60) as kc:
        yield km, kc


@pytest.fixture
async def relay(
    hostile: HostileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """The launcher in execd mode, its sandbox's execd the hostile server."""
    async with launched(hostile, tmp_path, monkeypatch, mode="execd") as kernel:
        yield kernel


@pytest.fixture
async def bridge(
    hostile: HostileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """The launcher in websocket mode, its sandbox's Jupyter server and kernel websocket hostile."""
    async with launched(hostile, tmp_path, monkeypatch, mode="websocket", max_output_bytes=4 * MiB) as kernel:
        yield kernel


async def execute(kc: Any, code: str = "cell") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Send one execute; return its one reply and the IOPub messages up to idle (fails on a second reply)."""
    msg_id = kc.execute(code)
    iopub = await until_idle(kc, msg_id)
    reply = await reply_to(kc.shell_channel, msg_id)
    with pytest.raises(Exception):  # noqa: B017 (queue.Empty: no second reply may follow)
        await kc.get_shell_msg(timeout=0.5)
    return reply["content"], iopub


def of_type(messages: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m["content"] for m in messages if m["msg_type"] == msg_type]


def surrogate_bytes() -> bytes:
    return (
        b'{"type": "stdout", "text": "a\\ud800b\\u0000c"}\n\n'
        b'{"type": "result", "results": {"text/x\\udc00": "v", "text": "\\udfff"}}\n\n'
    )


async def test_relay_gives_one_reply_for_every_hostile_cell(
    hostile: HostileServer, relay: tuple[AsyncKernelManager, Any]
) -> None:
    km, kc = relay
    pid = km.provisioner.pid
    deep = b'{"type": "stdout", "text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n\n"
    traceback = {"type": "error", "error": {"ename": "Boom", "evalue": "v", "traceback": ["t" * 1000] * 15_000}}
    empty_lines = {"type": "error", "error": {"ename": "Boom", "evalue": "v", "traceback": [""] * 3_500_000}}
    cells = [
        ("deep nesting", stream(deep, {"type": "stdout", "text": "after\n"}, COMPLETE), "ok"),
        ("lone surrogates and NULs", stream(surrogate_bytes(), COMPLETE), "ok"),
        ("events after the end", stream(COMPLETE, {"type": "error", "error": {"ename": "Late", "evalue": ""}}), "ok"),
        (
            "a stream that stops without an end",
            stream({"type": "stdout", "text": "partial"}),
            "OpenSandboxConnectionError",
        ),
        ("a 400 MB error body", huge(400 * MiB, 500), "ResponseTooLarge"),
        ("a 15 MB traceback", stream(traceback), "Boom"),
        ("3.5 M empty traceback lines (14 MB of JSON, 0 characters)", stream(empty_lines), "Boom"),
        (
            "non-string MIME values",
            stream(
                {"type": "result", "results": {"text": 5, "image/png": [1], "application/json": {"a": 1}}}, COMPLETE
            ),
            "ok",
        ),
    ]
    with RssPeak(pid) as rss:
        for name, behaviour, expected in cells:
            hostile.behaviour["POST /code"] = behaviour
            reply, iopub = await within(execute(kc), 120, name)
            assert (reply["status"] if expected == "ok" else reply.get("ename")) == expected, f"{name}: {reply}"
            if name == "deep nesting":
                assert of_type(iopub, "stream") == [{"name": "stdout", "text": "after\n"}]
            if name == "lone surrogates and NULs":
                assert of_type(iopub, "stream") == [{"name": "stdout", "text": "a\ufffdb\ufffdc"}]
                relayed = {"data": {"text/x\ufffd": "v", "text/plain": "\ufffd"}, "metadata": {}, "execution_count": 1}
                shown = OutputPolicy().filter("execute_result", relayed)  # the launcher's strict policy after the relay
                assert shown is not None and of_type(iopub, "execute_result")[0]["data"] == shown["data"]
            if name == "a stream that stops without an end":
                assert "dropped before the run ended" in reply["evalue"]
            if "traceback" in name:  # the cap counts lines and bytes, not only characters
                (error,) = of_type(iopub, "error")
                assert len(json.dumps(error["traceback"])) <= 64 * 1024 + 2, name
                assert len(json.dumps(reply["traceback"])) <= 2 * 1024 + 2, name
                assert "earlier traceback line(s) cut" in error["traceback"][0]
            if name == "non-string MIME values":
                assert of_type(iopub, "execute_result")[0]["data"] == {"application/json": {"a": 1}}
    assert rss.growth < 2 * MEMORY_BOUND, f"relay RSS grew by {rss.growth / MiB:.0f} MiB"


async def test_relay_coalesces_a_flood_of_one_character_events(
    hostile: HostileServer, relay: tuple[AsyncKernelManager, Any]
) -> None:
    """16 MiB of one-character stdout events used to become ~560 000 IOPub messages."""
    km, kc = relay
    event = json.dumps({"type": "stdout", "text": "x"}).encode() + b"\n\n"
    hostile.behaviour["POST /code"] = stream(event * (17 * MiB // len(event)))
    hostile.behaviour["DELETE /code"] = answer(200)
    with RssPeak(km.provisioner.pid) as rss:
        reply, iopub = await within(execute(kc), 300, "the flood")
    assert reply["ename"] == "OutputLimitExceeded" and "16777216 bytes" in reply["evalue"]
    streams = of_type(iopub, "stream")
    assert 0 < len(streams) < 2000, f"{len(streams)} stream messages"
    assert set("".join(s["text"] for s in streams)) == {"x"}
    assert ("DELETE", "/code?id=ctx") in hostile.requests, "the relay interrupts execd after the cap"
    assert rss.growth < 2 * MEMORY_BOUND, f"relay RSS grew by {rss.growth / MiB:.0f} MiB"


async def test_relay_survives_an_execd_that_ignores_interrupts_and_floods_the_answer(
    hostile: HostileServer, relay: tuple[AsyncKernelManager, Any]
) -> None:
    km, kc = relay

    async def forever(h: HostileHandler) -> None:
        await h.events({"type": "stdout", "text": "running\n"}, finish=False)
        while not h.request.connection.stream.closed():  # type: ignore[union-attr]
            await h.events({"type": "ping", "text": "pong"}, finish=False)
            await asyncio.sleep(0.2)

    hostile.behaviour["POST /code"] = forever
    hostile.behaviour["DELETE /code"] = huge(400 * MiB)
    msg_id = kc.execute("while True: pass")
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    with RssPeak(km.provisioner.pid) as rss:
        request = kc.session.msg("interrupt_request", {})
        kc.control_channel.send(request)
        interrupt_reply = await reply_to(kc.control_channel, request["header"]["msg_id"], timeout=60)
        reply = await reply_to(kc.shell_channel, msg_id, timeout=60)
    assert interrupt_reply["content"]["status"] == "error"
    assert interrupt_reply["content"]["ename"] == "ResponseTooLarge"
    assert reply["content"]["status"] == "error"
    assert "did not end the cell within 1 s of the interrupt" in reply["content"]["evalue"]
    assert rss.growth < MEMORY_BOUND, f"relay RSS grew by {rss.growth / MiB:.0f} MiB"
    hostile.behaviour["POST /code"] = stream(COMPLETE)
    reply, _ = await execute(kc)
    assert reply["status"] == "ok"


async def test_the_websocket_bridge_survives_a_hostile_kernel(
    hostile: HostileServer, bridge: tuple[AsyncKernelManager, Any]
) -> None:
    """Garbage frames, wrong channels, short messages, unreadable headers and a 3 MB traceback, then a reply."""
    km, kc = bridge
    traceback = ["t" * 1000] * 3000

    async def attack(ws: HostileKernelSocket, channel: str, parts: list[bytes]) -> None:
        request = json.loads(parts[0])
        if request["msg_type"] != "execute_request":
            return
        await ws.raw(b"\x00\x01\x02")
        await ws.raw((2**62).to_bytes(8, "little") + b"x" * 64)
        await ws.raw("a text frame in the v1 format")
        await ws.send("elsewhere", kernel_message("stream", request, {"name": "stdout", "text": "nowhere"}))
        await ws.send("iopub", kernel_message("stream", request, {"name": "stdout", "text": "short"})[:2])
        await ws.send("shell", [json.dumps({"msg_type": "execute_reply"}).encode(), b"{", b"{}", b"{}"])
        await ws.send("shell", [b"[" * 100_000, b"{}", b"{}", b"{}"])
        error = {"ename": "Boom", "evalue": "v" * 100_000, "traceback": traceback}
        await ws.send("iopub", kernel_message("error", request, error))
        await ws.send("iopub", kernel_message("stream", request, {"name": "stdout", "text": "survived\n"}))
        await ws.send("shell", kernel_message("execute_reply", request, {"status": "error", "execution_count": 1, **error}))
        await ws.send("iopub", kernel_message("status", request, {"execution_state": "idle"}))

    hostile.kernel_behaviour = attack
    with RssPeak(km.provisioner.pid) as rss:
        reply, iopub = await within(execute(kc, "attack"), 120, "the hostile kernel's cell")
    assert of_type(iopub, "stream") == [{"name": "stdout", "text": "survived\n"}]
    (error,) = of_type(iopub, "error")
    assert sum(map(len, error["traceback"])) <= 64 * 1024 and len(error["evalue"]) < 9 * 1024
    assert reply["status"] == "error" and sum(map(len, reply["traceback"])) <= 2 * 1024
    assert len(reply["evalue"]) < 9 * 1024
    assert rss.growth < MEMORY_BOUND, f"launcher RSS grew by {rss.growth / MiB:.0f} MiB"
    assert await km.is_alive()


async def test_a_kernel_that_keeps_sending_over_the_cap_is_ended(
    hostile: HostileServer, bridge: tuple[AsyncKernelManager, Any]
) -> None:
    """Each message over max_output_bytes closes the websocket; the launcher reopens it, a few times only."""
    km, kc = bridge

    async def flood(ws: HostileKernelSocket) -> None:
        await ws.raw(b"x" * (5 * MiB))

    async def over_the_cap(ws: HostileKernelSocket, channel: str, parts: list[bytes]) -> None:
        await flood(ws)

    hostile.kernel_on_open = flood
    hostile.kernel_behaviour = over_the_cap
    kc.execute("a request the kernel answers with too much")
    for _ in range(600):
        if not await km.is_alive():
            break
        await asyncio.sleep(0.1)
    assert not await km.is_alive(), "the launcher kept reopening a websocket the kernel keeps flooding"
    assert "times within 60 s" in (km.provisioner.exit_reason or "")
    assert 2 <= hostile.kernel_connections <= 7
    assert ("DELETE", "/v1/sandboxes/sbx") in hostile.requests, "the sandbox is deleted"


async def test_the_launcher_retries_a_failed_delete_at_shutdown(
    hostile: HostileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 to the launcher's DELETE at shutdown is retried: the sandbox does not outlive the kernel."""
    answers = [answer(503, {"code": "BUSY", "message": "try again"}), answer(204)]

    async def flaky(h: HostileHandler) -> None:
        await (answers.pop(0) if len(answers) > 1 else answers[0])(h)

    async with launched(hostile, tmp_path, monkeypatch, mode="execd") as (km, kc):
        hostile.behaviour["DELETE /v1/sandboxes/sbx"] = flaky
        kc.stop_channels()
        await km.shutdown_kernel()  # polite, the way a user stops it
        assert hostile.requests.count(("DELETE", "/v1/sandboxes/sbx")) == 2


async def test_the_launchers_renewals_survive_answers_of_the_wrong_shape(
    hostile: HostileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Non-JSON, a JSON list and a 500 to renew-expiration: the launcher renews on, the kernel lives."""
    answers = [answer(200, raw=b"<html>not json"), answer(200, [1]), answer(500, raw=b"oops"),
               answer(200, {"expiresAt": "2030-01-01T00:00:00Z"})]

    async def wrong_then_right(h: HostileHandler) -> None:
        await (answers.pop(0) if len(answers) > 1 else answers[0])(h)

    renew = ("POST", "/v1/sandboxes/sbx/renew-expiration")
    async with launched(hostile, tmp_path, monkeypatch, mode="execd", renew_interval=0.2) as (km, kc):
        hostile.behaviour["POST /v1/sandboxes/sbx/renew-expiration"] = wrong_then_right
        before = hostile.requests.count(renew)
        for _ in range(600):
            if not answers[:-1] and hostile.requests.count(renew) >= before + 6:
                break
            await asyncio.sleep(0.1)
        assert not answers[:-1], "the launcher stopped renewing after an answer of the wrong shape"
        assert hostile.requests.count(renew) >= before + 6, "no renewals after the wrong answers"
        assert await km.is_alive()
        hostile.behaviour["POST /code"] = stream(COMPLETE)
        reply, _ = await execute(kc)
        assert reply["status"] == "ok"


async def test_connection_errors_reach_the_user_with_a_message(hostile: HostileServer) -> None:
    """A dropped connection mid-stream is named, never an empty ReadError."""

    async def reset(h: HostileHandler) -> None:
        await h.events({"type": "stdout", "text": "x"}, finish=False)
        h.request.connection.stream.close()  # type: ignore[union-attr]

    hostile.behaviour["POST /code"] = reset
    async with ExecdClient(hostile.url) as execd:
        with pytest.raises(OpenSandboxConnectionError) as info:
            await execd.run("1")
    assert "dropped" in str(info.value) and str(info.value).startswith("POST ")
