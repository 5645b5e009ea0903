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
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, cast, runtime_checkable

from .. import backends
from ..controls import escape_controls
from ..errors import KernelSandboxError
from ..metrics import usage_reply
from ..policy.output import OutputPolicy
from ..privdir import EXIT, LAUNCHER_LOCK, ORPHANED, OWNER_LOCK, PrivateDir
from . import journal
from .asleep import dormant_answers
from .dormant import (
    STATE_OPTION,
    decode_frames,
    dormant_argv,
    exec_with,
    handle_signals,
    read_state,
)
from .front import ExitStatus, Front, KernelLink
from .request import (
    LaunchRequest,
    Settings,
    read_request,
    request_from_state,
    request_state,
)
from .asleep import SleepableLink
from .sleep import Sleeper


@runtime_checkable
class RestingLink(KernelLink, Protocol):
    """A link that lets the dormant process (:mod:`.dormant`) hold its sleeping kernel's channels:
    the Docker :class:`Sleeper`, and the OpenSandbox link while its sandbox is paused."""

    resting: asyncio.Future[None]
    may_rest: Callable[[], bool]

    def snapshot(self) -> dict[str, Any]:
        """What a launcher exec'd anew needs to go on (JSON): with ``kernel_info``, ``lost`` (the
        names the sleep did not keep) and, optionally, ``new_kernel`` (False: the kernel that
        wakes is the same one) and ``keep`` (a command the dormant process runs meanwhile:
        :meth:`.dormant.Dormant._keep`)."""

    async def resume(self, front: Front, kept: dict[str, Any]) -> None:
        """Go on asleep as the launcher before an exec left off (``kept``: :meth:`snapshot`)."""

    def own_dir(self) -> PrivateDir | None:
        """The directory made for a kernel whose client ran argv (None: the provisioner's)."""


OWNER_CHECK_INTERVAL = 1.0
RECONNECT_WAIT = 5.0
"""Seconds a launcher exec'd by the dormant process waits for its clients to reconnect."""

log = logging.getLogger("kernel_sandbox.launch")


def make_link(request: LaunchRequest) -> KernelLink:
    """The kernel link of the request's backend (the registry imports its wing now: each pulls in
    its SDK); one that sleeps when idle with ``suspend_after`` (:mod:`.sleep`)."""
    link_class = backends.load(backends.for_settings(request.settings).link)
    if getattr(request.settings, "suspend_after", None) is None:
        link: KernelLink = link_class(request)
        return link
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


async def serve(
    request: LaunchRequest,
    status_fd: int | None = None,
    resumed: dict[str, Any] | None = None,
    may_exec: bool = False,
) -> int:
    """Run the kernel for ``request`` until it ends or is stopped; return the launcher's exit
    code. ``resumed``: the state a launcher before an exec left (:mod:`.dormant`); ``may_exec``:
    this process is the launcher's own, which a sleeping kernel's dormant process may replace."""
    loop = asyncio.get_running_loop()
    private = request.private
    if private is not None:
        _hold_lock(private, resumed)
    stop: asyncio.Future[str] = loop.create_future()
    front = Front(request.connection, output_policy(request.settings))
    try:
        # first, so that a client's first heartbeat is answered at once
        front.bind(resumed["listeners"] if resumed is not None else None)
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
    handle_signals()  # blocked across an exec by the dormant process
    owner = asyncio.ensure_future(_watch_owner(request, stop))
    ticking = asyncio.ensure_future(journal.keep_time())
    try:
        front.attach(link)
        if resumed is not None:
            started = asyncio.ensure_future(cast(RestingLink, link).resume(front, resumed["sleep"]))
        else:
            started = asyncio.ensure_future(link.start(front))
        await asyncio.wait((started, stop), return_when=asyncio.FIRST_COMPLETED)
        if started.done():
            started.result()
            front.kernel_ready()
            _report_ready(status_fd)
            status_fd = None  # closed: its number may be reused by now
            if resumed is not None:  # the launcher is busy (no rest) until it is done
                front.track(asyncio.ensure_future(_take_back(front, resumed, stop_with)))
            resting = _resting(link, request, may_exec, owner)
            status = await _until_ended(request, front, link, stop, resting)
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


async def _until_ended(
    request: LaunchRequest,
    front: Front,
    link: KernelLink,
    stop: asyncio.Future[str],
    resting: asyncio.Future[Any],
) -> ExitStatus:
    """Wait until the kernel ends or the launcher is stopped; meanwhile, once ``resting`` says so,
    let the dormant process take a sleeping kernel's place."""
    ended = asyncio.ensure_future(link.ended())
    while True:
        await asyncio.wait((ended, stop, resting), return_when=asyncio.FIRST_COMPLETED)
        if ended.done() or stop.done():
            break
        sleeper = cast(RestingLink, link)
        if front.input_waiting():  # a message came meanwhile: handled here, the rest is later
            sleeper.resting = resting = asyncio.get_running_loop().create_future()
            continue
        _go_dormant(request, front, sleeper)  # returns only if it failed
        resting = asyncio.get_running_loop().create_future()  # it sleeps on in this process
    return ended.result() if ended.done() else ExitStatus(0, stop.result())


def _resting(
    link: KernelLink, request: LaunchRequest, may_exec: bool, owner: asyncio.Future[None]
) -> asyncio.Future[Any]:
    """Done when the dormant process may take over the sleeping kernel: the launcher is its own
    process, the link is a :class:`RestingLink`, and the kernel's owner is there (else the owner
    watch counts down here)."""
    if not may_exec or not isinstance(link, RestingLink):
        return asyncio.get_running_loop().create_future()  # never
    private = request.private

    def owner_there() -> bool:
        if owner.done():
            return False
        if private is None:
            return os.getppid() == request.client_pid
        return private.held(OWNER_LOCK) and not (private / ORPHANED).exists()

    link.may_rest = owner_there
    return link.resting


def _go_dormant(request: LaunchRequest, front: Front, link: RestingLink) -> None:
    """Exec the dormant process (:mod:`.dormant`) in this one's place; returns only if the exec
    failed (the kernel then sleeps on here)."""
    lock = _lock_fd(request.private)
    locks = [fd for fd in (lock, _lock_fd(link.own_dir())) if fd is not None]
    argv = launcher_argv()
    listeners = front.listener_fds()
    owner = (
        {"pid": request.client_pid}
        if request.private is None
        else {"lock": str(request.private / OWNER_LOCK)}
    )
    gate_dir = front.gate_dir()
    kept = link.snapshot()
    answers = dormant_answers(kept["kernel_info"], kept["lost"], kept.get("new_kernel", True))
    state: dict[str, Any] = {
        "launcher": {
            "request": request_state(request),
            "sleep": kept,
            "listeners": listeners,
            "lock": lock,
            "argv": argv,
        },
        "answers": {
            kind: {
                "channels": channels,
                "reply": reply,
                # the launcher's own replies skip the output policy, as they do when it is awake
                "content": json.dumps(content)
                if kind in front.requests
                else front.reply_content(channels[0], reply, content),
                "status": status,
            }
            for kind, (channels, reply, content, status) in answers.items()
        },
        "key": request.connection.key.hex(),
        "signature_scheme": request.connection.signature_scheme,
        "transport": request.connection.transport,
        "locks": locks,
        "owner": owner,
        "remove": None if gate_dir is None else str(gate_dir.path),
        "keep": kept.get("keep"),
    }
    state["answers"]["usage_request"] = {
        "channels": ["control"],
        "reply": "usage_reply",
        "content": json.dumps(usage_reply(link.usage())),
        "status": False,
    }
    journal.installed().flush_counts()
    log.info("the sleeping kernel's channels go to the dormant process")
    try:
        exec_with(dormant_argv(argv), state, [*listeners.values(), *locks])
    except OSError as exc:
        log.warning("the sleeping kernel's launcher stays whole: %s", exc)


def _hold_lock(private: PrivateDir, resumed: dict[str, Any] | None) -> None:
    """Hold the launcher's lock of ``private``: the one inherited across an exec, if any."""
    if resumed is not None:
        private.adopt(LAUNCHER_LOCK, resumed["lock"])
    else:
        private.hold(LAUNCHER_LOCK)


def _lock_fd(directory: PrivateDir | None) -> int | None:
    return None if directory is None else directory.lock_fd(LAUNCHER_LOCK)


async def _take_back(
    front: Front, resumed: dict[str, Any], stop_with: Callable[[str], None]
) -> None:
    """After the dormant process exec'd the launcher again: stop at once if a signal was why;
    else wait for the clients to reconnect and handle the messages it read."""
    why = resumed["why"]
    if isinstance(why, str) and why.startswith("stopped by"):
        stop_with(why)
        return
    await front.clients_back(resumed["subscribers"], RECONNECT_WAIT)
    for channel, frames in resumed["pending"]:
        front.replay(channel, decode_frames(frames))


def launcher_argv() -> list[str]:
    """This launcher's command line, to exec it again (without the options of one start)."""
    argv, skip = [sys.executable], False
    for arg in sys.orig_argv[1:]:
        if skip:
            skip = False
        elif arg in ("--status-fd", STATE_OPTION):
            skip = True
        elif not arg.startswith(("--status-fd=", f"{STATE_OPTION}=")):
            argv.append(arg)
    return argv


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
    parser.add_argument(STATE_OPTION, dest="state_fd", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the launcher; the exit code is the kernel's fate (0: a clean shutdown)."""
    args = build_parser().parse_args(argv)
    journal.install(os.environ.get("KERNEL_SANDBOX_LOG_LEVEL", "WARNING").upper())
    resumed = read_state(args.state_fd) if args.state_fd is not None else None
    try:
        request = request_from_state(resumed["request"]) if resumed else read_request(args)
    except KernelSandboxError as exc:
        print(f"kernel-sandbox: {escape_controls(str(exc))}", file=sys.stderr)
        _close(args.status_fd)
        return 1
    return asyncio.run(serve(request, args.status_fd, resumed, may_exec=True))
