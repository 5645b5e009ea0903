"""Fixtures for the OpenSandbox backend tests.

* ``opensandbox_deployment`` (session): the published ``opensandbox-server`` started on 127.0.0.1
  by the harness in tests/opensandbox/server/ (installed in its own virtualenv, local stand-in
  images), or, when ``OPEN_SANDBOX_API_BASE`` is set, that deployment instead (with
  ``OPEN_SANDBOX_API_KEY``; ``KERNEL_SANDBOX_OSB_IMAGE`` / ``KERNEL_SANDBOX_OSB_ENTRYPOINT``
  override the sandbox image, default the code-interpreter image).
* ``fake_opensandbox``: the in-process fakes, for error paths the real server cannot produce.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.opensandbox_fakes import FakeOpenSandbox

from kernel_sandbox.opensandbox.lifecycle import DEFAULT_ENTRYPOINT, DEFAULT_SANDBOX_IMAGE, OpenSandboxClient

sys.path.insert(0, str(Path(__file__).resolve().parent / "server"))

KERNEL_NAME = "sandboxed-python-opensandbox"
SPEC_DIR = Path(__file__).resolve().parents[2] / "kernelspecs" / KERNEL_NAME
IN_CI = bool(os.environ.get("CI"))


@dataclass
class Deployment:
    """An OpenSandbox deployment to test against, and the options every test sandbox gets."""

    api_base: str
    api_key: str
    image: str
    entrypoint: list[str]
    metadata: dict[str, str]
    jupyter_image: str = DEFAULT_SANDBOX_IMAGE
    jupyter_entrypoint: list[str] = field(default_factory=lambda: list(DEFAULT_ENTRYPOINT))
    local: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def options(self, kind: str = "execd", **overrides: Any) -> dict[str, Any]:
        """Provisioner / Sandbox options for a test kernel of ``kind`` on this deployment.

        ``execd``: the sandbox image with execd only (the code-interpreter image on a real
        deployment), mode execd; ``websocket``: the code-interpreter image, mode auto, so the
        launcher's probe must find its Jupyter server.
        """
        options: dict[str, Any] = {
            "api_base": self.api_base,
            "api_key": self.api_key,
            "image": self.image,
            "entrypoint": list(self.entrypoint),
            "mode": "execd",
            "metadata": dict(self.metadata),
            "resource_limits": {"cpu": "1", "memory": "1Gi"},
            "poll_interval": 0.2,
            "ready_timeout": 180.0,
            "state_check_interval": 1.0,
            **self.extra,
        }
        if kind == "websocket":
            options.update(image=self.jupyter_image, entrypoint=list(self.jupyter_entrypoint), mode="auto")
            options["jupyter_wait"] = 180.0
        options.update(overrides)
        return options

    def kernelspec(self, directory: Path, kind: str = "execd", **overrides: Any) -> Path:
        """The shipped OpenSandbox kernelspec under ``directory/kernels``, configured for this deployment.

        The API key stays out of kernel.json: the tests pass it as ``OPEN_SANDBOX_API_KEY``.
        """
        target = directory / "kernels" / KERNEL_NAME
        shutil.copytree(SPEC_DIR, target, dirs_exist_ok=True)
        spec = json.loads((target / "kernel.json").read_text())
        config = self.options(kind, **overrides)
        config.pop("api_key")
        spec["metadata"]["kernel_provisioner"]["config"] = config
        (target / "kernel.json").write_text(json.dumps(spec))
        return target

    def client(self) -> OpenSandboxClient:
        return OpenSandboxClient(self.api_base, self.api_key, poll_interval=0.2, ready_timeout=180)

    def live_sandboxes(self) -> list[dict[str, Any]]:
        """This run's sandboxes the server still knows."""

        async def listing() -> list[dict[str, Any]]:
            async with self.client() as client:
                return await client.list_sandboxes(metadata=self.metadata)

        return asyncio.run(listing())


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI must run the OpenSandbox server tests: .ci/run prepares them)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def opensandbox_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The deployment under test for the whole session; at the end none of its sandboxes may remain."""
    run_label = {"kernel-sandbox-test-run": secrets.token_hex(6)}
    api_base = os.environ.get("OPEN_SANDBOX_API_BASE")
    if api_base:
        entrypoint = os.environ.get("KERNEL_SANDBOX_OSB_ENTRYPOINT")
        deployment = Deployment(
            api_base=api_base,
            api_key=os.environ.get("OPEN_SANDBOX_API_KEY", ""),
            image=os.environ.get("KERNEL_SANDBOX_OSB_IMAGE", DEFAULT_SANDBOX_IMAGE),
            entrypoint=json.loads(entrypoint) if entrypoint else list(DEFAULT_ENTRYPOINT),
            metadata=run_label,
        )
        yield deployment
        assert not deployment.live_sandboxes(), "sandboxes of this test run were left on the deployment"
        return
    try:
        from local_server import LocalServer
        from prepare import prepare

        prepared = prepare()
    except Exception as exc:  # noqa: BLE001 (no engine, no kernel image, no PyPI: say so)
        _unavailable(f"the OpenSandbox server harness could not be prepared: {type(exc).__name__}: {exc}")
    server = LocalServer(prepared, tmp_path_factory.mktemp("opensandbox-server"))
    server.run_label = run_label
    server.start()
    deployment = Deployment(
        api_base=server.api_base,
        api_key=server.api_key,
        image=prepared.sandbox_image,
        entrypoint=["sleep", "infinity"],
        metadata=run_label,
        jupyter_image=prepared.code_interpreter_image,
        jupyter_entrypoint=["/opt/code-interpreter/code-interpreter.sh"],
        local=server,
    )
    try:
        yield deployment
        left = deployment.live_sandboxes()
    finally:
        leftovers = server.stop()
    assert not left, f"sandboxes of this test run were left on the server: {[s.get('id') for s in left]}"
    assert not leftovers, f"containers of this test run were left behind: {leftovers}\n{server.log_tail()}"


@pytest.fixture
def deployment(opensandbox_deployment: Deployment) -> Iterator[Deployment]:
    """The session's deployment; no sandbox of a test may outlive it."""
    yield opensandbox_deployment
    left = opensandbox_deployment.live_sandboxes()
    assert not left, f"sandboxes left behind by this test: {[s.get('id') for s in left]}"


@pytest.fixture
def deployment_jupyter_path(deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary JUPYTER_PATH for kernelspecs configured by ``deployment.kernelspec``, the key in the env."""
    data_dir = tmp_path / "jupyter"
    data_dir.mkdir()
    monkeypatch.setenv("JUPYTER_PATH", str(data_dir))
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", deployment.api_key)
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE", raising=False)
    return data_dir


@pytest.fixture(scope="session")
def fake_opensandbox_server() -> Iterator[FakeOpenSandbox]:
    """One fake lifecycle server and execd stand-in for the whole session."""
    fake = FakeOpenSandbox(ping_interval=0.3).start()
    yield fake
    fake.stop()


@pytest.fixture
def fake_opensandbox(fake_opensandbox_server: FakeOpenSandbox) -> Iterator[FakeOpenSandbox]:
    """The session's fakes with per-test knobs reset; no sandbox may outlive the test."""
    lifecycle = fake_opensandbox_server.lifecycle
    lifecycle.polls_until_running = 0
    lifecycle.advertised_token = None
    lifecycle.endpoint_answers = {}
    lifecycle.policies, lifecycle.policy_answers = {}, {}
    yield fake_opensandbox_server
    leaked = [sandbox.id for sandbox in lifecycle.live()]
    lifecycle.sandboxes.clear()
    assert not leaked, f"sandboxes left behind: {leaked}"


@pytest.fixture
def opensandbox_kernelspec(fake_opensandbox: FakeOpenSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Install the OpenSandbox kernelspec into a temporary JUPYTER_PATH, pointed at the fakes by env."""
    data_dir = tmp_path / "jupyter"
    shutil.copytree(SPEC_DIR, data_dir / "kernels" / KERNEL_NAME)
    monkeypatch.setenv("JUPYTER_PATH", str(data_dir))
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", fake_opensandbox.api_base)
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", fake_opensandbox.lifecycle.api_key)
    return KERNEL_NAME
