"""Docker Engine calls shared by the provisioner, the CLI and the garbage collector."""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from .errors import EngineUnavailable, ImageMissing

DEFAULT_IMAGE = "kernel-sandbox-python:latest"
LABEL = "kernel-sandbox"
LABEL_KERNEL_ID = "kernel-sandbox.kernel-id"
LABEL_OWNER_HOST = "kernel-sandbox.owner-host"
LABEL_OWNER_PID = "kernel-sandbox.owner-pid"
LABEL_SOCKET_DIR = "kernel-sandbox.socket-dir"
LAUNCH_GRACE_SECONDS = 120
OURS = [LABEL, LABEL_KERNEL_ID]
"""Docker label filter for kernel containers (the image's own label alone is not enough)."""


def socket_root() -> Path:
    """Return the short per-user directory that holds the kernels' IPC socket directories."""
    return Path(f"/tmp/ksbx-{os.getuid()}")


def docker_client() -> docker.DockerClient:
    """Connect to the Docker engine named by the environment (``DOCKER_HOST``) or the local socket."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise EngineUnavailable(
            f"Cannot reach the Docker engine at {where} ({exc}). Start it "
            "(`sudo systemctl start docker`, or `sudo dockerd &` where there is no systemd) "
            "or point DOCKER_HOST at a running engine; `kernel-sandbox doctor` checks the setup."
        ) from exc
    return client


def has_image(client: docker.DockerClient, image: str) -> bool:
    """True when the engine has an image named ``image``."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def require_image(client: docker.DockerClient, image: str) -> None:
    """Raise :class:`ImageMissing` with the command that builds ``image`` when it is absent."""
    if not has_image(client, image):
        raise ImageMissing(
            f"The kernel image {image!r} is not on this Docker engine. "
            f"Build it with `kernel-sandbox image build --tag {image}`."
        )


def owner_labels(kernel_id: str, socket_dir: Path | None) -> dict[str, str]:
    """Labels that mark a container as ours and name the process and host that own it."""
    labels = {
        LABEL: "true",
        LABEL_KERNEL_ID: kernel_id,
        LABEL_OWNER_HOST: socket.gethostname(),
        LABEL_OWNER_PID: str(os.getpid()),
    }
    if socket_dir is not None:
        labels[LABEL_SOCKET_DIR] = str(socket_dir)
    return labels


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_orphan(container: Container) -> bool:
    """True when the container has stopped or the process on this host that started it is gone."""
    if container.status not in ("running", "created", "restarting", "paused"):
        return True
    labels = container.labels
    if labels.get(LABEL_OWNER_HOST) != socket.gethostname():
        return False
    pid = labels.get(LABEL_OWNER_PID, "")
    return pid.isdigit() and not _pid_alive(int(pid))


@dataclass
class GcReport:
    """What ``gc`` removed."""

    containers: list[str] = field(default_factory=list)
    socket_dirs: list[str] = field(default_factory=list)


def remove_container(container: Container) -> None:
    """Force-remove a container, tolerating one that is already gone."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise


def gc(client: docker.DockerClient, *, everything: bool = False) -> GcReport:
    """Remove kernel-sandbox containers whose kernel is dead (all of them when ``everything``)."""
    report = GcReport()
    live_dirs: set[str] = set()
    for container in client.containers.list(all=True, filters={"label": OURS}, ignore_removed=True):
        if everything or is_orphan(container):
            remove_container(container)
            report.containers.append(container.name)
        elif LABEL_SOCKET_DIR in container.labels:
            live_dirs.add(container.labels[LABEL_SOCKET_DIR])
    root = socket_root()
    if root.is_dir():
        for entry in root.iterdir():
            young = time.time() - entry.stat().st_mtime < LAUNCH_GRACE_SECONDS
            if str(entry) not in live_dirs and (everything or not young):
                shutil.rmtree(entry, ignore_errors=True)
                report.socket_dirs.append(str(entry))
    return report
