"""Fixtures for the notebook, CLI and JupyterLab tests: a repo-relative layout and a Jupyter server."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kernel_sandbox.containers import LABEL, LABEL_OWNER_PID, remove_container
from kernel_sandbox.kernelspecs import install

from nb_helpers import ARTIFACTS, free_port


@dataclass
class LabServer:
    """A JupyterLab server on 127.0.0.1, its token and process."""

    url: str
    token: str
    process: subprocess.Popen[bytes]
    root_dir: Path
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}


@pytest.fixture(scope="session")
def lab_server(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab on a random port of 127.0.0.1 with a token, seeing only our kernelspecs.

    Its config, data, runtime and settings directories are temporary, so the user's own
    Jupyter set-up neither leaks in nor gets touched; news and update checks are off.
    """
    base = tmp_path_factory.mktemp("lab")
    prefix = base / "prefix"
    install("sandboxed-python", prefix=str(prefix))
    install("sandboxed-python", prefix=str(prefix), install_as="sandboxed-python-small",
            display_name="Sandboxed Python (small)", config={"memory": "256m", "pids_limit": 64})
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    root = base / "root"
    root.mkdir()
    env = {
        **os.environ,
        "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_DATA_DIR": str(base / "data"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
    }
    port, token = free_port(), secrets.token_hex(16)
    log = base / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyterlab",
                "--no-browser", "--allow-root",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.news_url=",
                "--KernelSpecManager.ensure_native_kernel=False",
            ],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    server = LabServer(f"http://127.0.0.1:{port}", token, process, root, log)
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/api/status", headers=server.headers, timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"JupyterLab did not answer:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    try:
        yield server
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "jupyterlab-server.log").write_bytes(log.read_bytes())
        left = docker_engine.containers.list(all=True, filters={"label": [LABEL, f"{LABEL_OWNER_PID}={process.pid}"]})
        for container in left:
            remove_container(container)
        assert not left, f"JupyterLab left {len(left)} kernel container(s) behind after it shut down"
