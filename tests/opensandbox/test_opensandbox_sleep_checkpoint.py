"""OpenSandbox kernels that sleep by checkpoint (``suspend_by``, issue 37 item 4), against the published
``opensandbox-server`` of the harness: the launcher saves the kernel's variables and files through its own
cells, keeps the blob on the host, deletes the sandbox, and wakes the kernel in a new sandbox with them.

Where the server cannot pause (a Kubernetes provider without pause answers ``400 SANDBOX::INVALID_STATE``
"Pause is not supported for this sandbox type"), ``suspend_by: auto`` takes that path. The published
server's Docker runtime can pause, so a small proxy in front of it answers the pause as such a server does
(the one faked answer: an HTTP error path); everything else reaches the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import tornado.httpserver
import tornado.web

from kernel_sandbox.errors import SandboxError, SandboxNotFound
from kernel_sandbox.execution import AsyncSandbox
from kernel_sandbox.privdir import SLEEP_SLOT, kept_checkpoint

from support.kernel import DORMANT_GOAL, dormant, unique_memory
from test_opensandbox_sleep import sandbox_options, sleep_state, until

pytestmark = pytest.mark.opensandbox_server

WOKE = "The kernel slept from "
NOT_SUPPORTED = {"code": "SANDBOX::INVALID_STATE", "message": "Pause is not supported for this sandbox type"}


async def gone(deployment: Any, sandbox_id: str, wait: float = 0) -> bool:
    """Whether the server no longer knows the sandbox (within ``wait`` seconds: the sleep says it sleeps
    before it deletes the sandbox)."""
    deadline = asyncio.get_running_loop().time() + wait
    async with deployment.client() as client:
        while True:
            try:
                await client.get(sandbox_id)
            except SandboxNotFound:
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("kind", ["execd", "websocket"])
async def test_an_idle_kernel_sleeps_by_checkpoint_and_wakes_in_a_new_sandbox(deployment: Any, kind: str) -> None:
    """Asleep, nothing is left on the server and a few MiB on the host (the dormant process in the
    launcher's place); the next cell wakes the kernel in a new sandbox, with its variables and files."""
    options = sandbox_options(deployment, kind, suspend_after=2, suspend_by="checkpoint")
    async with AsyncSandbox("opensandbox", **options) as sb:
        state = "import numpy as np\nx = 41\narray = np.arange(200_000)\nopen('notes.txt', 'w').write('kept')"
        before = await sb.run(state)
        assert before.error is None, before
        first = sb._km.provisioner.sandbox_id
        await until(lambda: sleep_state(sb).get("state") == "suspended", what="the kernel to sleep")
        assert "paused" not in sleep_state(sb) and sleep_state(sb)["bytes"] > 1_600_000, "in several chunks"
        assert kept_checkpoint(sb._km.provisioner.private.path, SLEEP_SLOT).is_file()
        assert await gone(deployment, first, wait=60), "the sandbox is deleted, not paused"
        launcher = sb._km.provisioner.process.pid
        await until(lambda: dormant(launcher), what="the dormant process to hold the channels")
        assert unique_memory(launcher) <= DORMANT_GOAL
        assert (await sb.metrics()).state == "suspended"

        said: list[str] = []
        after = await sb.run(
            "print(x, array.sum() == np.arange(200_000).sum(), open('notes.txt').read())",
            on_stdout=said.append,
            on_stderr=said.append,
        )
        assert after.error is None and after.stdout.endswith("41 True kept\n"), after
        assert after.execution_count == before.execution_count + 1, (before, after)
        assert sum(text.count(WOKE) for text in said) == 1, said
        assert sb._km.provisioner.sandbox_id not in (None, first)
        assert sleep_state(sb) == {}
        assert not kept_checkpoint(sb._km.provisioner.private.path, SLEEP_SLOT).exists(), "awake, it holds no blob"
        again = await sb.run("print(x)")
        assert again.stdout == "41\n" and WOKE not in again.stdout, "said once"


@contextlib.asynccontextmanager
async def refusing_pause(api_base: str) -> AsyncIterator[str]:
    """A proxy to the lifecycle API at ``api_base`` that answers every pause as a server that cannot pause;
    yields its own base URL."""
    parts = urlsplit(api_base)
    origin = f"{parts.scheme}://{parts.netloc}"
    client = httpx.AsyncClient(timeout=60)
    paused: list[str] = []

    class Forward(tornado.web.RequestHandler):
        async def _forward(self, path: str) -> None:
            if self.request.method == "POST" and path.endswith("/pause"):
                paused.append(path)
                self.set_status(400)
                self.finish(NOT_SUPPORTED)
                return
            headers = {k: v for k, v in self.request.headers.items() if k.lower() not in ("host", "content-length")}
            answer = await client.request(
                self.request.method, origin + self.request.uri, headers=headers, content=self.request.body or None
            )
            self.set_status(answer.status_code)
            for name, value in answer.headers.items():
                if name.lower() in ("content-type", "retry-after"):
                    self.set_header(name, value)
            self.finish(answer.content)

        get = post = delete = patch = put = _forward

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.setblocking(False)
    server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"(/.*)", Forward)]))
    server.add_sockets([listener])
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}{parts.path}", paused
    finally:
        server.stop()
        await client.aclose()


async def test_where_the_server_cannot_pause_auto_sleeps_by_checkpoint(deployment: Any) -> None:
    async with refusing_pause(deployment.api_base) as (api_base, paused):
        options = sandbox_options(deployment, api_base=api_base, suspend_after=3600)
        async with AsyncSandbox("opensandbox", **options) as sb:
            assert (await sb.run("y = 'kept'")).error is None
            first = sb._km.provisioner.sandbox_id
            await sb.suspend()
            assert len(paused) == 1, "asked to pause first"
            assert sleep_state(sb)["state"] == "suspended" and await gone(deployment, first, wait=60)
            await sb.wake()
            assert (await sb.run("print(y)")).stdout == "kept\n"
            await sb.suspend()  # the server said it never pauses: not asked again
            assert len(paused) == 1 and sleep_state(sb)["state"] == "suspended"
            assert (await sb.run("print(y)")).stdout.endswith("kept\n")


async def test_with_suspend_by_pause_a_server_that_cannot_pause_leaves_the_kernel_awake(deployment: Any) -> None:
    async with refusing_pause(deployment.api_base) as (api_base, _):
        options = sandbox_options(deployment, api_base=api_base, suspend_after=3600, suspend_by="pause")
        async with AsyncSandbox("opensandbox", **options) as sb:
            assert (await sb.run("y = 'kept'")).error is None
            with pytest.raises(SandboxError, match="Pause is not supported"):
                await sb.suspend()
            assert sleep_state(sb)["state"] == "awake" and "not supported" in sleep_state(sb)["why"]
            assert not await gone(deployment, sb._km.provisioner.sandbox_id)
            assert (await sb.run("print(y)")).stdout == "kept\n"


@pytest.mark.security("attack", "container")
async def test_a_kernel_that_plants_its_own_sleep_code_cannot_make_the_host_keep_more_than_it_states(
    deployment: Any,
) -> None:
    """The launcher installs its kernel side only where it is missing, so the kernel may plant one first: it
    states a small blob and answers each chunk with a megabyte. The host takes no chunk past the stated size,
    keeps nothing, and the kernel stays awake in its sandbox."""
    options = sandbox_options(deployment, suspend_after=3600, suspend_by="checkpoint")
    async with AsyncSandbox("opensandbox", **options) as sb:
        planted = (
            "import sys, types, json, base64, hashlib\n"
            "fake = types.ModuleType('_kernel_sandbox_magics')\n"
            "def say(marker, meta, parts=()):\n"
            "    body = json.dumps({'meta': meta, 'parts': [base64.b64encode(p).decode() for p in parts]})\n"
            "    print(f'BEGIN-{marker} {len(body)} {hashlib.sha256(body.encode()).hexdigest()} {body} END-{marker}')\n"
            "fake.sleep_save = lambda marker: say(marker, {'size': 1000, 'sha256': '0' * 64, 'saved': [], "
            "'not_saved': {}, 'files': 0, 'files_not_saved': {}, 'blob': '/tmp/blob'})\n"
            "fake.sleep_read = lambda marker, offset, size: say(marker, {'size': 1000}, [b'x' * 2**20])\n"
            "fake.sleep_drop = lambda: None\n"
            "sys.modules['_kernel_sandbox_magics'] = fake\nz = 'alive'"
        )
        before = await sb.run(planted)
        assert before.error is None and before.execution_count is not None
        with pytest.raises(SandboxError, match="Refused the checkpoint|invalid|no answer"):
            await sb.suspend()
        assert sleep_state(sb)["state"] == "awake"
        assert not kept_checkpoint(sb._km.provisioner.private.path, SLEEP_SLOT).exists()
        assert not await gone(deployment, sb._km.provisioner.sandbox_id)
        after = await sb.run("print(z)")
        assert after.stdout == "alive\n"
        assert after.execution_count == before.execution_count + 1, "the sleep's own cells count for no one"
