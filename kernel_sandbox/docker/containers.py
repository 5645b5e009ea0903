"""Docker Engine calls shared by the launcher, the CLI and the garbage collector, and the container
spec.

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
import requests.exceptions
from docker.models.containers import Container

from ..errors import ConfigError, EngineUnavailable, ImageMissing, KernelSandboxError
from ..kernelside import MAGICS, source, sources
from ..kernelside.boot import KEY_ENV, MODULES_ENV
from ..privdir import ADOPTED, PrivateDir, abandoned_dirs, remove_dead_parts, remove_private
from ..provisioners.process import pid_alive
from ..settings import HOME_DIR, PACKAGES_DIR, WORK_DIR
from .settings import DEFAULT_IMAGE, DockerSettings

__all__ = ["DEFAULT_IMAGE", "HOME_DIR", "WORK_DIR"]

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
API_TIMEOUT = 30
"""Seconds any single Docker API call may take before it fails (streams have no such limit)."""
PACKAGES_ENV = {
    "PIP_TARGET": PACKAGES_DIR,
    "PYTHONPATH": PACKAGES_DIR,
    "PIP_NO_CACHE_DIR": "1",
}
"""pip in the kernel installs into the packages' tmpfs (on ``sys.path``), unpacks there
(:mod:`.kernelside.packages`), and keeps no cache (a kernel is disposable; a cache would take the
home's room)."""


PODMAN_ROOT_SOCKET = "/run/podman/podman.sock"
"""Where root's Podman API socket is (``podman system service``, or ``podman.socket``)."""
PODMAN_API = "v4.0.0"
"""The version of Podman's own API asked (Podman 4 and 5 serve it)."""
PODMAN_FIX = (
    "Start it: as root `podman system service --time=0 unix:///run/podman/podman.sock &`; as a "
    "user `systemctl --user start podman.socket` or `podman system service --time=0 &` (or set "
    "CONTAINER_HOST to its address); or set the kernel's 'engine' option to 'docker'."
)


def podman_address(environment: Mapping[str, str] | None = None) -> str:
    """Where Podman's API socket is expected: ``CONTAINER_HOST``, else root's or this user's
    (``$XDG_RUNTIME_DIR/podman/podman.sock``)."""
    environ = os.environ if environment is None else environment
    if environ.get("CONTAINER_HOST"):
        return environ["CONTAINER_HOST"]
    if os.geteuid() == 0:
        return f"unix://{PODMAN_ROOT_SOCKET}"
    runtime_dir = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return f"unix://{runtime_dir}/podman/podman.sock"


def _podman_client(timeout: int, environment: Mapping[str, str] | None) -> docker.DockerClient:
    address = podman_address(environment)
    try:
        client = docker.DockerClient(base_url=address, timeout=timeout)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EngineUnavailable(
            f"engine='podman': cannot reach Podman's API socket at {address} ({exc}). {PODMAN_FIX}"
        ) from exc
    return client


def docker_client(
    timeout: int = API_TIMEOUT,
    environment: Mapping[str, str] | None = None,
    engine: str = "auto",
) -> docker.DockerClient:
    """Connect to the engine ``engine`` names: Docker (``DOCKER_HOST`` of ``environment``, default
    this process's), Podman (:func:`podman_address`), or ``auto``: Docker, else Podman's socket
    when Docker does not answer and ``DOCKER_HOST`` is unset."""
    if engine == "podman":
        return _podman_client(timeout, environment)
    try:
        client = docker.from_env(timeout=timeout, environment=environment)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        environ = os.environ if environment is None else environment
        if engine == "auto" and not environ.get("DOCKER_HOST"):
            try:
                return _podman_client(timeout, environment)
            except EngineUnavailable:
                pass
        raise EngineUnavailable(
            f"Cannot reach the Docker engine at {engine_address()} ({exc}). Start it "
            "(`sudo systemctl start docker`, or `sudo dockerd &` where there is no systemd) "
            "or point DOCKER_HOST at a running engine (or start Podman's API socket and set "
            "engine='podman'); `kernel-sandbox doctor` checks the setup."
        ) from exc
    return client


def engine_clients(timeout: int = API_TIMEOUT) -> list[docker.DockerClient]:
    """A client of each engine that answers here (Docker's and Podman's), for ``gc`` and ``ps``;
    raise the Docker engine's error when none does."""
    try:
        clients = [docker_client(timeout, engine="docker")]
    except EngineUnavailable as exc:
        clients, error = [], exc
    try:
        podman = docker_client(timeout, engine="podman")
        if not any(is_podman(client) for client in clients):  # DOCKER_HOST may name Podman
            clients.append(podman)
    except EngineUnavailable:
        if not clients:
            raise error from None
    return clients


def is_podman(client: docker.DockerClient) -> bool:
    """True when ``client`` speaks to Podman's Docker-compatible API."""
    components = client.version().get("Components") or []
    return any(part.get("Name") == "Podman Engine" for part in components)


def engine_address(engine: str = "docker") -> str:
    """Where the engine (``docker`` or ``podman``) is expected, for messages."""
    if engine == "podman":
        return podman_address()
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def concrete_engine(engine: str, podman: bool) -> str:
    """The engine a launcher's client reached, as the engine option names it for every later
    call (its watchdog, the clean-up of what it left): ``auto`` that fell back to Podman is
    'podman', else 'docker' (``DOCKER_HOST``, which may name a Podman socket)."""
    if engine != "auto":
        return engine
    return "podman" if podman and not os.environ.get("DOCKER_HOST") else "docker"


def unpinged_client(engine: str, timeout: int, version: str) -> docker.DockerClient:
    """A client of ``engine`` made without any call to it (for a ping that must not hang)."""
    if engine == "podman":
        return docker.DockerClient(base_url=podman_address(), timeout=timeout, version=version)
    return docker.from_env(timeout=timeout, version=version)


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


def check_engine(info: Mapping[str, Any], settings: DockerSettings) -> None:
    """Refuse, before any container exists, settings that this engine cannot enforce."""
    runtimes = info.get("Runtimes") or {}
    if settings.runtime and settings.runtime not in runtimes:
        raise ConfigError(
            f"runtime={settings.runtime!r} is not registered with the Docker engine (it has: "
            f"{', '.join(sorted(runtimes)) or 'none'}); register it under 'runtimes' in "
            "/etc/docker/daemon.json and reload dockerd (`kernel-sandbox doctor` shows how)"
        )
    needs = [
        ("memory", settings.memory is not None, "MemoryLimit"),
        ("memory", settings.memory is not None, "SwapLimit"),
        ("pids_limit", settings.pids_limit is not None, "PidsLimit"),
        ("cpus", settings.cpus is not None, "CpuCfsQuota"),
    ]
    for option, wanted, capability in needs:
        if wanted and info.get(capability) is False:
            raise ConfigError(
                f"{option}: this Docker engine cannot enforce it ({capability} is off in `docker "
                f"info`); enable the cgroup controller, or set {option}='unlimited' to run without "
                "that limit"
            )
    cores = info.get("NCPU")
    if settings.cpus is not None and isinstance(cores, int) and settings.cpus > cores:
        raise ConfigError(f"cpus={settings.cpus}: the Docker engine has only {cores} CPUs")


def podman_host(client: docker.DockerClient) -> dict[str, Any]:
    """The ``host`` part of Podman's own ``/libpod/info`` (its compatible ``/info`` says every
    limit is enforced even where a rootless Podman ignores them)."""
    response = client.api.get(f"{client.api.base_url}/{PODMAN_API}/libpod/info")
    response.raise_for_status()
    return dict(response.json().get("host") or {})


PODMAN_CONTROLLERS = (("memory", "memory"), ("pids_limit", "pids"), ("cpus", "cpu"))


def check_podman(host: Mapping[str, Any], settings: DockerSettings) -> None:
    """Refuse limits this Podman would ignore: each needs its cgroup controller delegated to
    Podman (a rootless Podman on cgroup v1 has none)."""
    controllers = set(host.get("cgroupControllers") or [])
    rootless = (host.get("security") or {}).get("rootless")
    for option, controller in PODMAN_CONTROLLERS:
        if getattr(settings, option) is not None and controller not in controllers:
            where = "rootless " if rootless else ""
            raise ConfigError(
                f"{option}: this {where}Podman cannot enforce it: its cgroup controller "
                f"{controller!r} is not delegated to it (cgroup {host.get('cgroupVersion', '?')}, "
                f"controllers: {', '.join(sorted(controllers)) or 'none'}). Run Podman on cgroup "
                "v2 with the controllers delegated to the user (systemd: Delegate=yes in "
                "user@.service), or as root; or set "
                f"{option}='unlimited' to run without that limit"
            )


def applied_limits(host_config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """The limits of ``spec`` that the engine did not apply, read from the container's
    HostConfig."""
    expected = {
        "Memory": spec.get("mem_limit", 0),
        "MemorySwap": spec.get("memswap_limit", 0),
        "NanoCpus": spec.get("nano_cpus", 0),
        "ReadonlyRootfs": spec["read_only"],
        "NetworkMode": spec["network_mode"],
        "IpcMode": spec["ipc_mode"],
    }
    wrong = [
        f"{key} is {host_config.get(key)!r}, not {value!r}"
        for key, value in expected.items()
        if (host_config.get(key) or 0) != (value or 0)
    ]
    if (host_config.get("PidsLimit") or 0) != spec.get("pids_limit", 0):
        wrong.append(
            f"PidsLimit is {host_config.get('PidsLimit')!r}, not {spec.get('pids_limit')!r}"
        )
    if sorted(host_config.get("CapDrop") or []) != ["ALL"]:
        wrong.append(f"CapDrop is {host_config.get('CapDrop')!r}")
    if "no-new-privileges" not in (host_config.get("SecurityOpt") or []):
        wrong.append(f"SecurityOpt is {host_config.get('SecurityOpt')!r}")
    return wrong


PROCESS_HARDENING = {
    "CapBnd": "0000000000000000",
    "CapEff": "0000000000000000",
    "NoNewPrivs": "1",
    "Seccomp": "2",
}
"""What ``/proc/PID/status`` of a kernel's process shows: no capability can be held or gained, and
a seccomp filter is on."""


def podman_applied(attrs: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """:func:`applied_limits` for a Podman container, from its inspect data ``attrs``.

    Podman's inspect shows its private IPC namespace as ``shareable`` and ``ALL`` dropped
    capabilities one by one, so those are read from the container's init process instead: its
    capabilities (none), ``no_new_privs``, seccomp, and an IPC namespace that is not this
    process's.
    """
    host_config = {**attrs["HostConfig"], "IpcMode": spec["ipc_mode"], "CapDrop": ["ALL"]}
    wrong = applied_limits(host_config, spec)
    pid = (attrs.get("State") or {}).get("Pid")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        own_ipc = os.readlink(f"/proc/{pid}/ns/ipc") != os.readlink("/proc/self/ns/ipc")
    except (OSError, TypeError) as exc:
        return [*wrong, f"the kernel's process {pid} cannot be checked here ({exc})"]
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    wrong += [
        f"the kernel's {key} is {fields.get(key, '').strip()!r}, not {value!r}"
        for key, value in PROCESS_HARDENING.items()
        if fields.get(key, "").strip() != value
    ]
    if not own_ipc:
        wrong.append("the kernel shares this process's IPC namespace")
    return wrong


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
