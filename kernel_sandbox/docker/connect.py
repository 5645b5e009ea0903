"""Connections to the container engine: a client of Docker or of Podman's compatible API, where
each is expected, and whether the kernel image is there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import docker
import docker.errors
import requests.exceptions

from ..errors import EngineUnavailable, ImageMissing

API_TIMEOUT = 30
"""Seconds any single Docker API call may take before it fails (streams have no such limit)."""


PODMAN_ROOT_SOCKET = "/run/podman/podman.sock"
"""Where root's Podman API socket is (``podman system service``, or ``podman.socket``)."""
PODMAN_API = "v4.0.0"
"""The version of Podman's own API asked (Podman 4 and 5 serve it)."""
ENGINE_FIX = (
    "start the engine: `sudo systemctl start docker`; without systemd: `sudo dockerd &`; not "
    "installed: `sudo apt-get install docker.io` (Debian/Ubuntu) or see "
    "https://docs.docker.com/engine/install/; as root on Debian/Ubuntu, `kernel-sandbox setup "
    "--install-engine` does both; a remote engine: export DOCKER_HOST"
)
SOCKET_FIX = (
    "let your user use the engine: `sudo usermod -aG docker $USER`, then log in again "
    "(the docker group is root-equivalent on this host); or run the command with sudo"
)


def engine_fix(error: Exception) -> str:
    """The fix for an unreachable engine: the docker group when the socket refused us, else starting
    it."""
    return SOCKET_FIX if "Permission denied" in str(error) else ENGINE_FIX


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
