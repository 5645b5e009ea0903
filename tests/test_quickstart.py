"""./quickstart, the first command from a checkout: its help, and its stops without an engine.

The stops run the real script as a real other account (``nobody``, when the tests run as root)
with this test environment active (so nothing is installed) and ``DOCKER_HOST`` naming a socket
that is absent or refuses that account: no engine answers, and the script must say why and
print the command that fixes it, without starting JupyterLab.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
QUICKSTART = CHECKOUT / "quickstart"
NOBODY = 65534


def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=120, env=env, cwd="/",
        stdin=subprocess.DEVNULL,
    )


def as_other_user(command: list[str]) -> list[str]:
    """``command`` as an account other than root: ``nobody`` when the tests run as root, else ours.

    ``nobody`` keeps one capability, to read what root's directories hold: the test environment's
    Python may live under /root (pyenv's). Writing, and so connecting to a socket, stays refused.
    """
    if os.geteuid() != 0:
        return command
    read = "+dac_read_search"
    user = [f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return ["setpriv", *user, f"--inh-caps={read}", f"--ambient-caps={read}", *command]


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory the other account can enter (pytest's tmp_path is root's alone)."""
    with tempfile.TemporaryDirectory(prefix="ks-quickstart-", dir="/tmp") as path:
        os.chmod(path, 0o755)
        yield Path(path)


def stop_as_user(docker_host: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "USER": "kstester",
        "VIRTUAL_ENV": sys.prefix,
        "DOCKER_HOST": docker_host,
    }
    return run(as_other_user([str(QUICKSTART), "--no-browser"]), env)


def test_help_says_what_it_does_and_stops() -> None:
    result = run([str(QUICKSTART), "--help"])
    assert result.returncode == 0, result.stderr
    assert "./quickstart [JUPYTERLAB ARGUMENTS ...]" in result.stdout
    assert "--allow-root" in result.stdout and ".ci/run" in result.stdout
    assert "=== " not in result.stdout  # --help sets nothing up


def test_no_engine_stops_with_the_command_that_starts_or_installs_it(world_dir: Path) -> None:
    absent = world_dir / "docker.sock"
    result = stop_as_user(f"unix://{absent}", world_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "installed in " + sys.prefix in result.stdout  # the package step found it done
    installed = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin")
    if installed:
        why = "dockerd is installed but not running, and starting it needs root"
        systemd = Path("/run/systemd/system").is_dir()
        fix = "sudo systemctl start docker" if systemd else "sudo sh -c 'dockerd"
    else:
        why = "Docker is not installed, and installing it needs root"
        fix = "sudo apt-get install -y docker.io && sudo usermod -aG docker kstester"
    assert f"quickstart: no Docker engine answers at {absent}: {why}\n  fix: {fix}" in result.stderr
    assert result.stderr.rstrip().endswith("then ./quickstart again")
    assert "[ok]" not in result.stdout  # it stopped before setup and JupyterLab


def test_a_socket_that_refuses_the_user_names_the_docker_group(world_dir: Path) -> None:
    path = world_dir / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        os.chmod(path, 0o600 if os.geteuid() == 0 else 0)
        result = stop_as_user(f"unix://{path}", world_dir)
    finally:
        server.close()
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"quickstart: the Docker engine's socket {path} does not let kstester in\n"
        "  fix: sudo usermod -aG docker kstester, log in again" in result.stderr
    )


# ------------------------------------------------------------------ a fresh machine, as root

FRESH_LABEL = "kernel-sandbox-test"  # not the kernels' label: `ps` and the kernel tests never see it
LAB_PORT = 8888


def _checkout_tar() -> bytes:
    """The checkout's tracked files as they are now, as a tar (no .venv, no .git: a fresh clone)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=CHECKOUT, check=True, capture_output=True).stdout
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in filter(None, listed.decode().split("\0")):
            if (CHECKOUT / name).exists():
                tar.add(CHECKOUT / name, arcname=f"src/{name}", recursive=False)
    return buffer.getvalue()


LAB_PROBE = """
import json, sys, urllib.request
base, token = sys.argv[1].split("/lab?token=")
get = lambda path: urllib.request.urlopen(f"{base}{path}?token={token}", timeout=30)
assert get("/lab").status == 200
print(json.load(get("/api/kernelspecs"))["default"])
"""


@pytest.fixture
def fresh_machine(docker_engine) -> Iterator:
    """A fresh Debian machine as root: a privileged container of the bootstrapped base image (no
    debootstrap, no Docker, no registry), with the checkout's files in /src and a volume for its
    own engine's /var/lib/docker. The host's apt archives and kernel-sandbox wheel cache are lent
    to it (a cache: what it finds there it need not download), and the host's certificates and
    pip.conf (how this site reaches the registries); apt and pip reach only the package registries,
    as on the machines the project runs on."""
    from kernel_sandbox.docker.image import BASE_FALLBACK, UPSTREAM_BASE, WHEEL_CACHE

    if os.geteuid() != 0:
        pytest.skip("the fresh machine is a privileged container: root only")
    base = next((image for image in (BASE_FALLBACK, UPSTREAM_BASE) if _has(docker_engine, image)), None)
    if base is None:
        pytest.fail(f"neither {BASE_FALLBACK} nor {UPSTREAM_BASE} is in the engine (`kernel-sandbox image build` makes one)")
    client = docker.from_env(timeout=600)  # removing a machine with an engine inside takes a while
    volume = client.volumes.create(labels={FRESH_LABEL: "quickstart"})
    mounts = {volume.name: {"bind": "/var/lib/docker", "mode": "rw"}}
    if Path("/var/cache/apt/archives").is_dir():
        mounts["/var/cache/apt/archives"] = {"bind": "/var/cache/apt/archives", "mode": "rw"}
    for site in ("/etc/ssl/certs", "/etc/pip.conf"):  # how this site reaches the registries
        if os.path.exists(site):
            mounts[site] = {"bind": site, "mode": "ro"}
    if WHEEL_CACHE.is_dir():
        mounts[str(WHEEL_CACHE)] = {"bind": "/root/.cache/kernel-sandbox/wheelhouse", "mode": "ro"}
    container = client.containers.run(
        base, ["sh", "-c", AS_A_MACHINE], detach=True, labels={FRESH_LABEL: "quickstart"},
        volumes=mounts, environment={"HOME": "/root"}, hostname="fresh", **_machine_powers(),
    )
    try:
        container.put_archive("/", _checkout_tar())
        yield container
    finally:
        container.remove(force=True)
        volume.remove(force=True)
        client.close()


# What a machine's root may do that a container's may not: /sys and the cgroup controllers writable
# (its engine makes cgroups and mounts), then idle while the test runs commands in it.
AS_A_MACHINE = "mount -o remount,rw /sys && mount -o remount,rw /proc/sys && for c in /sys/fs/cgroup/*/; do mount -o remount,bind,rw $c; done; exec sleep infinity"


def _machine_powers() -> dict:
    """A privileged container's powers, less the capabilities the test process has not (Docker's
    own privileged mode asks for every one, and fails where one is missing)."""
    held = int(next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapBnd:")).split()[1], 16)
    missing = [name for bit, name in CAPABILITIES.items() if not held >> bit & 1]
    return {
        "cap_add": ["ALL"], "cap_drop": missing, "device_cgroup_rules": ["a *:* rwm"],
        "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    }


CAPABILITIES = dict(enumerate((
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
    "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN "
    "SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE "
    "MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
).split()))


def _has(client, image: str) -> bool:
    from kernel_sandbox.docker.connect import has_image

    return has_image(client, image)


@pytest.mark.fresh_machine
@pytest.mark.timeout(2400)
def test_quickstart_as_root_on_a_fresh_machine_reaches_jupyterlab_in_one_run(fresh_machine) -> None:
    assert fresh_machine.exec_run(["sh", "-c", "command -v debootstrap dockerd docker"]).exit_code != 0
    api = fresh_machine.client.api
    run = api.exec_create(
        fresh_machine.id,
        ["./quickstart", "--no-browser", "--ip", "127.0.0.1", "--port", str(LAB_PORT)],
        workdir="/src", environment={"CI": ""},
    )
    lines: list[str] = []

    def read() -> None:
        pending = ""
        for chunk in api.exec_start(run["Id"], stream=True):
            pending += chunk.decode(errors="replace")
            *done, pending = pending.split("\n")
            lines.extend(done)
            print(*done, sep="\n", flush=True)  # shown when the test fails or times out

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    url = None
    deadline = time.monotonic() + 1800  # a bound, not a figure: minutes on two busy cores
    while url is None and reader.is_alive() and time.monotonic() < deadline:
        url = next((found.group(0) for line in lines if (found := re.search(rf"http://127\.0\.0\.1:{LAB_PORT}/lab\?token=\w+", line))), None)
        time.sleep(1)
    output = "\n".join(lines)
    assert url is not None, output[-6000:]
    assert "installing debootstrap" in output  # as root it installed what the image build needs
    assert "making kernel-sandbox-base:bookworm with debootstrap" in output  # no registry answered
    assert "[ok] kernel image" in output and "fix:" not in output
    code, default = fresh_machine.exec_run(["/src/.venv/bin/python", "-c", LAB_PROBE, url])
    assert code == 0 and default.decode().strip() == "sandboxed-python", default
