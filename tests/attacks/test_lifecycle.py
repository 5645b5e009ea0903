"""Kernels' lifecycle under faults: SIGKILL at awkward moments, an engine that goes away or hangs.

* The server (a process that starts a kernel through the provisioner) and its launcher are
  SIGKILLed at the moment the container exists but is not started yet, once it runs but before
  the kernel answers, and during a restart. Issue 12.1: the container is gone within 60 s, with
  no ``gc``.
* The launcher alone is SIGKILLed during a start: the start fails and nothing is left
  (tests/support/resource_counts.py's ResourceWatch).
* The engine becomes unreachable mid-session: ``DOCKER_HOST`` points at a Unix-socket proxy to
  the real engine that the test controls (the shared dockerd is never touched). ``cut`` closes
  every connection and refuses new ones; ``stalled`` keeps them open and forwards nothing, as a
  hung engine does. Issue 12.3: calls fail within a bounded time, ``poll()`` says the kernel is
  dead, and a kernel started once the engine is back works.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from traitlets.config import Config
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.docker.containers import LABEL, LABEL_KERNEL_ID, LABEL_OWNER_PID, remove_container
from kernel_sandbox.kernelspecs import started_client
from kernel_sandbox.privdir import user_root
from kernel_sandbox.provisioners.standby import POOL

from support.attacks import request
from support.engine_proxy import EngineProxy
from support.resource_counts import Bounds, ResourceWatch, private_host_dirs

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

ORPHAN_LIMIT = 60.0

OWNER = r'''
import asyncio, json, sys
from jupyter_client.manager import AsyncKernelManager
async def main():
    km = AsyncKernelManager(kernel_name="sandboxed-python")
    if sys.argv[1] == "restarting":
        await km.start_kernel()
        print(json.dumps({"started": km.provisioner.container_id}), flush=True)
        await km.restart_kernel(now=True)
    else:
        await km.start_kernel()
    print(json.dumps({"ready": km.provisioner.container_id}), flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
'''


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.security("fault", "sessions")
@pytest.mark.parametrize("moment", ["created", "started", "restarting"])
def test_server_and_launcher_killed_at_an_awkward_moment_leave_no_container(docker_engine, jupyter_prefix, moment,
                                                                            record_property) -> None:
    """SIGKILL the server and its launcher when the container is created, started, or being replaced: it must go."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, moment], stdout=subprocess.PIPE, text=True)
    mine = {"label": [LABEL, f"{LABEL_OWNER_PID}={owner.pid}"]}
    events = docker_engine.events(filters={"type": "container", "label": mine["label"]}, decode=True,
                                  since=int(time.time()) - 1)
    seen: dict[str, str] = {}
    try:
        if moment == "restarting":
            assert owner.stdout is not None
            first = json.loads(owner.stdout.readline())["started"]
            seen["first"] = first
        wanted = "create" if moment == "created" else "start"
        deadline = time.monotonic() + 120
        for event in events:  # the new container's event (after a restart: the second one's)
            if event.get("Action") == wanted and event.get("id") != seen.get("first"):
                launchers = [pid for pid in _children(owner.pid) if b"kernel_sandbox.launch" in Path(f"/proc/{pid}/cmdline").read_bytes()]
                for pid in launchers:
                    os.kill(pid, signal.SIGSTOP)  # freeze it at this step, then kill everything
                _kill(owner.pid)
                for pid in launchers:
                    _kill(pid)
                seen["container"] = event["id"]
                break
            if time.monotonic() > deadline:
                pytest.fail(f"no {wanted} event of the owner's container within 120 s")
        owner.wait(30)
        container = docker_engine.containers.get(seen["container"]) if _exists(docker_engine, seen["container"]) else None
        record_property("state_at_kill", container.status if container else "gone")
        start = time.monotonic()
        while _exists(docker_engine, seen["container"]) and time.monotonic() - start < ORPHAN_LIMIT:
            time.sleep(1)
        record_property("seconds_to_removal", round(time.monotonic() - start, 1))
        assert not _exists(docker_engine, seen["container"]), (
            f"the kernel's container (state {container.status if container else '?'} when its server and launcher were "
            f"SIGKILLed {moment}) is still there {ORPHAN_LIMIT:g} s later: before the connectors are open the kernel has "
            "no lifeline, and a created container never runs into auto-remove"
        )
    finally:
        events.close()
        _kill(owner.pid)
        owner.wait(30)
        for container in docker_engine.containers.list(all=True, ignore_removed=True, filters=mine):
            private = container.labels.get("kernel-sandbox.private-dir")
            remove_container(container)
            if private:
                shutil.rmtree(private, ignore_errors=True)


def _exists(engine: docker.DockerClient, container_id: str) -> bool:
    try:
        engine.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


@pytest.mark.security("fault", "sessions")
@pytest.mark.parametrize("moment", ["created", "started"])
async def test_a_launcher_killed_during_start_fails_the_start_and_leaves_nothing(docker_engine, jupyter_prefix, moment) -> None:
    """Only the launcher dies (the server lives on) while the container is created or starting: nothing stays."""
    with private_host_dirs() as dirs, ResourceWatch(docker_engine, private=dirs) as watch:
        user_root()  # the per-user root of private directories stays by design: made before counting
        before = watch.snapshot()
        # No standby: a start that adopted one would create no container, and the killer would hit the refill.
        kernel_id = uuid.uuid4().hex
        km = AsyncKernelManager(kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"standby": 0}}),
                                kernel_id=kernel_id)
        # this kernel's container only: a standby refill of an earlier test (same owner pid) also starts one
        events = docker_engine.events(filters={"type": "container", "label": [LABEL, f"{LABEL_KERNEL_ID}={kernel_id}"]},
                                      decode=True, since=int(time.time()) - 1)
        wanted = "create" if moment == "created" else "start"

        def kill_on_event() -> None:
            for event in events:
                if event.get("Action") == wanted:
                    for pid in _children(os.getpid()):
                        if b"kernel_sandbox.launch" in Path(f"/proc/{pid}/cmdline").read_bytes():
                            _kill(pid)
                    return

        killer = threading.Thread(target=kill_on_event, daemon=True)
        killer.start()
        try:
            with pytest.raises(Exception) as failure:
                await km.start_kernel()
        finally:
            events.close()
            if km.has_kernel:
                await km.shutdown_kernel(now=True)
        assert "killed" in str(failure.value) or "SIGKILL" in str(failure.value), failure.value
        try:
            await watch.settle_async(before, Bounds(fds=4, threads=4, rss=64 << 20), timeout=60)
        finally:
            for container in docker_engine.containers.list(
                    all=True, ignore_removed=True, filters={"label": [LABEL, f"{LABEL_OWNER_PID}={os.getpid()}"]}):
                remove_container(container)  # ours, left by the failed start (the test fails on it above)


@pytest.fixture
def engine_proxy(monkeypatch) -> Iterator[EngineProxy]:
    proxy = EngineProxy()
    monkeypatch.setenv("DOCKER_HOST", proxy.url)
    try:
        yield proxy
    finally:
        proxy.set("pass")
        POOL.clear(wait=60)  # the standbys started through the proxy go while it still forwards
        proxy.close()


DEAD_WITHIN = 60.0
"""How long a session may take to notice that its engine is gone (issue 12.3: bounded, not forever)."""


@pytest.mark.security("fault", "sessions")
@pytest.mark.parametrize("fault", ["cut", "stalled"])
async def test_an_engine_that_goes_away_mid_session_is_noticed(docker_engine, jupyter_prefix, engine_proxy, fault,
                                                               record_property) -> None:
    """The engine is cut off (connections closed) or hangs (connections open, nothing moves) under a running kernel."""
    km = AsyncKernelManager(kernel_name="sandboxed-python")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    container_id = km.provisioner.container_id
    try:
        await kc.wait_for_ready(timeout=90)
        assert (await request(km, kc, "1 + 1", timeout=60)).status == "ok"
        engine_proxy.set(fault)
        start = time.monotonic()
        outcome = await request(km, kc, "print('after the engine went away')", timeout=DEAD_WITHIN)
        while await km.is_alive() and time.monotonic() - start < DEAD_WITHIN:
            await asyncio.sleep(1)
        noticed = not await km.is_alive()
        record_property("execute_outcome", outcome.status)
        record_property("seconds_until_dead", round(time.monotonic() - start, 1) if noticed else None)
        assert outcome.status in ("died", "error") or noticed, (
            f"with the engine {fault}, an execute ended as {outcome.status!r} after {outcome.seconds:.0f} s and poll() "
            f"still says the kernel is alive {DEAD_WITHIN:g} s later: nothing in the launcher notices a hung engine"
        )
        assert noticed, f"poll() still reports the kernel alive {DEAD_WITHIN:g} s after the engine was {fault}"
        reason = getattr(km.provisioner, "exit_reason", None) or ""
        record_property("exit_reason", reason)
        assert "engine" in reason.lower(), f"the reason does not say the engine went away: {reason!r}"
    finally:
        engine_proxy.set("pass")
        kc.stop_channels()
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
        if container_id and _exists(docker_engine, container_id):
            remove_container(docker_engine.containers.get(container_id))
    again = AsyncKernelManager(kernel_name="sandboxed-python")
    async with started_client(again, timeout=90) as kc:
        assert (await request(again, kc, "1", timeout=60)).status == "ok", "no kernel once the engine was back"
