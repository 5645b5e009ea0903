"""Attacks on re-attach (issue 25, item 1): forged records, another account, another server's kernels.

The orphans are real: Docker kernels started by a process that then died, as a SIGKILLed server's.
A forged record is planted next to them in the user's private root. Each must be refused with a
log line that says why, and nothing may be started, signalled or removed on its say.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from kernel_sandbox.docker.containers import LABEL, LABEL_KERNEL_ID
from kernel_sandbox.errors import KernelLaunchError
from kernel_sandbox.kernelspecs import SandboxKernelSpecManager
from kernel_sandbox.privdir import CONFIG, LAUNCHER_LOCK, LAUNCHER_STATE, RECORD, PrivateDir, user_root
from kernel_sandbox.reattach import find, read_record
from kernel_sandbox.server import ReattachingKernelManager

from support.reattach import end_launcher, make_orphans

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


@pytest.fixture
def orphans(docker_engine, tmp_path):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    made = make_orphans(2, runtime)
    yield runtime, made
    for orphan in made:
        end_launcher(orphan.launcher_pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and docker_engine.containers.list(
        all=True, ignore_removed=True, filters={"id": [o.container_id for o in made]}
    ):
        time.sleep(0.5)


def _forged_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="forged-", dir=user_root()))


def _write(path: Path, data: object, mode: int = 0o600) -> None:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    path.chmod(mode)


def _running(engine, container_id: str) -> bool:
    return any(c.status == "running" for c in engine.containers.list(all=True, ignore_removed=True, filters={"id": container_id}))


async def _print_x(manager, kernel_id: str) -> list[str]:
    kc = manager.get_kernel(kernel_id).client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        out: list[str] = []
        await kc.execute_interactive(
            "print(x)", timeout=60, output_hook=lambda m: out.append(m["content"]["text"]) if m["msg_type"] == "stream" else None
        )
        return out
    finally:
        kc.stop_channels()


async def test_forged_records_are_refused_and_nothing_is_done_on_their_say(orphans, docker_engine, caplog) -> None:
    runtime, (good, victim) = orphans
    record = json.loads((good.private_dir / RECORD).read_text())
    config = json.loads((good.private_dir / CONFIG).read_text())
    bystander = subprocess.Popen(["sleep", "300"])
    forged = [_forged_dir() for _ in range(5)]
    symlinked, not_json, foreign, elsewhere, impostor = forged
    held = PrivateDir(impostor)
    try:
        (symlinked / RECORD).symlink_to(good.private_dir / RECORD)
        _write(not_json / RECORD, "{'kernel_id': ")
        _write(foreign / RECORD, record)
        os.chown(foreign / RECORD, 65534, 65534)
        _write(elsewhere / RECORD, record)  # a copy: it names the good kernel's directory, not its own
        _write(elsewhere / CONFIG, config)
        # a well-formed record of its own directory, whose "launcher" is a bystander process of ours
        fake_id = "f0f0f0f0-0000-4000-8000-000000000000"
        info = {**record["provisioner_info"], "private_dir": str(impostor), "pid": bystander.pid,
                "connection_info": {**record["provisioner_info"]["connection_info"], "ip": str(impostor / "k")}}
        _write(impostor / RECORD, {**record, "kernel_id": fake_id, "provisioner_info": info})
        _write(impostor / CONFIG, {**config, "kernel_id": fake_id})
        _write(impostor / LAUNCHER_STATE, {"pid": bystander.pid, "container_id": victim.container_id})
        assert held.hold(LAUNCHER_LOCK)  # as if a launcher held it
        # the victim's real directory, its launcher's state rewritten to name the good kernel's container
        state = json.loads((victim.private_dir / LAUNCHER_STATE).read_text())
        _write(victim.private_dir / LAUNCHER_STATE, {**state, "container_id": good.container_id})

        log = logging.getLogger("test.reattach")
        caplog.set_level(logging.WARNING, logger="test.reattach")
        other_server = ReattachingKernelManager(connection_dir=str(runtime.parent), kernel_spec_manager=SandboxKernelSpecManager(), log=log)
        assert other_server.list_kernel_ids() == [], "a server of another runtime directory took a kernel"
        manager = ReattachingKernelManager(connection_dir=str(runtime), kernel_spec_manager=SandboxKernelSpecManager(), log=log)
        assert manager.list_kernel_ids() == [good.kernel_id]

        said = "\n".join(r.getMessage() for r in caplog.records)
        for reason in (
            f"{symlinked / RECORD}: cannot open it",
            f"{not_json / RECORD} is not JSON",
            f"{foreign / RECORD} is not a regular file of uid {os.geteuid()}",
            f"{elsewhere / RECORD} names another private directory",
            f"{impostor}: pid {bystander.pid} is not this user's launcher of that directory",
            f"not re-attaching kernel {victim.kernel_id}: {victim.private_dir}: container {good.container_id[:12]} is not this kernel's",
        ):
            assert reason in said
        # nothing was started, signalled or removed on a forged record's say
        assert bystander.poll() is None
        assert _running(docker_engine, victim.container_id) and _running(docker_engine, good.container_id)
        os.kill(victim.launcher_pid, 0)
        assert not docker_engine.containers.list(all=True, filters={"label": [LABEL, f"{LABEL_KERNEL_ID}={fake_id}"]})
        assert all(path.exists() for path in forged) and victim.private_dir.exists()

        assert await _print_x(manager, good.kernel_id) == ["42\n"]
        await manager.shutdown_kernel(good.kernel_id)
        assert not _running(docker_engine, good.container_id)
    finally:
        held.release(LAUNCHER_LOCK)
        bystander.kill()
        bystander.wait()
        for path in forged:
            shutil.rmtree(path, ignore_errors=True)


def test_another_account_cannot_attach(orphans, other_user) -> None:
    """Another account, running kernel-sandbox's own code as a second user's server would, finds and reaches nothing."""
    _, (orphan, _) = orphans
    gid = int(subprocess.run(["id", "-g", other_user.name], capture_output=True, text=True, check=True).stdout)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the other account: this interpreter, its uid and gid
        results = {}
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(other_user.uid)
            os.environ["XDG_RUNTIME_DIR"] = str(orphan.private_dir.parent)  # the victim's root, claimed as its own
            for name, attempt in (
                ("find", lambda: find(orphan.kernel_id)),
                ("read_record", lambda: read_record(orphan.private_dir)),
                ("open", lambda: open(orphan.private_dir / RECORD).read()),
                ("connect", lambda: socket.socket(socket.AF_UNIX).connect(str(orphan.private_dir / "k-1"))),
            ):
                try:
                    attempt()
                    results[name] = "done"
                except (KernelLaunchError, OSError) as exc:
                    results[name] = f"{type(exc).__name__}: {exc}"
            results["root"] = str(user_root())
        finally:
            os.write(write_end, json.dumps(results).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        results = json.loads(pipe.read() or "{}")
    os.waitpid(child, 0)
    shutil.rmtree(results.get("root", "/nonexistent"), ignore_errors=True)
    assert results["find"].startswith(f"KernelLaunchError: no live sandboxed kernel {orphan.kernel_id} of uid {other_user.uid}")
    assert results["read_record"].startswith("KernelLaunchError") and "is not a private directory" in results["read_record"]
    assert results["open"].startswith("PermissionError") and results["connect"].startswith("PermissionError")
    assert results["root"] != str(user_root())
    # and the kernel still waits for its owner (the launcher looks at its owner lock once a second)
    deadline = time.monotonic() + 30
    while (record := read_record(orphan.private_dir)).orphaned is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert record.kernel_id == orphan.kernel_id and not record.attached and record.time_left() is not None


def test_a_dead_kernel_is_reported_by_its_own_server_only(tmp_path, caplog) -> None:
    """A record whose launcher is gone (killed, no exit status yet) is refused; the server of its runtime
    directory says so at its start, a server of another runtime directory (another notebook server of the
    same user) keeps quiet about it."""
    here, there = tmp_path / "here", tmp_path / "there"
    dead = subprocess.Popen(["true"])
    dead.wait()
    dirs = []
    try:
        for runtime in (here, there):
            runtime.mkdir(mode=0o700)
            private = _forged_dir()
            dirs.append(private)
            kernel_id = str(uuid.uuid4())
            info = {"private_dir": str(private), "pid": dead.pid,
                    "connection_info": {"key": "k", "signature_scheme": "hmac-sha256", "transport": "ipc", "ip": str(private / "k")}}
            _write(private / RECORD, {"kernel_id": kernel_id, "kernel_name": "sandboxed-python",
                                      "runtime_dir": str(runtime.resolve()), "provisioner_info": info})
            _write(private / CONFIG, {"kernel_id": kernel_id})
        caplog.set_level(logging.WARNING, logger="test.reattach.dead")
        manager = ReattachingKernelManager(connection_dir=str(here), kernel_spec_manager=SandboxKernelSpecManager(),
                                           log=logging.getLogger("test.reattach.dead"))
        assert manager.list_kernel_ids() == []
        said = "\n".join(r.getMessage() for r in caplog.records)
        assert f"{dirs[0]}: no live launcher with pid {dead.pid} holds it" in said, said
        assert str(dirs[1]) not in said, said
    finally:
        for path in dirs:
            shutil.rmtree(path, ignore_errors=True)
