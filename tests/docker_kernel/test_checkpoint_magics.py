"""``%checkpoint`` and ``%restore`` in a Sandboxed Python kernel, with the launcher as the store
(:mod:`kernel_sandbox.kernelside.magics`, :mod:`kernel_sandbox.launch.checkpoints`), on real Docker
kernels restarted as JupyterLab restarts them.

The variables and work files come back in a new container; what cannot be pickled is named; the
host keeps the blob in the kernel's private directory (0600), never opened; a kernel that forges
requests (over the cap, understating its size, a symlink or a FIFO for its blob, malformed shapes,
a flood) gets refusals and reaches only its own checkpoint; after an out-of-memory restart with
``checkpoint_on_oom`` the first cell says the checkpoint is kept.
"""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

import kernel_sandbox.docker.blobs as blobs
import kernel_sandbox.launch.checkpoints as store
from kernel_sandbox.execution import AsyncSandbox, Checkpoint
from kernel_sandbox.kernelside.magics import REQUEST
from kernel_sandbox.kernelspecs import started_client
from kernel_sandbox.privdir import (
    checkpoint_part,
    checkpoint_root,
    kept_checkpoint,
    remove_dead_parts,
    remove_private,
    stored_bytes,
)

from support.kernel import PODMAN, RUNTIMES, cell, runtime_option, until_ended

pytestmark = pytest.mark.usefixtures("docker_engine", "jupyter_prefix", "own_store")

MADE = """
import numpy as np, socket, threading, os
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
x = 41 + 1
triple = lambda v: v * x
point = Point(3, 4)
array = np.arange(12).reshape(3, 4)
sock = socket.socket()
worker = threading.Thread(target=lambda: None)
os.makedirs("out", exist_ok=True)
open("out/report.txt", "w").write("made before the checkpoint")
"""
FORGE = """
import json, os, time, secrets, signal, threading, _kernel_sandbox_checkpoint as ck
def send(**content):
    '''Send the launcher a request of our own, as the cell running now; return its answer path.'''
    answer = os.path.join(ck.area(), f"answer-{secrets.token_hex(8)}.json")
    k = get_ipython().kernel
    k.session.send(k.iopub_socket, "kernel_sandbox_checkpoint", {"answer": answer, **content},
                   parent=k.get_parent("shell"), ident=b"kernel_sandbox_checkpoint")
    return answer
def forge(wait=15, **content):
    '''Send a request and wait for its answer (None: none came within ``wait`` s).'''
    answer = send(**content)
    for _ in range(int(wait / 0.05)):
        if os.path.exists(answer):
            reply = json.load(open(answer)); os.unlink(answer); return reply
        time.sleep(0.05)
def stall(path):
    '''Stop the launcher's copy of ``path`` (an exec as this kernel's user) as soon as it runs.'''
    tail = b"\\0read\\0" + path.encode() + b"\\0"
    def watch():
        while True:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if open(f"/proc/{pid}/cmdline", "rb").read().endswith(tail):
                        os.kill(int(pid), signal.SIGSTOP); return
                except OSError:
                    pass
    threading.Thread(target=watch, daemon=True).start()
def report(path, size=None, sha=None):
    import hashlib
    data = open(path, "rb").read()
    return dict(action="checkpoint", blob=path, size=len(data) if size is None else size,
                sha256=sha or hashlib.sha256(data).hexdigest(), saved=["y"], not_saved={}, files=0,
                files_not_saved={})
"""


ASKED = "if False:\n    %checkpoint\n"
"""A cell the user ran with a line ``%checkpoint``, which a kernel that forges answers itself."""


def manager(**settings: Any) -> AsyncKernelManager:
    """A manager of the Docker kernelspec with these provisioner settings, restarted as JupyterLab
    restarts (the launcher's private directory is kept)."""
    km = AsyncKernelManager(
        kernel_name="sandboxed-python", config=Config({"DockerProvisioner": settings})
    )
    km.autorestart = False
    return km


async def restart(km: AsyncKernelManager, kc: Any) -> None:
    await km.restart_kernel(now=True)
    await kc.wait_for_ready(timeout=120)


@pytest.fixture
def own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint store of this test's own (its launchers inherit ``XDG_STATE_HOME``): the
    store's total counts every kernel of the user, other tests' too."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return checkpoint_root()


@pytest.fixture
async def session() -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """A kernel (1 MiB checkpoint cap) with the forging helpers defined, and its client."""
    km = manager(checkpoint_max_bytes="1m")
    async with started_client(km) as kc:
        assert (await cell(kc, FORGE))[1]["status"] == "ok"
        yield km, kc


@pytest.mark.parametrize("runtime", [*RUNTIMES, PODMAN])
async def test_variables_and_files_come_back_in_the_restarted_kernels_new_container(runtime: str, request: pytest.FixtureRequest) -> None:
    if runtime == PODMAN:
        request.getfixturevalue("podman_engine")
    km = manager(**runtime_option(runtime))
    async with started_client(km) as kc:
        await cell(kc, MADE)
        first_container = km.provisioner.container_id
        text, reply = await cell(kc, "%checkpoint")
        assert reply["status"] == "ok", text
        assert "Checkpoint kept by the host: 9 names" in text
        assert "Not saved: sock (TypeError: cannot pickle 'socket' object)" in text
        assert "Not saved: worker (" in text
        kept = kept_checkpoint(km.provisioner.private.path)
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
        checkpoint = Checkpoint.load(kept)  # the kept file is a checkpoint file, hash checked
        assert set(checkpoint.saved) == {"Point", "array", "np", "os", "point", "socket", "threading", "triple", "x"}
        assert set(checkpoint.not_saved) == {"sock", "worker"} and checkpoint.backend == "docker"

        await restart(km, kc)
        assert (await cell(kc, "print('x' in globals())"))[0] == "False\n"
        text, reply = await cell(kc, "%restore")
        assert reply["status"] == "ok", text
        assert text.startswith("Restored 9 names (Point, array, np, os, point, socket, threading, triple, x) and 1 file from the checkpoint made "), text
        after, _ = await cell(
            kc,
            "print(x, triple(2), point.x + point.y, array.sum(), open('out/report.txt').read(),"
            " 'sock' in globals())",
        )
        assert after == "42 84 7 66 made before the checkpoint False\n"
        assert km.provisioner.container_id != first_container, "the kernel was not restarted"
        assert kept.exists(), "a restore keeps the checkpoint for the next restart"
    assert not kept.exists(), "the checkpoint goes with the kernel's shutdown"


async def test_restore_without_a_checkpoint_and_bad_arguments_say_what_to_do(
    session: tuple[AsyncKernelManager, Any],
) -> None:
    _, kc = session
    assert (await cell(kc, "print([k for k in os.environ if k.startswith('KERNEL_SANDBOX')])"))[0] == "[]\n"
    text, reply = await cell(kc, "%restore")
    assert reply["status"] == "error" and reply["ename"] == "CheckpointFailed"
    assert "No checkpoint is kept for this kernel: run %checkpoint first" in text
    text, reply = await cell(kc, "%checkpoint now")
    assert "%checkpoint takes no arguments (got 'now')" in text


@pytest.mark.security("attack", "results")
async def test_a_checkpoint_over_the_cap_is_refused_before_it_is_pulled(
    session: tuple[AsyncKernelManager, Any],
) -> None:
    km, kc = session
    text, reply = await cell(kc, "big = os.urandom(2 * 1024 * 1024)\n%checkpoint")
    assert reply["status"] == "error"
    assert "over checkpoint_max_bytes=1048576; nothing was pulled" in text
    assert not (kept_checkpoint(km.provisioner.private.path)).exists()
    assert not list(kept_checkpoint(km.provisioner.private.path).parent.glob(km.provisioner.private.path.name + "*"))


@pytest.mark.security("attack", "results")
async def test_a_kernel_that_understates_its_blob_cannot_send_more_or_replace_the_kept_one(
    session: tuple[AsyncKernelManager, Any],
) -> None:
    km, kc = session
    assert (await cell(kc, "y = 1\n%checkpoint"))[1]["status"] == "ok"
    kept = kept_checkpoint(km.provisioner.private.path)
    good = kept.read_bytes()
    code = (
        "open('/tmp/blob', 'wb').write(bytes(range(256)) * 400)\n"
        "import hashlib\n"
        "head = hashlib.sha256((bytes(range(256)) * 400)[:1000]).hexdigest()\n"
        "print(forge(**report('/tmp/blob', size=1000, sha=head)))\n"  # states 1000 bytes of 102400
    )
    first = (await cell(kc, ASKED + code))[0]
    # the right size, another hash
    second = (await cell(kc, ASKED + "print(forge(**report('/tmp/blob', sha='0' * 64)))"))[0]
    assert "the file in the container is 102400 bytes, not the 1000 stated; nothing was kept" in first
    assert "not the one the kernel stated" in second
    assert kept.read_bytes() == good, "a refused checkpoint leaves the kept one as it was"
    assert not kept.with_name(kept.name + ".part").exists()


@pytest.mark.security("attack", "container")
async def test_a_blob_path_that_is_a_symlink_or_a_fifo_is_refused_and_blocks_nothing(
    session: tuple[AsyncKernelManager, Any],
) -> None:
    km, kc = session
    code = (
        "os.symlink('/etc/passwd', '/tmp/link'); os.mkfifo('/tmp/fifo')\n"
        "print(forge(**report('/etc/passwd') | {'blob': '/tmp/link'}))\n"
    )
    link = (await cell(kc, ASKED + code))[0]
    fifo = (await cell(kc, ASKED + "print(forge(**report('/etc/passwd') | {'blob': '/tmp/fifo'}))"))[0]
    restore = (await cell(kc, "print(forge(action='restore', blob='/tmp/link'))"))[0]
    assert "'status': 'error'" in link and "Too many levels of symbolic links" in link
    assert "'status': 'error'" in fifo and "is not a regular file" in fifo
    assert "No checkpoint is kept" in restore
    assert not (kept_checkpoint(km.provisioner.private.path)).exists()


SHAPES = [
    "[1, 2]",
    "{'action': 'checkpoint'}",
    "dict(report('/etc/hostname'), size='10')",
    "dict(report('/etc/hostname'), size=-1)",
    "dict(report('/etc/hostname'), sha256='not hex')",
    "dict(report('/etc/hostname'), blob='relative/path')",
    "dict(report('/etc/hostname'), blob='/tmp/\\x00nul')",
    "dict(report('/etc/hostname'), saved=[1, 2])",
    "dict(report('/etc/hostname'), not_saved=['a'])",
    "dict(report('/etc/hostname'), files=True)",
    "dict(action='erase', blob='/tmp/x')",
    "dict(action='restore', blob=7)",
]


@pytest.mark.security("attack", "results")
async def test_malformed_requests_are_refused_and_the_launcher_serves_on(
    session: tuple[AsyncKernelManager, Any],
) -> None:
    km, kc = session
    answers = []
    for shape in SHAPES:  # each in a cell the user ran with %checkpoint: one request for each
        text, reply = await cell(kc, ASKED + f"print(repr(forge(**{shape})) if isinstance({shape}, dict) else 'skip')")
        assert reply["status"] == "ok", text
        answers.append(text.strip())
    assert answers[0] == "skip"  # a list is no request: the cell itself sends it below
    assert all("'status': 'error'" in answer for answer in answers[1:]), answers
    # a request whose answer path is not a path, or whose content is not a mapping: dropped, no answer
    code = (
        "k = get_ipython().kernel\n"
        "for content in ([1, 2], {'answer': 5}, {'answer': 'rel'}, 'text', None):\n"
        "    k.session.send(k.iopub_socket, 'kernel_sandbox_checkpoint', json.dumps(content).encode(),"
        " parent=k.get_parent('shell'))\n"
        "k.session.send(k.iopub_socket, 'kernel_sandbox_checkpoint', b'\\xff not json',"
        " parent=k.get_parent('shell'))\n"
        "y = 2\n"
    )
    assert (await cell(kc, code))[1]["status"] == "ok"
    text, reply = await cell(kc, "%checkpoint")
    assert reply["status"] == "ok", text
    assert not kept_checkpoint(km.provisioner.private.path).with_suffix(".checkpoint.part").exists()


@pytest.mark.security("load", "results")
async def test_a_flood_of_forged_requests_is_served_one_at_a_time_and_reaches_no_client(
    session: tuple[AsyncKernelManager, Any],
) -> None:
    km, kc = session
    code = (
        "open('/tmp/blob', 'wb').write(os.urandom(900_000))\n"
        "k = get_ipython().kernel\n"
        "for i in range(2000):\n"
        "    k.session.send(k.iopub_socket, 'kernel_sandbox_checkpoint',"
        " dict(report('/tmp/blob'), answer=f'/tmp/answer-{i}'), parent=k.get_parent('shell'))\n"
    )
    seen: list[str] = []

    def watch(msg: dict[str, Any]) -> None:
        seen.append(msg["msg_type"])

    reply = await kc.execute_interactive(ASKED + code, timeout=120, output_hook=watch)
    assert reply["content"]["status"] == "ok"
    assert REQUEST not in seen, "a request to the launcher reached a client"
    # the launcher took the first and dropped the rest while it was busy: a handful of answers
    count = "print(len([n for n in os.listdir('/tmp') if n.startswith('answer-')]))"
    deadline = time.monotonic() + 60
    while (await cell(kc, count))[0] == "0\n" and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)  # any request served after the first would have answered by now
    answered = int((await cell(kc, count))[0])
    assert answered == 1, f"{answered} of 2000 forged requests were served, not the one the cell asked for"
    assert (await cell(kc, "print(1 + 1)"))[0] == "2\n"
    assert (kept_checkpoint(km.provisioner.private.path)).stat().st_size > 900_000


@pytest.mark.security("attack", "channel")
async def test_a_checkpoint_no_cell_asked_for_writes_nothing_on_the_host(
    session: tuple[AsyncKernelManager, Any], own_store: Path
) -> None:
    """Code in the kernel forges the launcher's request (the magic's own, sent as the magic
    sends it) in cells that run no ``%checkpoint`` line: no answer, no exec, not a byte stored."""
    km, kc = session
    code = (
        "open('/tmp/blob', 'wb').write(os.urandom(900_000))\n"
        "print(forge(wait=5, **report('/tmp/blob')))\n"
        "for i in range(200):\n"
        "    send(**report('/tmp/blob'))\n"
        "note = '%checkpoint'  # the word, not a line of its own\n"
    )
    text, reply = await cell(kc, code)
    assert reply["status"] == "ok" and text == "None\n", text
    text, reply = await cell(kc, "get_ipython().run_line_magic('checkpoint', '')")
    assert reply["status"] == "error", text
    assert "run %checkpoint as a line of its own" in text
    await asyncio.sleep(2)  # a request served would have made its file by now
    assert not own_store.exists() or stored_bytes(own_store) == (0, 0)
    assert (await cell(kc, "print(len([n for n in os.listdir(ck.area()) if n.startswith('answer-')]))"))[0] == "0\n"
    # the cell the user runs is served, once
    text, reply = await cell(kc, ASKED + "print(forge(**report('/tmp/blob'))['status'])\nprint(forge(wait=3, **report('/tmp/blob')))")
    assert text == "ok\nNone\n", text
    assert kept_checkpoint(km.provisioner.private.path).stat().st_size > 900_000
    # one request for each line the user wrote
    text, reply = await cell(kc, "del note\n%checkpoint\n%checkpoint")
    assert reply["status"] == "ok" and text.count("Checkpoint kept by the host") == 2, text


STALLED = (
    ASKED
    + "open('/tmp/stall', 'wb').write(os.urandom(24 * 1024 * 1024))\n"
    + "stall('/tmp/stall')\n"
    + "print(send(**report('/tmp/stall')))\n"
)
"""The user runs %checkpoint; the kernel answers with a blob and stops the launcher's copy."""


async def until_part(part: Path) -> int:
    """The size of the partial file once the launcher made it (its copy is stalled)."""
    deadline = time.monotonic() + 60
    while not part.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return part.stat().st_size


@pytest.mark.security("fault", "sessions")
async def test_a_stalled_checkpoint_leaves_no_file_after_sandbox_close(own_store: Path) -> None:
    async with AsyncSandbox(checkpoint_max_bytes="32m") as sb:
        assert (await sb.run(FORGE)).error is None
        private = sb._km.provisioner.private.path
        execution = await sb.run(STALLED)
        assert execution.error is None, execution
        part = checkpoint_part(private)
        assert await until_part(part) > 24 * 1024 * 1024, "the store reserves the stated size"
        assert not kept_checkpoint(private).exists(), "the copy was not stalled"
    assert not part.exists(), "Sandbox.close() left the partial checkpoint"
    assert stored_bytes(own_store) == (0, 0)


@pytest.mark.security("fault", "sessions")
async def test_a_stalled_checkpoint_of_a_killed_launcher_is_removed_by_gc_not_before(own_store: Path) -> None:
    km = manager(checkpoint_max_bytes="32m")
    async with started_client(km) as kc:
        assert (await cell(kc, FORGE))[1]["status"] == "ok"
        private = km.provisioner.private.path
        text, reply = await cell(kc, STALLED)
        assert reply["status"] == "ok", text
        part = checkpoint_part(private)
        await until_part(part)
        assert remove_dead_parts() == [] and part.exists(), "gc removed a copy its launcher still writes"
        os.kill(km.provisioner.pid, signal.SIGKILL)
        await until_ended(km)
        assert part.exists()  # what round four found: 1 GiB a session, forever
        assert remove_dead_parts() == [part], "gc left a dead launcher's partial checkpoint"
        assert stored_bytes(own_store) == (0, 0)


@pytest.mark.security("load", "sessions")
async def test_kernels_each_under_their_cap_are_refused_past_the_total_naming_max_checkpoint_bytes(
    own_store: Path,
) -> None:
    first, second = (manager(checkpoint_max_bytes="4m", max_checkpoint_bytes="6m") for _ in range(2))
    blob = "import os\nbig = os.urandom(3_500_000)\n%checkpoint"
    async with started_client(first) as kc1, started_client(second) as kc2:
        text, reply = await cell(kc1, blob)
        assert reply["status"] == "ok", text
        text, reply = await cell(kc2, blob)
        assert reply["status"] == "error"
        assert "over max_checkpoint_bytes=6291456; nothing was pulled" in text, text
        assert "raise max_checkpoint_bytes" in text
        # replacing one's own counts the kept one until the new one is in
        text, reply = await cell(kc1, "%checkpoint")
        assert "over max_checkpoint_bytes=6291456" in text, text
        used, files = stored_bytes(own_store)
        assert files == 1 and 3_500_000 < used <= 4 * 1024 * 1024
        await first.shutdown_kernel(now=True)  # its checkpoint goes: room again
        text, reply = await cell(kc2, "%checkpoint")
        assert reply["status"] == "ok", text


async def test_after_an_out_of_memory_restart_the_first_cell_offers_the_checkpoint() -> None:
    km = manager(memory="256m", checkpoint_on_oom=True)
    async with started_client(km) as kc:
        assert (await cell(kc, "kept = 'before the hog'\n%checkpoint"))[1]["status"] == "ok"
        kc.execute("hog = 'x' * (1024 ** 3)")
        await until_ended(km)
        assert km.provisioner.exit_reason.startswith("out of memory")
        await restart(km, kc)
        text, _ = await cell(kc, "print('first')")
        assert "[kernel-sandbox] The kernel before this one ended (out of memory, limit 256 MiB" in text
        assert "run %restore to load it" in text
        assert (await cell(kc, "print('second')"))[0] == "second\n", "said once"
        text, reply = await cell(kc, "%restore\nprint(kept)")
        assert reply["status"] == "ok" and text.endswith("before the hog\n"), text


async def test_the_offer_is_said_once_and_only_with_a_checkpoint_and_gc_removes_what_a_kernel_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's offer and the removal of a private directory with its kept checkpoint (unit, no
    container)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    private = tmp_path / "k1"
    private.mkdir(mode=0o700)
    kept = store.CheckpointStore(private, None, 100, 1000, "docker")  # type: ignore[arg-type]
    kept.leave_offer("out of memory")
    assert kept.take_offer() is None, "no checkpoint kept: nothing to offer"
    kept.path.parent.mkdir(parents=True)
    kept.path.write_bytes(b"")
    kept.leave_offer("out of memory, limit 256 MiB; raise memory")
    assert "ended (out of memory, limit 256 MiB; raise memory)" in (kept.take_offer() or "")
    assert kept.take_offer() is None, "an offer is said once"
    remove_private(private)  # what shutdown and `kernel-sandbox gc` do with a kernel's directory
    assert not private.exists() and not kept.path.exists()


@pytest.mark.parametrize("module", [store, blobs], ids=["store", "blobs"])
def test_the_hosts_checkpoint_code_holds_no_deserialiser(module: Any) -> None:
    """An ``ast`` scan: the launcher's store and the container copy import no unpickler and call
    no decoder but JSON (answers, offers)."""
    tree = ast.parse(Path(module.__file__).read_text())
    banned = {"pickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib", "zipfile", "tarfile"}
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not (imported | names) & (banned | {"eval", "exec", "compile", "__import__", "Unpickler"})
    decoders = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in ("load", "loads")]
    assert all(isinstance(node.value, ast.Name) and node.value.id == "json" for node in decoders)
