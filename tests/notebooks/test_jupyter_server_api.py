"""jupyter_server's REST and websocket APIs drive a sandboxed kernel through its whole life.

Start by name, execute over the kernel channels websocket, interrupt a busy loop, restart into
a fresh container, delete, and find no container left (Docker queried by the kernel-id label).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import httpx
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from kernel_sandbox.docker.containers import OURS
from kernel_sandbox.docker.containers import kernel_of


class KernelChannels:
    """A client for /api/kernels/<id>/channels speaking JSON messages (the default protocol)."""

    def __init__(self, server, kernel_id: str) -> None:
        self.server, self.kernel_id = server, kernel_id
        self.session = uuid.uuid4().hex
        self.ws: WebSocketClientConnection | None = None

    async def __aenter__(self) -> KernelChannels:
        url = self.server.url.replace("http://", "ws://") + f"/api/kernels/{self.kernel_id}/channels?session_id={self.session}"
        self.ws = await websocket_connect(HTTPRequest(url, headers=self.server.headers))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.ws is not None
        self.ws.close()

    async def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "username": "test", "session": self.session,
                  "date": datetime.now(timezone.utc).isoformat(), "version": "5.3"}
        assert self.ws is not None
        await self.ws.write_message(json.dumps(
            {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": channel, "buffers": []}
        ))
        return msg_id

    async def execute(self, code: str) -> str:
        return await self.send("execute_request", {"code": code, "silent": False, "store_history": True,
                                                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})

    async def receive(self, timeout: float = 60) -> dict[str, Any]:
        assert self.ws is not None
        raw = await asyncio.wait_for(self.ws.read_message(), timeout)
        assert raw is not None, "the kernel websocket closed"
        return json.loads(raw)

    async def until_reply(self, msg_id: str, on_message=None, timeout: float = 60) -> tuple[dict[str, Any], str]:
        """Wait for the execute_reply to ``msg_id`` (and its idle status); return it and the stdout seen."""
        stdout, reply, idle = "", None, False
        while reply is None or not idle:
            msg = await self.receive(timeout)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if on_message is not None:
                await on_message(msg)
            kind = msg["msg_type"]
            if kind == "stream" and msg["content"]["name"] == "stdout":
                stdout += msg["content"]["text"]
            elif kind == "execute_reply":
                reply = msg["content"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        return reply, stdout


def containers(docker_engine, kernel_id: str) -> list:
    """The containers serving ``kernel_id`` (one that started as a standby carries the standby's id label)."""
    ours = docker_engine.containers.list(all=True, ignore_removed=True, filters={"label": OURS})
    return [container for container in ours if kernel_of(container.labels) == kernel_id]


async def test_kernel_lifecycle_over_rest_and_websocket(lab_server, docker_engine) -> None:
    async with httpx.AsyncClient(base_url=lab_server.url, headers=lab_server.headers, timeout=120) as http:
        specs = (await http.get("/api/kernelspecs")).json()["kernelspecs"]
        assert specs["sandboxed-python"]["spec"]["display_name"] == "Sandboxed Python"

        response = await http.post("/api/kernels", json={"name": "sandboxed-python"})
        assert response.status_code == 201, response.text
        kernel_id = response.json()["id"]
        try:
            [first] = containers(docker_engine, kernel_id)
            assert first.status == "running"

            async with KernelChannels(lab_server, kernel_id) as channels:
                reply, out = await channels.until_reply(await channels.execute(
                    "import os, socket\nprint(socket.gethostname(), sorted(os.listdir('/sys/class/net')), os.getuid() != 0)\nsecret = 42"
                ))
                assert reply["status"] == "ok"
                assert out == "sandbox ['lo'] True\n"

                async def interrupt_once_looping(msg: dict[str, Any]) -> None:
                    if msg["msg_type"] == "stream" and "looping" in msg["content"]["text"]:
                        interrupted = await http.post(f"/api/kernels/{kernel_id}/interrupt")
                        assert interrupted.status_code == 204

                reply, out = await channels.until_reply(
                    await channels.execute("import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.01)"),
                    on_message=interrupt_once_looping,
                )
                assert out == "looping\n"
                assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
                reply, out = await channels.until_reply(await channels.execute("print(secret)"))
                assert out == "42\n"  # the interrupt kept the kernel and its state

            restarted = await http.post(f"/api/kernels/{kernel_id}/restart")
            assert restarted.status_code == 200, restarted.text
            [second] = containers(docker_engine, kernel_id)
            assert second.id != first.id  # a restart is a fresh container

            async with KernelChannels(lab_server, kernel_id) as channels:
                reply, _ = await channels.until_reply(await channels.execute("secret"))
                assert reply["status"] == "error" and reply["ename"] == "NameError"
                reply, out = await channels.until_reply(await channels.execute("print('alive again')"))
                assert out == "alive again\n"
        finally:
            deleted = await http.delete(f"/api/kernels/{kernel_id}")
        assert deleted.status_code == 204
        assert (await http.get(f"/api/kernels/{kernel_id}")).status_code == 404
    deadline = time.monotonic() + 30
    left = [first.id, second.id]
    while (left := [c for c in left if docker_engine.containers.list(all=True, ignore_removed=True, filters={"id": c})]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert left == []
