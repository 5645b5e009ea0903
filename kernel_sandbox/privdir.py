"""Private host directories: one per kernel, under a per-user root, readable by their owner only.

The root is ``$XDG_RUNTIME_DIR/kernel-sandbox`` when ``XDG_RUNTIME_DIR`` is the user's own private
directory, else ``/tmp/kernel-sandbox-UID``. A root or kernel directory that is not a real
directory owned by this user with mode 0700 (say, one another account made first) is refused,
never used or repaired. No part of these directories is visible to a kernel: the container has
no bind mount of them, so every path in them was made by the host user's own processes.

What one kernel's directory holds (:class:`PrivateDir` names them):

* the client's IPC sockets (when the provisioner chose IPC) and the launcher's own sockets that
  lead to the kernel's channels;
* ``config.json``, the effective settings the provisioner hands to the launcher (0600);
* ``owner.lock``, held by the provisioner; ``launcher.lock``, held by the launcher while it lives;
* ``launcher.json`` (the launcher's pid and container id) and ``exit.json`` (why the kernel ended);
* for a kernel that was a standby (:mod:`kernel_sandbox.provisioners.standby`): ``connection.json``,
  the connection file the pool wrote for it, and ``adopted.json``, the id of the kernel it became;
* ``record.json``, what a later owner needs to re-attach (:mod:`kernel_sandbox.reattach`: the
  kernel's id and kernelspec name, the runtime directory of its server, the provisioner's info with
  the connection info, key included), and ``orphaned.json``, written by the launcher while no owner
  holds the directory (since when, and for how long it waits).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import KernelLaunchError

CONFIG = "config.json"
OWNER_LOCK = "owner.lock"
LAUNCHER_LOCK = "launcher.lock"
LAUNCHER_STATE = "launcher.json"
EXIT = "exit.json"
ADOPTED = "adopted.json"
RECORD = "record.json"
ORPHANED = "orphaned.json"
SECRETS = "secrets.json"
SLEEP = "sleep.json"
"""Written by the launcher while its kernel sleeps (``suspend_after``), or stays awake and why."""
SUSPEND_REQUEST = "kernel_sandbox_suspend_request"
"""A control request (from a client holding the connection key) to put the kernel to sleep now."""
WAKE_REQUEST = "kernel_sandbox_wake_request"
"""A control request to wake a sleeping kernel now."""
SLEEP_SLOT = ".sleep"
"""The name a sleeping kernel's checkpoint is kept under (:func:`kept_checkpoint`), beside its own
``%checkpoint``."""
NEW_DIR_GRACE_SECONDS = 60
CHECKPOINT_SUFFIX = ".checkpoint"
PART_SUFFIX = ".part"
STORE_LOCK = ".lock"


def user_root() -> Path:
    """The current user's root for private directories, created (0700) when missing, then
    checked."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and _is_private_dir(Path(runtime_dir)):
        root = Path(runtime_dir) / "kernel-sandbox"
    else:
        root = Path(tempfile.gettempdir()) / f"kernel-sandbox-{os.geteuid()}"
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    require_private(root)
    return root


def checkpoint_root() -> Path:
    """Where the launchers keep kernels' checkpoints (``%checkpoint``): on disk, in
    ``$XDG_STATE_HOME`` (else ``~/.local/state``) ``/kernel-sandbox/checkpoints``, 0700, not in the
    private directories, which are often on a small tmpfs (``$XDG_RUNTIME_DIR``)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "kernel-sandbox" / "checkpoints"


def kept_checkpoint(private: Path, slot: str = "") -> Path:
    """The file of the checkpoint kept for the kernel whose private directory is ``private`` (in
    ``slot``: :data:`SLEEP_SLOT` for its sleep)."""
    return checkpoint_root() / f"{private.name}{slot}{CHECKPOINT_SUFFIX}"


def checkpoint_part(private: Path, slot: str = "") -> Path:
    """The file a checkpoint for the kernel whose private directory is ``private`` is written to
    before it replaces the kept one; its writer holds a lock on it (:func:`remove_dead_parts`)."""
    return checkpoint_root() / f"{private.name}{slot}{CHECKPOINT_SUFFIX}{PART_SUFFIX}"


@contextlib.contextmanager
def checkpoint_store() -> Iterator[Path]:
    """The checkpoint root (made 0700 when missing, then checked), locked against every other
    launcher and ``gc`` of this user while the block runs."""
    root = checkpoint_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    require_private(root)
    fd = os.open(root / STORE_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield root
    finally:
        os.close(fd)


def stored_bytes(root: Path, slot: str = "") -> tuple[int, int]:
    """``(bytes, files)`` of the checkpoints under ``root`` (only those of ``slot``, when given:
    :data:`SLEEP_SLOT`), kept and partial (a partial one is counted at the size its writer
    reserved)."""
    total = count = 0
    kept = slot + CHECKPOINT_SUFFIX  # a private directory's name has no dot: no other slot ends so
    for entry in os.scandir(root):
        if entry.name.endswith((kept, kept + PART_SUFFIX)) and (
            entry.is_file(follow_symlinks=False)
        ):
            total += entry.stat(follow_symlinks=False).st_size
            count += 1
    return total, count


def remove_dead_parts() -> list[Path]:
    """Remove the partial checkpoints no living launcher writes (a launcher killed mid-copy left
    them); return their paths."""
    if not checkpoint_root().is_dir():
        return []
    removed = []
    with checkpoint_store() as root:
        for part in root.glob(f"*{CHECKPOINT_SUFFIX}{PART_SUFFIX}"):
            try:
                fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its launcher lives and writes it
            else:
                part.unlink(missing_ok=True)
                removed.append(part)
            finally:
                os.close(fd)
    return removed


def note_sleep(private: PrivateDir | None, state: dict[str, Any] | None) -> None:
    """Write (None: remove) the kernel's :data:`SLEEP` for ``ps`` and ``metrics()``: it sleeps,
    or stays awake and why; nothing without a private directory."""
    if private is None:
        return
    with contextlib.suppress(OSError):
        if state is None:
            (private / SLEEP).unlink(missing_ok=True)
        else:
            private.write_json(SLEEP, state)


def sleep_note(private: Path) -> dict[str, Any]:
    """What the launcher of the kernel whose private directory is ``private`` last noted of its
    sleep (:data:`SLEEP`: ``state`` ``suspended``, or ``awake`` with ``why``); empty when none."""
    try:
        state = json.loads((private / SLEEP).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def sleeping(private: Path) -> bool:
    """True while the kernel whose private directory is ``private`` sleeps."""
    return sleep_note(private).get("state") == "suspended"


def remove_private(path: Path) -> None:
    """Delete a kernel's private directory with everything in it, and the checkpoint kept (or
    being written) for it."""
    shutil.rmtree(path, ignore_errors=True)
    for slot in ("", SLEEP_SLOT):
        kept_checkpoint(path, slot).unlink(missing_ok=True)
        checkpoint_part(path, slot).unlink(missing_ok=True)


def _is_private_dir(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def require_private(path: Path) -> None:
    """Raise :class:`KernelLaunchError` unless ``path`` is a real directory of this user, mode
    0700."""
    if not _is_private_dir(path):
        try:
            info = os.lstat(path)
            found = f"owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}"
        except OSError as exc:
            found = exc.strerror or str(exc)
        raise KernelLaunchError(
            f"{path} is not a private directory of uid {os.geteuid()} ({found}); kernel-sandbox "
            "keeps kernel keys and sockets only in a directory that is the user's own with mode "
            "0700. Another account may have made it first: remove it (as root) or set "
            "XDG_RUNTIME_DIR to a private directory."
        )


class PrivateDir:
    """One kernel's private directory on the host."""

    def __init__(self, path: Path) -> None:
        require_private(path)
        self.path = path
        self._held: dict[str, int] = {}

    @classmethod
    def create(cls) -> PrivateDir:
        """Make a new directory with a random name under :func:`user_root`."""
        return cls(Path(tempfile.mkdtemp(prefix="", dir=user_root())))

    def __repr__(self) -> str:
        return f"PrivateDir({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def ipc(self, name: str) -> str:
        """A ZMQ ``ipc://`` address for a socket file named ``name`` in this directory."""
        return f"ipc://{self.path / name}"

    def write_json(self, name: str, data: Any) -> Path:
        """Write ``data`` as JSON to ``name``, replacing it atomically; the file is 0600."""
        target = self.path / name
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{name}.")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, target)
        return target

    def read_json(self, name: str) -> Any:
        """The JSON content of ``name``, or None when it does not exist."""
        try:
            return json.loads((self.path / name).read_text())
        except FileNotFoundError:
            return None

    def _open(self, name: str) -> int:
        return os.open(
            self.path / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )

    def hold(self, name: str) -> bool:
        """Take the lock ``name`` and keep it until :meth:`release`; False when another holds it."""
        if name in self._held:
            return True
        fd = self._open(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        self._held[name] = fd
        return True

    def lock_fd(self, name: str) -> int | None:
        """The descriptor holding the lock ``name`` (None: not held by this object)."""
        return self._held.get(name)

    def adopt(self, name: str, fd: int) -> None:
        """Hold the lock ``name`` by ``fd``, inherited across an exec (:mod:`.launch.dormant`)."""
        os.set_inheritable(fd, False)
        self._held[name] = fd

    def release(self, name: str) -> None:
        """Let go of the lock ``name`` if this object holds it."""
        fd = self._held.pop(name, None)
        if fd is not None:
            os.close(fd)

    def held(self, name: str) -> bool:
        """True when some process (this one included) holds the lock ``name``."""
        if name in self._held:
            return True
        try:
            fd = os.open(self.path / name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def remove(self) -> None:
        """Release every lock and delete the directory with everything in it."""
        for name in list(self._held):
            self.release(name)
        remove_private(self.path)


def abandoned_dirs() -> list[Path]:
    """Kernel directories under the user's root that no provisioner or launcher holds any more."""
    root = user_root()
    found = []
    for entry in root.iterdir():
        if (
            not _is_private_dir(entry)
            or time.time() - entry.stat().st_mtime < NEW_DIR_GRACE_SECONDS
        ):
            continue
        directory = PrivateDir(entry)
        if not directory.held(OWNER_LOCK) and not directory.held(LAUNCHER_LOCK):
            found.append(entry)
    return found
