"""The launcher: ``python -m kernel_sandbox.launch -f CONNECTION_FILE (--kernelspec DIR | --config
FILE)``.

The one code path that sandboxes a kernel. Given the connection file a Jupyter client wrote, it
starts the kernel in a container with the kernelspec's provisioner settings and serves the
client's five channels by relaying them to it. Clients that launch a kernelspec's ``argv``
themselves (VS Code, PyCharm) run it with ``--kernelspec``; the Docker provisioner runs it with
``--config``, a 0600 file in the kernel's private directory holding its effective settings.

The kernelspec's provisioner picks the backend, through the registry
(:mod:`kernel_sandbox.backends`): ``kernel-sandbox-docker`` runs the kernel in a Docker container
(:mod:`kernel_sandbox.docker.link`), ``kernel-sandbox-opensandbox`` in an OpenSandbox sandbox
(:mod:`kernel_sandbox.opensandbox.link`); the OpenSandbox provisioner runs the launcher the same
way.

Lifecycle: SIGINT interrupts the running cell; SIGTERM, a ``shutdown_request`` or the end of
the launcher ends the kernel and removes its container or sandbox (a SIGKILLed launcher's
container ends through its lifeline; its sandbox expires ``timeout`` seconds after the last
renewal). When the process that started the launcher goes away, the kernel is
shut down: at once for a client that ran ``argv``, after ``orphan_timeout`` for a provisioner
(whose successor may re-attach meanwhile). Exit status 0 is a clean shutdown; a kernel that
could not be sandboxed exits 1 with one message on stderr saying why and how to fix it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from typing import cast

from .. import backends
from ..controls import escape_controls
from ..errors import KernelSandboxError
from ..policy.output import OutputPolicy
from ..privdir import EXIT, LAUNCHER_LOCK, ORPHANED, OWNER_LOCK, PrivateDir
from . import journal
from .front import ExitStatus, Front, KernelLink
from .request import (
    LaunchRequest,
    Settings,
    read_request,
)

OWNER_CHECK_INTERVAL = 1.0

log = logging.getLogger("kernel_sandbox.launch")


def make_link(request: LaunchRequest) -> KernelLink:
    """The kernel link of the request's backend (the registry imports its wing now: each pulls in
    its SDK); one that sleeps when idle with ``suspend_after`` (:mod:`.sleep`), unless the link
    does that itself (``SUSPENDS_ITSELF``: OpenSandbox pauses its sandbox)."""
    link_class = backends.load(backends.for_settings(request.settings).link)
    if getattr(request.settings, "suspend_after", None) is None or getattr(
        link_class, "SUSPENDS_ITSELF", False
    ):
        link: KernelLink = link_class(request)
        return link
    from .sleep import Sleeper, SleepableLink

    return Sleeper(request, lambda: cast(SleepableLink, link_class(request)))


def output_policy(settings: Settings) -> OutputPolicy:
    """A new output policy for one kernel connection with these settings (it tracks widget
    comms)."""
    return OutputPolicy.from_name(
        settings.output_policy,
        allow_mime_types=settings.allow_mime_types,
        allow_widget_modules=settings.allow_widget_modules,
        allow_help_links=settings.allow_help_links,
    )


async def _watch_owner(request: LaunchRequest, gone: asyncio.Future[str]) -> None:
    """Resolve ``gone`` when the process that started the launcher is no longer there."""
    private = request.private
    if private is None:
        while os.getppid() == request.client_pid:
            await asyncio.sleep(OWNER_CHECK_INTERVAL)
        gone.set_result("the client that started the kernel is gone")
        return
    timeout = request.settings.orphan_timeout
    free_since: float | None = None
    while True:
        if private.held(OWNER_LOCK):
            if free_since is not None:
                (private / ORPHANED).unlink(missing_ok=True)
            free_since = None
        else:
            # for `kernel-sandbox ps`: an orphan waiting to be re-attached, and until when
            if free_since is None:
                # the directory may be gone: the countdown goes on
                with contextlib.suppress(OSError):
                    private.write_json(ORPHANED, {"since": time.time(), "timeout": timeout})
            free_since = free_since or time.monotonic()
            if timeout is not None and time.monotonic() - free_since >= timeout:
                gone.set_result(
                    f"the process that started the kernel has been gone for {timeout:g} s"
                )
                return
        await asyncio.sleep(OWNER_CHECK_INTERVAL)


async def serve(request: LaunchRequest, status_fd: int | None = None) -> int:
    """Run the kernel for ``request`` until it ends or is stopped; return the launcher's exit
    code."""
    loop = asyncio.get_running_loop()
    private = request.private
    if private is not None:
        private.hold(LAUNCHER_LOCK)
    stop: asyncio.Future[str] = loop.create_future()
    front = Front(request.connection, output_policy(request.settings))
    try:
        front.bind()  # first, so that a client's first heartbeat is answered at once
    except KernelSandboxError as exc:
        print(f"kernel-sandbox: {escape_controls(str(exc))}", file=sys.stderr, flush=True)
        _finish(private, ExitStatus(1, str(exc), type(exc).__name__))
        return 1
    link = make_link(request)

    def stop_with(reason: str) -> None:
        if not stop.done():
            stop.set_result(reason)

    loop.add_signal_handler(signal.SIGTERM, stop_with, "stopped by SIGTERM")
    loop.add_signal_handler(signal.SIGHUP, stop_with, "stopped by SIGHUP")
    loop.add_signal_handler(signal.SIGINT, lambda: asyncio.ensure_future(link.interrupt()))
    owner = asyncio.ensure_future(_watch_owner(request, stop))
    ticking = asyncio.ensure_future(journal.keep_time())
    try:
        front.attach(link)
        started = asyncio.ensure_future(link.start(front))
        await asyncio.wait((started, stop), return_when=asyncio.FIRST_COMPLETED)
        if started.done():
            started.result()
            front.kernel_ready()
            _report_ready(status_fd)
            status_fd = None  # closed: its number may be reused by now
            ended = asyncio.ensure_future(link.ended())
            await asyncio.wait((ended, stop), return_when=asyncio.FIRST_COMPLETED)
            status = ended.result() if ended.done() else ExitStatus(0, stop.result())
        else:
            started.cancel()
            status = ExitStatus(0, stop.result())
    except KernelSandboxError as exc:
        status = ExitStatus(1, str(exc), type(exc).__name__)
        print(f"kernel-sandbox: {escape_controls(str(exc))}", file=sys.stderr, flush=True)
    except Exception as exc:
        log.exception("the launcher failed")
        status = ExitStatus(1, f"the launcher failed: {exc!r}")
    finally:
        owner.cancel()
        ticking.cancel()
        await link.stop()
        front.close()
        _close(status_fd)
    if status.code:
        log.error("kernel %s ended: %s", request.kernel_id, status.reason)
    journal.installed().flush_counts()
    _finish(private, status)
    return status.code


def _finish(private: PrivateDir | None, status: ExitStatus) -> None:
    """Leave the exit status for the provisioner that owns the directory, or remove the
    directory."""
    if private is None:
        return
    if private.held(OWNER_LOCK):
        # the server logs it, a program raises it: shown, never obeyed
        reason = escape_controls(status.reason)
        private.write_json(EXIT, {"code": status.code, "reason": reason, "error": status.error})
        private.release(LAUNCHER_LOCK)
    else:
        private.remove()  # nobody is left to read why the kernel ended


def _report_ready(status_fd: int | None) -> None:
    """Say ``ready`` to whoever started the launcher; one that stopped waiting (its process ended
    while a standby started) is no failure: the owner watch decides what comes next."""
    if status_fd is not None:
        with contextlib.suppress(BrokenPipeError):
            os.write(status_fd, b"ready\n")
        _close(status_fd)


def _close(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def build_parser() -> argparse.ArgumentParser:
    """The launcher's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m kernel_sandbox.launch",
        description="Start a sandboxed kernel for the client that wrote CONNECTION_FILE and relay "
        "its channels.",
    )
    parser.add_argument(
        "-f", dest="connection_file", required=True, help="the client's connection file"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--kernelspec",
        metavar="DIR",
        help="kernelspec directory whose kernel.json holds the settings",
    )
    source.add_argument(
        "--config", metavar="FILE", help="effective settings written by the provisioner (0600)"
    )
    parser.add_argument("--status-fd", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the launcher; the exit code is the kernel's fate (0: a clean shutdown)."""
    args = build_parser().parse_args(argv)
    journal.install(os.environ.get("KERNEL_SANDBOX_LOG_LEVEL", "WARNING").upper())
    try:
        request = read_request(args)
    except KernelSandboxError as exc:
        print(f"kernel-sandbox: {escape_controls(str(exc))}", file=sys.stderr)
        _close(args.status_fd)
        return 1
    return asyncio.run(serve(request, args.status_fd))
