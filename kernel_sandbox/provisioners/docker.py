"""Kernel provisioner that runs each kernel in a fresh, locked-down Docker container.

The container is started by the launcher (:mod:`kernel_sandbox.launch`), the one code path that
sandboxes; this provisioner runs it as a local process (:class:`~.launched.LaunchedProvisioner`,
shared with the OpenSandbox provisioner) and adds the Docker side: the options, the mounts
checked before the launch, and the removal of a container whose launcher was killed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import docker.errors

from ..containers import docker_client, remove_container, resolve_mounts
from ..errors import KernelSandboxError
from ..kernelspecs import DOCKER_PROVISIONER
from ..policy import output_policy_trait
from ..settings import OPTIONS, DockerSettings
from .launched import LaunchedProvisioner, option_trait


class DockerProvisioner(LaunchedProvisioner):
    """Launch the kernel of a kernelspec in a new container on the local Docker engine.

    Every option of :class:`~kernel_sandbox.settings.DockerSettings` is a traitlet here
    (``c.DockerProvisioner.memory = "2g"``) and a key of the kernelspec's provisioner config;
    they are checked together, and an unknown or bad one stops the launch with its name.
    """

    backend = DOCKER_PROVISIONER
    backend_title = "the Docker backend"
    options = OPTIONS

    image = option_trait(OPTIONS["image"])
    network = option_trait(OPTIONS["network"])
    memory = option_trait(OPTIONS["memory"])
    cpus = option_trait(OPTIONS["cpus"])
    pids_limit = option_trait(OPTIONS["pids_limit"])
    user = option_trait(OPTIONS["user"])
    uid_range = option_trait(OPTIONS["uid_range"])
    read_only = option_trait(OPTIONS["read_only"])
    tmp_size = option_trait(OPTIONS["tmp_size"])
    home_size = option_trait(OPTIONS["home_size"])
    work_size = option_trait(OPTIONS["work_size"])
    mounts = option_trait(OPTIONS["mounts"])
    mount_cwd = option_trait(OPTIONS["mount_cwd"])
    env = option_trait(OPTIONS["env"])
    runtime = option_trait(OPTIONS["runtime"])
    launch_timeout = option_trait(OPTIONS["launch_timeout"])
    orphan_timeout = option_trait(OPTIONS["orphan_timeout"])
    kernel_cmd = option_trait(OPTIONS["kernel_cmd"])
    output_policy = output_policy_trait()
    allow_mime_types = option_trait(OPTIONS["allow_mime_types"])
    allow_widget_modules = option_trait(OPTIONS["allow_widget_modules"])

    def settings(self) -> DockerSettings:
        """The effective settings: traitlets configuration and kernel.json, checked."""
        return DockerSettings.from_config({name: getattr(self, name) for name in OPTIONS})

    def prepare(self, settings: DockerSettings, cwd: str | None) -> None:
        """The mounts' host paths must exist before the launcher starts."""
        resolve_mounts(settings, cwd)

    @property
    def container_id(self) -> str | None:
        """The id of the kernel's container, once the launcher has made it."""
        return self.launcher_state.get("container_id")

    async def remove_leftover(self, state: dict[str, Any]) -> None:
        """Remove the container of a launcher that could not (it was killed)."""
        if state.get("container_id"):
            await asyncio.to_thread(_remove_quietly, state["container_id"], self.log)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The launch already waits for the kernel; allow for the container's start."""
        return max(recommended, float(self.launch_timeout))


def _remove_quietly(container_id: str, log: Any) -> None:
    """Remove a container whose launcher could not (it was killed); one already gone is fine."""
    try:
        remove_container(docker_client().containers.get(container_id))
    except docker.errors.NotFound:
        return
    except (KernelSandboxError, docker.errors.DockerException) as exc:
        log.warning("could not remove the kernel's container %s: %s", container_id[:12], exc)
