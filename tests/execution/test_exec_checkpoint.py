"""Checkpoint and restore (:mod:`kernel_sandbox.execution.checkpoint`) on real Docker kernels.

The state comes back equal in a new container; what cannot be pickled is listed by name; the host
never decodes the blob (a kernel's malicious pickle runs nothing on the host, and the host-side
module holds no deserialiser); a blob over the cap is refused before it is pulled; a checkpoint of
another image, or a tampered one, is refused.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import pickle
import secrets
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

import kernel_sandbox.execution.checkpoint as host_checkpoint
import kernel_sandbox.checkpoint_file as checkpoint_file
from kernel_sandbox.docker.settings import DEFAULT_IMAGE
from kernel_sandbox.errors import CheckpointError, ConfigError
from kernel_sandbox.execution import Checkpoint, Sandbox
from kernel_sandbox.execution.channel import CHUNK

STATE = """
import numpy as np, pandas as pd, socket, threading
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def __eq__(self, other):
        return type(other).__name__ == "Point" and (self.x, self.y) == (other.x, other.y)
def build(ns):
    rng = np.random.default_rng(7)
    for i in range(94):
        ns[f"g{i}"] = [i, str(i) * i, {"k": i / 7}]
    ns["array"] = rng.normal(size=(300, 40))
    ns["frame"] = pd.DataFrame({"a": rng.integers(0, 9, 200), "b": rng.normal(size=200).round(3)})
    ns["point"] = Point(3, 4)
    ns["scale"] = 3
    ns["alias"] = ns["g1"]
"""
MADE = STATE + """
build(globals())
triple = lambda v: v * scale
sock = socket.socket()
worker = threading.Thread(target=lambda: None)
gen = (i for i in range(3))
import os
os.makedirs("out", exist_ok=True)
open("out/report.txt", "w").write("made before the checkpoint")
os.symlink("/etc/passwd", "out/passwd")
os.mkfifo("out/pipe")
"""
COMPARE = STATE + """
expected = {}
build(expected)
def same(a, b):
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, pd.DataFrame):
        return a.equals(b)
    return a == b
print(sorted(n for n in expected if not same(globals()[n], expected[n])),
      alias is g1, triple(2), open("out/report.txt").read())
"""


@pytest.fixture(scope="module")
def made(docker_engine) -> Iterator[tuple[Checkpoint, str]]:
    """A checkpoint of a kernel with 100 user globals, a socket, a thread and a generator; its container id."""
    with Sandbox(timeout=120) as sb:
        ex = sb.run(MADE)
        assert ex.error is None, ex.error
        container = sb._async._km.provisioner.container_id
        yield sb.checkpoint(), container


def test_state_comes_back_equal_in_a_new_container(made: tuple[Checkpoint, str], tmp_path: Path) -> None:
    checkpoint, old_container = made
    assert set(checkpoint.not_saved) == {"sock", "worker", "gen"}
    assert "socket" in checkpoint.not_saved["sock"] and "lock" in checkpoint.not_saved["worker"]
    user = [name for name in checkpoint.saved if name not in ("np", "pd", "socket", "threading", "os", "Point", "build")]
    assert len(user) == 100 and {"array", "frame", "point", "triple", "alias"} <= set(user)
    assert checkpoint.files == 1 and checkpoint.image.startswith("sha256:")
    assert checkpoint.files_not_saved == {"out/passwd": "a symbolic link", "out/pipe": "not a regular file"}
    path = tmp_path / "state.ckpt"
    checkpoint.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = Checkpoint.load(path)
    assert loaded == checkpoint
    with Sandbox(timeout=120, restore=loaded) as sb:
        assert sb._async._km.provisioner.container_id != old_container
        assert sb.run("type(point) is Point and point.x").text == "3"
        out = sb.run(COMPARE)
        assert out.error is None, out.error
        assert out.stdout == "[] True 6 made before the checkpoint\n"
        assert sb.run("scale = 10; triple(2)").text == "20", "the lambda's globals are the new kernel's namespace"


def test_repr_is_short_and_names_what_was_not_saved(made: tuple[Checkpoint, str]) -> None:
    text = repr(made[0])
    assert text.startswith("Checkpoint(size=") and "sha256=" in text and "kernel-sandbox-python" in text
    assert "not_saved={" in text and "sock: TypeError" in text and len(text) < 1200


@pytest.mark.security("attack", "results")
def test_a_malicious_pickle_in_the_checkpoint_runs_nothing_on_the_host(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel writes a pickle that would create a host file if the host ever unpickled its checkpoint."""
    marker = tmp_path / "pwned"
    sandbox.run(
        "import io, os, pickle, sys, zipfile\n"
        "ck = sys.modules['_kernel_sandbox_checkpoint']\nreal_save = ck.save\n"
        "class Evil:\n"
        f"    def __reduce__(self): return (io.open, ({str(marker)!r}, 'w'))\n"
        "def save(work):\n"
        "    target = os.path.join(ck.area(), ck.BLOB)\n"
        "    with zipfile.ZipFile(target, 'w') as z:\n"
        "        z.writestr(ck.NAMESPACE, pickle.dumps({'x': Evil()}))\n"
        "    return {'size': os.path.getsize(target), 'sha256': ck.digest(target), 'saved': ['x'],\n"
        "            'not_saved': {}, 'files': 0, 'files_not_saved': {}}\n"
        "ck.save = save\n"
    )
    import cloudpickle

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the host tried to unpickle")

    for module, name in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (cloudpickle, "loads")):
        monkeypatch.setattr(module, name, refuse)
    try:
        checkpoint = sandbox.checkpoint()
    finally:
        sandbox.run("ck.save = real_save")
    checkpoint.save(tmp_path / "evil.ckpt")
    loaded = Checkpoint.load(tmp_path / "evil.ckpt")
    assert loaded.data == checkpoint.data and loaded.saved == ("x",)
    assert not marker.exists()
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="could not be restored"), Sandbox(restore=loaded):
        pass  # the pickle runs in the new sandbox, where the host's path does not exist
    assert not marker.exists()


def test_the_host_side_module_holds_no_deserialiser() -> None:
    """An ``ast`` scan of the host's checkpoint code (the module and the file format it shares with
    the launcher): no pickle, dill, cloudpickle, marshal or eval."""
    modules = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve", "joblib", "jsonpickle",
               "copyreg", "importlib", "builtins"}
    tree = ast.parse(Path(host_checkpoint.__file__).read_text())
    tree.body += ast.parse(Path(checkpoint_file.__file__).read_text()).body
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not (imported | names) & (modules | {"__import__", "eval", "exec", "compile", "Unpickler"})
    decoders = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in ("load", "loads", "Unpickler")]
    assert all(isinstance(node.value, ast.Name) and node.value.id in ("json", "cls") for node in decoders)
    assert sum(isinstance(node.value, ast.Name) and node.value.id == "json" for node in decoders) == 1, "the file's header only"
    assert imported <= {"__future__", "collections", "contextlib", "datetime", "hashlib", "json", "os", "re", "struct", "dataclasses", "typing"}
    relative = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
    assert relative == {"errors", "files", "backend", "checkpoint_file"}, (
        "the errors, the buffer chunks gather in, the session's backend type for hints, the file format"
    )
    files = ast.parse(Path(host_checkpoint.__file__).with_name("files.py").read_text())
    assert {alias.name for node in ast.walk(files) if isinstance(node, ast.Import) for alias in node.names} <= {"io", "os", "posixpath"}


PATCHED_OPS = (
    "import sys\nth = sys.modules['_kernel_sandbox_toolhost']\nck = sys.modules['_kernel_sandbox_checkpoint']\n"
    "original = th.OPS['checkpoint']\n"
)
"""Kernel code an attacker's tests start with: the helper's checkpoint operation, to replace."""


@pytest.mark.security("attack", "results")
def test_a_checkpoint_over_the_cap_is_refused_before_it_is_pulled(sandbox: Sandbox) -> None:
    """The size the kernel states is checked first: no chunk of a blob over ``max_bytes`` is asked for."""
    sandbox.run(
        PATCHED_OPS + "asked = []\nbig = bytes(2_000_000)\n"
        "th.OPS['checkpoint'] = lambda r, b: (asked.append(r['action']), original(r, b))[1]\n"
    )
    with pytest.raises(CheckpointError, match=r"over max_bytes=1000000 \(checkpoint\(max_bytes=...\)\); nothing was pulled"):
        sandbox.checkpoint(max_bytes=1_000_000)
    assert sandbox.run("print(asked)").stdout == "['save', 'drop']\n"
    sandbox.run("th.OPS['checkpoint'] = original; del big")


@pytest.mark.security("load", "results")
def test_checkpoint_and_download_hold_what_they_pull_once(sandbox: Sandbox) -> None:
    """The program's peak (tracemalloc, every thread) is the blob's size plus a few chunks, not the
    chunks and their join (round four measured 2x ``max_bytes``)."""
    size = 24 * 1024 * 1024
    sandbox.run(f"import os\nblob = os.urandom({size})\nopen('blob.bin', 'wb').write(blob)")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        data = sandbox.download("blob.bin")
        download_peak = tracemalloc.get_traced_memory()[1] - base
        assert len(data) == size
        del data
        sandbox.run("os.unlink('blob.bin')")
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        checkpoint = sandbox.checkpoint(max_bytes=size + CHUNK)
        checkpoint_peak = tracemalloc.get_traced_memory()[1] - base
        assert size < checkpoint.size < size + CHUNK
        del checkpoint
    finally:
        tracemalloc.stop()
        sandbox.run("del blob")
    # measured: the size plus 16 MiB (four chunks in flight) for both
    assert download_peak < size + 6 * CHUNK, download_peak / 2**20
    assert checkpoint_peak < size + 6 * CHUNK, checkpoint_peak / 2**20


@pytest.mark.security("attack", "results")
def test_a_kernel_that_understates_its_checkpoint_cannot_send_more(sandbox: Sandbox) -> None:
    """The kernel states 100 bytes and answers the read with megabytes: refused, nothing kept."""
    sandbox.run(
        PATCHED_OPS + "def lying(r, b):\n"
        "    if r['action'] == 'save':\n"
        "        return {'ok': {**ck.save(th._work()), 'size': 100}}\n"
        "    if r['action'] == 'read':\n"
        "        return {'ok': [100, bytes(3_000_000)]}\n"
        "    return original(r, b)\n"
        "th.OPS['checkpoint'] = lying\nfiller = bytes(3_000_000)\n"
    )
    with pytest.raises(CheckpointError, match="sent more than it stated"):
        sandbox.checkpoint(max_bytes=1_000_000)
    sandbox.run("th.OPS['checkpoint'] = original; del filler")


@pytest.fixture(scope="module")
def other_image(docker_engine) -> Iterator[str]:
    """An image of this run only: the kernel image plus a label (so another id)."""
    tag = f"kernel-sandbox-python:ckpt-other-{secrets.token_hex(4)}"
    dockerfile = f"FROM {DEFAULT_IMAGE}\nLABEL kernel-sandbox-checkpoint-test={tag}\n"
    docker_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag
    docker_engine.images.remove(tag)


@pytest.mark.security("attack", "sessions")
def test_a_checkpoint_of_another_image_is_refused_naming_the_option(made: tuple[Checkpoint, str], other_image: str) -> None:
    """A checkpoint restores into the image it was made in only: another image is refused before the blob goes in."""
    with pytest.raises(ConfigError, match=r"restores only into the image it was made in: start the sandbox with image='kernel-sandbox-python:latest'"):
        Sandbox(image=other_image, restore=made[0], standby=0).start()


@pytest.mark.security("attack", "sessions")
def test_a_tampered_checkpoint_is_refused(made: tuple[Checkpoint, str], tmp_path: Path) -> None:
    """A blob changed after it was made fails its sha256: refused by Checkpoint.load and by restore=."""
    checkpoint = made[0]
    path = tmp_path / "state.ckpt"
    checkpoint.save(path)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="sha256 of its blob is not the one recorded"):
        Checkpoint.load(path)
    tampered = dataclasses.replace(checkpoint, data=bytes(raw[-checkpoint.size :]))
    with pytest.raises(CheckpointError, match="sha256 of its blob is not the one recorded"):
        Sandbox(restore=tampered).start()


def test_bad_options_and_files_are_refused(made: tuple[Checkpoint, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="restore must be a Checkpoint"):
        Sandbox(restore=b"bytes")
    with pytest.raises(ConfigError, match="restore= is for a new sandbox"):
        Sandbox.attach("no-such-kernel", restore=made[0])
    path = tmp_path / "big.ckpt"
    made[0].save(path)
    with pytest.raises(CheckpointError, match=r"over max_bytes=100 \(Checkpoint.load"):
        Checkpoint.load(path, max_bytes=100)
    (tmp_path / "other").write_bytes(b"PK\x03\x04 not a checkpoint file")
    with pytest.raises(CheckpointError, match="not a kernel-sandbox checkpoint file"):
        Checkpoint.load(tmp_path / "other")
    with pytest.raises(FileExistsError):
        made[0].save(path)
