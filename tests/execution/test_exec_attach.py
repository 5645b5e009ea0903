"""A program takes over a sandbox whose owner process died (issue 25): `kernel-sandbox ps`, AsyncSandbox.attach."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from kernel_sandbox.errors import ConfigError, KernelLaunchError
from kernel_sandbox.execution import AsyncSandbox

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

OWNER = """
import os
from kernel_sandbox import Sandbox
sandbox = Sandbox().start()
sandbox.run("kept = 'from the first owner'")
print(sandbox.kernel_id, sandbox._async._km.provisioner.container_id, flush=True)
os._exit(0)  # killed: no close, the launcher waits orphan_timeout for a new owner
"""


def _ps() -> str:
    return subprocess.run([sys.executable, "-m", "kernel_sandbox.cli", "ps"], capture_output=True, text=True, check=True, timeout=120).stdout


async def test_a_program_attaches_to_the_sandbox_of_a_dead_one(docker_engine) -> None:
    with tempfile.TemporaryFile("w+") as out:  # not a pipe: the launcher keeps its owner's
        assert subprocess.run([sys.executable, "-c", OWNER], stdout=out, stderr=subprocess.DEVNULL, timeout=240).returncode == 0
        out.seek(0)
        kernel_id, container_id = out.read().split()

    deadline = time.monotonic() + 30  # the launcher looks at its owner once a second
    while not re.search(rf"kernel {kernel_id}\t.*\torphan: re-attach within \d+ s$", listed := _ps(), re.M) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert re.search(rf"kernel {kernel_id}\t.*\torphan: re-attach within \d+ s$", listed, re.M), listed

    sandbox = await AsyncSandbox.attach(kernel_id, timeout=60)
    try:
        assert sandbox.kernel_id == kernel_id and sandbox._km.provisioner.container_id == container_id
        assert (await sandbox.run("print(kept)")).stdout == "from the first owner\n"
        with pytest.raises(KernelLaunchError, match="attached to another process"):
            await AsyncSandbox.attach(kernel_id)  # one owner at a time
        assert f"kernel {kernel_id}\torphan" not in _ps()
    finally:
        await sandbox.close()
    assert not docker_engine.containers.list(all=True, ignore_removed=True, filters={"id": container_id})
    with pytest.raises(KernelLaunchError, match=f"no live sandboxed kernel {kernel_id} of uid {os.geteuid()}"):
        await AsyncSandbox.attach(kernel_id)


async def test_attach_refuses_a_backend_without_sandboxes() -> None:
    with pytest.warns(UserWarning, match="NOT a sandbox"), pytest.raises(ConfigError, match="no sandboxed kernel"):
        await AsyncSandbox.attach("0f0f0f0f-0000-4000-8000-000000000000", backend="local")
