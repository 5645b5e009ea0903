"""Kernels that outlive their owner: found again by the next Jupyter server, or by another process.

A provisioner leaves ``record.json`` in its kernel's private directory
(:mod:`kernel_sandbox.privdir`): the kernel's id and kernelspec name, the runtime directory of its
server and what ``get_provisioner_info`` returns (the private directory, the launcher's pid, the
connection info with its key). When the owner goes (SIGTERM, SIGKILL, a crash), the launcher keeps
the kernel for ``orphan_timeout`` seconds, and writes ``orphaned.json`` meanwhile. Whoever takes the
owner lock before that becomes the owner: a Jupyter server at its start (the kernels its runtime
directory had, :mod:`kernel_sandbox.server`), a program with :func:`attach`
(``AsyncSandbox.attach``).

Nothing of a record is trusted on its own say: the directory must be the user's own 0700 one,
the record a regular 0600 file of the user (never a symlink), of the expected shape, naming its own
directory, the kernel id the launcher was started for, a live launcher of that directory (its
pid, owned by the user) and, on Docker, a container whose labels name that launcher and
directory. A record that fails is logged with the reason and left alone: nothing is started,
signalled or removed on its say (the launcher still ends at ``orphan_timeout``).

The Jupyter server's managers that use this are in :mod:`kernel_sandbox.server` (jupyter_server
is needed only there).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager, _get_future
from jupyter_client.provisioning import KernelProvisionerFactory

from .errors import ConfigError, KernelLaunchError
from .privdir import (
    ADOPTED,
    CONFIG,
    EXIT,
    LAUNCHER_LOCK,
    LAUNCHER_STATE,
    ORPHANED,
    OWNER_LOCK,
    RECORD,
    PrivateDir,
    user_root,
)

RECORD_MAX_BYTES = 256 * 1024
_KERNEL_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]{0,99}")

log = logging.getLogger("kernel_sandbox.reattach")


@dataclass(frozen=True)
class Record:
    """A kernel waiting for (or held by) an owner, as its private directory describes it,
    checked."""

    kernel_id: str
    kernel_name: str
    runtime_dir: str
    provisioner_info: dict[str, Any]
    private: Path
    backend: str
    settings: dict[str, Any]
    env: dict[str, str]
    cwd: str | None
    orphaned: dict[str, Any] | None
    """``since`` (epoch seconds) and ``timeout`` while no owner holds it, else None."""

    def time_left(self) -> float | None:
        """Seconds until the launcher ends an orphan (None: it has an owner, or waits without
        limit)."""
        if self.orphaned is None or not isinstance(self.orphaned.get("timeout"), (int, float)):
            return None
        since = self.orphaned.get("since")
        return max(
            0.0,
            float(since if isinstance(since, (int, float)) else time.time())
            + self.orphaned["timeout"]
            - time.time(),
        )

    @property
    def attached(self) -> bool:
        """True while some process holds the kernel's owner lock."""
        return PrivateDir(self.private).held(OWNER_LOCK)


def _read_private_json(path: Path) -> Any:
    """The JSON of a regular file of this user that no other account may write; KernelLaunchError
    otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise KernelLaunchError(
            f"{path}: cannot open it ({exc.strerror}; a symlink is refused)"
        ) from exc
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise KernelLaunchError(
                f"{path} is not a regular file of uid {os.geteuid()} that only it may write "
                f"(owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)})"
            )
        data = handle.read(RECORD_MAX_BYTES + 1)
    if len(data) > RECORD_MAX_BYTES:
        raise KernelLaunchError(f"{path} is larger than {RECORD_MAX_BYTES} bytes")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise KernelLaunchError(f"{path} is not JSON ({exc})") from exc


def _field(data: Any, name: str, kind: type, where: Path) -> Any:
    value = data.get(name) if isinstance(data, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise KernelLaunchError(f"{where}: {name!r} is missing or not a {kind.__name__}")
    return value


def read_record(directory: Path) -> Record:
    """The checked record of the kernel in ``directory``; KernelLaunchError saying what is wrong."""
    private = PrivateDir(directory)  # the user's own, 0700, not a symlink
    record_file, path = private / RECORD, private.path
    record = _read_private_json(record_file)
    kernel_id = _field(record, "kernel_id", str, record_file)
    if not _KERNEL_ID.fullmatch(kernel_id):
        raise KernelLaunchError(f"{record_file}: {kernel_id[:100]!r} is not a kernel id")
    info = _field(record, "provisioner_info", dict, record_file)
    if info.get("private_dir") != str(path):
        raise KernelLaunchError(
            f"{record_file} names another private directory "
            f"({str(info.get('private_dir'))[:200]!r})"
        )
    connection = _field(info, "connection_info", dict, record_file)
    for name in ("key", "signature_scheme", "transport", "ip"):
        _field(connection, name, str, record_file)
    if connection["transport"] != "ipc" or Path(connection["ip"]).parent != path:
        raise KernelLaunchError(
            f"{record_file}: the kernel's channels are not sockets of its own directory"
        )
    config = _read_private_json(private / CONFIG)
    started_as = _field(config, "kernel_id", str, private / CONFIG)
    adopted = _read_private_json(private / ADOPTED) if (private / ADOPTED).exists() else None
    expected = (
        _field(adopted, "kernel_id", str, private / ADOPTED) if adopted is not None else started_as
    )
    if kernel_id != expected:
        raise KernelLaunchError(
            f"{record_file} says kernel {kernel_id}, but the launcher there runs kernel {expected}"
        )
    pid = _field(info, "pid", int, record_file)
    _check_launcher(private, pid)
    env = config.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise KernelLaunchError(f"{private / CONFIG}: 'env' is not a mapping of names to strings")
    orphaned = _read_private_json(private / ORPHANED) if (private / ORPHANED).exists() else None
    return Record(
        kernel_id=kernel_id,
        kernel_name=_field(record, "kernel_name", str, record_file),
        runtime_dir=_field(record, "runtime_dir", str, record_file),
        provisioner_info=info,
        private=path,
        backend=_field(config, "provisioner", str, private / CONFIG),
        settings=_field(config, "settings", dict, private / CONFIG),
        env=env,
        cwd=config.get("cwd") if isinstance(config.get("cwd"), str) else None,
        orphaned=orphaned if isinstance(orphaned, dict) else None,
    )


def _check_launcher(private: PrivateDir, pid: int) -> None:
    """Raise unless ``pid`` is this user's live launcher of ``private`` (the one that holds its
    launcher lock)."""
    state = private.read_json(LAUNCHER_STATE)
    if not private.held(LAUNCHER_LOCK) or not isinstance(state, dict) or state.get("pid") != pid:
        raise KernelLaunchError(
            f"{private.path}: no live launcher with pid {pid} holds it (the kernel ended)"
        )
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError as exc:
        raise KernelLaunchError(
            f"{private.path}: the launcher pid {pid} is gone ({exc.strerror})"
        ) from exc
    if owner != os.geteuid() or os.fsencode(str(private / CONFIG)) not in command:
        raise KernelLaunchError(
            f"{private.path}: pid {pid} is not this user's launcher of that directory"
        )


def records(runtime_dir: str | None = None) -> tuple[list[Record], list[str]]:
    """Every checked kernel record of this user, and one line per directory whose record was
    refused; with ``runtime_dir``, a refusal of a record that names another runtime directory
    (another server's kernel, e.g. one whose launcher was killed) is left out."""
    found, refused = [], []
    for entry in sorted(user_root().iterdir()):
        if entry.is_symlink() or not entry.is_dir():
            continue
        if not os.path.lexists(entry / RECORD) or _ended(entry):
            continue
        try:
            found.append(read_record(entry))
        except KernelLaunchError as exc:
            if runtime_dir is None or _recorded_runtime_dir(entry) in (None, runtime_dir):
                refused.append(str(exc))
        # a shape nobody foresaw: refused too
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            refused.append(f"{entry}: unreadable record ({exc!r})")
    return found, refused


def _recorded_runtime_dir(directory: Path) -> str | None:
    """The runtime directory a refused record names (resolved), None when it cannot be read."""
    try:
        named = _read_private_json(directory / RECORD).get("runtime_dir")
    except (KernelLaunchError, OSError, ValueError, AttributeError):
        return None
    return os.path.realpath(named) if isinstance(named, str) else None


def _ended(directory: Path) -> bool:
    """True when the kernel of ``directory`` ended and left its exit status (its owner reads it and
    removes the directory, or ``kernel-sandbox gc`` does): nothing to re-attach, nothing wrong."""
    try:
        return os.path.lexists(directory / EXIT) and not PrivateDir(directory).held(LAUNCHER_LOCK)
    except KernelLaunchError:  # not the user's own directory: read_record says so
        return False


def find(kernel_id: str) -> Record:
    """The checked record of the live kernel ``kernel_id``; KernelLaunchError when there is none."""
    found, refused = records()
    for record in found:
        if record.kernel_id == kernel_id:
            return record
    detail = "".join(f"\n  refused: {line}" for line in refused)
    raise KernelLaunchError(
        f"no live sandboxed kernel {kernel_id} of uid {os.geteuid()} to re-attach to{detail}"
    )


def _taken(record: Record) -> PrivateDir:
    private = PrivateDir(record.private)
    if not private.hold(OWNER_LOCK):
        raise KernelLaunchError(
            f"kernel {record.kernel_id} is attached to another process (it holds "
            f"{private / OWNER_LOCK})"
        )
    return private


def take(km: AsyncKernelManager, record: Record) -> None:
    """Make ``km`` the owner of the recorded kernel: its provisioner, connection info and restart
    arguments.

    Blocking (a few file reads and, on Docker, one engine call); raises KernelLaunchError and takes
    nothing when the record or what it names is not this kernel's.
    """
    from .provisioners.launched import LaunchedProvisioner

    provisioner = KernelProvisionerFactory.instance(parent=km.parent).create_provisioner_instance(
        record.kernel_id, km.kernel_spec, parent=km
    )
    if not isinstance(provisioner, LaunchedProvisioner) or provisioner.backend != record.backend:
        raise KernelLaunchError(
            f"kernel {record.kernel_id} ran on {record.backend}, but kernelspec {km.kernel_name!r} "
            "does not select it"
        )
    private = _taken(record)
    try:
        provisioner.check_orphan(private.read_json(LAUNCHER_STATE) or {}, private)
    except Exception:
        private.release(OWNER_LOCK)
        raise
    info = record.provisioner_info
    provisioner.pid, provisioner.pgid, provisioner.ip = (
        info["pid"],
        info.get("pgid"),
        info.get("ip"),
    )
    provisioner.private = private
    provisioner.connection_info = info["connection_info"]
    provisioner.hold_share(record.settings)  # its share of this process's kernel budget
    km.kernel_id = record.kernel_id
    km.provisioner = provisioner
    km.load_connection_info(info["connection_info"])
    # typed here: jupyter_client annotates _launch_args as Dict[str, traitlets.Any] (the trait
    # class)
    launch_args: dict[str, Any] = {
        "env": {**os.environ, **record.env},
        **({"cwd": record.cwd} if record.cwd else {}),
    }
    km._launch_args = launch_args
    km._attempted_start = True  # as after start_kernel: a shutdown or restart makes a fresh `ready`
    km._ready = _get_future()
    km._ready.set_result(None)


async def attach(kernel_id: str, km: AsyncKernelManager) -> AsyncKernelManager:
    """Make ``km`` (of the kernel's kernelspec) the owner of the live kernel ``kernel_id`` and start
    its restarter."""
    take(km, find(kernel_id))
    km.start_restarter()
    km._connect_control_socket()
    return km


def session_database(runtime_dir: str) -> str:
    """The session database of the servers of ``runtime_dir``: a 0600 file in the user's private
    root."""
    digest = hashlib.sha256(os.path.realpath(runtime_dir).encode()).hexdigest()[:16]
    path = user_root() / f"sessions-{digest}.db"
    try:
        os.close(
            os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        )
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ConfigError(
                f"{path} is not a 0600 file of uid {os.geteuid()} (owner uid {info.st_uid}, mode "
                f"{stat.filemode(info.st_mode)}); remove it, or set "
                "SessionManager.database_filepath"
            ) from None
    return str(path)
