"""Faults: the engine going away mid-session, and a failure at each step of a launch.

The engine is made unreachable to one launcher only, by pointing its DOCKER_HOST at a proxy
this test owns and then cutting the proxy: dockerd itself, shared with others, is never touched.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from pathlib import Path

import docker.errors
import pytest
from jupyter_client.connect import write_connection_file
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.docker.containers import LABEL_KERNEL_ID
from kernel_sandbox.kernelspecs import install, started_client
from kernel_sandbox.docker import link as docker_link
from kernel_sandbox.docker.channels import REOPEN_LIMIT
from kernel_sandbox.launch import serve
from kernel_sandbox.launch.request import request_from_kernelspec
from kernel_sandbox.launch.sockets import Connection

from support.engine_proxy import EngineProxy
from support.launcher_hooks import REOPEN_MAX_DELAY_ENV
from support.kernel import ArgvKernel

pytestmark = pytest.mark.usefixtures("docker_engine", "jupyter_prefix")


def test_an_engine_that_goes_away_ends_the_kernel_in_bounded_time(tmp_path: Path, docker_engine) -> None:
    proxy = EngineProxy()
    spec_dir = Path(install("sandboxed-python", prefix=str(tmp_path), install_as="faults"))
    kernel = ArgvKernel(spec_dir, tmp_path, env={**os.environ, "DOCKER_HOST": proxy.url}, kernel_id="faults")
    try:
        kernel.ready(timeout=90)
        assert kernel.client.execute_interactive("x = 1", timeout=60)["content"]["status"] == "ok"
        assert docker_engine.containers.list(filters={"label": f"{LABEL_KERNEL_ID}=faults"})
        started = time.monotonic()
        proxy.set("cut")
        assert kernel.process.wait(60) == 1, "the launcher did not notice that the engine was gone"
        took = time.monotonic() - started
        assert "the Docker engine became unreachable" in kernel.process.stderr.read().decode()
        assert took < 60
        deadline = time.monotonic() + 30
        while docker_engine.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_KERNEL_ID}=faults"}):
            assert time.monotonic() < deadline, "the kernel's container outlived its cut streams"
            time.sleep(0.2)
    finally:
        if kernel.process.poll() is None:
            kernel.process.kill()
        kernel.stop()
        proxy.close()


KILL_STREAMS = r"""
import os, signal, threading, time
def kill_connectors():
    end = time.time() + 300
    while time.time() < end:
        for pid in os.listdir('/proc'):
            try:
                if pid.isdigit() and open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')[1:3] == [b'-I', b'-S']:
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, IndexError):
                pass
        time.sleep(0.05)
threading.Thread(target=kill_connectors, daemon=True).start()
"""


async def test_a_kernel_that_keeps_killing_its_streams_is_ended_not_reopened_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each loss of a kernel stream is reopened later than the one before; after a limit the kernel ends.
    The waits between reopens stop growing at 1 s here, not at REOPEN_MAX_DELAY (5 s: 31 s of waiting)."""
    monkeypatch.setenv(REOPEN_MAX_DELAY_ENV, "1")
    km = AsyncKernelManager(kernel_name="sandboxed-python")
    async with started_client(km, timeout=90) as kc:
        kc.execute(KILL_STREAMS)
        deadline = time.monotonic() + 240
        while await km.is_alive():
            assert time.monotonic() < deadline, "the launcher kept reopening the streams the kernel kills"
            await asyncio.sleep(1)
        reason = km.provisioner.exit_reason or ""
        assert f"ended {REOPEN_LIMIT} times in a row" in reason, reason


async def test_the_next_kernel_after_the_engine_is_back_works() -> None:
    async with started_client("sandboxed-python", timeout=60) as kc:
        assert (await kc.execute_interactive("1", timeout=60))["content"]["status"] == "ok"


def _request(tmp_path: Path, **config: object):
    (tmp_path / "kernel.json").write_text(json.dumps({
        "argv": [], "display_name": "x", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "kernel-sandbox-docker", "config": config}},
    }))
    _, info = write_connection_file(str(tmp_path / "kernel-injected.json"), key=secrets.token_hex(16).encode())
    return request_from_kernelspec(Connection.from_info(info), str(tmp_path / "kernel-injected.json"), str(tmp_path))


def _fail(exc: Exception):
    def raising(*args: object, **kwargs: object) -> None:
        raise exc

    return raising


@pytest.mark.parametrize(
    "step",
    ["create", "start", "open the channels", "heartbeat timeout", "kernel exits at once", "limits check"],
)
async def test_a_launch_failing_at_any_step_leaves_nothing(
    step: str, tmp_path: Path, docker_engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    config: dict[str, object] = {"launch_timeout": 15}
    api_error = docker.errors.APIError("injected: OCI runtime create failed")
    if step == "create":
        monkeypatch.setattr("docker.models.containers.ContainerCollection.create", _fail(api_error))
    elif step == "start":
        monkeypatch.setattr("docker.models.containers.Container.start", _fail(api_error))
    elif step == "open the channels":
        monkeypatch.setattr(docker_link.DockerLink, "_exec_socket", _fail(api_error))
    elif step == "heartbeat timeout":
        config.update(launch_timeout=3, kernel_cmd=["sleep", "60"])
    elif step == "kernel exits at once":
        config.update(kernel_cmd=["python", "-c", "raise SystemExit('kernel refuses to start')"])
    elif step == "limits check":
        monkeypatch.setattr("kernel_sandbox.docker.link.applied_limits", lambda *args: ["Memory is 0"])
    request = _request(tmp_path, **config)
    code = await serve(request)
    assert code == 1
    message = capsys.readouterr().err
    assert message.startswith("kernel-sandbox: "), message  # one message, the kernel's own output inside it
    assert not docker_engine.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_KERNEL_ID}=injected"})
    if step == "kernel exits at once":
        assert "kernel refuses to start" in message
    if step == "heartbeat timeout":
        assert "did not answer within 3 s" in message


async def test_the_provisioner_reports_a_dead_launcher(docker_engine) -> None:
    km = AsyncKernelManager(kernel_name="sandboxed-python")
    km.autorestart = False
    await km.start_kernel()
    container = km.provisioner.container_id
    try:
        os.kill(km.provisioner.pid, 9)
        deadline = time.monotonic() + 30
        while await km.provisioner.poll() is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert km.provisioner.exit_reason == "the launcher was killed by SIGKILL"
    finally:
        await km.shutdown_kernel(now=True)
    assert not docker_engine.containers.list(all=True, ignore_removed=True, filters={"id": container})
