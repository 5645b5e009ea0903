"""Podman as the Docker wing's engine (``engine: podman``): what differs from Docker, and the lifecycle.

The isolation suite's kernel fixture (tests/docker_kernel/test_isolation.py) runs on Podman too: every
security claim seen from inside the kernel, the tmpfs budgets and the planted links. Here: the spec
translated for Podman's API, limits a rootless Podman would ignore refused, a kernel's process with
capabilities refused by the read-back, removal on shutdown, on the launcher's death and by ``gc``, and
a missing socket failing closed with the option and the fix.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid

import docker.errors
import pytest
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from kernel_sandbox.docker.containers import LABEL, LABEL_KERNEL_ID, LABEL_LAUNCHER_PID, container_spec, for_podman
from kernel_sandbox.docker.checks import check_podman, podman_applied
from kernel_sandbox.docker.settings import DockerSettings
from kernel_sandbox.errors import ConfigError, KernelSandboxError

from support.kernel import PODMAN, run_cell, runtime_option

ORPHAN_LIMIT = 60.0
"""Seconds within which the watchdog of a SIGKILLed launcher removes its container (as on Docker)."""
ROOTLESS_V1 = {"cgroupVersion": "v1", "cgroupControllers": [], "security": {"rootless": True}}
"""What Podman's own /libpod/info says of a rootless Podman on cgroup v1 (this machine's): no controller."""


def _spec(**options: object) -> dict:
    settings = DockerSettings.from_config({"engine": PODMAN, **options})
    return container_spec(
        settings, kernel_id="k", kernel_key="x", user=(4242, 4242), env={}, mounts=[], labels={}
    )


def test_the_spec_for_podman_owns_tmpfs_by_podmans_option_and_keeps_every_other_rule() -> None:
    spec = _spec()
    podman = for_podman(spec)
    for path, options in podman["tmpfs"].items():
        assert "uid=" not in options and "gid=" not in options, path  # Podman's API refuses them
        assert "notmpcopyup" in options.split(","), path  # empty, as Docker's tmpfs is
        assert ("U" in options.split(",")) is ("uid=" in spec["tmpfs"][path]), path
        kept = [opt for opt in spec["tmpfs"][path].split(",") if not opt.startswith(("uid=", "gid="))]
        assert options.split(",")[: len(kept)] == kept, path  # size, mode, noexec/exec, nosuid, nodev
    limits = {ulimit.name: (ulimit.soft, ulimit.hard) for ulimit in podman["ulimits"]}
    assert limits["nproc"] == (256, 256)  # pids_limit: the pids cgroup holds the kernel to it anyway
    assert set(limits) == {"nofile", "nproc"}
    unchanged = {key: value for key, value in podman.items() if key not in ("tmpfs", "ulimits")}
    assert unchanged == {key: value for key, value in spec.items() if key != "tmpfs"}


@pytest.mark.security("fault", "options")
@pytest.mark.parametrize("option, controller", [("memory", "memory"), ("pids_limit", "pids"), ("cpus", "cpu")])
def test_a_limit_a_rootless_podman_would_ignore_is_refused_naming_the_option(option: str, controller: str) -> None:
    """Rootless Podman on cgroup v1 starts the container without its limits (it only logs that), while its
    Docker-compatible /info claims each one: the launch must stop before any container exists."""
    others = {name: "unlimited" for name in ("memory", "pids_limit", "cpus") if name != option}
    settings = DockerSettings.from_config({"engine": PODMAN, **others})
    with pytest.raises(ConfigError) as caught:
        check_podman(ROOTLESS_V1, settings)
    message = str(caught.value)
    assert message.startswith(f"{option}: this rootless Podman cannot enforce it")
    assert repr(controller) in message and f"{option}='unlimited'" in message and "Delegate=yes" in message
    check_podman(ROOTLESS_V1, DockerSettings.from_config({"engine": PODMAN, **others, option: "unlimited"}))
    delegated = {**ROOTLESS_V1, "cgroupVersion": "v2", "cgroupControllers": ["cpu", "memory", "pids"]}
    check_podman(delegated, DockerSettings.from_config({"engine": PODMAN}))


@pytest.mark.security("attack", "container")
def test_the_read_back_refuses_a_kernel_process_that_holds_capabilities() -> None:
    """Podman's inspect lists dropped capabilities one by one and its private IPC namespace as shareable, so
    the read-back looks at the kernel's process itself: this test's own process (capabilities as root, no
    no_new_privs, no seccomp, the host's IPC namespace) is what a container without the hardening would be."""
    spec = _spec()
    host_config = {
        "Memory": spec["mem_limit"], "MemorySwap": spec["memswap_limit"], "NanoCpus": spec["nano_cpus"],
        "ReadonlyRootfs": True, "NetworkMode": "none", "IpcMode": "shareable", "PidsLimit": 256,
        "CapDrop": ["CHOWN", "KILL"], "SecurityOpt": ["no-new-privileges"],
    }
    wrong = podman_applied({"HostConfig": host_config, "State": {"Pid": os.getpid()}}, spec)
    assert "the kernel's NoNewPrivs is '0', not '1'" in wrong
    assert "the kernel shares this process's IPC namespace" in wrong
    if os.geteuid() == 0:
        assert any(line.startswith("the kernel's CapBnd is") for line in wrong)
    gone = podman_applied({"HostConfig": host_config, "State": {"Pid": 0}}, spec)
    assert gone == ["the kernel's process 0 cannot be checked here ([Errno 2] No such file or directory: '/proc/0/status')"]


@pytest.mark.security("fault", "sessions")
@pytest.mark.usefixtures("jupyter_prefix")
async def test_a_missing_podman_socket_fails_the_launch_naming_the_option_and_the_fix(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTAINER_HOST", f"unix://{tmp_path}/no-podman.sock")
    km = AsyncKernelManager(
        kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {"engine": PODMAN, "standby": 0}})
    )
    with pytest.raises((KernelSandboxError, RuntimeError)) as caught:
        await km.start_kernel()
    message = str(caught.value)
    assert f"engine='podman': cannot reach Podman's API socket at unix://{tmp_path}/no-podman.sock" in message
    assert "podman system service" in message and "'engine' option to 'docker'" in message
    assert not km.has_kernel


def _manager() -> AsyncKernelManager:
    return AsyncKernelManager(
        kernel_name="sandboxed-python", config=Config({"DockerProvisioner": {**runtime_option(PODMAN), "standby": 0}})
    )


def _gone(engine, container_id: str) -> bool:
    try:
        engine.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


@pytest.mark.usefixtures("jupyter_prefix")
async def test_a_kernel_on_podman_runs_and_its_container_goes_at_shutdown(podman_engine) -> None:
    km = _manager()
    await km.start_kernel()
    try:
        out, reply = await run_cell(km, "import os; print(os.getuid() != 0, sorted(os.listdir('/sys/class/net')))")
        assert reply["status"] == "ok" and out == "True ['lo']\n"
        container = podman_engine.containers.get(km.provisioner.container_id)
        assert container.labels[LABEL] == "true" and container.labels[LABEL_KERNEL_ID] == km.kernel_id
    finally:
        await km.shutdown_kernel()
    assert _gone(podman_engine, container.id)


@pytest.mark.security("fault", "sessions")
@pytest.mark.usefixtures("jupyter_prefix")
async def test_a_sigkilled_launcher_leaves_no_container_on_podman(podman_engine) -> None:
    km = _manager()
    await km.start_kernel()
    container_id = km.provisioner.container_id
    try:
        os.kill(km.provisioner.pid, signal.SIGKILL)
        deadline = time.monotonic() + ORPHAN_LIMIT
        while not _gone(podman_engine, container_id) and time.monotonic() < deadline:
            time.sleep(1)
        assert _gone(podman_engine, container_id), "the watchdog did not remove the container on Podman"
    finally:
        await km.shutdown_kernel(now=True)


def test_gc_and_ps_find_a_dead_launchers_container_on_podman(podman_engine) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"kernel-sandbox-gc-{uuid.uuid4().hex[:8]}"
    container = podman_engine.containers.create(
        "kernel-sandbox-python:latest", ["sleep", "600"], name=name,
        labels={LABEL: "true", LABEL_KERNEL_ID: "gc-test", LABEL_LAUNCHER_PID: str(dead.pid)},
    )
    try:
        cli = [sys.executable, "-m", "kernel_sandbox.cli"]
        listed = subprocess.run([*cli, "ps"], capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0 and name in listed.stdout, listed.stderr
        removed = subprocess.run([*cli, "gc"], capture_output=True, text=True, timeout=120)
        assert removed.returncode == 0 and f"removed container {name}" in removed.stdout, removed.stderr
        assert _gone(podman_engine, container.id)
    finally:
        if not _gone(podman_engine, container.id):
            container.remove(force=True)


def test_doctor_checks_podman_socket_init_image_and_limits(podman_engine) -> None:
    result = subprocess.run([sys.executable, "-m", "kernel_sandbox.cli", "doctor"], capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.startswith("[") and "podman" in line]
    assert [line.split(":")[0] for line in lines] == [
        "[ok] podman init", *(["[ok] podman subuid"] if os.geteuid() else []), "[ok] podman socket", "[ok] podman image",
        "[ok] podman limits",
    ], result.stdout


@pytest.mark.security("fault", "sessions")
@pytest.mark.parametrize(
    "engine_fixture",
    [pytest.param("docker_engine", marks=pytest.mark.docker), pytest.param("podman_engine", marks=pytest.mark.podman)],
)
def test_a_base_image_that_cannot_run_python_fails_the_build_and_leaves_no_container(engine_fixture, request) -> None:
    """The build's probe of the base image: a container that fails to start is not removed by the engine's
    auto-remove (Podman as root refused the probe's rlimits this way and left three behind)."""
    from kernel_sandbox.docker.image import _probe_python
    from kernel_sandbox.errors import ImageBuildError

    engine = request.getfixturevalue(engine_fixture)
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("empty"), io.BytesIO(b""))
    tag = f"kernel-sandbox-no-python-{uuid.uuid4().hex[:8]}"
    engine.api.import_image_from_data(layer.getvalue(), repository=tag, tag="latest")
    try:
        with pytest.raises(ImageBuildError, match="cannot run python3"):
            _probe_python(engine, f"{tag}:latest")
        assert not engine.containers.list(all=True, filters={"ancestor": f"{tag}:latest"}, ignore_removed=True)
    finally:
        engine.images.remove(f"{tag}:latest", force=True)


SOCKETS = r"""
import os, stat
found = []
for top in ("/run", "/var/run", "/tmp", "/home", "/dev", "/mnt", "/srv", "/opt", "/root"):
    for base, dirs, files in os.walk(top, onerror=lambda e: None):
        for name in dirs + files:
            try:
                if stat.S_ISSOCK(os.lstat(os.path.join(base, name)).st_mode):
                    found.append(os.path.join(base, name))
            except OSError:
                pass
engine = [p for p in ("/run/podman", "/var/run/docker.sock", "/run/user", "/run/containers") if os.path.exists(p)]
print(found, engine, open("/proc/1/comm").read().strip())
"""


@pytest.mark.security("attack", "container")
@pytest.mark.usefixtures("jupyter_prefix")
async def test_the_kernel_finds_no_engine_socket_and_no_runtime_directory_of_the_host(podman_engine) -> None:
    """What matters more rootless: the engine's socket is the user's own, in the user's runtime directory.
    The kernel finds no Unix socket anywhere it can look, neither Podman's nor Docker's, nor a runtime
    directory, and its pid 1 is the container's init (the host's processes are out of sight)."""
    km = _manager()
    await km.start_kernel()
    try:
        out, reply = await run_cell(km, SOCKETS)
        assert reply["status"] == "ok", reply
        assert out == "[] [] podman-init\n"  # catatonit, as Podman mounts it
    finally:
        await km.shutdown_kernel(now=True)
