"""The ``opensandbox`` backend: the OpenSandbox provisioner's kernelspec (limits as Kubernetes quantities)."""

from __future__ import annotations

import re
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from ...errors import ConfigError
from ...kernelspecs import OPENSANDBOX_SPEC, shipped_spec
from . import Backend, given


def _k8s_memory(size: str) -> str:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", size.lower())
    if not match:
        raise ConfigError(f"memory={size!r}: use a size such as 512m or 2g")
    number, unit = match.groups()
    return f"{number}{unit.upper()}i" if unit else number


def opensandbox_config(options: dict[str, Any]) -> dict[str, Any]:
    """The Sandbox options as the OpenSandbox provisioner's config (limits as Kubernetes quantities)."""
    config = given(options)
    if config.pop("mounts", None):
        raise ConfigError("The opensandbox backend does not take mounts; upload files instead")
    limits = {}
    if "memory" in config:
        limits["memory"] = _k8s_memory(str(config.pop("memory")))
    if "cpus" in config:
        limits["cpu"] = str(config.pop("cpus"))
    config.pop("pids_limit", None)
    if limits:
        config["resource_limits"] = limits
    if "launch_timeout" in config:
        config["ready_timeout"] = config.pop("launch_timeout")
    return config


class OpenSandboxBackend(Backend):
    """A kernel in an OpenSandbox sandbox; its sandbox expires by itself when the launcher is gone."""

    name = "opensandbox"
    comms_known = False  # the launcher's execd relay has no comms; the websocket mode has

    def check(self, options: dict[str, Any]) -> None:
        from ...opensandbox.settings import OpenSandboxSettings

        OpenSandboxSettings.from_config(opensandbox_config(options))

    def kernel_spec(self, options: dict[str, Any]) -> KernelSpec:
        return shipped_spec(OPENSANDBOX_SPEC, opensandbox_config(options))
