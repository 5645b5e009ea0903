"""The ``opensandbox`` backend: the OpenSandbox provisioner's kernelspec (limits as Kubernetes
quantities)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from ..egress import opensandbox_rules
from ..errors import ConfigError, NetworkDisabledError, OpenSandboxError, SandboxError
from ..kernelspecs import OPENSANDBOX_SPEC, shipped_spec
from ..execution.backend import Backend, LauncherRequest, given

log = logging.getLogger(__name__)


def _k8s_memory(size: str) -> str:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", size.lower())
    if not match:
        raise ConfigError(f"memory={size!r}: use a size such as 512m or 2g")
    number, unit = match.groups()
    return f"{number}{unit.upper()}i" if unit else number


def opensandbox_config(options: dict[str, Any]) -> dict[str, Any]:
    """The Sandbox options as the OpenSandbox provisioner's config (limits as Kubernetes
    quantities)."""
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
    """A kernel in an OpenSandbox sandbox; its sandbox expires by itself when the launcher is
    gone."""

    name = "opensandbox"
    comms_known = False  # the launcher's execd relay has no comms; the websocket mode has
    package_window = True

    def speaks_comms(self, kernel_info: dict[str, Any]) -> bool:
        # the execd relay's kernel_info names it; the websocket mode's kernel does not
        from .relay import IMPLEMENTATION

        return kernel_info.get("implementation") != IMPLEMENTATION

    def check(self, options: dict[str, Any]) -> None:
        from .settings import OpenSandboxSettings

        OpenSandboxSettings.from_config(opensandbox_config(options))

    def kernel_spec(self, options: dict[str, Any]) -> KernelSpec:
        return shipped_spec(OPENSANDBOX_SPEC, opensandbox_config(options))

    @staticmethod
    def _client(provisioner: Any) -> Any:
        """A lifecycle client with the kernel's settings (the API key stays on the host)."""
        from .lifecycle import OpenSandboxClient

        settings = provisioner.settings()
        return OpenSandboxClient(
            settings.api_base,
            settings.api_key,
            limits=settings.limits,
            poll_interval=min(settings.poll_interval, 0.5),
            ready_timeout=settings.ready_timeout,
        )

    @staticmethod
    def _sandbox_id(provisioner: Any) -> str:
        sandbox_id = provisioner.sandbox_id
        if not sandbox_id:
            raise SandboxError("the kernel's sandbox is not known yet; start the sandbox first")
        return str(sandbox_id)

    async def pause(self, provisioner: Any, paused: bool) -> None:
        """Pause or resume the kernel's sandbox on the server and wait until it is Paused or
        Running."""
        sandbox_id = self._sandbox_id(provisioner)
        async with self._client(provisioner) as client:
            await (client.pause(sandbox_id) if paused else client.resume(sandbox_id))

    @contextlib.asynccontextmanager
    async def index_window(
        self, provisioner: Any, request: LauncherRequest, seconds: float
    ) -> AsyncIterator[None]:
        """Add ``package_index`` allow rules to the sandbox's egress policy (``PUT /networkpolicy``,
        by the host's lifecycle client) and put the policy read before back when the block ends.

        A sandbox created without a policy has open egress: nothing to do. ``seconds`` is not
        enforced by the server: the restore runs in a ``finally`` (error, timeout, cancel).
        """
        settings = provisioner.settings()
        if settings.egress["allow_internet"]:  # created without a networkPolicy: egress is open
            yield
            return
        sandbox_id = self._sandbox_id(provisioner)
        rules = opensandbox_rules("package_index", settings.package_index)
        async with self._client(provisioner) as client:
            try:
                before = await client.network_policy(sandbox_id)
            except OpenSandboxError as exc:
                raise _no_window(exc) from exc
            targets = {rule["target"] for rule in rules}
            opened = {
                **before,
                "egress": rules + [r for r in before["egress"] if r["target"] not in targets],
            }
            finished = False
            try:
                try:
                    await client.replace_network_policy(sandbox_id, opened)
                except OpenSandboxError as exc:
                    raise _no_window(exc) from exc
                yield
                finished = True
            finally:
                try:
                    await asyncio.shield(client.replace_network_policy(sandbox_id, before))
                except Exception as exc:
                    log.error(
                        "sandbox %s: could not put its egress policy back after install(): %s",
                        sandbox_id,
                        exc,
                    )
                    if finished:
                        raise SandboxError(
                            f"The package index could not be closed again on sandbox {sandbox_id} "
                            f"({exc}): it may still reach package_index; close the sandbox."
                        ) from exc


def _no_window(exc: BaseException) -> NetworkDisabledError:
    return NetworkDisabledError(
        "Cannot install packages: the OpenSandbox server could not open package_index for this "
        f"call through the sandbox's /networkpolicy API ({exc}). Create the sandbox with the index "
        "in network (network=['pypi.org', 'files.pythonhosted.org']), give a network_policy that "
        "allows it, or network=True."
    )
