"""``%checkpoint`` and ``%restore``: keep a kernel's variables across a restart, with the launcher
on the host as the store (the kernel side; the host side: :mod:`kernel_sandbox.launch.checkpoints`).
The extension also wraps IPython's ``%pip`` (:func:`.packages.wrap_pip_magic`).

The boot (:mod:`.boot`) installs this module and loads it as an IPython extension. ``%checkpoint``
saves the user's names and the work directory's files with :mod:`.checkpoint`, then asks the
launcher, by an IOPub message of its own type (:data:`REQUEST`, never passed on to a client), to
take the blob: the launcher pulls it out of the container and keeps it on the host, in the kernel's
private directory, where it outlives a restart of the kernel (until the kernel is shut down).
``%restore`` asks the launcher to put the kept blob back, and loads it. The launcher answers by
writing a small JSON file at the path the request names; the magic waits for it. The launcher
decides and checks everything (the size cap, the hash, the image): a kernel that forges requests
reaches only its own checkpoint. The launcher keeps a checkpoint only for a cell the client signed
with a line ``%checkpoint`` of its own (:func:`checkpoint_lines`), once per such line: a kernel
cannot fill the host's disk unasked.

The launcher's sleep (:mod:`kernel_sandbox.launch.sleep`) calls the ``sleep_*`` functions in
cells of its own, each printing its answer as a text frame (:mod:`.textframe`); where the kernel
was not booted with this module (OpenSandbox) the sleep installs it first.
"""

import base64
import json
import os
import secrets
import threading
import time

try:  # inside the kernel, the boot installed the siblings under these names
    import _kernel_sandbox_checkpoint as checkpoint
    import _kernel_sandbox_packages as packages
    import _kernel_sandbox_textframe as textframe
    import _kernel_sandbox_workfiles as files
except ImportError:  # on the host (tests run this module as code)
    from kernel_sandbox.kernelside import checkpoint, packages, textframe
    from kernel_sandbox.kernelside import workfiles as files

REQUEST = "kernel_sandbox_checkpoint"
"""The IOPub message type of a request to the launcher."""
ANSWER_TIMEOUT = 300.0
"""Seconds to wait for the launcher's answer (it moves up to its size cap meanwhile)."""
ANSWER_BYTES = 1024 * 1024
POLL_SECONDS = 0.02
SHOWN_NAMES = 20
KERNEL_MODULES = (
    "ipykernel",
    "IPython",
    "zmq",
    "jupyter_client",
    "tornado",
    "comm",
    "debugpy",
    "_pydevd",
    "pydevd",
    "concurrent.futures",
)
"""Where the kernel's own threads come from (and thread pools' workers)."""


def checkpoint_lines(code):
    """How many lines ``%checkpoint`` of their own the cell ``code`` has (the launcher serves as
    many checkpoint requests for the cell the client signed; the magic refuses early at none)."""
    lines = code.splitlines() if isinstance(code, str) else ()
    return sum(line.strip() == "%checkpoint" for line in lines)


class CheckpointFailed(Exception):
    """What the launcher or the kernel refused, in words; shown without a traceback."""

    def _render_traceback_(self):
        return [f"{type(self).__name__}: {self}"]


def _ask(kernel, action, **fields):
    """Send the launcher one request and return its answer (a dict), or raise
    :class:`CheckpointFailed`."""
    answer = os.path.join(checkpoint.area(), f"answer-{secrets.token_hex(16)}.json")
    content = {"action": action, "answer": answer, **fields}
    kernel.session.send(
        kernel.iopub_socket,
        REQUEST,
        content,
        parent=kernel.get_parent("shell"),
        ident=kernel._topic(REQUEST),
    )
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while not os.path.exists(answer):
        if time.monotonic() > deadline:
            raise CheckpointFailed(
                f"the launcher did not answer within {ANSWER_TIMEOUT:g} s (is this kernel "
                "started by kernel-sandbox's launcher, version 0.1 or newer?)"
            )
        time.sleep(POLL_SECONDS)
    try:
        with open(answer, "rb") as handle:
            reply = json.loads(handle.read(ANSWER_BYTES))
    finally:
        os.unlink(answer)
    if not isinstance(reply, dict) or reply.get("status") != "ok":
        why = reply.get("evalue") if isinstance(reply, dict) else None
        raise CheckpointFailed(str(why or "the launcher refused the request"))
    return reply


def _names(names):
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown + (f", ... ({len(names) - SHOWN_NAMES} more)" if len(names) > SHOWN_NAMES else "")


def _count(number, word):
    return f"{number} {word}" + ("" if number == 1 else "s")


def _size(count):
    for unit in ("bytes", "KiB", "MiB"):
        if count < 1024 or unit == "MiB":
            return f"{count:g} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return ""


def report_text(report):
    """The lines ``%checkpoint`` prints for the kernel's ``report``: what was saved, what not and
    why."""
    lines = [
        f"Checkpoint kept by the host: {_count(len(report['saved']), 'name')} "
        f"({_names(report['saved']) or 'none'}), {_count(report['files'], 'file')}, "
        f"{_size(report['size'])}, sha256 {report['sha256'][:12]}.",
    ]
    for name, why in report["not_saved"].items():
        lines.append(f"Not saved: {name} ({why})")
    for path, why in report["files_not_saved"].items():
        lines.append(f"File not saved: {path} ({why})")
    lines.append("It outlives a restart of this kernel: run %restore in the new kernel.")
    return "\n".join(lines)


class Magics:
    """The two line magics, for one shell whose work directory is ``work``."""

    def __init__(self, shell, work):
        self.shell, self.work = shell, work

    def checkpoint(self, line):
        """%checkpoint: save the names you defined and the work directory's files; the host
        keeps them for %restore, across a restart of this kernel."""
        _no_arguments("checkpoint", line)
        cell = (self.shell.kernel.get_parent("shell") or {}).get("content") or {}
        if not checkpoint_lines(cell.get("code")):
            raise CheckpointFailed(
                "the host keeps a checkpoint only for a cell you run with %checkpoint on a line of "
                "its own (the launcher takes the request from such a cell only): run %checkpoint "
                "as a line of its own"
            )
        report = checkpoint.save(self.work)
        try:
            _ask(
                self.shell.kernel,
                "checkpoint",
                blob=os.path.join(checkpoint.area(), checkpoint.BLOB),
                **report,
            )
        finally:
            checkpoint.drop()
        print(report_text(report))

    def restore(self, line):
        """%restore: load the checkpoint the host keeps for this kernel (made by %checkpoint)."""
        _no_arguments("restore", line)
        blob = os.path.join(checkpoint.area(), checkpoint.BLOB)
        answer = _ask(self.shell.kernel, "restore", blob=blob)
        loaded = checkpoint.load(self.work, answer["sha256"])
        made = f" made {answer['created']}" if answer.get("created") else ""
        print(
            f"Restored {_count(len(loaded['restored']), 'name')} "
            f"({_names(loaded['restored']) or 'none'}) and {_count(loaded['files'], 'file')} from "
            f"the checkpoint{made}."
        )


def _ready_to_sleep():
    """Refuse a sleep (:mod:`kernel_sandbox.launch.sleep`, which runs this before its
    checkpoint) while packages installed with ``%pip`` or ``install()`` are there: the new
    container would not have them, and names that refer to them could not be restored."""
    names = packages.installed(os.environ)
    if names:
        raise CheckpointFailed(
            f"packages installed in this kernel ({_names(names)}) would be gone after a sleep, "
            "and the names that use them could not come back; the kernel stays awake (install "
            "them in the image to let it sleep)"
        )


WORK = os.getcwd()
"""The kernel's work directory: where it was when this module was installed (at its start)."""


def _say(marker, meta, buffers=()):
    """Print the answer to one of the launcher's cells, as a frame of its ``marker``."""
    print(textframe.frame(marker, meta, list(buffers)).text, flush=True)


def running_threads():
    """The threads started in the kernel that still run, besides the kernel's own: a sleep stops
    them with the container, whether a name holds them or not (a worker of a thread pool, idle or
    not, is not told apart: its pool is)."""
    found = {}
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        where = getattr(target, "__module__", None) or type(thread).__module__ or ""
        if thread is not threading.main_thread() and not where.startswith(KERNEL_MODULES):
            found[f"thread {thread.name}"] = "a running thread stops with the container"
    return found


def sleep_save(marker):
    """The launcher's sleep (:mod:`kernel_sandbox.launch.sleep`): save the kernel's state, unless
    packages installed in it refuse it (:func:`_ready_to_sleep`); answer the report (the running
    threads among the names not saved) and the blob's path, for the launcher to pull."""
    _ready_to_sleep()
    report = checkpoint.save(WORK)
    report["not_saved"] = {**report["not_saved"], **running_threads()}
    _say(marker, dict(report, blob=os.path.join(checkpoint.area(), checkpoint.BLOB)))


def sleep_path(marker):
    """Answer where the launcher puts the blob to wake the kernel from."""
    _say(marker, {"blob": os.path.join(checkpoint.area(), checkpoint.BLOB)})


def sleep_read(marker, offset, size):
    """Answer ``size`` bytes of the blob at ``offset`` and its whole size (a backend without a
    file channel pulls it through cells)."""
    total, data = files.read_chunk(checkpoint.area(), checkpoint.BLOB, offset, size)
    _say(marker, {"size": total}, [data])


def sleep_write(marker, offset, data):
    """Write the base64 ``data`` at ``offset`` of the blob (0 starts it anew); answer its size."""
    size = files.write_chunk(checkpoint.area(), checkpoint.BLOB, offset, base64.b64decode(data))
    _say(marker, {"size": size})


def sleep_load(marker, sha256, count):
    """Load the blob the launcher put back, if its sha256 is ``sha256``; the next cell's
    execution count is ``count`` (None: unchanged), unless the kernel counted further already (a
    relay that stores every cell in its history: a number used again would clash there)."""
    from IPython import get_ipython

    loaded = checkpoint.load(WORK, sha256)
    shell = get_ipython()
    if count is not None and count > shell.execution_count:
        shell.execution_count = count
    _say(marker, loaded)


def sleep_drop():
    """Remove the blob, if any (after the launcher pulled it, or gave it up)."""
    checkpoint.drop()


def _no_arguments(name, line):
    if line.strip():
        raise CheckpointFailed(f"%{name} takes no arguments (got {line.strip()!r})")


def load_ipython_extension(shell):
    """Register ``%checkpoint`` and ``%restore``, and run ``%pip`` with pip's own temporary
    directory (IPython calls this at the kernel's start)."""
    magics = Magics(shell, WORK)
    shell.register_magic_function(magics.checkpoint, "line", "checkpoint")
    shell.register_magic_function(magics.restore, "line", "restore")
    pip = shell.find_line_magic("pip")
    if pip is not None and os.environ.get("PIP_TARGET"):
        shell.register_magic_function(packages.wrap_pip_magic(pip), "line", "pip")
