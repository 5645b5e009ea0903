"""The ``docker`` backend: the Docker provisioner's kernelspec (the launcher runs the container)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from ..errors import NetworkDisabledError, SandboxError
from ..kernelspecs import DOCKER_SPEC, shipped_spec
from ..metrics import CgroupProbe, MetricsUnavailable
from ..execution.backend import Backend, LauncherRequest, given


def docker_config(options: dict[str, Any]) -> dict[str, Any]:
    """The Sandbox options as the Docker provisioner's config."""
    config = given(options)
    if "mounts" in config:
        config["mounts"] = list(config["mounts"])
    return config


class DockerBackend(Backend):
    """A kernel in a locked-down Docker container."""

    name = "docker"
    package_window = True
    pool_defaults = {"standby": 0}

    def check(self, options: dict[str, Any]) -> None:
        from .settings import DockerSettings

        DockerSettings.from_config(docker_config(options))

    def kernel_spec(self, options: dict[str, Any]) -> KernelSpec:
        return shipped_spec(DOCKER_SPEC, docker_config(options))

    @contextlib.asynccontextmanager
    async def index_window(
        self, provisioner: Any, request: LauncherRequest, seconds: float
    ) -> AsyncIterator[None]:
        """Open the index in the launcher's proxy (network off or a list) through a control request
        only this client can sign; the launcher closes it after ``seconds`` at the latest."""
        reply = await request({"open": seconds})
        if reply.get("status") != "ok":
            raise NetworkDisabledError(
                "Cannot install packages: the launcher did not open the package index "
                f"({reply.get('evalue', 'no answer')}). Set network=True, or list the index in "
                "network."
            )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(request({"close": reply["window"]}))

    async def image(self, provisioner: Any) -> tuple[str, str]:
        """The id of the kernel container's image, as the engine reports it, and the image
        option."""
        container_id = getattr(provisioner, "container_id", None)
        if not container_id:
            raise SandboxError("the kernel has no container (it is not running)")
        client = await asyncio.to_thread(provisioner.engine_client)
        found = await asyncio.to_thread(client.api.inspect_container, container_id)
        return str(found["Image"]), provisioner.settings().image

    def probe(self, provisioner: Any) -> CgroupProbe:
        """The cgroup of the kernel's container, found through the engine's inspect data."""
        container_id = getattr(provisioner, "container_id", None)
        if not container_id:
            raise MetricsUnavailable("the kernel has no container (it is not running)")
        return CgroupProbe.for_container(
            provisioner.engine_client().api.inspect_container(container_id)
        )

    def kill_now(self, provisioner: Any) -> None:
        """Remove the container first (the launcher may be too slow to), then the rest."""
        with contextlib.suppress(Exception):
            container_id = getattr(provisioner, "container_id", None)
            if container_id:
                from .containers import remove_container

                remove_container(provisioner.engine_client().containers.get(container_id))
        super().kill_now(provisioner)
