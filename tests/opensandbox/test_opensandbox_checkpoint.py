"""Checkpoint and restore on the opensandbox backend, against the published server: the blob travels
through the same file channel (here as text cells: execd mode), and a checkpoint of another backend's
image is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import Checkpoint, Sandbox

pytestmark = pytest.mark.opensandbox_server

STATE = (
    "import numpy as np, socket\n"
    "class Box:\n    def __init__(self, v): self.v = v\n"
    "factor = 4\nscaled = lambda v: v * factor\n"
    "array = np.arange(300_000, dtype='float64')\nbox = Box([1, 2])\nsock = socket.socket()\n"
    "open('notes.txt', 'w').write('kept')\n"
)


def test_state_comes_back_in_a_new_sandbox(deployment: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In execd mode, the text-cell path (the websocket mode moves it on the comm, as Docker does)."""
    monkeypatch.chdir(tmp_path)
    options = deployment.options("execd")
    with Sandbox("opensandbox", **options) as sb:
        assert sb.run(STATE).error is None
        checkpoint = sb.checkpoint()
        first = sb._async._km.provisioner.sandbox_id
    assert checkpoint.size > 2_400_000, "the array travelled in several chunks"
    assert set(checkpoint.not_saved) == {"sock"} and {"array", "box", "scaled", "Box"} <= set(checkpoint.saved)
    assert checkpoint.image == options["image"] and checkpoint.backend == "opensandbox"
    checkpoint.save(tmp_path / "state.ckpt")
    with Sandbox("opensandbox", restore=Checkpoint.load(tmp_path / "state.ckpt"), **options) as sb:
        assert sb._async._km.provisioner.sandbox_id != first
        out = sb.run("print(array.sum() == np.arange(300_000).sum(), type(box) is Box, box.v, scaled(2), open('notes.txt').read())")
        assert out.stdout == "True True [1, 2] 8 kept\n", out


def test_a_docker_checkpoint_is_refused_by_an_opensandbox_kernel(
    deployment: Any, docker_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same image name, another backend: the image ids differ, and the restore is refused naming ``image=``."""
    monkeypatch.chdir(tmp_path)
    with Sandbox(standby=0) as sb:
        sb.run("x = 1")
        checkpoint = sb.checkpoint()
    with pytest.raises(ConfigError, match=r"restores only into the image it was made in: start the sandbox with image="):
        Sandbox("opensandbox", restore=checkpoint, **deployment.options("execd")).start()
