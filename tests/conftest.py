"""Fixtures shared by every test: a reachable Docker engine, the kernel image, installed kernelspecs."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import launcher_hooks

from kernel_sandbox.docker.containers import LABEL_OWNER_PID, OURS, is_orphan, remove_container
from kernel_sandbox.docker.settings import DEFAULT_IMAGE
from kernel_sandbox.errors import EngineUnavailable, ImageMissing
from kernel_sandbox.docker.connect import docker_client, require_image
from kernel_sandbox.kernelspecs import install
from kernel_sandbox.docker.containers import kernel_of
from kernel_sandbox.provisioners.standby import CLOSE_WAIT, POOL

IN_CI = bool(os.environ.get("CI"))

pytest_plugins = ["support.security_figures", "support.ci_strict", "support.schedule", "pytester"]


# The tiers, set here alone from what a test needs (its fixtures, as pytest resolved them) and where it
# lives: `pytest -m unit` is the fast loop, which needs no engine, no browser and no server.
TIERS = {
    "opensandbox": {"opensandbox_deployment"},
    "browser": {"browser", "chromium"},
    "docker": {"docker_engine"},
    "podman": {"podman_engine"},
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier: load (tests/load/), opensandbox, browser, docker, podman, else
    unit (a test that takes its engine by a parameter carries the engine's mark on that parameter).

    The ``fresh_machine`` tier (a container playing a fresh machine, whose apt and pip reach the
    package registries) runs only when asked for by name, ``-m fresh_machine``: every other test
    sends traffic to loopback alone.
    """
    if "fresh_machine" not in (config.option.markexpr or ""):
        fresh = [item for item in items if item.get_closest_marker("fresh_machine")]
        if fresh:
            config.hook.pytest_deselected(items=fresh)
            items[:] = [item for item in items if item not in fresh]
    for item in items:
        needs = set(getattr(item, "fixturenames", ()))
        tiers = [tier for tier, fixtures in TIERS.items() if needs & fixtures]
        if item.path.parent.name == "load":
            tiers.append("load")
        if item.get_closest_marker("docker") or item.get_closest_marker("opensandbox_server"):
            tiers.append("docker")
        if item.get_closest_marker("podman"):  # an engine chosen by a parameter's mark
            tiers.append("podman")
        for tier in dict.fromkeys(tiers) or ["unit"]:
            item.add_marker(tier)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI must run the Docker and Podman tests: .ci/run starts the engines and builds the image)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine():
    """A Docker client for a reachable engine with the kernel image; skips outside CI when absent."""
    try:
        client = docker_client()
    except EngineUnavailable:
        _unavailable("no Docker engine")
    try:
        require_image(client, DEFAULT_IMAGE)
    except ImageMissing:
        _unavailable(f"kernel image {DEFAULT_IMAGE} not built (`kernel-sandbox image build`)")
    return client


@pytest.fixture(scope="session")
def podman_engine():
    """A client of Podman's API socket (root's, or this user's) with the kernel image; skips outside CI
    when absent (.ci/run installs Podman, loads the image into its store and starts the socket)."""
    try:
        client = docker_client(engine="podman")
    except EngineUnavailable as exc:
        _unavailable(f"no Podman API socket ({exc})")
    try:
        require_image(client, DEFAULT_IMAGE)
    except ImageMissing:
        _unavailable(f"kernel image {DEFAULT_IMAGE} not in Podman's store (`kernel-sandbox image build --engine podman`)")
    return client


@pytest.fixture(scope="session")
def jupyter_prefix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Jupyter data prefix holding the shipped kernelspecs, put first on JUPYTER_PATH."""
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    install("sandboxed-python", prefix=str(prefix))
    install("sandboxed-python", prefix=str(prefix), install_as="sandboxed-python-small",
            config={"memory": "128m", "pids_limit": 64})
    install("sandboxed-python-opensandbox", prefix=str(prefix))
    old = os.environ.get("JUPYTER_PATH")
    data_dir = prefix / "share" / "jupyter"
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(data_dir), old]))
    yield data_dir
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old


@pytest.fixture(scope="session")
def engine_if_any():
    """A Docker client when an engine is reachable, else None (for checks that need no skip)."""
    try:
        return docker_client()
    except EngineUnavailable:
        return None


@pytest.fixture(scope="session")
def podman_if_any():
    """A client of Podman's API socket when it answers, else None (the leak checks look there too)."""
    try:
        return docker_client(engine="podman")
    except EngineUnavailable:
        return None


@pytest.fixture(autouse=True)
def nothing_leaks(engine_if_any, podman_if_any):
    """After every test, none of this process's kernel containers may be left stopped, on Docker or Podman.

    Only containers labelled with this process as their owner are looked at: other users of the
    engine (another test run, a notebook server) keep theirs, running or stopped.
    """
    yield
    mine = {"label": [*OURS, f"{LABEL_OWNER_PID}={os.getpid()}"]}
    engines = [engine for engine in (engine_if_any, podman_if_any) if engine is not None]
    containers = [c for engine in engines for c in engine.containers.list(all=True, filters=mine, ignore_removed=True)]
    leaked = [c.name for c in containers if is_orphan(c)]
    for container in containers:
        if container.name in leaked:
            remove_container(container)
    assert not leaked, f"containers of this test process left behind stopped: {leaked}"


@pytest.fixture(scope="session", autouse=True)
def no_standby_outlives_the_run(engine_if_any, podman_if_any):
    """At the end of the run, this process's standby kernels (``standby`` defaults to 1) go as at its exit.

    ``POOL.clear(CLOSE_WAIT)`` is what :mod:`atexit` runs (``close()``, which also starts no more):
    it stops every standby and waits for its container.
    """
    yield
    POOL.clear(CLOSE_WAIT)
    mine = {"label": [*OURS, f"{LABEL_OWNER_PID}={os.getpid()}"]}
    engines = [engine for engine in (engine_if_any, podman_if_any) if engine is not None]
    containers = [c for engine in engines for c in engine.containers.list(all=True, filters=mine, ignore_removed=True)]
    idle = [c for c in containers if kernel_of(c.labels) is None]
    for container in idle:
        remove_container(container)
    assert not idle, f"standby kernels left behind after the pool was cleared: {[c.name for c in idle]}"


GUARD = pytest.StashKey[contextlib.ExitStack]()


def pytest_configure(config: pytest.Config) -> None:
    """Every launcher of the run resolves names from a test map (empty: nothing resolves) and its
    egress proxy connects to 127.0.0.0/8 only (tests/support/launcher_hooks.py): no test can make
    it send a packet elsewhere, or ask DNS. Set up once, by the process that starts the workers;
    tests with names to resolve set their own map (tests/support/package_index.py)."""
    if hasattr(config, "workerinput"):
        return
    stack = config.stash[GUARD] = contextlib.ExitStack()
    resolver = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "resolver.json"
    resolver.write_text("{}")
    resolver.chmod(0o600)
    stack.enter_context(launcher_hooks.installed(resolver))


def pytest_unconfigure(config: pytest.Config) -> None:
    if GUARD in config.stash:
        config.stash[GUARD].close()


@pytest.fixture(scope="session", autouse=True)
def egress_stays_on_loopback() -> Iterator[None]:
    """Fails the session if a launcher tried to connect outside 127.0.0.0/8."""
    resolver = os.environ[launcher_hooks.TEST_RESOLVER_ENV]
    yield
    assert not Path(resolver + ".guard").exists(), "a launcher tried to connect outside 127.0.0.0/8"
