"""In-process stand-ins for an OpenSandbox deployment on 127.0.0.1, for error paths only.

Where the published server can run (tests/opensandbox/test_opensandbox_server.py and the kernel
tests), tests use it. These fakes stay for what it cannot be made to do on demand: a sandbox
that turns ``Failed`` under a live kernel, an execd that refuses the advertised token, renewals
on a sub-second schedule. They follow the server's measured behaviour
(shared/opensandbox-server.md):

* ``FakeLifecycle`` stands for ``opensandbox-server`` 1.1.1's lifecycle API: ``POST /sandboxes``
  answers **202 with ``Running`` at once** (``polls_until_running`` > 0 shows ``Pending`` first,
  as a Kubernetes deployment may), the endpoint answers **200 at once** with
  ``127.0.0.1:PORT/proxy/44772`` (execd's own reverse proxy, as in bridge mode), ``GET`` adds the
  image's labels to ``metadata``, a deleted or expired sandbox is **404
  ``DOCKER::SANDBOX_NOT_FOUND``**, DELETE answers 204, errors are ``{code, message}``. It
  advertises an ``X-EXECD-ACCESS-TOKEN`` header with the endpoint, as a deployment with
  secure access does (the Docker runtime sends none).
* The execd is the execd STAND-IN (server/execd_standin.py, the same file the harness puts into
  sandboxes as ``/execd``): bare-JSON events, ``error`` terminal, real ipykernels.
* With ``jupyter=True``, a sandbox created with ``JUPYTER_TOKEN`` in its env gets a real
  ``jupyter server`` on 127.0.0.1 with that token (as the code-interpreter image runs one), whose
  endpoint for ``JUPYTER_PORT`` is execd's proxy to it: the websocket mode without Docker.

Both run on one tornado IOLoop in a background thread, so sync and async tests can use them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import tornado.httpserver
import tornado.ioloop
import tornado.netutil
import tornado.web

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensandbox" / "server"))
from execd_standin import TOKEN_HEADER, Execd  # noqa: E402

logging.getLogger("tornado.access").setLevel(logging.ERROR)
IMAGE_LABELS = {"org.opencontainers.image.title": "stand-in image label"}

FakeExecd = Execd


@dataclass
class FakeSandbox:
    id: str
    body: dict[str, Any]
    state: str = "Running"
    polls_until_running: int = 0
    renewals: list[str] = field(default_factory=list)
    jupyter: subprocess.Popen[bytes] | None = None
    jupyter_ports: tuple[int, int] = (0, 0)
    """(the port the sandbox asked for, the port its Jupyter server really listens on)"""


def start_jupyter(token: str) -> tuple[subprocess.Popen[bytes], int]:
    """A real jupyter_server on a free 127.0.0.1 port with ``token`` (local kernels: a fake sandbox)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    root = tempfile.mkdtemp(prefix="fake-sandbox-jupyter-")
    command = [
        sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0", "--ServerApp.open_browser=False", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}", "--ServerApp.log_level=WARN", "--allow-root",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_TOKEN", "JPY_"))}
    return subprocess.Popen(command, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port


class FakeLifecycle:
    """State of the fake lifecycle server."""

    def __init__(self, execd: Execd, api_key: str = "test-key", jupyter: bool = False) -> None:
        self.execd = execd
        self.api_key = api_key
        self.jupyter = jupyter
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.deleted: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.polls_until_running = 0
        self.advertised_token: str | None = None
        self.endpoint_answers: dict[int, tuple[int, dict[str, Any]] | float] = {}
        """Per port: ``(status, body)`` to answer instead of the endpoint, or seconds to hang before answering."""
        self.policies: dict[str, dict[str, Any]] = {}
        """Per sandbox id: its egress policy as ``/networkpolicy`` keeps it (deny-all until replaced)."""
        self.policy_answers: dict[str, list[tuple[int, Any]]] = {}
        """Per method of ``/networkpolicy``: ``(status, body)`` answers to give, in order, instead of serving it."""
        self._ids = itertools.count(1)
        self.port = 0

    def live(self) -> list[FakeSandbox]:
        """Sandboxes that were created and not deleted."""
        return list(self.sandboxes.values())


class _LifecycleHandler(tornado.web.RequestHandler):
    def initialize(self, lifecycle: FakeLifecycle) -> None:
        self.lifecycle = lifecycle

    def prepare(self) -> None:
        self.lifecycle.requests.append((self.request.method or "", self.request.uri or ""))
        key = self.request.headers.get("OPEN-SANDBOX-API-KEY")
        if key != self.lifecycle.api_key:
            self.fail(401, "MISSING_API_KEY" if key is None else "INVALID_API_KEY", "missing or wrong API key")

    def fail(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.finish({"code": code, "message": message})

    def sandbox(self, sandbox_id: str) -> FakeSandbox | None:
        sandbox = self.lifecycle.sandboxes.get(sandbox_id)
        if sandbox is None:
            self.fail(404, "DOCKER::SANDBOX_NOT_FOUND", f"Sandbox {sandbox_id} not found.")
        return sandbox

    @staticmethod
    def describe(sandbox: FakeSandbox, image_labels: bool = True) -> dict[str, Any]:
        metadata = dict(sandbox.body.get("metadata", {}))
        if image_labels:
            metadata.update(IMAGE_LABELS)
        return {
            "id": sandbox.id,
            "status": {"state": sandbox.state},
            "metadata": metadata,
            "entrypoint": sandbox.body.get("entrypoint"),
            "image": sandbox.body.get("image"),
            "createdAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2026-01-01T00:05:00Z",
        }


class SandboxesHandler(_LifecycleHandler):
    def post(self) -> None:
        body = json.loads(self.request.body)
        missing = [name for name in ("image", "entrypoint", "resourceLimits") if name not in body]
        if missing or int(body.get("timeout", 60)) < 60:
            detail = [{"type": "missing", "loc": ["body", name], "msg": "Field required"} for name in missing]
            if int(body.get("timeout", 60)) < 60:
                detail.append(
                    {
                        "type": "greater_than_equal",
                        "loc": ["body", "timeout"],
                        "msg": "Input should be greater than or equal to 60",
                    }
                )
            self.set_status(422)
            self.finish({"detail": detail})
            return
        sandbox = FakeSandbox(
            id=f"sbx-{next(self.lifecycle._ids)}", body=body, polls_until_running=self.lifecycle.polls_until_running
        )
        if sandbox.polls_until_running > 0:
            sandbox.state = "Pending"
        env = body.get("env") or {}
        if self.lifecycle.jupyter and env.get("JUPYTER_TOKEN"):
            sandbox.jupyter, port = start_jupyter(env["JUPYTER_TOKEN"])
            sandbox.jupyter_ports = (int(env.get("JUPYTER_PORT", 44771)), port)
        self.lifecycle.sandboxes[sandbox.id] = sandbox
        self.set_status(202)
        self.finish(self.describe(sandbox, image_labels=False))

    def get(self) -> None:
        wanted = dict(parse_qsl(self.get_query_argument("metadata", "")))
        items = [
            self.describe(s)
            for s in self.lifecycle.sandboxes.values()
            if all(s.body.get("metadata", {}).get(k) == v for k, v in wanted.items())
        ]
        pagination = {"page": 1, "pageSize": 100, "totalItems": len(items), "totalPages": 1, "hasNextPage": False}
        self.finish({"items": items, "pagination": pagination})


class SandboxHandler(_LifecycleHandler):
    def get(self, sandbox_id: str) -> None:
        sandbox = self.sandbox(sandbox_id)
        if sandbox is None:
            return
        if sandbox.state == "Pending":
            sandbox.polls_until_running -= 1
            if sandbox.polls_until_running <= 0:
                sandbox.state = "Running"
        self.finish(self.describe(sandbox))

    def delete(self, sandbox_id: str) -> None:
        sandbox = self.sandbox(sandbox_id)
        if sandbox is None:
            return
        stop_jupyter(sandbox)
        del self.lifecycle.sandboxes[sandbox_id]
        self.lifecycle.deleted.append(sandbox_id)
        self.set_status(204)
        self.finish()


def stop_jupyter(sandbox: FakeSandbox) -> None:
    if sandbox.jupyter is not None:
        sandbox.jupyter.terminate()
        try:
            sandbox.jupyter.wait(10)
        except subprocess.TimeoutExpired:
            sandbox.jupyter.kill()
            sandbox.jupyter.wait(10)
        sandbox.jupyter = None


class EndpointHandler(_LifecycleHandler):
    async def get(self, sandbox_id: str, port: str) -> None:
        sandbox = self.sandbox(sandbox_id)
        if sandbox is None:
            return
        answer = self.lifecycle.endpoint_answers.get(int(port))
        if isinstance(answer, float):
            await asyncio.sleep(answer)
        elif answer is not None:
            self.set_status(answer[0])
            self.finish(answer[1])
            return
        if int(port) == 0:
            self.fail(400, "SANDBOX::INVALID_PORT", "port must be between 1 and 65535")
            return
        if sandbox.jupyter is not None and int(port) == sandbox.jupyter_ports[0]:
            port = str(sandbox.jupyter_ports[1])
        token = self.lifecycle.advertised_token or self.lifecycle.execd.token
        self.finish(
            {"endpoint": f"127.0.0.1:{self.lifecycle.execd.port}/proxy/{port}", "headers": {TOKEN_HEADER: token}}
        )


class RenewHandler(_LifecycleHandler):
    def post(self, sandbox_id: str) -> None:
        sandbox = self.sandbox(sandbox_id)
        if sandbox is None:
            return
        expires = json.loads(self.request.body)["expiresAt"]
        sandbox.renewals.append(expires)
        self.finish({"expiresAt": expires})


class NetworkPolicyHandler(_LifecycleHandler):
    """``GET``/``PUT /sandboxes/{id}/networkpolicy`` as the server forwards them to the sidecar's ``/policy``."""

    def _canned(self) -> bool:
        answers = self.lifecycle.policy_answers.get(self.request.method or "")
        if not answers:
            return False
        status, body = answers.pop(0)
        self.set_status(status)
        self.finish(json.dumps(body))
        return True

    def get(self, sandbox_id: str) -> None:
        if not self._canned():
            self.finish(self.lifecycle.policies.get(sandbox_id, {"defaultAction": "deny", "egress": []}))

    def put(self, sandbox_id: str) -> None:
        if not self._canned():
            self.lifecycle.policies[sandbox_id] = json.loads(self.request.body)
            self.finish(self.lifecycle.policies[sandbox_id])


class ServedInThread:
    """Tornado applications on 127.0.0.1, served by an IOLoop of their own in a daemon thread.

    A subclass adds its applications in :meth:`serve` (which runs on that loop) with :meth:`listen`.
    """

    def __init__(self, name: str) -> None:
        self._loop: tornado.ioloop.IOLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def serve(self) -> None:
        raise NotImplementedError

    @staticmethod
    def listen(app: tornado.web.Application) -> int:
        """Serve ``app`` on a free port of 127.0.0.1 and return the port."""
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        tornado.httpserver.HTTPServer(app).add_sockets(sockets)
        return int(sockets[0].getsockname()[1])

    def _run(self) -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        self._loop = tornado.ioloop.IOLoop.current()
        self.serve()
        self._ready.set()
        self._loop.start()

    def start(self) -> Any:
        """Start serving and return self."""
        self._thread.start()
        self._ready.wait(30)
        return self

    def stop(self) -> None:
        """Stop the loop."""
        if self._loop is not None:
            self._loop.add_callback(self._loop.stop)
            self._thread.join(10)


class FakeOpenSandbox(ServedInThread):
    """Both fakes on one IOLoop in a daemon thread; ``api_base`` is the lifecycle URL."""

    def __init__(self, api_key: str = "test-key", ping_interval: float = 0.5, jupyter: bool = False) -> None:
        super().__init__("fake-opensandbox")
        self.execd = Execd(token="execd-token", ping_interval=ping_interval)
        self.lifecycle = FakeLifecycle(self.execd, api_key=api_key, jupyter=jupyter)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.lifecycle.port}/v1"

    @property
    def execd_url(self) -> str:
        return f"http://127.0.0.1:{self.execd.port}/proxy/44772"

    def serve(self) -> None:
        self.execd.port = self.listen(self.execd.app())
        lc = {"lifecycle": self.lifecycle}
        self.lifecycle.port = self.listen(
            tornado.web.Application(
                [
                    (r"/v1/sandboxes", SandboxesHandler, lc),
                    (r"/v1/sandboxes/([^/]+)", SandboxHandler, lc),
                    (r"/v1/sandboxes/([^/]+)/endpoints/(\d+)", EndpointHandler, lc),
                    (r"/v1/sandboxes/([^/]+)/renew-expiration", RenewHandler, lc),
                    (r"/v1/sandboxes/([^/]+)/networkpolicy", NetworkPolicyHandler, lc),
                ]
            )
        )

    def call(self, coro_fn: Any, timeout: float = 60) -> Any:
        """Run ``coro_fn()`` on the servers' loop and return its result."""
        assert self._loop is not None
        done: queue.Queue[tuple[bool, Any]] = queue.Queue()

        async def runner() -> None:
            try:
                done.put((True, await coro_fn()))
            except BaseException as exc:
                done.put((False, exc))

        self._loop.add_callback(runner)
        ok, value = done.get(timeout=timeout)
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """Shut down every context kernel and stop the loop."""
        if self._loop is None:
            return
        for sandbox in self.lifecycle.sandboxes.values():
            stop_jupyter(sandbox)
        self.call(self.execd.close)
        super().stop()
