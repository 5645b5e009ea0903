"""Fixtures of the attacker's tests: a kernel to attack, another host account, the browser and JupyterLab.

Everything an attack does runs as code in the kernel (the attacker's position) or, for the
host-user tests, as a second account made with ``useradd`` for the test and removed after it.

The browser fixtures (JupyterLab with Docker kernels in Chromium) are the policy tests' own,
loaded from tests/policy/conftest.py so that both suites drive the same server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.connect import write_connection_file
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from kernel_sandbox.kernelspecs import install, started_client

from support.attacks import HOST_PYTHON, OtherUser
from support.kernel import RUNTIMES, runtime_option
from support.lab import stop

_POLICY = Path(__file__).resolve().parent.parent / "policy"
if str(_POLICY) not in sys.path:
    sys.path.insert(0, str(_POLICY))
_spec = importlib.util.spec_from_file_location("policy_fixtures", _POLICY / "conftest.py")
assert _spec is not None and _spec.loader is not None
policy_fixtures = sys.modules.setdefault("policy_fixtures", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(policy_fixtures)
browser = policy_fixtures.browser
lab = policy_fixtures.lab
widget_image = policy_fixtures.widget_image


@pytest.fixture(params=RUNTIMES)
async def kernel(request, docker_engine, jupyter_prefix) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """A Sandboxed Python kernel (the provisioner's path, launcher included) and a client of it, on
    each runtime: the attacks from inside the container run on runc and on gVisor."""
    config = Config({"DockerProvisioner": runtime_option(request.param)})
    km = AsyncKernelManager(kernel_name="sandboxed-python", config=config)
    async with started_client(km, timeout=90) as kc:
        yield km, kc


@pytest.fixture
def logged_argv_kernel(docker_engine, tmp_path) -> Iterator[tuple[str, dict[str, Any], Path]]:
    """A kernel started as VS Code starts one (the kernelspec's argv, a TCP connection file), its
    launcher's stderr kept in a file: the connection file, its content and the log's path."""
    spec_dir = install("sandboxed-python", prefix=str(tmp_path / "prefix"))
    argv = json.loads((Path(spec_dir) / "kernel.json").read_text())["argv"]
    connection_file, info = write_connection_file(str(tmp_path / "kernel-logged.json"), ip="127.0.0.1",
                                                  transport="tcp", key=os.urandom(16).hex().encode())
    log = tmp_path / "launcher.log"
    with open(log, "wb") as sink:
        launcher = subprocess.Popen([part.replace("{connection_file}", connection_file) for part in argv], stderr=sink)
    try:
        yield connection_file, info, log
    finally:
        stop(launcher)


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    """A fresh unprivileged host account (``useradd``), removed with its files after the test."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the host-account attacks need root in CI (.ci/run runs as root)")
        pytest.skip("making a second host account needs root")
    if not Path(HOST_PYTHON).exists():
        pytest.fail(f"{HOST_PYTHON} is needed to run code as another account")
    name = f"ksattack{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield OtherUser(name, pwd.getpwnam(name).pw_uid)
    finally:
        subprocess.run(["userdel", name], check=False)


local_kernel = policy_fixtures.kernel
"""A real local ipykernel (module scope), to make real widget messages for the policy tests."""
