"""Starting a launcher process: its config file, its command, its start, its ``ready`` report.

Shared by a provisioner's launch (:mod:`.launched`) and a warm standby's (:mod:`.standby`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


from ..privdir import CONFIG, PrivateDir


def write_launcher_config(
    private: PrivateDir,
    backend: str,
    settings: dict[str, Any],
    kernel_id: str,
    env: dict[str, str],
    cwd: str | None,
) -> Path:
    """The launcher's 0600 config file in ``private``: the settings, the kernel's id, environment
    and cwd."""
    config = {
        "provisioner": backend,
        "settings": settings,
        "kernel_id": kernel_id,
        "env": env,
        "cwd": str(cwd) if cwd else None,
    }
    return private.write_json(CONFIG, config)


def launcher_command(connection_file: str, config_file: Path, status_fd: int) -> list[str]:
    """The command that runs the launcher for a provisioner (``status_fd``: where it reports
    ``ready``)."""
    return [
        sys.executable,
        "-m",
        "kernel_sandbox.launch",
        "-f",
        connection_file,
        "--config",
        str(config_file),
        "--status-fd",
        str(status_fd),
    ]


def start_launcher(cmd: list[str], status_fd: int, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Run the launcher as jupyter_client runs a local kernel (its own session), passing it
    ``status_fd``."""
    # here, not at the top: the launcher imports this module (pid_alive) and never needs it
    from jupyter_client.launcher import launch_kernel

    try:
        process: subprocess.Popen[bytes] = launch_kernel(cmd, pass_fds=(status_fd,), **kwargs)
    finally:
        os.close(status_fd)
    return process


def read_status(fd: int) -> bool:
    """Block until the launcher reports ``ready`` on the pipe, or closes it (False)."""
    with os.fdopen(fd, "rb") as pipe:
        return pipe.readline().strip() == b"ready"


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (also one of another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
