"""Issue 28 against the published ``opensandbox-server`` 1.1.1 (its Docker runtime, started by the harness).

What the Docker runtime can produce is tested here for real: pause and resume under a live kernel,
a ``pvc`` volume (a Docker named volume there), the refusal of signed endpoints (400
``SANDBOX::API_NOT_SUPPORTED``) and the fallback to plain ones, ``mode: auto`` falling back to execd
when the Jupyter port's endpoint is not handed out. What it cannot (429, 403 quota) is in
test_opensandbox_capacity.py with the server's exact bodies.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from kernel_sandbox.execution import AsyncSandbox, Sandbox

pytestmark = pytest.mark.opensandbox_server


def sandbox_options(deployment: Any, **overrides: Any) -> dict[str, Any]:
    options = deployment.options("execd", **overrides)
    options.pop("resource_limits")
    return {"memory": "512m", "cpus": 1, **options}


async def until_paused_note(kc: Any, deadline: float) -> str:
    """Send kernel_info requests until the launcher holds one for the paused sandbox; return its note."""
    while time.monotonic() < deadline:
        msg_id = kc.kernel_info()
        wait_until = time.monotonic() + 3
        while time.monotonic() < wait_until:
            try:
                msg = await kc.get_iopub_msg(timeout=0.5)
            except Exception:  # noqa: BLE001 (queue.Empty: nothing yet)
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                return str(msg["content"]["text"])
    raise AssertionError("the launcher never held a request for the paused sandbox")


@pytest.mark.security("fault", "sessions")
async def test_a_kernel_paused_and_resumed_by_the_api_keeps_working(deployment: Any) -> None:
    """Paused through the execution API, a request waits (busy, a stderr note) and is answered after resume."""
    options = sandbox_options(deployment, state_check_interval=0.3)
    async with AsyncSandbox("opensandbox", **options) as sb:
        assert (await sb.run("x = 41")).error is None
        sandbox_id = sb._km.provisioner.sandbox_id
        await sb.pause()
        async with deployment.client() as client:
            assert (await client.get(sandbox_id))["status"]["state"] == "Paused"
        note = await until_paused_note(sb._kc, time.monotonic() + 60)
        assert f"sandbox {sandbox_id} is paused" in note
        stderr: list[str] = []
        run = asyncio.ensure_future(sb.run("x + 1", on_stderr=stderr.append))
        await asyncio.sleep(1)
        assert not run.done(), "a paused sandbox cannot have answered"
        assert await sb._km.is_alive(), "a paused sandbox is not a dead kernel"
        await sb.resume()
        result = await run
        assert result.error is None and result.text == "42"
        assert any("is paused" in text for text in stderr), stderr
        assert (await sb.run("x * 2")).text == "82"


def test_a_pvc_volume_is_mounted_and_removed_with_the_sandbox(deployment: Any) -> None:
    if deployment.local is None:
        pytest.skip("checks the Docker named volume on the local engine: only the local harness has one")
    claim = f"ks-test-{secrets.token_hex(4)}"
    volume = {"name": "work", "pvc": {"claimName": claim, "deleteOnSandboxTermination": True}, "mountPath": "/mnt/work",
              "readOnly": True}
    engine = docker.from_env()
    with Sandbox("opensandbox", **sandbox_options(deployment, volumes=[volume])) as sb:
        mounts = sb.run("print(open('/proc/mounts').read())").stdout
        (line,) = [line for line in mounts.splitlines() if " /mnt/work " in line]
        assert " ro," in line or line.split()[3].startswith("ro"), line
        assert engine.volumes.get(claim).name == claim
    for _ in range(100):
        if not engine.volumes.list(filters={"name": claim}):
            break
        time.sleep(0.1)
    assert not [v.name for v in engine.volumes.list(filters={"name": claim}) if v.name == claim], "the volume leaked"


def test_signed_endpoints_asked_of_a_server_without_them_fall_back_to_plain(deployment: Any) -> None:
    if deployment.local is None:
        pytest.skip("the local harness runs the Docker runtime, which refuses signed routes")
    with Sandbox("opensandbox", **sandbox_options(deployment, signed_endpoints=600)) as sb:
        assert sb.run("6 * 7").text == "42"
    refused = [
        line for line in Path(deployment.local.log_path).read_text(errors="replace").splitlines()
        if "expires=" in line and " 400" in line
    ]
    assert refused, "the launcher did not ask for a signed endpoint first"
