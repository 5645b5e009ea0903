"""Fixtures for the OpenSandbox backend tests: fake servers on 127.0.0.1 and the kernelspec."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from opensandbox_fakes import FakeOpenSandbox

KERNEL_NAME = "sandboxed-python-opensandbox"
SPEC_DIR = Path(__file__).resolve().parents[2] / "kernelspecs" / KERNEL_NAME


@pytest.fixture(scope="session")
def fake_opensandbox_server() -> Iterator[FakeOpenSandbox]:
    """One fake lifecycle server and execd for the whole session."""
    fake = FakeOpenSandbox(ping_interval=0.3).start()
    yield fake
    fake.stop()


@pytest.fixture
def fake_opensandbox(fake_opensandbox_server: FakeOpenSandbox) -> Iterator[FakeOpenSandbox]:
    """The session's fake servers with per-test knobs reset; no sandbox may outlive the test."""
    lifecycle = fake_opensandbox_server.lifecycle
    lifecycle.polls_until_running = 0
    lifecycle.advertised_token = None
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
