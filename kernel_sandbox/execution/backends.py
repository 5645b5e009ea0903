"""Backend name → an in-memory kernelspec selecting the right provisioner, and its manager."""

from __future__ import annotations

import re
import sys
from typing import Any

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from ..kernelspecs import DOCKER_SPEC, OPENSANDBOX_SPEC, kernel_manager as spec_manager, shipped_spec

BACKENDS = ("docker", "opensandbox", "local")
KERNEL_NAME = "kernel-sandbox-execution"
IPYKERNEL_ARGV = ["-m", "ipykernel_launcher", "-f", "{connection_file}"]


def _k8s_memory(size: str) -> str:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", size.lower())
    if not match:
        raise ValueError(f"memory={size!r}: use a size such as 512m or 2g")
    number, unit = match.groups()
    return f"{number}{unit.upper()}i" if unit else number


def _docker_config(options: dict[str, Any]) -> dict[str, Any]:
    config = {key: value for key, value in options.items() if value is not None}
    if "mounts" in config:
        config["mounts"] = list(config["mounts"])
    return config


def check_options(backend: str, options: dict[str, Any]) -> None:
    """Refuse options of ``backend`` that are unknown or out of range (ConfigError naming the option)."""
    if backend == "docker":
        from ..settings import DockerSettings

        DockerSettings.from_config(_docker_config(options))
    elif backend == "opensandbox":
        from ..opensandbox.settings import OpenSandboxSettings

        OpenSandboxSettings.from_config(_opensandbox_config(options))


def _opensandbox_config(options: dict[str, Any]) -> dict[str, Any]:
    """The Sandbox options as the OpenSandbox provisioner's config (limits as Kubernetes quantities)."""
    config = {key: value for key, value in options.items() if value is not None}
    if config.pop("mounts", None):
        raise ValueError("The opensandbox backend does not take mounts; upload files instead")
    limits = {}
    if "memory" in config:
        limits["memory"] = _k8s_memory(str(config.pop("memory")))
    if "cpus" in config:
        limits["cpu"] = str(config.pop("cpus"))
    config.pop("pids_limit", None)
    if limits:
        config["resource_limits"] = limits
    if "network" in config:
        config["allow_internet"] = bool(config.pop("network"))
    if "launch_timeout" in config:
        config["ready_timeout"] = config.pop("launch_timeout")
    return config


def kernel_spec(backend: str, options: dict[str, Any]) -> KernelSpec:
    """Build the kernelspec for ``backend`` with the sandbox ``options`` mapped onto its provisioner."""
    if backend == "docker":
        return shipped_spec(DOCKER_SPEC, _docker_config(options))
    if backend == "opensandbox":
        return shipped_spec(OPENSANDBOX_SPEC, _opensandbox_config(options))
    options = {key: value for key, value in options.items() if value is not None}
    if backend == "local":
        return KernelSpec(
            argv=[sys.executable, *IPYKERNEL_ARGV],
            display_name="Python (local, not sandboxed)",
            language="python",
            interrupt_mode="signal",
            env=dict(options.get("env") or {}),
        )
    raise ValueError(f"Unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def kernel_manager(spec: KernelSpec) -> AsyncKernelManager:
    """An AsyncKernelManager that launches ``spec``."""
    return spec_manager(KERNEL_NAME, spec=spec)
