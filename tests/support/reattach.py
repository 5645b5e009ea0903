"""What the re-attach tests share: kernels whose owner process died (orphans), made in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ORPHAN_OWNER = r"""
import asyncio, json, os, sys, uuid
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config
from kernel_sandbox.kernelspecs import SandboxKernelSpecManager

async def main(count, orphan_timeout):
    config = Config({"DockerProvisioner": {"standby": 0, "orphan_timeout": orphan_timeout}})
    for _ in range(count):
        kernel_id = str(uuid.uuid4())  # and its connection file in the runtime directory, as a Jupyter server has it
        km = AsyncKernelManager(kernel_name="sandboxed-python", kernel_spec_manager=SandboxKernelSpecManager(), config=config,
                                kernel_id=kernel_id, connection_file=os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], f"kernel-{kernel_id}.json"))
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)
        assert (await kc.execute_interactive("x = 42", timeout=120))["content"]["status"] == "ok"
        kc.stop_channels()
        state = km.provisioner.launcher_state
        print(json.dumps({"kernel_id": km.kernel_id, "container_id": state["container_id"],
                          "launcher_pid": state["pid"], "private_dir": str(km.provisioner.private.path)}), flush=True)
    os._exit(0)  # as a SIGKILLed server: no shutdown, the owner lock goes with the process

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"""


@dataclass
class Orphan:
    """A live kernel whose owner is gone: its launcher waits ``orphan_timeout`` for a new one."""

    kernel_id: str
    container_id: str
    launcher_pid: int
    private_dir: Path


def make_orphans(count: int, runtime_dir: Path, orphan_timeout: float = 60) -> list[Orphan]:
    """Start ``count`` Docker kernels (``x = 42`` run in each) from a process that then dies; their connection
    files go to ``runtime_dir``, as a Jupyter server's do."""
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime_dir)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # not pipes: the launchers keep them
        code = subprocess.run(
            [sys.executable, "-c", ORPHAN_OWNER, str(count), str(orphan_timeout)], stdout=out, stderr=err, env=env, timeout=300
        ).returncode
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    found = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert code == 0 and len(found) == count, stderr[-3000:]
    return [Orphan(o["kernel_id"], o["container_id"], int(o["launcher_pid"]), Path(o["private_dir"])) for o in found]


def end_launcher(pid: int) -> None:
    """SIGTERM a launcher these tests made (it removes its container); one already gone is fine."""
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        pass
