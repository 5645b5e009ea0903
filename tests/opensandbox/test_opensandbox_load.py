"""Many kernels at once against the published ``opensandbox-server`` (issue 28 item 3).

16 kernels are started at once through jupyter_client (the OpenSandbox kernelspec, execd mode),
each runs a cell, all are shut down, and the server lists none of this test's sandboxes
afterwards. The Docker runtime has no capacity limit, so a **capacity gate** stands in for a
Kubernetes pool in front of the real server (one run covers both: 16 at once, 12 fit): a reverse proxy on 127.0.0.1 that passes every
call through to it, but answers ``POST /sandboxes`` with the server's exact 429
(``KUBERNETES::POOL_CAPACITY_EXHAUSTED``, ``Retry-After: 1``) while ``capacity`` sandboxes it let
through are not deleted yet. Behind it the excess waits and then starts; with no capacity at all,
a launch fails with the typed error after its ``ready_timeout``. Nothing may leak either way.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import tornado.web
from jupyter_client.manager import AsyncKernelManager
from support.opensandbox_fakes import ServedInThread

from kernel_sandbox.errors import KernelLaunchError
from kernel_sandbox.kernelspecs import started_client
from kernel_sandbox.opensandbox.gc import LABEL_KERNEL_ID

pytestmark = pytest.mark.opensandbox_server

KERNELS = 16
CAPACITY = 12
POOL_EXHAUSTED = {
    "code": "KUBERNETES::POOL_CAPACITY_EXHAUSTED",
    "message": "No Pool capacity became available before the acquisition timeout.",
}


class CapacityGate(ServedInThread):
    """A reverse proxy to the lifecycle server that admits at most ``capacity`` live sandboxes."""

    def __init__(self, upstream: str, capacity: int) -> None:
        super().__init__("capacity-gate")
        self.upstream = upstream.rstrip("/")
        self.capacity = capacity
        self.live: set[str] = set()
        self.admitting = 0
        self.refused = 0
        self.kernels_asking: set[str] = set()
        """Kernel ids of every create that reached the gate (admitted or refused)."""
        self.everyone_asked = threading.Event()
        self.expected = 0
        self.port = 0

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def serve(self) -> None:
        gate = self

        class Proxy(tornado.web.RequestHandler):
            SUPPORTED_METHODS = ("GET", "POST", "DELETE", "PATCH", "PUT")

            async def dispatch(self) -> None:
                await gate.handle(self)

            get = post = delete = patch = put = dispatch  # type: ignore[assignment]

        self.port = self.listen(tornado.web.Application([(r"/.*", Proxy)]))

    async def handle(self, handler: tornado.web.RequestHandler) -> None:
        request = handler.request
        method, path = request.method or "GET", request.path
        creating = method == "POST" and path.rstrip("/") in ("/v1/sandboxes", "/sandboxes")
        if creating:
            body = json.loads(request.body)
            self.kernels_asking.add(body.get("metadata", {}).get(LABEL_KERNEL_ID, ""))
            if len(self.kernels_asking) >= self.expected:
                self.everyone_asked.set()
            if len(self.live) + self.admitting >= self.capacity:
                self.refused += 1
                handler.set_status(429)
                handler.set_header("Retry-After", "1")
                handler.finish(POOL_EXHAUSTED)
                return
            self.admitting += 1
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            async with httpx.AsyncClient(timeout=120) as http:
                answer = await http.request(
                    method, self.upstream + request.uri, headers=headers, content=request.body or None
                )
        finally:
            if creating:
                self.admitting -= 1
        if creating and answer.status_code == 202:
            self.live.add(answer.json()["id"])
        if method == "DELETE" and answer.status_code in (204, 404):
            self.live.discard(path.rstrip("/").rsplit("/", 1)[-1])
        handler.set_status(answer.status_code)
        for name in ("content-type", "retry-after"):
            if name in answer.headers:
                handler.set_header(name, answer.headers[name])
        handler.finish(answer.content)


@pytest.fixture
def gate(deployment: Any) -> Any:
    if deployment.local is None:
        pytest.skip("the gate stands in front of the local harness's server")
    gate = CapacityGate(deployment.local.api_base.removesuffix("/v1"), CAPACITY).start()
    yield gate
    gate.stop()


async def run_one(kernel_name: str, release: asyncio.Event | None = None) -> str:
    """Start one kernel, run a cell, (wait for ``release``,) shut it down; return the cell's output."""
    km = AsyncKernelManager(kernel_name=kernel_name)
    async with started_client(km, timeout=300) as kc:
        msg_id = kc.execute("import os; print(os.getpid() > 0, 6 * 7)")
        output = ""
        while True:
            msg = await kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                output += msg["content"]["text"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        if release is not None:
            await release.wait()
    return output


def kernelspec(deployment: Any, directory: Path, **overrides: Any) -> str:
    deployment.kernelspec(directory, "execd", poll_interval=0.5, state_check_interval=5.0, **overrides)
    return "sandboxed-python-opensandbox"


@pytest.mark.security("load", "opensandbox")
async def test_sixteen_kernels_at_once_past_the_capacity_wait_then_start_and_leave_nothing(
    deployment: Any, deployment_jupyter_path: Path, gate: CapacityGate
) -> None:
    """16 kernels start at once while 12 fit: the first 12 hold their sandboxes until every kernel
    has asked, so at least 4 creates meet the 429 and wait; as kernels end, the waiting ones start.
    Every kernel runs its cell, and afterwards neither the gate nor the server knows a sandbox of ours."""
    gate.expected = KERNELS
    name = kernelspec(deployment, deployment_jupyter_path, api_base=gate.api_base, ready_timeout=600.0)
    release = asyncio.Event()

    async def open_when_everyone_asked() -> None:
        await asyncio.get_running_loop().run_in_executor(None, gate.everyone_asked.wait, 300)
        release.set()

    opener = asyncio.ensure_future(open_when_everyone_asked())
    try:
        outputs = await asyncio.gather(*(run_one(name, release) for _ in range(KERNELS)))
    finally:
        opener.cancel()
    assert outputs == ["True 42\n"] * KERNELS
    assert len(gate.kernels_asking) == KERNELS
    assert gate.refused >= KERNELS - CAPACITY, f"only {gate.refused} creates met the capacity limit"
    assert not gate.live, f"sandboxes the gate let through and saw no delete for: {gate.live}"
    assert not await asyncio.to_thread(deployment.live_sandboxes), "the server still lists sandboxes of this test"


@pytest.mark.security("fault", "opensandbox")
async def test_no_capacity_until_the_deadline_fails_with_the_typed_error(
    deployment: Any, deployment_jupyter_path: Path, gate: CapacityGate
) -> None:
    gate.capacity = 0
    name = kernelspec(deployment, deployment_jupyter_path, api_base=gate.api_base, ready_timeout=3.0)
    km = AsyncKernelManager(kernel_name=name)
    with pytest.raises(KernelLaunchError, match="no capacity for a new sandbox") as info:
        await km.start_kernel()
    assert "(SandboxCapacityError)" in str(info.value) and "POOL_CAPACITY_EXHAUSTED" in str(info.value)
    assert gate.refused >= 2 and not gate.live
    assert not await asyncio.to_thread(deployment.live_sandboxes)
