"""The Sandboxed Python kernelspec through jupyter_client, on a real Docker engine."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import KernelProvisionerFactory
from traitlets.config import Config

from kernel_sandbox.docker.containers import LABEL, LABEL_KERNEL_ID, OURS
from kernel_sandbox.errors import ConfigError, ImageMissing, KernelLaunchError
from kernel_sandbox.kernelspecs import started_client
from kernel_sandbox.privdir import CONFIG, user_root
from kernel_sandbox.docker.containers import kernel_of

from support.kernel import RUNTIMES, runtime_option, until_ended

pytestmark = pytest.mark.usefixtures("docker_engine", "jupyter_prefix")


async def run(km: AsyncKernelManager, code: str, timeout: float = 60) -> dict:
    """Execute ``code`` and collect its iopub output and reply."""
    kc = km.client()
    kc.start_channels()
    out: dict = {"stream": "", "stderr": "", "results": [], "error": None, "inputs": []}

    def hook(msg: dict) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out["stream" if content["name"] == "stdout" else "stderr"] += content["text"]
        elif kind == "execute_result":
            out["results"].append(content)
        elif kind == "execute_input":
            out["inputs"].append(content["execution_count"])
        elif kind == "error":
            out["error"] = content

    try:
        await kc.wait_for_ready(timeout=60)
        reply = await kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    finally:
        kc.stop_channels()
    out["reply"] = reply["content"]
    return out


def containers_of(client, km: AsyncKernelManager) -> list:
    """The containers serving ``km``'s kernel (one that started as a standby carries the standby's id label)."""
    ours = client.containers.list(all=True, ignore_removed=True, filters={"label": OURS})
    return [container for container in ours if kernel_of(container.labels) == km.kernel_id]


def existing(client, container_ids: list[str]) -> list[str]:
    """Those of ``container_ids`` the engine still has (running or not)."""
    return [cid for cid in container_ids if client.containers.list(all=True, ignore_removed=True, filters={"id": cid})]


def assert_no_private_dir_of(km: AsyncKernelManager) -> None:
    for config in user_root().glob(f"*/{CONFIG}"):
        assert json.loads(config.read_text())["kernel_id"] != km.kernel_id, f"{config.parent} is left"


@pytest.fixture
async def km():
    manager = AsyncKernelManager(kernel_name="sandboxed-python")
    await manager.start_kernel()
    yield manager
    if manager.has_kernel:
        await manager.shutdown_kernel(now=True)


async def test_execute_stream_result_and_count(km: AsyncKernelManager) -> None:
    out = await run(km, "print('hello from the sandbox')\n6 * 7")
    assert out["stream"] == "hello from the sandbox\n"
    assert out["results"][0]["data"]["text/plain"] == "42"
    assert out["reply"]["status"] == "ok"
    count = out["reply"]["execution_count"]
    assert out["results"][0]["execution_count"] == count == out["inputs"][0]
    again = await run(km, "1")
    assert again["reply"]["execution_count"] == count + 1


async def test_interrupt_stops_a_busy_loop_and_kernel_lives(km: AsyncKernelManager) -> None:
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        msg_id = kc.execute("import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.01)")
        while True:
            msg = await kc.get_iopub_msg(timeout=30)
            if msg["msg_type"] == "stream":
                break
        await km.interrupt_kernel()
        reply = await kc.get_shell_msg(timeout=30)
        while reply["parent_header"]["msg_id"] != msg_id:  # a late reply to wait_for_ready's repeated kernel_info
            assert reply["msg_type"] == "kernel_info_reply", reply
            reply = await kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
    finally:
        kc.stop_channels()
    assert await km.is_alive()
    assert (await run(km, "'still here'"))["results"][0]["data"]["text/plain"] == "'still here'"


async def test_restart_gives_fresh_container_and_state(km: AsyncKernelManager, docker_engine) -> None:
    await run(km, "secret = 41")
    first = km.provisioner.container_id
    await km.restart_kernel()
    assert km.provisioner.container_id != first
    assert containers_of(docker_engine, km)[0].id == km.provisioner.container_id
    out = await run(km, "secret")
    assert out["error"]["ename"] == "NameError"


async def test_the_sandbox_is_locked_down(km: AsyncKernelManager) -> None:
    code = """
import os, subprocess
print(sorted(os.listdir('/sys/class/net')))
print(os.getuid(), os.getgid())
try:
    open('/etc/owned', 'w')
except OSError as exc:
    print('etc', type(exc).__name__)
open('/tmp/ok', 'w').write('x')
open('work.txt', 'w').write('y')
print(os.getcwd(), os.path.exists('/tmp/ok'), os.path.exists('work.txt'))
print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])
print(open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])
"""
    out = await run(km, code)
    lines = out["stream"].splitlines()
    assert lines[0] == "['lo']"
    uid, _gid = (int(x) for x in lines[1].split())
    assert uid != 0
    assert lines[2] in ("etc PermissionError", "etc OSError")
    assert lines[3] == "/home/sandbox/work True True"
    assert int(lines[4], 16) == 0
    assert lines[5] == "1"


async def test_host_environment_does_not_leak(docker_engine) -> None:
    os.environ["KS_HOST_SECRET"] = "do-not-leak"
    manager = AsyncKernelManager(
        kernel_name="sandboxed-python",
        config=Config({"DockerProvisioner": {"env": {"GREETING": "hi"}}}),
    )
    try:
        await manager.start_kernel()
        out = await run(manager, "import os; print(os.environ.get('KS_HOST_SECRET'), os.environ['GREETING'])")
        assert out["stream"] == "None hi\n"
    finally:
        del os.environ["KS_HOST_SECRET"]
        await manager.shutdown_kernel(now=True)


# Under gVisor each forked process costs about 30 MiB of the memory limit (docs/docker.md#gvisor): its
# bomb gets the memory its pids_limit needs; below that it ends out of memory (the next test).
FORK_LIMITS = {"runc": ("256m", 64), "runsc": ("1g", 32)}


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_fork_loop_is_stopped_by_pids_limit(runtime: str) -> None:
    """A fork bomb fails with EAGAIN at pids_limit and the kernel lives, under gVisor too (which once ended the sandbox)."""
    memory, pids_limit = FORK_LIMITS[runtime]
    config = {**runtime_option(runtime), "memory": memory, "pids_limit": pids_limit, "standby": 0}
    manager = AsyncKernelManager(kernel_name="sandboxed-python", config=Config({"DockerProvisioner": config}))
    await manager.start_kernel()
    try:
        out = await run(manager, FORK_BOMB)
        word, forked, errno = out["stream"].split()
        assert word == "refused" and int(errno) == 11
        assert 0 < int(forked) < pids_limit
        assert (await run(manager, "'alive'"))["results"][0]["data"]["text/plain"] == "'alive'"
    finally:
        await manager.shutdown_kernel(now=True)


async def test_memory_hog_is_reported_out_of_memory(caplog: pytest.LogCaptureFixture) -> None:
    manager = AsyncKernelManager(kernel_name="sandboxed-python-small")
    manager.autorestart = False
    async with started_client(manager, timeout=60) as kc:
        kc.execute("hog = 'x' * (1024 ** 3)")
        await until_ended(manager)
        assert manager.provisioner.exit_reason == "out of memory, limit 128 MiB; raise memory"
        assert "out of memory, limit 128 MiB" in caplog.text


@pytest.mark.security("fault", "container")
async def test_under_gvisor_a_fork_bomb_short_of_memory_ends_out_of_memory_and_is_named_so() -> None:
    """gVisor copies a forked process's memory (about 30 MiB each): at 256m a bomb under pids_limit=64 runs out of
    memory first, as docs/docker.md says; the kernel's end is named out of memory (it once was an unexplained crash)."""
    config = {"runtime": "runsc", "memory": "256m", "pids_limit": 64, "standby": 0}
    manager = AsyncKernelManager(kernel_name="sandboxed-python", config=Config({"DockerProvisioner": config}))
    manager.autorestart = False
    async with started_client(manager, timeout=60) as kc:
        kc.execute(FORK_BOMB)
        await until_ended(manager, timeout=120)
        assert manager.provisioner.exit_reason == "out of memory, limit 256 MiB; raise memory"


CHILD_OOM = "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'x = bytearray(2**30)']).returncode)"
FORK_BOMB = """
import os, signal, time
children = []
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    print('refused', len(children), exc.errno)
finally:
    for pid in children:  # the processes back, so that the kernel can start threads again
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
"""
ENDINGS = {
    "exit": ("import os; os._exit(0)", "the kernel shut down"),
    "sigkill": ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed with SIGKILL by the container runtime"),
    "exit code": ("import os; os._exit(3)", "exit code 3"),
    "its own oom": ("hog = bytearray(2**30)", "out of memory, limit 256 MiB; raise memory"),
}


@pytest.mark.security("fault", "sessions")
@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_an_ending_is_named_from_what_ended_the_kernel_not_an_earlier_oom_of_a_child(ending: str) -> None:
    """A child is killed for memory and a fork bomb refused (EAGAIN); the kernel's later end is named as what it was."""
    code, reason = ENDINGS[ending]
    manager = AsyncKernelManager(kernel_name="sandboxed-python", config=Config(
        {"DockerProvisioner": {"memory": "256m", "pids_limit": 64, "standby": 0}}))
    manager.autorestart = False
    async with started_client(manager, timeout=60) as kc:

        async def printed(cell: str) -> str:
            out: list[str] = []
            await kc.execute_interactive(cell, timeout=120, output_hook=lambda msg: out.append(
                msg["content"]["text"]) if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout" else None)
            return "".join(out)

        assert await printed(CHILD_OOM) == "-9\n"  # the child, SIGKILLed by the OOM killer
        word, _, errno = (await printed(FORK_BOMB)).split()
        assert (word, errno) == ("refused", "11")  # EAGAIN at pids_limit; the kernel lives
        kc.execute(code)
        await until_ended(manager)
        assert (manager.provisioner.exit_reason or "").startswith(reason), manager.provisioner.exit_reason


async def test_an_abort_on_the_way_out_of_a_shutdown_is_no_crash_and_one_before_is(caplog: pytest.LogCaptureFixture) -> None:
    """A kernel that aborts (SIGABRT, exit code 134) in its teardown after a shutdown_request ended as
    asked: nothing is logged as an error, also when it was interrupted earlier in its life (the
    engine reports a SIGINT as a kill; a busy server's shutdown sent one). An interrupt between
    cells does not hit the next cell. The same abort in a cell is the crash it is."""
    for interrupted in (False, True):
        manager = AsyncKernelManager(kernel_name="sandboxed-python")
        await manager.start_kernel()
        await run(manager, "import atexit, os\natexit.register(os.abort)")
        if interrupted:
            await manager.interrupt_kernel()
            assert (await run(manager, "'still here'"))["results"][0]["data"]["text/plain"] == "'still here'"
        await manager.shutdown_kernel()
        assert manager.provisioner.exit_reason == "the kernel shut down", interrupted
        assert "exit code 134" not in caplog.text, interrupted
    manager = AsyncKernelManager(kernel_name="sandboxed-python")
    manager.autorestart = False
    async with started_client(manager, timeout=60) as kc:
        kc.execute("import os; os.abort()")
        await until_ended(manager)
        assert manager.provisioner.exit_reason == "exit code 134"


async def test_a_busy_kernel_asked_to_shut_down_is_interrupted_not_killed(docker_engine) -> None:
    """jupyter_client interrupts a kernel before its shutdown_request: a cell that runs is
    interrupted (SIGINT through the engine) and the kernel exits on its own, as a local one does,
    although the idle of the shutdown_request (handled in ipykernel's control thread) came
    meanwhile; it is not left to the launcher's SIGKILL."""
    manager = AsyncKernelManager(kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"standby": 0}}))
    await manager.start_kernel()
    container_id, since = manager.provisioner.container_id, int(time.time()) - 1
    kc = manager.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        kc.execute("import time\nprint('running', flush=True)\ntime.sleep(600)")
        while True:  # the cell runs
            msg = await kc.get_iopub_msg(timeout=60)
            if msg["msg_type"] == "stream" and "running" in msg["content"]["text"]:
                break
        await manager.shutdown_kernel()
    finally:
        kc.stop_channels()
    assert manager.provisioner.exit_reason == "the kernel shut down"
    kills = docker_engine.events(filters={"container": container_id, "event": "kill"}, decode=True,
                                 since=since, until=int(time.time()) + 1)
    assert [event["Actor"]["Attributes"].get("signal") for event in kills] == ["2"]


async def test_shutdown_leaves_nothing(docker_engine) -> None:
    manager = AsyncKernelManager(kernel_name="sandboxed-python")
    await manager.start_kernel()
    private_dir = manager.provisioner.private.path
    [container] = containers_of(docker_engine, manager)
    assert private_dir.is_dir() and container.id == manager.provisioner.container_id
    await manager.shutdown_kernel()
    assert not existing(docker_engine, [container.id])
    assert not private_dir.exists()


@pytest.mark.timeout(600)
async def test_ten_concurrent_kernels_leave_nothing(docker_engine) -> None:
    # Ten cold starts at once share two cores here: the launch deadline is widened (what this test
    # checks is isolation and that nothing is left, not how fast ten kernels come up together).
    config = Config({"DockerProvisioner": {"launch_timeout": 240.0}})
    managers = [AsyncKernelManager(kernel_name="sandboxed-python", config=config) for _ in range(10)]
    await asyncio.gather(*(m.start_kernel() for m in managers))
    outs = await asyncio.gather(*(run(m, "import socket; socket.gethostname()") for m in managers))
    assert all(o["results"][0]["data"]["text/plain"] == "'sandbox'" for o in outs)
    assert len({m.provisioner.container_id for m in managers}) == 10
    dirs = [m.provisioner.private.path for m in managers]
    containers = [m.provisioner.container_id for m in managers]
    await asyncio.gather(*(m.shutdown_kernel() for m in managers))
    assert not existing(docker_engine, containers)
    assert not any(d.exists() for d in dirs)


async def test_network_option_gives_a_network_and_publishes_nothing(docker_engine) -> None:
    manager = AsyncKernelManager(
        kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"network": True}})
    )
    await manager.start_kernel()
    try:
        assert manager.transport == "ipc"
        container = containers_of(docker_engine, manager)[0]
        assert not any(container.ports.values())
        out = await run(manager, "import os; print(sorted(os.listdir('/sys/class/net')))")
        assert out["stream"].strip() != "['lo']"
    finally:
        await manager.shutdown_kernel(now=True)


async def test_mounts_are_read_only_unless_asked(tmp_path: Path) -> None:
    ro_dir, rw_dir = tmp_path / "data", tmp_path / "out"
    ro_dir.mkdir()
    rw_dir.mkdir()
    rw_dir.chmod(0o777)
    (ro_dir / "input.txt").write_text("from the host")
    mounts = [f"{ro_dir}:data", f"{rw_dir}:/home/sandbox/work/out:rw"]
    manager = AsyncKernelManager(
        kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"mounts": mounts}})
    )
    await manager.start_kernel()
    code = """
print(open('data/input.txt').read())
try:
    open('data/new.txt', 'w')
except OSError as exc:
    print(type(exc).__name__)
open('out/result.txt', 'w').write('from the sandbox')
"""
    try:
        out = await run(manager, code)
        assert out["stream"].splitlines() == ["from the host", "OSError"]
        assert (rw_dir / "result.txt").read_text() == "from the sandbox"
    finally:
        await manager.shutdown_kernel(now=True)


async def test_reattach_after_server_restart(docker_engine) -> None:
    first = AsyncKernelManager(kernel_name="sandboxed-python")
    await first.start_kernel()
    await run(first, "kept = 'state survives'")
    info = await first.provisioner.get_provisioner_info()
    container = first.provisioner.container_id

    second = AsyncKernelManager(kernel_name="sandboxed-python", kernel_id=first.kernel_id)
    second.provisioner = KernelProvisionerFactory.instance().create_provisioner_instance(
        first.kernel_id, second.kernel_spec, parent=second
    )
    await second.provisioner.load_provisioner_info(info)
    second.load_connection_info(info["connection_info"])
    out = await run(second, "kept")
    assert out["results"][0]["data"]["text/plain"] == "'state survives'"
    await second.shutdown_kernel()
    assert not existing(docker_engine, [container])
    await asyncio.wait_for(first.provisioner.wait(), 30)


async def test_missing_image_names_the_build_command() -> None:
    manager = AsyncKernelManager(
        kernel_name="sandboxed-python",
        config=Config({"DockerProvisioner": {"image": "kernel-sandbox-python:no-such-tag"}}),
    )
    with pytest.raises(ImageMissing, match="kernel-sandbox image build"):
        await manager.start_kernel()
    assert_no_private_dir_of(manager)


async def test_failed_launch_removes_container_and_private_dir(docker_engine) -> None:
    refuse = ["python", "-c", "raise SystemExit('kernel refuses to start')"]
    manager = AsyncKernelManager(
        kernel_name="sandboxed-python",
        config=Config({"DockerProvisioner": {"launch_timeout": 20, "kernel_cmd": refuse}}),
    )
    with pytest.raises(KernelLaunchError, match="kernel refuses to start"):
        await manager.start_kernel()
    assert not docker_engine.containers.list(
        all=True, ignore_removed=True, filters={"label": [LABEL, f"{LABEL_KERNEL_ID}={manager.kernel_id}"]}
    )
    assert_no_private_dir_of(manager)


OWNER_SCRIPT = """
import asyncio, sys
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

async def main():
    km = AsyncKernelManager(
        kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"orphan_timeout": 1}})
    )
    await km.start_kernel()
    print(km.provisioner.container_id, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_kernel_is_removed_when_its_owner_dies(docker_engine) -> None:
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OWNER_SCRIPT, stdout=asyncio.subprocess.PIPE
    )
    container_id = (await asyncio.wait_for(owner.stdout.readline(), 90)).decode().strip()
    assert docker_engine.containers.get(container_id).status == "running"
    owner.kill()
    await owner.wait()
    deadline = time.monotonic() + 60
    while docker_engine.containers.list(all=True, ignore_removed=True, filters={"id": container_id}):
        assert time.monotonic() < deadline, "the orphaned kernel's container was not removed within 60 s"
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("user", ["0:0", "1000:0", "root", "1000"])
async def test_root_or_malformed_user_is_refused(user: str) -> None:
    manager = AsyncKernelManager(
        kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"user": user}})
    )
    with pytest.raises(ConfigError, match="never runs as root|numeric UID:GID"):
        await manager.start_kernel()
    assert_no_private_dir_of(manager)


async def test_bad_mount_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    manager = AsyncKernelManager(
        kernel_name="sandboxed-python",
        config=Config({"DockerProvisioner": {"mounts": [f"{tmp_path}/missing:data"]}}),
    )
    with pytest.raises(ConfigError, match="does not exist"):
        await manager.start_kernel()
    assert_no_private_dir_of(manager)
