"""Usage read by the host from a kernel's cgroup, and the limits a kernel hits named on every path.

Real engine, real kernels. The figures are checked against the cgroup's own files, read here
by their path under /sys/fs/cgroup; what code in the kernel says about itself never counts.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import docker
import pytest
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from kernel_sandbox.execution import AsyncSandbox
from kernel_sandbox.metrics import CgroupProbe, Usage, near_misses, process_cgroups

from support.kernel import memory_in_use

pytestmark = pytest.mark.usefixtures("docker_engine", "jupyter_prefix")

THREAD_BOMB = """
import threading, time
threads = []
for _ in range(200):  # bounded: far more than pids_limit
    thread = threading.Thread(target=time.sleep, args=(2,), daemon=True)
    thread.start()
    threads.append(thread)
"""
FILL_TMP = """
with open('/tmp/fill', 'wb') as f:
    for _ in range(64):
        f.write(b'x' * 2**20)
        f.flush()
"""


async def test_metrics_follow_the_cgroup_to_90_percent_of_the_limit() -> None:
    async with AsyncSandbox(memory="256m", cpus=1, pids_limit=48, tmp_size="16m") as sandbox:
        container_id = sandbox._km.provisioner.container_id
        before = await sandbox.metrics()
        assert before.memory_limit == 256 * 2**20 and before.cpu_limit == 1.0 and before.pids_limit == 48
        assert 0 < before.pids <= 48 and before.source.startswith("cgroup v")
        tmp = {t.mount: t for t in before.tmpfs}["/tmp"]
        assert (tmp.size, tmp.option) == (16 * 2**20, "tmp_size")
        grow = int(0.9 * before.memory_limit) - before.memory
        execution = await sandbox.run(f"hog = b'x' * {grow}\nopen('/tmp/f', 'wb').write(b'y' * 2**22)")
        assert execution.error is None
        usage = await sandbox.metrics()
        counted = memory_in_use(container_id)
        assert usage.memory_percent >= 85
        assert abs(usage.memory - counted) <= 0.02 * usage.memory_limit
        assert {t.mount: t for t in usage.tmpfs}["/tmp"].used >= 2**22
        assert "memory=" in repr(usage) and "/256.0MiB" in repr(usage)
        listing = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "kernel_sandbox.cli", "ps"], capture_output=True, text=True,
            check=True, timeout=120)
        [line] = [line for line in listing.stdout.splitlines() if sandbox._km.provisioner.kernel_id in line]
        name, status, kernel, memory, cpu, pids, tmpfs, oom = line.split("\t")
        assert status == "running" and memory.endswith("/256.0MiB (%s%%)" % memory.rsplit("(", 1)[1][:-2])
        assert cpu.endswith("/100%") and pids.endswith("/48") and "tmp:" in tmpfs and oom == "0"


async def test_limits_are_named_in_execution_and_tool_errors() -> None:
    async with AsyncSandbox(memory="256m", pids_limit=32, tmp_size="8m", work_size="8m") as sandbox:
        bomb = await sandbox.run(THREAD_BOMB)
        assert bomb.error is not None and "pids_limit=32" in bomb.error.value
        assert "process limit reached" in bomb.error.value
        assert "[kernel-sandbox] process limit reached" in bomb.stderr  # the launcher's note, in the cell
        fill = await sandbox.run(FILL_TMP)
        assert fill.error is not None and fill.error.name == "OSError"
        assert "the tmpfs /tmp is full (8.0MiB; raise tmp_size)" in fill.error.value

        def fill_work() -> None:
            with open("big", "wb") as file:
                for _ in range(64):
                    file.write(b"x" * 2**20)
                    file.flush()

        result = await sandbox.run_tool(fill_work)
        assert result.status == "error" and "raise work_size" in result.error.value
        plain = await sandbox.run("1/0")
        assert "kernel-sandbox" not in plain.error.value  # nothing new was hit


async def test_launcher_answers_usage_requests_and_drops_forged_replies() -> None:
    """The kernel replaces its own usage handler and floods control with forged replies: the host's word stands."""
    manager = AsyncKernelManager(kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"memory": "256m"}}))
    await manager.start_kernel()
    kc = manager.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        kc.control_channel.send(kc.session.msg("kernel_info_request"))  # the kernel learns our control identity
        await kc.control_channel.get_msg(timeout=30)
        forge = """
k = get_ipython().kernel
def forged(stream, ident, parent):
    k.session.send(stream, "usage_reply", {"hostname": "forged", "kernel_memory": 1}, parent, ident)
k.control_handlers["usage_request"] = forged
def flood():
    for _ in range(500):
        k.session.send(k.control_stream, "usage_reply", {"hostname": "forged", "kernel_memory": 1},
                       k._control_parent, k._control_parent_ident)
k.control_stream.io_loop.add_callback(flood)
hog = b'x' * (64 * 2**20)
"""
        reply = await kc.execute_interactive(forge, timeout=60)
        assert reply["content"]["status"] == "ok"
        container_id = manager.provisioner.container_id
        request = kc.session.msg("usage_request", {})
        kc.control_channel.send(request)
        answer = await kc.control_channel.get_msg(timeout=30)
        counted = memory_in_use(container_id)
        assert answer["msg_type"] == "usage_reply" and answer["parent_header"]["msg_id"] == request["header"]["msg_id"]
        content = answer["content"]
        assert content["hostname"] == "sandbox" and content["kernel_sandbox"]["source"].startswith("cgroup")
        assert abs(content["kernel_memory"] - counted) <= 8 * 2**20 and content["kernel_memory"] > 64 * 2**20
        assert content["host_virtual_memory"]["total"] == 256 * 2**20
        assert content["cpu_count"] > 0
        assert not await kc.control_channel.msg_ready()  # none of the 500 forged replies came through
    finally:
        kc.stop_channels()
        await manager.shutdown_kernel(now=True)


async def test_cell_errors_carry_the_hosts_note_of_the_limit() -> None:
    config = Config({"DockerProvisioner": {"memory": "256m", "pids_limit": 24, "tmp_size": "8m"}})
    manager = AsyncKernelManager(kernel_name="sandboxed-python", config=config)
    await manager.start_kernel()
    kc = manager.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        notes: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
                notes.append(msg["content"]["text"])

        reply = await kc.execute_interactive(THREAD_BOMB, timeout=60, output_hook=hook)
        assert reply["content"]["status"] == "error"
        assert any("[kernel-sandbox] process limit reached" in n and "pids_limit=24" in n for n in notes)
        notes.clear()
        reply = await kc.execute_interactive(FILL_TMP, timeout=60, output_hook=hook)
        assert reply["content"]["status"] == "error"
        assert any("the tmpfs /tmp is full" in n and "tmp_size" in n for n in notes)
    finally:
        kc.stop_channels()
        await manager.shutdown_kernel(now=True)


def test_mountinfo_and_proc_cgroup_shapes() -> None:
    """Both cgroup layouts are read: v1 (one line per hierarchy) and v2 (the single 0:: line)."""
    v1, v2 = process_cgroups("12:pids:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\nbroken\n")
    assert v1["cpu"] == v1["cpuacct"] == v1["pids"] == "/docker/abc" and v2 == "/docker/abc"
    assert process_cgroups("0::/system.slice/docker-abc.scope\n") == ({}, "/system.slice/docker-abc.scope")


def test_probe_refuses_a_pid_that_is_not_the_containers(tmp_path: Path) -> None:
    """A reused init pid whose cgroup does not name the container is never read for it."""
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "7" / "cgroup").write_text("4:memory:/docker/someone-else\n0::/docker/someone-else\n")
    (proc / "self" / "mountinfo").write_text("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    from kernel_sandbox.errors import MetricsUnavailable

    with pytest.raises(MetricsUnavailable, match="not found"):
        CgroupProbe.for_container({"Id": "abc123", "State": {"Running": True, "Pid": 7}}, proc=proc)


def test_near_misses_name_the_option() -> None:
    from kernel_sandbox.metrics import TmpfsUsage

    before = Usage(pids_limit=16)
    after = Usage(pids_limit=16, pids_refused=3, oom_kills=1, memory_limit=2**27,
                  tmpfs=(TmpfsUsage("/home/sandbox/work", 2**20, 2**20, "work_size"),))
    notes = near_misses(before, after)
    assert notes[0].startswith("process limit reached: 3 fork(s)") and "pids_limit=16" in notes[0]
    assert "the tmpfs /home/sandbox/work is full (1.0MiB; raise work_size)" in notes[1]
    assert "out of memory" in notes[2] and "128.0MiB" in notes[2]
    assert near_misses(after, after) == []  # nothing new: an unrelated error is not blamed on the full tmpfs
    assert near_misses(after, after, "OSError: [Errno 28] No space left on device") == [notes[1]]


async def test_metrics_of_a_stopped_sandbox_say_why() -> None:
    from kernel_sandbox.errors import MetricsUnavailable

    sandbox = AsyncSandbox()
    with pytest.raises(MetricsUnavailable, match="not started"):
        await sandbox.metrics()


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def _screen_until(session: str, wanted: Callable[[str], bool], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if wanted(screen) or time.monotonic() > deadline:
            return screen
        time.sleep(0.2)


def _memory_shown(screen: str, name: str) -> float:
    """The MiB in use that top shows on the container's row (0 when it shows none)."""
    found = re.search(re.escape(name) + r".*? (\d+)M/256M ", screen)
    return float(found.group(1)) if found else 0.0


async def test_top_redraws_in_place_in_80_columns_and_plots(tmp_path: Path) -> None:
    session = f"ks-top-{os.getpid()}"
    plot = tmp_path / "run.png"
    command = (f"cd {tmp_path} && PYTHONPATH={os.environ.get('PYTHONPATH', '')} {sys.executable} -m kernel_sandbox.cli "
               f"top --interval 0.3 --plot {plot}; echo TOP-EXITED $?; sleep 60")
    async with AsyncSandbox(memory="256m", cpus=1) as sandbox:
        full = (await asyncio.to_thread(docker.from_env().containers.get, sandbox._km.provisioner.container_id)).name
        name = full.removeprefix("kernel-sandbox-")  # the prefix every row would repeat is left out
        _tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "30", command)
        try:
            first = await asyncio.to_thread(_screen_until, session, lambda s: name in s and "M/256M " in s)
            assert "kernel-sandbox top" in first and full not in first
            assert first.splitlines()[2].split() == ["NAME", "STATUS", "KERNEL", "MEMORY", "CPU", "PIDS", "TMPFS", "OOM"]
            [row] = [line for line in first.splitlines() if line.startswith(name)]
            assert len(row) < 80 and re.search(r" \d+%/100% +\d+/\d+ +h\d+ p\d+ w\d+ t\d+ +0$", row), row  # no column cut off
            await sandbox.run("hog = b'x' * (96 * 2**20)")
            later = await asyncio.to_thread(
                _screen_until, session, lambda s: _memory_shown(s, name) >= 120 and s.split("\n")[0] != first.split("\n")[0])
            assert _memory_shown(later, name) >= 120  # the hog's 96 MiB came into the table
            assert later.splitlines()[0] != first.splitlines()[0]  # the clock in the header moved: redrawn
            assert len([line for line in later.splitlines() if name in line]) == 1  # in place, not appended
            _tmux("send-keys", "-t", session, "q")
            done = await asyncio.to_thread(_screen_until, session, lambda s: "TOP-EXITED" in s)
            assert "TOP-EXITED 0" in done and f"Wrote {plot}" in done.replace("\n", "")  # a long path wraps at 80 columns
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    import matplotlib.image

    assert matplotlib.image.imread(plot).shape[:2] == (500, 800)


async def test_a_kernel_killed_through_the_engine_is_named(docker_engine) -> None:
    manager = AsyncKernelManager(kernel_name="sandboxed-python")
    manager.autorestart = False
    await manager.start_kernel()
    try:
        await asyncio.to_thread(docker_engine.api.kill, manager.provisioner.container_id, "SIGKILL")
        deadline = time.monotonic() + 60
        while await manager.provisioner.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert manager.provisioner.exit_reason.startswith("killed through the Docker engine (signal 9")
    finally:
        await manager.shutdown_kernel(now=True)


async def test_a_flood_of_error_messages_costs_one_reading_per_failed_request() -> None:
    """The kernel publishes thousands of `error` messages: the launcher reads the cgroup once, when the request goes idle."""
    config = Config({"DockerProvisioner": {"memory": "256m", "pids_limit": 24}})
    manager = AsyncKernelManager(kernel_name="sandboxed-python", config=config)
    await manager.start_kernel()
    kc = manager.client()
    kc.start_channels()
    flood = """
k = get_ipython().kernel
for _ in range(3000):
    k.session.send(k.iopub_socket, "error", {"ename": "E", "evalue": "v", "traceback": []}, parent=k.get_parent())
""" + THREAD_BOMB
    try:
        await kc.wait_for_ready(timeout=60)
        notes: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream" and "[kernel-sandbox]" in msg["content"]["text"]:
                notes.append(msg["content"]["text"])

        reply = await kc.execute_interactive(flood, timeout=120, output_hook=hook)
        assert reply["content"]["status"] == "error"
        assert len(notes) == 1 and "pids_limit=24" in notes[0]  # the bomb's error, explained once
    finally:
        kc.stop_channels()
        await manager.shutdown_kernel(now=True)


FORGE_PAIRS = """
k = get_ipython().kernel
forged = dict(k.get_parent()["header"], msg_id="forged")  # a request no client waits for
for _ in range({pairs}):
    k.session.send(k.iopub_socket, "error", {{"ename": "E", "evalue": "v", "traceback": []}}, parent={{"header": forged}})
    k.session.send(k.iopub_socket, "status", {{"execution_state": "idle"}}, parent={{"header": forged}})
"""


@pytest.mark.security("attack", "channel")
async def test_forged_errors_and_idles_read_the_cgroup_on_a_timer_not_per_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel publishes 2000 forged error + idle pairs: the launcher reads its cgroup at most once per interval."""
    import json
    import secrets

    from jupyter_client.asynchronous import AsyncKernelClient
    from jupyter_client.connect import write_connection_file

    from kernel_sandbox.launch.request import request_from_kernelspec
    from kernel_sandbox.launch import serve
    from kernel_sandbox.launch.front import LIMITS_INTERVAL
    from kernel_sandbox.launch.sockets import Connection

    reads: list[float] = []
    read = CgroupProbe.read

    def counted(probe: CgroupProbe) -> Usage:
        reads.append(time.monotonic())
        return read(probe)

    monkeypatch.setattr(CgroupProbe, "read", counted)  # the launcher runs in this process here
    (tmp_path / "kernel.json").write_text(json.dumps({
        "argv": [], "display_name": "x", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "kernel-sandbox-docker",
                                            "config": {"memory": "256m", "pids_limit": 24}}}}))
    connection_file, info = write_connection_file(str(tmp_path / "kernel-forged.json"), key=secrets.token_hex(16).encode())
    serving = asyncio.ensure_future(serve(request_from_kernelspec(Connection.from_info(info), connection_file, str(tmp_path))))
    kc = AsyncKernelClient(connection_file=connection_file)
    kc.load_connection_file()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        started = time.monotonic()
        reply = await kc.execute_interactive(FORGE_PAIRS.format(pairs=2000), timeout=300)
        took = time.monotonic() - started
        assert reply["content"]["status"] == "ok"
        assert len(reads) <= 2 + took / LIMITS_INTERVAL < 4000, f"{len(reads)} readings in {took:.1f} s for 2000 forged failures"
        await asyncio.sleep(2 * LIMITS_INTERVAL)  # a reading the forged failures left due is taken
        notes: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream" and "[kernel-sandbox]" in msg["content"]["text"]:
                notes.append(msg["content"]["text"])

        reply = await kc.execute_interactive(THREAD_BOMB, timeout=120, output_hook=hook)
        assert reply["content"]["status"] == "error"
        assert len(notes) == 1 and "pids_limit=24" in notes[0], notes  # the real failure, explained in its cell
        reply = await kc.execute_interactive("1/0", timeout=60, output_hook=hook)  # at once: it waits for the timer
        assert reply["content"]["status"] == "error" and len(notes) == 1, notes  # nothing new was hit
    finally:
        kc.shutdown()
        kc.stop_channels()
        assert await asyncio.wait_for(serving, 120) == 0
