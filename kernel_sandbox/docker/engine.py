"""Install and start Debian's Docker engine (``docker.io``), for ``kernel-sandbox setup
--install-engine``.

Only as root on Debian or Ubuntu, and only this machine's engine (not one ``DOCKER_HOST`` names).
With systemd the engine is started as its service; without (containers, CI machines)
``dockerd`` is started in the background with its log in ``DOCKERD_LOG``, after clearing what an
earlier, dead dockerd left behind: its pid files and its containerd (either makes a new dockerd
exit at once). A dockerd that runs is never stopped and never joined by a second one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker

from .connect import ENGINE_FIX, docker_client
from ..errors import EngineUnavailable

LOCAL_ENGINES = ("unix:///var/run/docker.sock", "unix:///run/docker.sock")
DOCKERD_LOG = Path("/var/log/kernel-sandbox-dockerd.log")
DOCKER_PID = Path("/var/run/docker.pid")
CONTAINERD_PID = Path("/var/run/docker/containerd/containerd.pid")
READY_TIMEOUT = 90.0
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Host:
    """What installing and starting the engine depends on."""

    root: bool
    debian_like: bool
    has_dockerd: bool
    systemd: bool

    @classmethod
    def probe(cls) -> Host:
        """Look at this machine."""
        return cls(
            root=os.geteuid() == 0,
            debian_like=_debian_like(Path("/etc/os-release"))
            and shutil.which("apt-get") is not None,
            has_dockerd=_which("dockerd") is not None,
            systemd=Path("/run/systemd/system").is_dir(),
        )


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def _debian_like(os_release: Path) -> bool:
    try:
        text = os_release.read_text()
    except OSError:
        return False
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    ids = {fields.get("ID", "").strip('"'), *fields.get("ID_LIKE", "").strip('"').split()}
    return bool(ids & {"debian", "ubuntu"})


def install_commands(host: Host) -> list[list[str]]:
    """The commands that install ``docker.io`` on ``host`` (none when dockerd is already there)."""
    if host.has_dockerd:
        return []
    if not host.root:
        raise EngineUnavailable(f"installing the Docker engine needs root; {ENGINE_FIX}")
    if not host.debian_like:
        raise EngineUnavailable(
            "--install-engine knows Debian and Ubuntu only; install Docker Engine as "
            "https://docs.docker.com/engine/install/ describes for this system, then run this "
            "command again"
        )
    return [["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "docker.io"]]


def start_command(host: Host) -> list[str]:
    """The command that starts the engine on ``host``: its service under systemd, else
    ``dockerd``."""
    if not host.root:
        raise EngineUnavailable(f"starting the Docker engine needs root; {ENGINE_FIX}")
    return ["systemctl", "start", "docker"] if host.systemd else [_which("dockerd") or "dockerd"]


def ensure_engine(install: bool, progress: Progress) -> docker.DockerClient:
    """Return a client of a reachable engine; with ``install``, install and start one first if
    needed."""
    try:
        return docker_client()
    except EngineUnavailable:
        if not install:
            raise
    where = os.environ.get("DOCKER_HOST")
    if where and where not in LOCAL_ENGINES:
        raise EngineUnavailable(
            f"DOCKER_HOST is {where}, and --install-engine installs and starts only this machine's "
            "engine: start the engine there, or unset DOCKER_HOST"
        )
    host = Host.probe()
    for command in install_commands(host):
        progress(f"running {' '.join(command)}")
        _run(command)
    command = start_command(host)
    if host.systemd:
        progress(f"running {' '.join(command)}")
        _run(command)
        _wait_for_engine(None)
    else:
        _start_dockerd(command, progress)
    return docker_client()


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **APT_ENV})
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        raise EngineUnavailable(
            f"`{' '.join(command)}` failed with exit code {result.returncode}:\n{tail}"
        )


def _alive(pid: int, name: str) -> bool:
    """True when ``pid`` runs a program called ``name`` and is not a zombie."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return comm == name and state != "Z"


def _pid_in(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _running(name: str) -> list[int]:
    """The live processes whose program is ``name``."""
    return sorted(
        int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _alive(int(entry), name)
    )


def _clear_leftovers() -> None:
    """With no dockerd running: stop the containerd a dead dockerd started, and remove both pid
    files."""
    pid = _pid_in(CONTAINERD_PID)
    if pid is not None and _alive(pid, "containerd"):
        os.kill(pid, 9)
        time.sleep(1)
    for path in (DOCKER_PID, CONTAINERD_PID):
        path.unlink(missing_ok=True)


def _wait_for_engine(process: subprocess.Popen[bytes] | None) -> bool:
    """Wait until the engine answers; False when ``process`` exits first or time runs out."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            docker_client()
            return True
        except EngineUnavailable:
            pass
        if process is not None and process.poll() is not None:
            return False
        time.sleep(1)
    return False


def _start_dockerd(command: list[str], progress: Progress) -> None:
    running = _running("dockerd")
    if running:
        progress(f"dockerd (pid {running[0]}) is running but not answering yet; waiting for it")
        if _wait_for_engine(None):
            return
        raise EngineUnavailable(
            f"dockerd (pid {', '.join(map(str, running))}) runs but does not answer; it is left "
            f"alone. Look at its log, or stop it (`kill {running[0]}`) and run this command again"
        )
    for attempt in (1, 2):
        _clear_leftovers()
        progress(f"starting dockerd in the background, attempt {attempt} (log: {DOCKERD_LOG})")
        with open(DOCKERD_LOG, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if _wait_for_engine(process):
            return
        if process.poll() is None:  # the dockerd this call started, and only that one
            process.kill()
            process.wait()
    tail = "\n".join(DOCKERD_LOG.read_text(errors="replace").splitlines()[-20:])
    raise EngineUnavailable(f"dockerd did not become ready; the end of {DOCKERD_LOG}:\n{tail}")
