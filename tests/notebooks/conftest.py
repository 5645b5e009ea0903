"""Fixtures for the notebook, CLI and JupyterLab tests: a JupyterLab server with Docker kernels, Chromium."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from ipykernel.kernelspec import get_kernel_dict

from kernel_sandbox.kernelspecs import install

from support.lab import LabServer, chromium, jupyterlab, remove_kernels_of


@pytest.fixture(scope="session")
def lab_server(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab (see support.lab.jupyterlab) with Sandboxed Python, a small variant of it, one with the output policy
    `trusted`, and a plain local kernel (Local Python, this interpreter's ipykernel) installed."""
    base = tmp_path_factory.mktemp("lab")
    prefix = base / "prefix"
    install("sandboxed-python", prefix=str(prefix))
    install("sandboxed-python", prefix=str(prefix), install_as="sandboxed-python-small",
            display_name="Sandboxed Python (small)", config={"memory": "256m", "pids_limit": 64})
    # its outputs reach the page whole (Styler colours, script): kernel-sandbox-frame alone stands between
    install("sandboxed-python", prefix=str(prefix), install_as="sandboxed-python-trusted",
            display_name="Sandboxed Python (trusted)", config={"output_policy": "trusted"})
    local = prefix / "share" / "jupyter" / "kernels" / "local-python"
    local.mkdir(parents=True)
    (local / "kernel.json").write_text(json.dumps({**get_kernel_dict(), "display_name": "Local Python"}))
    with jupyterlab(base, prefix / "share" / "jupyter", "jupyterlab-server.log") as server:
        yield server
    left = remove_kernels_of(docker_engine, server.process.pid)
    assert not left, f"JupyterLab left {len(left)} kernel container(s) behind after it shut down"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (support.lab.chromium), one per test module."""
    with chromium() as browser:
        yield browser
