"""The debugger through the launcher (issue 25, item 2): what JupyterLab's debugger sends, on a Docker kernel.

JupyterLab speaks the Debug Adapter Protocol in ``debug_request``/``debug_reply`` on the control
channel and ``debug_event`` on IOPub. These tests send its sequence (initialize, attach,
debugInfo, dumpCell, setBreakpoints, configurationDone, then execute; stackTrace, scopes,
variables, richInspectVariables, next, continue) through the launcher and its output policy.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time
from typing import Any

import pytest

from kernel_sandbox.kernelspecs import DOCKER_SPEC, OPENSANDBOX_SPEC, install, shipped_spec, started_client

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

CELL = "x = 42\ny = x + 1\nz = y * 2\n"


class Debugger:
    """A Debug Adapter Protocol client on a kernel client's control channel, as JupyterLab's."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.seq = 0

    async def request(self, command: str, timeout: float = 60, **arguments: Any) -> dict[str, Any]:
        self.seq += 1
        msg = self.kc.session.msg("debug_request", {"type": "request", "seq": self.seq, "command": command, "arguments": arguments})
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = await self.kc.get_control_msg(timeout=max(deadline - time.monotonic(), 0.01))
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert reply["msg_type"] == "debug_reply"
                return reply["content"]

    async def stopped(self, timeout: float = 60) -> dict[str, Any]:
        """The next ``stopped`` debug_event on IOPub."""
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.kc.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
            if msg["msg_type"] == "debug_event" and msg["content"].get("event") == "stopped":
                return msg["content"]["body"]

    async def variables(self, frame_id: int) -> dict[str, str]:
        scopes = (await self.request("scopes", frameId=frame_id))["body"]["scopes"]
        found: dict[str, str] = {}
        for scope in scopes:
            listed = await self.request("variables", variablesReference=scope["variablesReference"])
            found.update({v["name"]: v["value"] for v in listed["body"]["variables"]})
        return found


async def test_breakpoint_variables_and_step_through_the_launcher(docker_engine) -> None:
    async with started_client(DOCKER_SPEC, standby=0) as kc:
        info = (await kc.kernel_info(reply=True, timeout=60))["content"]
        assert "debugger" in info["supported_features"]
        dap = Debugger(kc)
        initialized = await dap.request(
            "initialize", clientID="jupyterlab", clientName="JupyterLab", adapterID="python", pathFormat="path",
            linesStartAt1=True, columnsStartAt1=True, supportsVariableType=True, supportsVariablePaging=True,
            supportsRunInTerminalRequest=True, locale="en",
        )
        assert initialized["success"], initialized
        assert (await dap.request("attach"))["success"]
        debug_info = await dap.request("debugInfo")
        assert debug_info["success"] and debug_info["body"]["isStarted"]
        source = (await dap.request("dumpCell", code=CELL))["body"]["sourcePath"]
        assert source.startswith(debug_info["body"]["tmpFilePrefix"])
        breakpoints = await dap.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": 2}], sourceModified=False)
        assert breakpoints["success"] and breakpoints["body"]["breakpoints"][0]["verified"]
        assert (await dap.request("configurationDone"))["success"]

        msg_id = kc.execute(CELL)
        stop = await dap.stopped()
        assert stop["reason"] == "breakpoint"
        thread = stop["threadId"]
        frame = (await dap.request("stackTrace", threadId=thread))["body"]["stackFrames"][0]
        assert (frame["line"], frame["source"]["path"]) == (2, source)
        seen = await dap.variables(frame["id"])
        assert seen["x"] == "42" and "y" not in seen
        rich = await dap.request("richInspectVariables", variableName="x", frameId=frame["id"])
        assert rich["success"] and rich["body"]["data"]["text/plain"] == "42"  # through the output policy's cleaning

        assert (await dap.request("next", threadId=thread))["success"]
        stepped = await dap.stopped()
        assert stepped["reason"] == "step"
        frame = (await dap.request("stackTrace", threadId=thread))["body"]["stackFrames"][0]
        assert frame["line"] == 3 and (await dap.variables(frame["id"]))["y"] == "43"

        assert (await dap.request("continue", threadId=thread))["success"]
        deadline = time.monotonic() + 60
        while True:
            reply = await kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.01))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "ok"
        assert (await dap.request("disconnect", restart=False, terminateDebuggee=False))["success"]
        with pytest.raises(queue.Empty):  # the debugger left nothing behind: the kernel is free for the next cell
            while True:
                await kc.get_iopub_msg(timeout=0.5)
        out = await kc.execute_interactive("print(z)", timeout=60)
        assert out["content"]["status"] == "ok"


def test_kernelspecs_say_which_have_a_debugger(tmp_path) -> None:
    """JupyterLab greys the debugger toggle out unless the kernelspec's metadata says ``debugger``."""
    assert shipped_spec(DOCKER_SPEC).metadata["debugger"] is True
    assert shipped_spec(OPENSANDBOX_SPEC).metadata["debugger"] is True  # websocket (and auto): ipykernel in the sandbox
    execd = install(OPENSANDBOX_SPEC, prefix=str(tmp_path), install_as="execd-only", config={"mode": "execd"})
    assert json.loads((tmp_path / "share/jupyter/kernels/execd-only/kernel.json").read_text())["metadata"]["debugger"] is False
    docker = install(DOCKER_SPEC, prefix=str(tmp_path))
    assert json.loads((tmp_path / "share/jupyter/kernels" / DOCKER_SPEC / "kernel.json").read_text())["metadata"]["debugger"] is True
    assert execd and docker
