"""Fixtures shared by every test: a reachable Docker engine, the kernel image, installed kernelspecs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_sandbox.containers import (
    DEFAULT_IMAGE,
    OURS,
    EngineUnavailable,
    ImageMissing,
    docker_client,
    is_orphan,
    require_image,
)
from kernel_sandbox.kernelspecs import install

IN_CI = bool(os.environ.get("CI"))


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI must run the Docker tests: .ci/run starts the engine and builds the image)")
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
def jupyter_prefix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Jupyter data prefix holding the shipped kernelspecs, put first on JUPYTER_PATH."""
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    install("sandboxed-python", prefix=str(prefix))
    install("sandboxed-python", prefix=str(prefix), install_as="sandboxed-python-small",
            config={"memory": "128m", "pids_limit": 64})
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


@pytest.fixture(autouse=True)
def nothing_leaks(engine_if_any):
    """After every test, no kernel container may be left whose owner process has gone."""
    yield
    if engine_if_any is None:
        return
    containers = engine_if_any.containers.list(all=True, filters={"label": OURS}, ignore_removed=True)
    leaked = [c.name for c in containers if is_orphan(c)]
    for name in leaked:
        engine_if_any.containers.get(name).remove(force=True)
    assert not leaked, f"containers left behind by dead owners: {leaked}"
