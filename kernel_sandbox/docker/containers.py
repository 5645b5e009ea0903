"""The kernel's container: its spec, its labels, who it runs as, its removal, and the garbage
collection of what dead launchers left (the engine's clients: :mod:`.connect`; its checks:
:mod:`.checks`).

:func:`container_spec` is a pure function from settings to the docker SDK's keyword arguments:
what the sandbox is made of can be read (and unit-tested) without an engine.
"""

from __future__ import annotations

import json
import os
import random
import resource
import socket
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from ..errors import ConfigError, KernelSandboxError
from ..kernelside import MAGICS, source, sources
from ..kernelside.boot import KEY_ENV, MODULES_ENV
from ..privdir import ADOPTED, PrivateDir, abandoned_dirs, remove_dead_parts, remove_private
from ..provisioners.process import pid_alive
from ..settings import HOME_DIR, PACKAGES_DIR, WORK_DIR
from .settings import DockerSettings

LABEL = "kernel-sandbox"
LABEL_KERNEL_ID = "kernel-sandbox.kernel-id"
LABEL_OWNER_HOST = "kernel-sandbox.owner-host"
LABEL_OWNER_PID = "kernel-sandbox.owner-pid"
"""The process that asked for the kernel (a notebook server, a test, VS Code)."""
LABEL_LAUNCHER_PID = "kernel-sandbox.launcher-pid"
"""The launcher that owns the container and removes it; ``gc`` looks at this one."""
LABEL_PRIVATE_DIR = "kernel-sandbox.private-dir"
OURS = [LABEL, LABEL_KERNEL_ID]
"""Docker label filter for kernel containers (the image's own label alone is not enough)."""
PACKAGES_ENV = {
    "PIP_TARGET": PACKAGES_DIR,
    "PYTHONPATH": PACKAGES_DIR,
    "PIP_NO_CACHE_DIR": "1",
}
"""pip in the kernel installs into the packages' tmpfs (on ``sys.path``), unpacks there
(:mod:`.kernelside.packages`), and keeps no cache (a kernel is disposable; a cache would take the
home's room)."""


def owner_labels(
    kernel_id: str, *, owner_pid: int, private_dir: Path | None = None
) -> dict[str, str]:
    """Labels that mark a container as ours and name the host, the asking process and the
    launcher."""
    labels = {
        LABEL: "true",
        LABEL_KERNEL_ID: kernel_id,
        LABEL_OWNER_HOST: socket.gethostname(),
        LABEL_OWNER_PID: str(owner_pid),
        LABEL_LAUNCHER_PID: str(os.getpid()),
    }
    if private_dir is not None:
        labels[LABEL_PRIVATE_DIR] = str(private_dir)
    return labels


# -- who the kernel runs as ----------------------------------------------------------------


def _fields(path: Path) -> list[list[str]]:
    try:
        return [line.split(":") for line in path.read_text().splitlines()]
    except OSError:
        return []


def _ids_in_use(etc: Path) -> tuple[set[int], list[range]]:
    ids = {
        int(row[i])
        for name, columns in (("passwd", (2, 3)), ("group", (2,)))
        for row in _fields(etc / name)
        for i in columns
        if len(row) > i and row[i].isdigit()
    }
    ranges = [
        range(int(row[1]), int(row[1]) + int(row[2]))
        for name in ("subuid", "subgid")
        for row in _fields(etc / name)
        if len(row) == 3 and row[1].isdigit() and row[2].isdigit()
    ]
    return ids, ranges


def unused_id(low: int, high: int, etc: Path = Path("/etc")) -> int:
    """An id in ``low..high`` that no host account uses as uid, gid or subordinate id."""
    ids, ranges = _ids_in_use(etc)

    def free(candidate: int) -> bool:
        return candidate not in ids and not any(candidate in span for span in ranges)

    for _ in range(256):
        candidate = random.randint(low, high)
        if free(candidate):
            return candidate
    for candidate in range(low, high + 1):
        if free(candidate):
            return candidate
    raise ConfigError(f"uid_range={low}-{high}: every id in it belongs to a host account")


def run_as(settings: DockerSettings) -> tuple[int, int]:
    """The kernel's uid and gid: ``user`` when set, the host user's, or an unused one when root."""
    if settings.user:
        uid, gid = settings.user.split(":")
        return int(uid), int(gid)
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    chosen = unused_id(*settings.uid_range)
    return chosen, chosen


# -- the container ---------------------------------------------------------------------------


def resolve_mounts(settings: DockerSettings, cwd: str | None) -> list[tuple[str, str, str]]:
    """Each bind mount as (host path, container path, mode), host paths resolved and checked."""
    mounts = [(mount.host, mount.target, mount.mode) for mount in settings.mounts]
    if settings.mount_cwd != "off" and cwd:
        mounts.append((cwd, WORK_DIR, settings.mount_cwd))
    resolved = []
    for host, target, mode in mounts:
        path = Path(host).expanduser().resolve()
        if not path.exists():
            raise ConfigError(
                f"mounts: the host path {path} does not exist (from {host}:{target}:{mode})"
            )
        resolved.append((str(path), target, mode))
    return resolved


def container_spec(
    settings: DockerSettings,
    *,
    kernel_id: str,
    kernel_key: str,
    user: tuple[int, int],
    env: Mapping[str, str],
    mounts: Iterable[tuple[str, str, str]],
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """Keyword arguments for ``client.containers.create(settings.image, **spec)``: the whole
    sandbox.

    ``env`` is what the kernelspec passes on (the host's environment never is); ``mounts`` come
    from :func:`resolve_mounts`; ``kernel_key`` is the kernel's own signing key, not the client's.
    """
    uid, gid = user
    sizes = settings.tmpfs_sizes()
    tmpfs = {
        "/tmp": f"rw,nosuid,nodev,size={sizes['tmp_size']},mode=1777",
        HOME_DIR: f"rw,nosuid,nodev,size={sizes['home_size']},uid={uid},gid={gid},mode=0755",
    }
    if "work_size" in sizes:
        tmpfs[WORK_DIR] = f"rw,nosuid,nodev,size={sizes['work_size']},uid={uid},gid={gid},mode=0755"
    # the one writable place mounted exec: compiled extensions that pip installs load from it
    tmpfs[PACKAGES_DIR] = (
        f"rw,exec,nosuid,nodev,size={sizes['packages_size']},uid={uid},gid={gid},mode=0755"
    )
    environment = {
        **env,
        **PACKAGES_ENV,
        **settings.env,
        "HOME": HOME_DIR,
        "PYTHONUNBUFFERED": "1",
        "JPY_PARENT_PID": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        KEY_ENV: kernel_key,
        MODULES_ENV: json.dumps(sources(MAGICS)),
    }
    spec: dict[str, Any] = {
        "command": ["python", "-c", source("boot"), *settings.kernel_cmd],
        "name": f"kernel-sandbox-{kernel_id[:8]}-{uuid.uuid4().hex[:6]}",
        "hostname": "sandbox",
        "labels": dict(labels),
        "environment": environment,
        "user": f"{uid}:{gid}",
        "working_dir": WORK_DIR,
        "init": True,
        "auto_remove": True,
        "log_config": {"type": "none", "config": {}},
        "read_only": settings.read_only,
        "tmpfs": tmpfs,
        "volumes": {host: {"bind": target, "mode": mode} for host, target, mode in mounts},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "ipc_mode": "private",
        "shm_size": sizes["shm_size"],
        "network_mode": "bridge" if settings.network is True else "none",
    }
    if settings.memory is not None:
        spec["mem_limit"] = spec["memswap_limit"] = settings.memory
    if settings.cpus is not None:
        spec["nano_cpus"] = round(settings.cpus * 1e9)
    if settings.pids_limit is not None:
        spec["pids_limit"] = settings.pids_limit
        if settings.runtime == "runsc":
            spec.update(runsc_pids(settings.pids_limit))
    if settings.runtime:
        spec["runtime"] = settings.runtime
    return spec


def for_podman(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` as Podman's Docker-compatible API takes it, with the same effect.

    Podman refuses the tmpfs options ``uid=``/``gid=``: its own ``U`` gives the tmpfs to the
    container's user instead, and ``notmpcopyup`` keeps it empty as Docker's is. As root Podman
    raises the open-files and process rlimits to the kernel's maximum, which a host (or a
    container) with lower hard limits refuses at start: the kernel gets the launcher's open-files
    limit, and ``pids_limit`` (or the launcher's) as its process limit, which the pids cgroup
    holds it to anyway.
    """
    podman = dict(spec)
    podman["tmpfs"] = {
        path: ",".join(
            [opt for opt in options.split(",") if not opt.startswith(("uid=", "gid="))]
            + (["U", "notmpcopyup"] if "uid=" in options else ["notmpcopyup"])
        )
        for path, options in spec["tmpfs"].items()
    }
    ulimits = list(spec.get("ulimits", []))
    podman["ulimits"] = ulimits + [
        ulimit
        for ulimit in own_ulimits(spec.get("pids_limit"))
        if not any(given.name == ulimit.name for given in ulimits)
    ]
    return podman


def own_ulimits(pids_limit: int | None = None) -> list[docker.types.Ulimit]:
    """This process's open-files limit, and ``pids_limit`` (else this process's) as the process
    limit: rlimits any engine can give a container (:func:`for_podman`)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = (pids_limit, pids_limit) if pids_limit else resource.getrlimit(resource.RLIMIT_NPROC)
    return [
        docker.types.Ulimit(name=name, soft=soft, hard=hard)
        for name, (soft, hard) in (("nofile", nofile), ("nproc", nproc))
    ]


RUNSC_HOST_THREADS = 512
"""Host threads gVisor's runtime may use besides one per process or thread of the kernel (about
150 idle: its Go runtime, gofer and platform)."""


def runsc_pids(pids_limit: int) -> dict[str, Any]:
    """``pids_limit`` as gVisor enforces it: its own RLIMIT_NPROC on the kernel's processes and
    threads (a fork or thread past it fails with EAGAIN, as the pids cgroup makes it under runc),
    and room in the pids cgroup, which counts the runtime's host threads, for the runtime itself
    (else a fork bomb that reaches the cgroup's limit crashes the whole sandbox)."""
    return {
        "ulimits": [docker.types.Ulimit(name="nproc", soft=pids_limit, hard=pids_limit)],
        "pids_limit": 2 * pids_limit + RUNSC_HOST_THREADS,
    }


def remove_container(container: Container) -> None:
    """Force-remove a container and return once it is gone (the engine may be removing it
    already)."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise
        try:
            container.wait(condition="removed")
        except docker.errors.NotFound:
            pass


# -- leftovers -------------------------------------------------------------------------------


def remove_launcher_containers(
    client: docker.DockerClient, kernel_id: str, launcher_pid: int | str
) -> None:
    """Remove every container one launcher made for ``kernel_id``, found by their labels (it may not
    have said which)."""
    labels = [f"{LABEL_KERNEL_ID}={kernel_id}", f"{LABEL_LAUNCHER_PID}={launcher_pid}"]
    for container in client.containers.list(
        all=True, filters={"label": labels}, ignore_removed=True
    ):
        remove_container(container)


def is_orphan(container: Container) -> bool:
    """True when nothing on this host will remove ``container``: its launcher (owner) is dead.

    A container of another host is never an orphan here; one without owner labels is an orphan
    once it has stopped. A stopped container whose owner lives is not: its owner may still read it.
    """
    labels = container.labels
    if LABEL_OWNER_HOST in labels and labels[LABEL_OWNER_HOST] != socket.gethostname():
        return False
    owner = labels.get(LABEL_LAUNCHER_PID) or labels.get(LABEL_OWNER_PID) or ""
    if owner.isdigit():
        return not pid_alive(int(owner))
    return container.status not in ("running", "created", "restarting", "paused")


@dataclass
class GcReport:
    """What ``gc`` removed."""

    containers: list[str] = field(default_factory=list)
    private_dirs: list[str] = field(default_factory=list)
    checkpoint_parts: list[str] = field(default_factory=list)


def gc(client: docker.DockerClient, *, everything: bool = False) -> GcReport:
    """Remove kernel containers whose owner is dead (all of them when ``everything``), abandoned
    dirs and the partial checkpoints of dead launchers."""
    report = GcReport()
    for container in client.containers.list(all=True, filters={"label": OURS}, ignore_removed=True):
        if everything or is_orphan(container):
            remove_container(container)
            report.containers.append(container.name or container.short_id)
    for path in abandoned_dirs():
        remove_private(path)
        report.private_dirs.append(str(path))
    report.checkpoint_parts = [str(path) for path in remove_dead_parts()]
    return report


def kernel_of(labels: Mapping[str, str]) -> str | None:
    """The id of the kernel a container serves, read from its labels; None for a standby not adopted
    yet.

    A standby's adoption is recorded in its private directory, which only this user can read.
    """
    # the standby pool is not for every engine call
    from ..provisioners.standby import STANDBY_ID_PREFIX

    kernel_id = labels.get(LABEL_KERNEL_ID, "?")
    if not kernel_id.startswith(STANDBY_ID_PREFIX):
        return kernel_id
    try:
        adopted = PrivateDir(Path(labels.get(LABEL_PRIVATE_DIR, ""))).read_json(ADOPTED)
    except (OSError, ValueError, KernelSandboxError):
        adopted = None
    return (
        str(adopted["kernel_id"]) if isinstance(adopted, dict) and "kernel_id" in adopted else None
    )
