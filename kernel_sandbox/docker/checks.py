"""Checks that the engine can enforce the kernel's settings before its container exists, and that
it applied them once it does (Docker's HostConfig, or Podman's container read from its init
process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker

from ..errors import ConfigError
from .connect import PODMAN_API
from .settings import DockerSettings


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
