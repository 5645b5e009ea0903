"""The ``opensandbox`` backend: the OpenSandbox provisioner's kernelspec (limits as Kubernetes quantities)."""

from __future__ import annotations

import re
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from ...errors import ConfigError, SandboxError
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

    async def pause(self, provisioner: Any, paused: bool) -> None:
        """Pause or resume the kernel's sandbox on the server and wait until it is Paused or Running."""
        from ...opensandbox.client import OpenSandboxClient

        sandbox_id = provisioner.sandbox_id
        if not sandbox_id:
            raise SandboxError("the kernel's sandbox is not known yet; start the sandbox first")
        settings = provisioner.settings()
        async with OpenSandboxClient(
            settings.api_base, settings.api_key, limits=settings.limits,
            poll_interval=min(settings.poll_interval, 0.5), ready_timeout=settings.ready_timeout,
        ) as client:
            await (client.pause(sandbox_id) if paused else client.resume(sandbox_id))
