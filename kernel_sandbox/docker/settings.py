"""The Docker backend's options: one model for the provisioner, the launcher, ``install`` and
programs.

:meth:`DockerSettings.from_config` checks every value before any container exists (see
:mod:`kernel_sandbox.settings` for the rules every backend's options follow).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..egress import parse_network
from ..errors import ConfigError
from ..hostsecrets import parse_bindings
from ..settings import HOME_DIR, PACKAGES_DIR, WORK_DIR, BackendSettings, Mount, parse_mounts
from ..parsers import (
    UNLIMITED,
    MiB,
    option,
    parse_argv,
    parse_choice,
    parse_cpus,
    parse_env,
    parse_flag,
    parse_id_range,
    parse_max_kernels,
    parse_max_memory,
    parse_memory,
    parse_orphan_seconds,
    parse_pids,
    parse_runtime,
    parse_seconds,
    parse_standby,
    parse_text,
    parse_tmpfs,
    parse_user,
)

DEFAULT_IMAGE = "kernel-sandbox-python:latest"
ENGINES = ("auto", "docker", "podman")
DEFAULT_KERNEL_CMD = ("python", "-m", "ipykernel_launcher", "-f", "{connection_file}")
TMPFS_SHARE = {
    "tmp_size": 1 / 16,
    "shm_size": 1 / 16,
    "home_size": 1 / 8,
    "work_size": 1 / 4,
    "packages_size": 1 / 4,
}
"""Default share of the memory limit for each writable tmpfs (``/dev/shm`` too); together 3/4, the
rest is the kernel's."""
TMPFS_FALLBACK = {
    "tmp_size": 128 * MiB,
    "shm_size": 64 * MiB,
    "home_size": 128 * MiB,
    "work_size": 256 * MiB,
    "packages_size": 256 * MiB,
}
"""Default tmpfs sizes when memory is unlimited (a tmpfs is never unlimited)."""
RUNSC_OVERHEAD = 64 * MiB
"""Memory gVisor's runtime holds in the container's cgroup besides the kernel's (about 50 MiB
measured idle). gVisor keeps the tmpfs in that same memory, so under ``runtime='runsc'`` the
tmpfs shares and the 3/4 rule count from ``memory`` less this: a full tmpfs is ENOSPC there too,
never an out-of-memory kill."""


@dataclass(frozen=True)
class DockerSettings(BackendSettings):
    """The settings of one Docker kernel, checked; build with :meth:`from_config`."""

    title = "the Docker backend"

    engine: str = option(
        "auto",
        parse_choice(ENGINES),
        "The container engine: 'docker' (DOCKER_HOST), 'podman' (its API socket: CONTAINER_HOST, "
        "else root's or the user's $XDG_RUNTIME_DIR/podman/podman.sock), or 'auto': Docker, else "
        "Podman's socket when Docker does not answer and DOCKER_HOST is unset.",
    )
    image: str = option(DEFAULT_IMAGE, parse_text, "Docker image that runs the kernel.")
    network: bool | tuple[str, ...] = option(
        False,
        parse_network,
        "false: no network; true: a bridge with open outbound access; or a list of destinations "
        "(HOST[:PORT][@ADDRESSES], *.domain) reached through the launcher's filtering proxy.",
    )
    secrets: tuple[str, ...] = option(
        (),
        parse_bindings,
        "Secrets the egress proxy adds to requests, never given to the kernel: "
        "NAME[=FILE]@HOST[:PORT][,HOST...][;query]. The kernel's NAME holds a placeholder; the "
        "value comes from the launching process's environment variable NAME (or FILE) and "
        "replaces the placeholder in the headers of requests to HOST only. HOST is allowed "
        "implicitly.",
    )
    memory: int | None = option(
        "1g", parse_memory, "Memory limit, swap included (e.g. 512m, 2g), or 'unlimited'."
    )
    cpus: float | None = option(1.0, parse_cpus, "CPU limit in cores, or 'unlimited'.")
    pids_limit: int | None = option(
        256,
        parse_pids,
        "Maximum number of processes and threads, or 'unlimited'; past it a fork or a thread "
        "fails with EAGAIN (under runsc too, by gVisor's own RLIMIT_NPROC).",
    )
    user: str = option(
        "",
        parse_user,
        "uid:gid the kernel runs as; empty: the host user's, or one from uid_range for root.",
    )
    uid_range: tuple[int, int] = option(
        "100000-999999",
        parse_id_range,
        "When Jupyter runs as root: the range the kernel's unused uid:gid is picked from.",
    )
    read_only: bool = option(True, parse_flag, "Mount the image's root filesystem read-only.")
    tmp_size: int | None = option(
        "auto",
        parse_tmpfs,
        "Size of the writable tmpfs at /tmp; 'auto': memory/16 (under runsc: of memory less 64m).",
    )
    shm_size: int | None = option(
        "auto", parse_tmpfs, "Size of /dev/shm (a tmpfs too); 'auto': memory/16."
    )
    home_size: int | None = option(
        "auto", parse_tmpfs, f"Size of the writable tmpfs at {HOME_DIR}; 'auto': memory/8."
    )
    work_size: int | None = option(
        "auto", parse_tmpfs, f"Size of the writable tmpfs at {WORK_DIR}; 'auto': memory/4."
    )
    packages_size: int | None = option(
        "auto",
        parse_tmpfs,
        f"Size of the tmpfs that pip installs into and unpacks in ({PACKAGES_DIR}, the one "
        "writable place where files may be run or loaded as code: compiled extensions); "
        "'auto': memory/4.",
    )
    mounts: tuple[Mount, ...] = option(
        (), parse_mounts, "Bind mounts HOST:CONTAINER[:ro|rw]; read-only unless ':rw'."
    )
    mount_cwd: str = option(
        "off",
        parse_choice(("off", "ro", "rw")),
        "Mount the kernel's working directory (the notebook's folder) as the work dir: off/ro/rw.",
    )
    env: dict[str, str] = option({}, parse_env, "Environment variables given to the kernel.")
    runtime: str = option(
        "", parse_runtime, "OCI runtime, e.g. 'runsc' for gVisor; empty: the engine's default."
    )
    launch_timeout: float = option(
        60.0, parse_seconds, "Seconds to wait for the kernel to come up."
    )
    kernel_cmd: tuple[str, ...] = option(
        DEFAULT_KERNEL_CMD,
        parse_argv,
        "The kernel's command inside the container; {connection_file} is replaced.",
    )
    standby: int = option(
        1,
        parse_standby,
        "Kernels kept started and idle for this configuration in the client's process, each handed "
        "whole to one launch (then replaced); 0: off.",
    )
    max_kernels: int | None = option(
        UNLIMITED,
        parse_max_kernels,
        "Docker kernels the client's process may run at once, standbys included; past it "
        "a launch waits up to launch_timeout for one to end. 'unlimited': no limit.",
    )
    max_memory: int | None = option(
        UNLIMITED,
        parse_max_memory,
        "Sum of the memory limits of the Docker kernels the client's process may run at once, "
        "standbys included (e.g. 8g); past it a launch waits as for max_kernels. 'unlimited': no "
        "limit.",
    )
    checkpoint_on_oom: bool = option(
        False,
        parse_flag,
        "After the kernel runs out of memory and is restarted, its first cell says that the "
        "checkpoint made with %checkpoint is kept, for %restore.",
    )

    suspend_after: float | None = option(
        UNLIMITED,
        parse_orphan_seconds,
        "Seconds of idleness (no client request, no running cell, no open widget) after which the "
        "launcher checkpoints the kernel, removes its container and wakes it, with its variables, "
        "in a new container at the next request; 'unlimited' (the execution API's default): "
        "never. The kernelspecs install writes 1800.",
    )

    def __post_init__(self) -> None:
        """The options that must hold together: the tmpfs sizes (/dev/shm's too) fit in memory,
        one mount of the work directory (and :class:`BackendSettings`'s)."""
        super().__post_init__()
        if self.runtime == "runsc" and self.memory is not None and self.memory < 2 * RUNSC_OVERHEAD:
            raise ConfigError(
                f"memory={self.memory // MiB}m is too little under runtime='runsc': gVisor's own "
                f"runtime holds about {RUNSC_OVERHEAD // MiB}m of it; give at least "
                f"{2 * RUNSC_OVERHEAD // MiB}m"
            )
        sizes = self.tmpfs_sizes()
        budget = self.tmpfs_budget
        if self.memory is not None and budget is not None and sum(sizes.values()) > budget * 3 / 4:
            used = " + ".join(f"{name} {size // MiB}m" for name, size in sizes.items())
            of = f"memory={self.memory // MiB}m" + (
                f" less gVisor's {RUNSC_OVERHEAD // MiB}m" if budget != self.memory else ""
            )
            raise ConfigError(
                f"{used} must fit in 3/4 of {of}, so that a full disk is ENOSPC and not an "
                "out-of-memory kill: raise memory or lower the sizes"
            )
        if self.max_memory is not None and (self.memory is None or self.memory > self.max_memory):
            asked = UNLIMITED if self.memory is None else f"{self.memory // MiB}m"
            raise ConfigError(
                f"memory={asked!r} does not fit in max_memory={self.max_memory // MiB}m: give "
                "every kernel a memory limit no larger than max_memory, or set max_memory to "
                "'unlimited'"
            )
        if self.secrets and self.network is True:
            raise ConfigError(
                "secrets need the filtering proxy, which network=true bypasses: give network a "
                "list of destinations (or false: the secrets' hosts are allowed anyway)"
            )
        if self.mount_cwd != "off" and any(mount.target == WORK_DIR for mount in self.mounts):
            raise ConfigError(
                f"mount_cwd={self.mount_cwd!r} and mounts both mount the work directory {WORK_DIR}"
            )

    def tmpfs_sizes(self) -> dict[str, int]:
        """The size in bytes of each writable tmpfs (``tmp_size``, ``shm_size``, ``home_size``,
        ``work_size``, ``packages_size``)."""
        sizes = {}
        budget = self.tmpfs_budget
        for name, share in TMPFS_SHARE.items():
            size = getattr(self, name)
            if size is None:
                size = int(budget * share) if budget is not None else TMPFS_FALLBACK[name]
            if name == "work_size" and self.work_mounted:
                continue
            sizes[name] = size
        return sizes

    @property
    def tmpfs_budget(self) -> int | None:
        """The memory the tmpfs shares count from: ``memory``, less :data:`RUNSC_OVERHEAD` under
        gVisor (None: unlimited)."""
        if self.memory is None:
            return None
        return self.memory - RUNSC_OVERHEAD if self.runtime == "runsc" else self.memory

    @property
    def work_mounted(self) -> bool:
        """True when a bind mount (or ``mount_cwd``) takes the place of the work directory's
        tmpfs."""
        return self.mount_cwd != "off" or any(mount.target == WORK_DIR for mount in self.mounts)

    def to_config(self) -> dict[str, Any]:
        """The settings as JSON-ready config that :meth:`from_config` reads back to equal
        settings."""
        config = super().to_config()
        config["mounts"] = [str(mount) for mount in self.mounts]
        config["uid_range"] = "{}-{}".format(*self.uid_range)
        for name in TMPFS_SHARE:
            if config[name] is None:
                config[name] = "auto"
        return config


OPTIONS: dict[str, dataclasses.Field[Any]] = DockerSettings.options()
"""Every option of the Docker backend, by name (:meth:`BackendSettings.options`)."""
