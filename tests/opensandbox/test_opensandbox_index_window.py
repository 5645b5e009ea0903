"""install() on a network-off OpenSandbox sandbox: the package index is opened for the call alone
through the runtime ``/sandboxes/{id}/networkpolicy`` API, by the host's lifecycle client, and the
policy read before is put back when pip ends (error, timeout, cancel).

Against the published server 1.1.1, whose Docker runtime forwards the policy to the egress
sidecar, here the harness's STAND-IN (it enforces nothing: these tests show which rules reach it
and when, not that traffic is filtered). The HTTP error paths use the fake lifecycle server.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from kernel_sandbox.errors import CallTimeoutError, NetworkDisabledError, SandboxError
from kernel_sandbox.execution import AsyncSandbox
from kernel_sandbox.execution.adapters import adapter
from kernel_sandbox.opensandbox.settings import OpenSandboxSettings

INDEX = ["index.test", "files.index.test"]
OPENED = [{"action": "allow", "target": name} for name in INDEX]
DENY_ALL = {"defaultAction": "deny", "egress": []}
NO_INDEX = ["--index-url", "http://127.0.0.1:9/simple", "--timeout", "1", "--retries", "0"]
SLOW_INDEX = """
import socket, threading
_server = socket.socket(); _server.bind(("127.0.0.1", 0)); _server.listen()
_held = []
threading.Thread(target=lambda: [_held.append(_server.accept()) for _ in iter(int, 1)], daemon=True).start()
print(_server.getsockname()[1])
"""


def provisioner(fake: Any, sandbox_id: str = "sb-1", **options: Any) -> Any:
    settings = OpenSandboxSettings.from_config({"api_base": fake.api_base, "api_key": "test-key", **options})
    return SimpleNamespace(sandbox_id=sandbox_id, settings=lambda: settings)


async def no_request(content: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("an OpenSandbox window sends no launcher request")


def window(fake: Any, **options: Any) -> Any:
    return adapter("opensandbox").index_window(provisioner(fake, **options), no_request, 60.0)


# ---- HTTP error paths (fake lifecycle server) -------------------------------------------------------


async def test_the_index_is_added_for_the_block_and_the_policy_put_back(fake_opensandbox: Any) -> None:
    lifecycle = fake_opensandbox.lifecycle
    lifecycle.policies["sb-1"] = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "api.example.com"}]}
    async with window(fake_opensandbox, package_index=INDEX):
        assert lifecycle.policies["sb-1"]["egress"] == [*OPENED, {"action": "allow", "target": "api.example.com"}]
    assert lifecycle.policies["sb-1"] == {"defaultAction": "deny", "egress": [{"action": "allow", "target": "api.example.com"}]}
    with pytest.raises(ZeroDivisionError):
        async with window(fake_opensandbox, package_index=INDEX, network=["api.example.com"]):
            1 / 0
    assert lifecycle.policies["sb-1"]["egress"] == [{"action": "allow", "target": "api.example.com"}]


async def test_open_egress_needs_no_window(fake_opensandbox: Any) -> None:
    requests = fake_opensandbox.lifecycle.requests
    before = len(requests)
    async with window(fake_opensandbox, network=True):
        pass
    assert not [r for r in requests[before:] if "networkpolicy" in r[1]]


@pytest.mark.parametrize(
    ("method", "status", "body"),
    [
        ("GET", 404, {"detail": "Not Found"}),  # a server without the route
        ("GET", 405, {"detail": "Method Not Allowed"}),
        ("PUT", 400, {"code": "SANDBOX::INVALID_PARAMETER", "message": "no egress sidecar for this sandbox"}),
        ("GET", 200, {"defaultAction": "deny", "egress": "everything"}),  # not a policy
        ("GET", 200, {"defaultAction": "deny", "egress": [{"action": "allow", "target": ["pypi.org"]}]}),
    ],
)
async def test_a_server_that_cannot_open_the_index_is_a_clear_error(
    fake_opensandbox: Any, method: str, status: int, body: Any
) -> None:
    lifecycle = fake_opensandbox.lifecycle
    lifecycle.policy_answers[method] = [(status, body)]
    entered = False
    with pytest.raises(NetworkDisabledError, match=r"network=\['pypi.org'.*network_policy.*network=True"):
        async with window(fake_opensandbox):
            entered = True
    assert not entered
    assert lifecycle.policies.get("sb-1", DENY_ALL) == DENY_ALL


async def test_a_policy_that_cannot_be_put_back_is_reported_not_swallowed(fake_opensandbox: Any) -> None:
    lifecycle = fake_opensandbox.lifecycle
    lifecycle.policy_answers["PUT"] = [(200, {}), (500, {"code": "INTERNAL", "message": "sidecar gone"})]
    with pytest.raises(SandboxError, match="could not be closed again.*sidecar gone"):
        async with window(fake_opensandbox):
            pass
    lifecycle.policy_answers["PUT"] = [(200, {}), (500, {"code": "INTERNAL", "message": "sidecar gone"})]
    with pytest.raises(ZeroDivisionError):  # the block's own error is kept; the failure is logged
        async with window(fake_opensandbox):
            1 / 0


# ---- the published server -----------------------------------------------------------------------------


async def _history(deployment: Any, sandbox_id: str) -> list[dict[str, Any]]:
    """The policies the stand-in sidecar received, in order (its own record: see egress_standin.py)."""
    async with deployment.client() as client:
        endpoint = await client.endpoint(sandbox_id, 18080)
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.get(endpoint.url + "/policy/history", headers=endpoint.headers)
    return [json.loads(entry["body"]) for entry in answer.json()]


async def _policy(deployment: Any, sandbox_id: str) -> dict[str, Any]:
    async with deployment.client() as client:
        return await client.network_policy(sandbox_id)


@pytest.mark.opensandbox_server
async def test_install_opens_the_index_in_the_policy_for_the_call_alone(deployment: Any) -> None:
    """Opened while pip runs, and put back after pip fails, after a cancel and after a timeout."""
    options = deployment.options()
    options.pop("resource_limits")
    async with AsyncSandbox("opensandbox", package_index=INDEX, **options) as sb:
        sandbox_id = sb._km.provisioner.sandbox_id
        assert await _policy(deployment, sandbox_id) == DENY_ALL

        failed = await sb.install(["nothing-here"], pip_args=NO_INDEX)  # pip fails: the policy is put back
        assert failed.error is not None
        assert await _history(deployment, sandbox_id) == [{"defaultAction": "deny", "egress": OPENED}, DENY_ALL]
        assert await _policy(deployment, sandbox_id) == DENY_ALL

        port = (await sb.run(SLOW_INDEX)).stdout.strip()
        slow = ["--index-url", f"http://127.0.0.1:{port}/simple", "--timeout", "8", "--retries", "0"]
        call = asyncio.ensure_future(sb.install(["nothing-here"], pip_args=slow))
        for _ in range(600):
            if (await _policy(deployment, sandbox_id))["egress"] == OPENED:
                break
            await asyncio.sleep(0.1)
        assert (await _policy(deployment, sandbox_id))["egress"] == OPENED  # open while pip runs
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await _policy(deployment, sandbox_id) == DENY_ALL
        assert (await _history(deployment, sandbox_id))[-1] == DENY_ALL

        port = (await sb.run(SLOW_INDEX)).stdout.strip()
        slow = ["--index-url", f"http://127.0.0.1:{port}/simple", "--timeout", "8", "--retries", "0"]
        opened = len(await _history(deployment, sandbox_id))
        with pytest.raises(CallTimeoutError):
            await sb.install(["nothing-here"], pip_args=slow, timeout=3)
        assert (await _history(deployment, sandbox_id))[opened:] == [{"defaultAction": "deny", "egress": OPENED}, DENY_ALL]
        assert await _policy(deployment, sandbox_id) == DENY_ALL
