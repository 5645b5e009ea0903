"""What tests that talk to kernels share: a kernelspec's argv started by hand (as VS Code starts it), the
messages of one request, and JupyterLab's debugger sequence.
"""

from __future__ import annotations

import json
import secrets
import queue
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file


RUNTIMES = ("runc", "runsc")
"""The OCI runtimes the container-facing tests run on: Docker's default and gVisor (.ci/run registers runsc)."""


PODMAN = "podman"
"""Not a runtime: Podman's engine (its default runtime), for the tests parametrised over runtimes and engines."""


def runtime_option(runtime: str) -> dict[str, str]:
    """The option that selects ``runtime`` (none for runc, the engine's default), or ``engine`` for :data:`PODMAN`."""
    if runtime == PODMAN:
        return {"engine": PODMAN}
    return {"runtime": runtime} if runtime != "runc" else {}


class ArgvKernel:
    """A kernelspec's argv started by hand, with a blocking client connected to the ports it was given.

    The connection file is ``kernel-KERNEL_ID.json`` in ``tmp_path``: the launcher takes the kernel's
    id (its container's or sandbox's label) from that name.
    """

    def __init__(self, spec_dir: Path, tmp_path: Path, env: dict[str, str] | None = None, kernel_id: str = "launched") -> None:
        self.kernel_id = kernel_id
        self.connection_file, _ = write_connection_file(
            str(tmp_path / f"kernel-{kernel_id}.json"), key=secrets.token_hex(16).encode()
        )
        argv = json.loads((spec_dir / "kernel.json").read_text())["argv"]
        cmd = [part.replace("{connection_file}", self.connection_file) for part in argv]
        self.process = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
        self.client = BlockingKernelClient(connection_file=self.connection_file)
        self.client.load_connection_file()
        self.client.start_channels()

    def ready(self, timeout: float = 90) -> None:
        """Wait for the launcher's heartbeat, then for the kernel.

        jupyter_client's own wait gives up when the first heartbeat is unanswered for a second,
        which a launcher still importing on a loaded machine can miss: poll it first, with a deadline.
        """
        self.wait_for_heartbeat(self.connection_file, timeout)
        self.client.wait_for_ready(timeout=timeout)

    @staticmethod
    def wait_for_heartbeat(connection_file: str, timeout: float = 90) -> None:
        """Ping the heartbeat of the kernel of ``connection_file`` until it answers (fail after ``timeout`` s)."""
        import zmq

        info = json.loads(Path(connection_file).read_text())
        context = zmq.Context()
        ping = context.socket(zmq.REQ)
        ping.connect(f"tcp://127.0.0.1:{info['hb_port']}")
        try:
            ping.send(b"ping")
            assert ping.poll(timeout * 1000), f"the launcher's heartbeat did not answer within {timeout} s"
        finally:
            ping.close(linger=0)
            context.term()

    def run(self, code: str, timeout: float = 60) -> tuple[str, dict[str, Any]]:
        """Execute ``code``; return its stdout and the reply's content."""
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=hook)
        return "".join(out), reply["content"]

    def stop(self, timeout: float = 30) -> str:
        """End the launcher as a client does (SIGTERM; it must exit within ``timeout`` s); return its stderr."""
        self.client.stop_channels()
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout)
        assert self.process.stderr is not None
        with self.process.stderr:
            return self.process.stderr.read().decode(errors="replace")


async def until_idle(kc: Any, msg_id: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Every IOPub message of request ``msg_id`` up to its idle status (other requests' messages are skipped)."""
    messages = []
    while True:
        msg = await kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages


async def until_ended(km: Any, timeout: float = 60) -> None:
    """Wait until the provisioner of kernel manager ``km`` sees its kernel gone (at most ``timeout`` s)."""
    import asyncio

    deadline = time.monotonic() + timeout
    while await km.provisioner.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


async def reply_to(channel: Any, msg_id: str, timeout: float = 120) -> dict[str, Any]:
    """The reply to ``msg_id`` on ``channel`` (late replies to earlier requests, e.g. kernel_info, are skipped)."""
    while True:
        reply = await channel.get_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


async def run_cell(km: Any, code: str, timeout: float = 120, ready_timeout: float = 120) -> tuple[str, dict[str, Any]]:
    """Execute ``code`` through a new client of kernel manager ``km`` (once the kernel answers); return
    its stdout and the reply's content. The client is closed on the way out."""
    kc = km.client()
    kc.start_channels()
    out: list[str] = []
    try:
        await kc.wait_for_ready(timeout=ready_timeout)
        reply = await kc.execute_interactive(
            code, timeout=timeout,
            output_hook=lambda msg: out.append(msg["content"]["text"]) if msg["msg_type"] == "stream" else None,
        )
    finally:
        kc.stop_channels()
    return "".join(out), reply["content"]


async def cell(kc: Any, code: str, timeout: float = 180) -> tuple[str, dict[str, Any]]:
    """Run ``code`` through the async client ``kc``; return its stdout and stderr together, and the reply's content."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    reply = await kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return "".join(out), reply["content"]


# ---- the debugger, as JupyterLab drives it --------------------------------------------------------

DEBUG_CELL = "x = 42\ny = x + 1\nz = y * 2\n"


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


async def debug_a_cell(kc: Any) -> None:
    """JupyterLab's debugger on ``kc``'s kernel: a breakpoint, the variables (also rich), a step, continue, disconnect."""
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
    source = (await dap.request("dumpCell", code=DEBUG_CELL))["body"]["sourcePath"]
    assert source.startswith(debug_info["body"]["tmpFilePrefix"])
    breakpoints = await dap.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": 2}], sourceModified=False)
    assert breakpoints["success"] and breakpoints["body"]["breakpoints"][0]["verified"]
    assert (await dap.request("configurationDone"))["success"]

    msg_id = kc.execute(DEBUG_CELL)
    stop = await dap.stopped()
    assert stop["reason"] == "breakpoint"
    thread = stop["threadId"]
    frames = (await dap.request("stackTrace", threadId=thread))["body"]["stackFrames"]
    frame = frames[0]
    assert (frame["line"], frame["source"]["path"]) == (2, source)
    # the kernel's own frames are hidden (ipykernel's rules), and so are the boot code's below them
    assert [(f["name"], f.get("source", {}).get("path")) for f in frames] == [("<module>", source)], frames
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


def cgroup_file(container_id: str, controller: str, name: str) -> str:
    """A file of the container's cgroup, read by its path (cgroup v1 or v2, cgroupfs driver)."""
    for path in (Path("/sys/fs/cgroup") / controller / "docker" / container_id / name,
                 Path("/sys/fs/cgroup") / "docker" / container_id / name,
                 Path("/sys/fs/cgroup/system.slice") / f"docker-{container_id}.scope" / name):
        if path.exists():
            return path.read_text()
    raise AssertionError(f"no {name} for {container_id[:12]} under /sys/fs/cgroup")


def memory_in_use(container_id: str) -> int:
    """What the cgroup counts, less inactive file cache (as `docker stats` shows it)."""
    stat = dict(line.split() for line in cgroup_file(container_id, "memory", "memory.stat").splitlines())
    if "total_inactive_file" in stat:
        return int(cgroup_file(container_id, "memory", "memory.usage_in_bytes")) - int(stat["total_inactive_file"])
    return int(cgroup_file(container_id, "memory", "memory.current")) - int(stat["inactive_file"])


DORMANT_GOAL = 12 * 2**20
"""Issue 37: what a sleeping kernel may cost the host (its launcher, the dormant process)."""


def dormant(pid: int) -> bool:
    """Whether the launcher ``pid`` is a sleeping kernel's dormant process now
    (kernel_sandbox/launch/dormant.py)."""
    return b"kernel_sandbox.launch.dormant" in Path(f"/proc/{pid}/cmdline").read_bytes()


def unique_memory(pid: int) -> int:
    """The process's unique memory (USS), in bytes."""
    rows = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return 1024 * sum(int(row.split()[1]) for row in rows if row.startswith(("Private_Clean", "Private_Dirty")))
