"""Kernel provisioner that runs each kernel in a fresh, locked-down Docker container.

The container is started by the launcher (:mod:`kernel_sandbox.launch`), the one code path that
sandboxes; this provisioner runs it as a local process
(:class:`~kernel_sandbox.provisioners.launched.LaunchedProvisioner`, shared with the OpenSandbox
provisioner) and adds the Docker side: the options, the mounts checked before the launch, and the
removal of a container whose launcher was killed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from jupyter_core.paths import is_hidden

from .containers import (
    LABEL,
    LABEL_KERNEL_ID,
    LABEL_LAUNCHER_PID,
    LABEL_OWNER_HOST,
    LABEL_PRIVATE_DIR,
    remove_container,
    remove_launcher_containers,
    resolve_mounts,
)
from .connect import docker_client
from ..errors import ConfigError, KernelLaunchError, KernelSandboxError
from ..backends import DOCKER_PROVISIONER
from ..privdir import CONFIG, LAUNCHER_LOCK, PrivateDir, sleeping
from .settings import DockerSettings
from ..provisioners.budget import Claim
from ..provisioners.launched import LaunchedProvisioner


class DockerProvisioner(LaunchedProvisioner):
    """Launch the kernel of a kernelspec in a new container on the local Docker engine.

    Every option of :class:`~kernel_sandbox.docker.settings.DockerSettings` is a traitlet here
    (``c.DockerProvisioner.memory = "2g"``) and a key of the kernelspec's provisioner config;
    they are checked together, and an unknown or bad one stops the launch with its name.
    """

    backend = DOCKER_PROVISIONER
    settings_model = DockerSettings
    # the trait made from the model's option (LaunchedProvisioner.__init_subclass__)
    launch_timeout: float
    engine: str

    def prepare(self, settings: DockerSettings, cwd: str | None) -> None:
        """The mounts' host paths must exist, and ``mount_cwd`` mount only a folder the server
        serves."""
        if settings.mount_cwd != "off" and cwd:
            check_served_cwd(settings.mount_cwd, cwd, getattr(self.parent, "parent", None))
        resolve_mounts(settings, cwd)

    async def standby_image(
        self, settings: DockerSettings, launcher_env: Mapping[str, str]
    ) -> str | None:
        """The id of the image standbys run now: a rebuilt image replaces them. None when it cannot
        be read."""
        try:
            return await asyncio.to_thread(
                _image_id, settings.image, _engine_env(launcher_env), settings.engine
            )
        except (
            KernelSandboxError,
            docker.errors.DockerException,
            requests.exceptions.RequestException,
        ):
            return None  # the cold start reports what is wrong

    def standby_context(self, settings: DockerSettings, cwd: str | None) -> Any:
        """The bind mounts, resolved: a standby serves every working directory that mounts the
        same."""
        return resolve_mounts(settings, cwd)

    def standby_cleanup(self, launcher_env: Mapping[str, str]) -> Callable[[dict[str, Any]], bool]:
        """Removes the container a standby's launcher left, on the launcher's engine."""
        return functools.partial(_remove_left, _engine_env(launcher_env))

    def budget_claim(self, settings: DockerSettings) -> Claim:
        """One kernel and its ``memory`` limit, under the settings' ``max_kernels`` and
        ``max_memory``."""
        return Claim(
            memory=settings.memory or 0,
            max_kernels=settings.max_kernels,
            max_memory=settings.max_memory,
        )

    def engine_client(self) -> docker.DockerClient:
        """A client of the engine that runs (or ran) this kernel's container: the one its
        launcher reached (it records it), else the ``engine`` option's."""
        return docker_client(engine=str(self.launcher_state.get("engine") or self.engine))

    @property
    def container_id(self) -> str | None:
        """The id of the kernel's container, once the launcher has made it."""
        return self.launcher_state.get("container_id")

    def check_orphan(self, state: dict[str, Any], private: PrivateDir) -> None:
        """The container the launcher recorded must be labelled as that launcher's, of that
        directory and kernel."""
        container_id, pid = state.get("container_id"), state.get("pid")
        if sleeping(private.path) and isinstance(pid, int) and private.held(LAUNCHER_LOCK):
            return  # asleep (suspend_after): no container, its launcher answers and wakes it
        if not isinstance(container_id, str) or not isinstance(pid, int):
            raise KernelLaunchError(
                f"{private.path}: the launcher recorded no container: nothing to re-attach to"
            )
        config = private.read_json(CONFIG)
        wanted = {
            LABEL: "true",
            LABEL_KERNEL_ID: str(config.get("kernel_id") if isinstance(config, dict) else None),
            LABEL_LAUNCHER_PID: str(pid),
            LABEL_PRIVATE_DIR: str(private.path),
            LABEL_OWNER_HOST: socket.gethostname(),
        }
        engine = str(state.get("engine") or self.engine)
        try:
            container = docker_client(engine=engine).containers.get(container_id)
        except docker.errors.NotFound:
            raise KernelLaunchError(
                f"{private.path}: its container {container_id[:12]} is gone"
            ) from None
        except (
            KernelSandboxError,
            docker.errors.DockerException,
            requests.exceptions.RequestException,
        ) as exc:
            raise KernelLaunchError(f"{private.path}: cannot look at its container: {exc}") from exc
        wrong = sorted(
            name for name, value in wanted.items() if container.labels.get(name) != value
        )
        if wrong:
            raise KernelLaunchError(
                f"{private.path}: container {container_id[:12]} is not this kernel's "
                f"({', '.join(wrong)} differ): refusing to re-attach to it"
            )

    async def remove_leftover(self, state: dict[str, Any]) -> None:
        """Remove the container of a launcher that could not (it was killed), by its id or its
        labels."""
        engine = str(state.get("engine") or self.engine)
        if state.get("container_id"):
            await asyncio.to_thread(_remove_quietly, state["container_id"], engine, self.log)
        if state.get("pid"):
            await asyncio.to_thread(
                _remove_launchers, self.kernel_id, int(state["pid"]), engine, self.log
            )

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The launch already waits for the kernel; allow for the container's start."""
        return max(recommended, float(self.launch_timeout))


def check_served_cwd(mode: str, cwd: str, kernel_managers: Any) -> None:
    """Raise ConfigError when a Jupyter server's kernel would mount (``mount_cwd``) a folder it does
    not serve.

    A page of the server chooses the kernel's working directory (``path`` of ``POST /api/kernels``),
    and jupyter_server keeps it neither inside its ``root_dir`` nor out of hidden folders. So a
    working directory outside the root (symlinks followed) or hidden in it (unless the server's
    contents manager has ``allow_hidden``) is refused. Without a server (``kernel_managers`` has no
    ``root_dir``: nbclient, your program) the caller chose the directory itself, and it is mounted.
    """
    root = getattr(kernel_managers, "root_dir", None)
    if not isinstance(root, str) or not root:
        return
    literal, real = Path(os.path.normpath(os.path.abspath(cwd))), Path(cwd).resolve()
    root_literal, root_real = Path(os.path.normpath(os.path.abspath(root))), Path(root).resolve()
    refuse = f"mount_cwd={mode!r}: the kernel's working directory {literal}"
    fix = (
        f"open the notebook from a visible folder inside {root_literal}, or set mount_cwd to 'off'"
    )
    if not (literal.is_relative_to(root_literal) and real.is_relative_to(root_real)):
        raise ConfigError(
            f"{refuse} is outside the Jupyter server's root {root_literal}, so it is not mounted: "
            f"{fix}"
        )
    contents = getattr(getattr(kernel_managers, "parent", None), "contents_manager", None)
    if not getattr(contents, "allow_hidden", False) and (
        is_hidden(str(literal), str(root_literal)) or is_hidden(str(real), str(root_real))
    ):
        raise ConfigError(
            f"{refuse} is hidden (a name starting with '.') in the Jupyter server's root, which "
            f"the server does not serve (ContentsManager.allow_hidden), so it is not mounted: {fix}"
        )


def _engine_env(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((name, value) for name, value in environ.items() if name.startswith("DOCKER_"))
    )


@functools.lru_cache(maxsize=4)
def _engine(environment: tuple[tuple[str, str], ...], engine: str) -> docker.DockerClient:
    return docker_client(environment=dict(environment), engine=engine)


def _image_id(image: str, environment: tuple[tuple[str, str], ...], engine: str) -> str:
    return str(_engine(environment, engine).images.get(image).id)


def _remove_left(environment: tuple[tuple[str, str], ...], state: dict[str, Any]) -> bool:
    """Remove the container named in a launcher's state; False when the engine cannot be asked
    now."""
    if not state.get("container_id"):
        return True
    try:
        client = docker_client(10, dict(environment), str(state.get("engine") or "auto"))
        remove_container(client.containers.get(state["container_id"]))
    except docker.errors.NotFound:
        return True
    except (
        KernelSandboxError,
        docker.errors.DockerException,
        requests.exceptions.RequestException,
    ):
        return False
    return True


def _remove_launchers(kernel_id: str, launcher_pid: int, engine: str, log: Any) -> None:
    """Remove the containers a launcher made for ``kernel_id`` (it may have been killed before it
    recorded one)."""
    try:
        remove_launcher_containers(docker_client(engine=engine), kernel_id, launcher_pid)
    except (KernelSandboxError, docker.errors.DockerException) as exc:
        log.warning("could not remove the containers of kernel %s: %s", kernel_id, exc)


def _remove_quietly(container_id: str, engine: str, log: Any) -> None:
    """Remove a container whose launcher could not (it was killed); one already gone is fine."""
    try:
        remove_container(docker_client(engine=engine).containers.get(container_id))
    except docker.errors.NotFound:
        return
    except (KernelSandboxError, docker.errors.DockerException) as exc:
        log.warning("could not remove the kernel's container %s: %s", container_id[:12], exc)
