"""The kernel-sandbox command: install, doctor, gc, and the errors users meet first."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_sandbox.docker.containers import (
    LABEL_KERNEL_ID,
    LABEL_LAUNCHER_PID,
    LABEL_OWNER_HOST,
    OURS,
    resolve_mounts,
)
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.docker.settings import DockerSettings
from kernel_sandbox.settings import WORK_DIR


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_install_writes_the_options_into_kernel_json(tmp_path: Path) -> None:
    result = cli(
        "install", "--prefix", str(tmp_path), "--name", "sbx-big", "--display-name", "Big sandbox",
        "--memory", "2g", "--cpus", "2", "--network", "--mount", f"{tmp_path}:data", "--env", "A=b",
    )
    assert result.returncode == 0, result.stderr
    spec_dir = tmp_path / "share" / "jupyter" / "kernels" / "sbx-big"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["display_name"] == "Big sandbox"
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "kernel-sandbox-docker",
        "config": {"suspend_after": 1800, "memory": "2g", "cpus": 2.0, "network": True, "mounts": [f"{tmp_path}:data"],
                   "env": {"A": "b"}},
    }
    assert (spec_dir / "logo-64x64.png").is_file()


def test_install_refuses_an_option_the_provisioner_lacks(tmp_path: Path) -> None:
    result = cli("install", "--prefix", str(tmp_path), "--kernel", "sandboxed-python-opensandbox", "--memory", "1g")
    assert result.returncode == 1
    assert "the OpenSandbox backend has no option 'memory'" in result.stderr
    assert "resource_limits" in result.stderr


def test_doctor_with_no_engine_prints_the_fix() -> None:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = cli("doctor", env=env)
    assert result.returncode == 1
    assert "[FAIL] docker engine: Cannot reach the Docker engine at unix:///nonexistent/docker.sock" in result.stdout
    assert "fix: start the engine: `sudo systemctl start docker`" in result.stdout


def mounts(*specs: str) -> list[tuple[str, str, str]]:
    return resolve_mounts(DockerSettings.from_config({"mounts": list(specs)}), None)


def test_mount_specs_are_checked(tmp_path: Path) -> None:
    assert mounts(f"{tmp_path}:data") == [(str(tmp_path), f"{WORK_DIR}/data", "ro")]
    assert mounts(f"{tmp_path}:/mnt/x:rw") == [(str(tmp_path), "/mnt/x", "rw")]
    with pytest.raises(ConfigError, match="does not exist"):
        mounts(f"{tmp_path}/missing:data")
    with pytest.raises(ConfigError, match="mode must be 'ro' or 'rw'"):
        mounts(f"{tmp_path}:data:rx")
    with pytest.raises(ConfigError, match="HOST_PATH:CONTAINER_PATH"):
        mounts("nocolon")


def test_gc_removes_only_what_a_dead_owner_left(docker_engine, tmp_path: Path) -> None:
    """gc removes containers whose launcher is dead on this host, never one whose launcher lives;
    likewise partial checkpoints: one no launcher holds goes, one a launcher writes (locked) stays."""
    state = tmp_path / "state"
    store = state / "kernel-sandbox" / "checkpoints"
    store.mkdir(parents=True, mode=0o700)
    (store / "dead.checkpoint.part").write_bytes(b"x" * 1000)
    live = store / "live.checkpoint.part"
    writer = os.open(live, os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(writer, fcntl.LOCK_EX)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()

    def make(command: list[str], **owner: str):
        labels = {"kernel-sandbox": "true", LABEL_KERNEL_ID: "gc-test", **owner}
        return docker_engine.containers.run(
            "kernel-sandbox-python:latest", command, labels=labels, network_mode="none", detach=True
        )

    unowned_stopped = make(["true"])
    dead_owner = make(["sleep", "300"], **{LABEL_OWNER_HOST: host, LABEL_LAUNCHER_PID: str(gone.pid)})
    live_owner_stopped = make(["true"], **{LABEL_OWNER_HOST: host, LABEL_LAUNCHER_PID: str(os.getpid())})
    unowned_live = make(["sleep", "300"])
    other_host = make(["true"], **{LABEL_OWNER_HOST: "another-host", LABEL_LAUNCHER_PID: str(gone.pid)})
    for container in (unowned_stopped, live_owner_stopped, other_host):
        container.wait(timeout=60)
    try:
        result = cli("gc", env={**os.environ, "XDG_STATE_HOME": str(state)})
        assert result.returncode == 0, result.stderr
        assert f"removed partial checkpoint {store / 'dead.checkpoint.part'}" in result.stdout
        assert sorted(path.name for path in store.iterdir()) == [".lock", "live.checkpoint.part"]
        names = {c.name for c in docker_engine.containers.list(all=True, filters={"label": OURS}, ignore_removed=True)}
        assert unowned_stopped.name not in names and dead_owner.name not in names
        assert {live_owner_stopped.name, unowned_live.name, other_host.name} <= names
        assert f"removed container {dead_owner.name}" in result.stdout
    finally:
        os.close(writer)
        for container in (live_owner_stopped, unowned_live, other_host):
            container.remove(force=True)


def test_doctor_checks_the_gvisor_registration() -> None:
    from kernel_sandbox.doctor import runsc_check

    assert runsc_check({}).ok
    assert runsc_check({"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}).ok
    missing = runsc_check({"runsc": {"path": "/usr/bin/runsc"}})
    assert not missing.ok and "--network=none" in missing.fix


@pytest.mark.parametrize(
    "odd", [[], {"metadata": []}, {"metadata": {"kernel_provisioner": "kernel-sandbox-docker"}}, "not json"]
)
def test_installed_lists_sandboxed_kernelspecs_and_passes_over_malformed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: object
) -> None:
    """``doctor`` reads every installed kernel.json: another kernel's odd one must not break it."""
    from kernel_sandbox.kernelspecs import install, installed

    install("sandboxed-python", prefix=str(tmp_path))
    odd_dir = tmp_path / "share" / "jupyter" / "kernels" / "odd"
    odd_dir.mkdir()
    (odd_dir / "kernel.json").write_text(odd if isinstance(odd, str) else json.dumps(odd))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    found = installed()
    assert "sandboxed-python" in found and "odd" not in found


BURN = """
import time
while time.process_time() < 3:  # three seconds of CPU, then idle
    pass
"""


def test_ps_has_a_header_and_shows_cpu_over_the_last_second_not_since_the_start(docker_engine) -> None:
    """A kernel that burned CPU and went idle: ps says it is idle now, as docker stats would; the
    first reading of its cgroup (what ps showed before) still averages the burn since its start."""
    from kernel_sandbox import Sandbox
    from kernel_sandbox.metrics import CgroupProbe

    with Sandbox(cpus=1) as sandbox:
        assert sandbox.run(BURN).error is None
        container_id, kernel_id = sandbox._async._km.provisioner.container_id, sandbox.kernel_id
        since_start = CgroupProbe.for_container(docker_engine.api.inspect_container(container_id)).read()
        listed = cli("ps")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split("\t") == ["NAME", "STATUS", "KERNEL", "MEMORY", "CPU", "PIDS", "TMPFS", "OOM", "NOTE"]
    [row] = [line.split("\t") for line in lines if f"kernel {kernel_id}" in line]
    recent = float(row[4].split("%")[0])
    assert since_start.cpu_seconds >= 3 and since_start.cpu_percent >= 10  # the average since the start
    assert recent <= 5, row  # idle over the last second
