"""The launcher's watchdog: it removes the kernel's container when the launcher dies, whatever kills
it.

The Docker link starts it (``python -m kernel_sandbox.docker.watchdog LAUNCHER_PID KERNEL_ID
ENGINE``, in a session of its own, so that a signal to the launcher's process group does not
reach it) before it creates the container, and holds the write end of the pipe that is the
watchdog's stdin.
When the launcher ends, the pipe closes. After a clean end the launcher has written :data:`DONE`
first (its container is gone) and the watchdog just exits; otherwise (SIGKILL, the OOM killer, a
crash) it removes every container labelled with the launcher's pid and the kernel id, and looks
once more :data:`LATE_CREATE` seconds later for a create the engine was still handling. While
the engine fails it tries again every :data:`RETRY` s for :data:`PATIENCE` s.

This holds whatever the kernel does inside its container (it may stop the connector processes
that are its in-container lifeline) and for a container that never started (a created container
never reaches auto-remove). Until the launcher is gone the watchdog has imported the standard
library and the packages' registry entries (about 7 MiB of unique memory, next to each awake
kernel), never the Docker SDK, and waits in one ``read``. It writes nothing (it holds none of the
launcher's output pipes, which it may outlive); its exit code says whether it removed what was
left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

DONE = b"done"
"""What the launcher writes before it closes the pipe when its container is already removed."""
LATE_CREATE = 2.0
"""Seconds after which the watchdog looks again, for a container whose create was in flight."""
PATIENCE = 600.0
"""Seconds the watchdog keeps trying while the engine fails (a hung engine may come back)."""
RETRY = 10.0


def start(kernel_id: str, engine: str) -> subprocess.Popen[bytes]:
    """Start the watchdog of this launcher's containers for ``kernel_id`` on ``engine`` (the
    engine option); write :data:`DONE` to its stdin at a clean end."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernel_sandbox.docker.watchdog",
            str(os.getpid()),
            kernel_id,
            engine,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        # it may outlive the launcher: it holds none of the launcher's pipes
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def release(watchdog: subprocess.Popen[bytes] | None, done: bool) -> None:
    """Let the watchdog go: with ``done`` it exits at once, else it removes what is left."""
    if watchdog is None or watchdog.stdin is None or watchdog.stdin.closed:
        return
    try:
        if done:
            watchdog.stdin.write(DONE)
        watchdog.stdin.close()
    except OSError:
        pass


def main(argv: list[str]) -> int:
    """Wait for the launcher's end on stdin; remove its containers unless it said it was done."""
    launcher_pid, kernel_id, engine = argv
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # it ends with the launcher, never before
    said = b""
    while chunk := os.read(0, 64):
        said = (said + chunk)[: len(DONE) + 1]
    if said == DONE:
        return 0
    # the Docker SDK only when needed
    from .connect import docker_client
    from .containers import remove_launcher_containers

    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            client = docker_client(engine=engine)
            remove_launcher_containers(client, kernel_id, launcher_pid)
            time.sleep(LATE_CREATE)
            remove_launcher_containers(client, kernel_id, launcher_pid)
            break
        except Exception:  # the engine is gone, hung or failing: try again, then leave it to gc
            if time.monotonic() + RETRY > deadline:
                return 1  # `kernel-sandbox gc` removes them once the engine answers
            time.sleep(RETRY)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
