"""The Docker link's channels (:class:`ChannelLink`): one stream per channel, opened through an exec
stream (or a socket in the container's network namespace), opened again when it ends (up to
:data:`REOPEN_LIMIT` losses in a row), and the messages relayed each way, signed with the
kernel's own key. The link's engine watching (:mod:`.events`) and its start and stop
(:mod:`.link`) build on it."""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, cast

import docker
import docker.errors

from ..kernelside import source
from ..kernelside.boot import PORTS, SIGNATURE_SCHEME
from ..launch import egress
from ..launch.checkpoints import CheckpointStore
from ..launch.messages import DELIM, REQUEST_CHANNELS, Signer, msg_type_of, parse_part, unpack
from ..launch.front import ExitStatus, Front
from ..metrics import CgroupProbe, Usage
from ..privdir import PrivateDir
from .blobs import ContainerFiles
from .output import KernelOutput
from .exec_stream import own_socket
from .kernel_stream import ChannelStream
from .netns import connect_in_netns
from .settings import DockerSettings

if TYPE_CHECKING:
    from ..launch.intercept import SecretTable
    from ..launch.request import LaunchRequest

log = logging.getLogger("kernel_sandbox.launch")


PROBE = b"kernel-sandbox-probe"
OOM_PROBE = b"kernel-sandbox-oom-probe"
"""The heartbeat ping sent after each OOM event: its echo says the kernel's process lived through
it (the OOM killer took another process of the container)."""
REOPEN_DELAY = 0.2
"""Seconds before a kernel stream that ended is opened again; doubled after each loss, up to
:data:`REOPEN_MAX_DELAY`."""
REOPEN_MAX_DELAY = 5.0
REOPEN_LIMIT = 10
"""Losses of one channel in a row (none of them open for :data:`REOPEN_STABLE` s) that end the
kernel."""
REOPEN_STABLE = 10.0
WAITING_LIMIT = 1000
"""Client messages kept per channel while its stream is not open yet (ZMQ's own default queue
size)."""
EXIT_REPORT_WAIT = 5.0
"""Seconds to wait for the engine's report of a kernel that died while its channels were opened."""
LIFELINE_CHANNEL = "hb"
"""The channel that always goes through an exec stream: its connector is the kernel's lifeline."""
CHANNEL_PORTS = {
    channel: PORTS[f"{channel}_port"] for channel in (*REQUEST_CHANNELS, "iopub", "hb")
}
RUNS_CODE = ("execute_request", "comm_open", "comm_msg", "comm_close")
"""The shell requests that run the user's code: what an interrupt is for."""
RUNNING_LIMIT = 1024
"""Such requests the launcher follows at once (more: the kernel counts as running)."""
SHUTDOWN_WAIT = 10.0
"""Seconds a kernel has, after its ``shutdown_request``, to exit on its own before the launcher
stops it (as jupyter_client's manager kills a kernel after ``shutdown_wait_time``: an ipykernel
thread left running can keep the interpreter from exiting)."""


class ChannelLink:
    """The Docker link's state, and its channels: each opened, reopened when it ends, and the
    messages relayed each way; how the kernel ended is recorded here (:meth:`_end`)."""

    def __init__(self, request: LaunchRequest) -> None:
        self.request = request
        # make_link chose this link by their type
        self.settings = cast(DockerSettings, request.settings)
        self.container_id: str | None = None
        self.output = KernelOutput()
        self._key = secrets.token_hex(32)
        self._signer = Signer(self._key.encode(), SIGNATURE_SCHEME)
        self._client: docker.DockerClient | None = None
        self._engine = "docker"
        """The engine that runs the container: 'docker' (``DOCKER_HOST``) or 'podman'."""
        self._engine_is_podman = False
        """Podman answers there (also when ``DOCKER_HOST`` names its socket)."""
        self._front: Front | None = None
        self._channels: dict[str, ChannelStream] = {}
        self._waiting: dict[str, collections.deque[list[Any]]] = {
            name: collections.deque() for name in CHANNEL_PORTS
        }
        self._streams: list[asyncio.BaseTransport] = []
        self._execs: dict[str, asyncio.Transport] = {}
        """The exec streams by exec id: each is closed when the engine reports its process's end
        (code in the kernel that holds a process's pipe open keeps its stream open otherwise)."""
        self._events: Any = None
        self._oom_events = 0
        """OOM kills the engine reported in the container (any of its processes)."""
        self._oom_lived = 0
        """The most of them the kernel's process answered a heartbeat after: it was not their
        victim."""
        self._oom = False
        """True when the kernel's own process ended out of memory (decided at its end)."""
        self._stopping = False
        self._loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[ExitStatus] = self._loop.create_future()
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._welcomed: asyncio.Future[None] = self._loop.create_future()
        self._informed: asyncio.Future[None] = self._loop.create_future()
        self._info_id = secrets.token_hex(16)
        self._creating: asyncio.Future[Any] | None = None
        self._netns: int | None = None
        self._cancel = threading.Event()
        self._losses = dict.fromkeys(CHANNEL_PORTS, 0)
        self._paused: set[str] = set()
        self._watchdog: Any = None
        self._engine_hung = False
        self._probing: asyncio.Future[None] | None = None
        self._reopening: set[asyncio.Future[None]] = set()
        self._shutdown_asked = False
        self._running: set[str] = set()
        """The ids of the client's requests that run code (:data:`RUNS_CODE`) whose idle status
        has not come: for :meth:`interrupt` alone. Per request: ipykernel handles control
        requests in their own thread, so the idle of one says nothing of a cell that runs."""
        self._egress: egress.Egress | None = None
        self._secrets: SecretTable | None = None
        self._cgroup: CgroupProbe | None = None
        self._checked = Usage()
        self._killed: str | None = None
        self._broken_by: ExitStatus | None = None
        self._checkpoints: CheckpointStore | None = None
        self._files: ContainerFiles | None = None
        self._own_dir: PrivateDir | None = None
        self.keep_dir: PrivateDir | None = None
        """Where ``%checkpoint`` keeps its blob when the request has no private directory (a
        sleeping kernel's launcher lends its own, so that the blob outlives the container); None:
        a directory of the link's own, for its life."""

    def _exec_socket(self, cmd: list[str]) -> tuple[str, socket.socket]:
        """Run ``cmd`` in the container; its exec id and its stdin/stdout stream."""
        assert self._client is not None and self.container_id is not None
        exec_id = self._client.api.exec_create(
            self.container_id, cmd, stdin=True, stdout=True, stderr=True
        )["Id"]
        return exec_id, own_socket(self._client.api.exec_start(exec_id, socket=True))

    async def _open_channel(self, name: str) -> None:
        port, wait = CHANNEL_PORTS[name], self.settings.launch_timeout
        netns = None if name == LIFELINE_CHANNEL else self._netns
        exec_id = None
        if netns is not None:
            # past the launch deadline, so that a kernel that never listens is reported as such
            sock = await connect_in_netns(netns, port, wait + EXIT_REPORT_WAIT, self._cancel)
        else:
            cmd = ["python", "-I", "-S", "-c", source("connector"), str(port), str(wait)]
            exec_id, sock = await asyncio.to_thread(self._exec_socket, cmd)
        if self._stopping:
            sock.close()
            return
        transport, _ = await self._loop.connect_accepted_socket(
            lambda: ChannelStream(self, name, multiplexed=netns is None), sock
        )
        if exec_id is not None:
            self._execs[exec_id] = transport

    # -- channels and messages -----------------------------------------------------------------

    def _channel_open(self, channel: ChannelStream) -> None:
        self._channels[channel.name] = channel
        if channel.name in self._paused and channel.transport is not None:
            channel.transport.pause_reading()
        waiting = self._waiting[channel.name]
        while waiting:
            channel.send(waiting.popleft())

    def _expected_loss(self) -> bool:
        """True when losing a kernel stream is what should happen: the launcher stops, the kernel
        ended, or a client asked it to shut down (a restart too)."""
        return self._stopping or self._ended.done() or self._shutdown_asked

    def _open_failed(self, name: str, reason: object) -> None:
        """Log a kernel stream that could not be (re)opened: a warning only when nothing explains
        it."""
        if self._expected_loss():
            log.debug("the kernel's %s stream did not open while the kernel ends: %s", name, reason)
        else:
            log.warning("could not reopen the kernel's %s stream: %s", name, reason)

    def _channel_lost(self, channel: ChannelStream) -> None:
        if self._channels.get(channel.name) is channel:
            del self._channels[channel.name]
        if channel.engine_text is not None:
            text = channel.engine_text.decode(errors="replace").strip()
            self._open_failed(
                channel.name, f"the Docker engine could not start its connector ({text})"
            )
        if self._stopping or self._ended.done():
            return
        name = channel.name
        stable = time.monotonic() - channel.opened >= REOPEN_STABLE
        losses = self._losses[name] = 1 if stable else self._losses[name] + 1
        if losses > REOPEN_LIMIT:
            self._end(
                ExitStatus(
                    1,
                    f"the kernel's {name} stream ended {REOPEN_LIMIT} times in a row; it was "
                    "stopped",
                )
            )
            return
        delay = min(REOPEN_DELAY * 2 ** (losses - 1), REOPEN_MAX_DELAY)
        log.debug("the kernel's %s stream ended; opening another in %.1f s", name, delay)

        async def reopen() -> None:
            await asyncio.sleep(delay)
            if not (self._stopping or self._ended.done()):
                try:
                    await self._open_channel(name)
                # judged after the failure: stop() cancels a connect in flight
                except Exception as exc:
                    self._open_failed(name, exc)

        task = asyncio.ensure_future(reopen())
        self._reopening.add(task)
        task.add_done_callback(self._reopening.discard)

    def _throttle(self, channel: str, paused: bool) -> None:
        if self._front is not None and channel in REQUEST_CHANNELS:
            self._front.throttle(channel, paused)

    def _send(self, channel: str, frames: list[Any]) -> None:
        open_channel = self._channels.get(channel)
        if open_channel is not None:
            open_channel.send(frames)
        elif len(self._waiting[channel]) < WAITING_LIMIT:
            self._waiting[channel].append(frames)
        else:
            log.warning("dropped a %s message: the kernel's channel is not open", channel)

    def _from_kernel(self, channel: str, frames: list[bytes]) -> None:
        if channel == "hb":
            if frames[0] == PROBE:
                if not self._ready.done():
                    self._ready.set_result(None)
            elif frames[0] == OOM_PROBE and len(frames) == 2 and frames[1].isdigit():
                self._oom_lived = max(self._oom_lived, min(int(frames[1]), self._oom_events))
            elif self._front is not None:
                self._front.heartbeat_reply(frames)
            return
        message = unpack(frames, self._signer, f"kernel on {channel}")
        if message is None or self._front is None:
            return
        idents, parts = message
        if channel == "iopub" and b"status" in parts[0] and msg_type_of(parts[0]) == "status":
            self._note_status(parts)
        if channel == "iopub" and not self._welcomed.done() and b"iopub_welcome" in parts[0]:
            self._welcomed.set_result(None)
        if not idents and channel == "shell" and self._info_id.encode() in parts[1]:
            if not self._informed.done():
                self._informed.set_result(None)
            return  # the answer to the launcher's own request
        self._front.from_kernel(channel, idents, parts)

    def _note_status(self, parts: list[Any]) -> None:
        if self._running and b'"idle"' in parts[3]:
            parent = parse_part(parts[1])
            if isinstance(parent, dict):
                self._running.discard(str(parent.get("msg_id")))

    def running(self) -> bool:
        """Whether a request of the client's that runs code has not ended (said idle)."""
        return bool(self._running)

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """Sign a client message with the kernel's key and send it on (noting a shutdown
        request)."""
        header = parts[0]
        if (
            channel == "shell"
            and isinstance(header, bytes)
            and (b"execute_request" in header or b"comm_" in header)
            and len(self._running) < RUNNING_LIMIT
        ):
            request = parse_part(header)
            if isinstance(request, dict) and request.get("msg_type") in RUNS_CODE:
                self._running.add(str(request.get("msg_id")))
        if (
            not self._shutdown_asked
            and channel != "stdin"
            and isinstance(header, bytes)
            and b"shutdown_request" in header
            and msg_type_of(header) == "shutdown_request"
        ):
            self._shutdown_asked = True
            self._loop.call_later(SHUTDOWN_WAIT, self._shutdown_overdue)
        self._send(channel, [*idents, DELIM, self._signer.sign(parts), *parts])

    def heartbeat(self, frames: list[Any]) -> None:
        """Forward a ping to the kernel's heartbeat."""
        self._send("hb", list(frames))

    def pause_reading(self, channel: str, paused: bool) -> None:
        """Stop (resume) reading ``channel``'s stream: the kernel's own socket then holds or drops
        its messages."""
        if paused:
            self._paused.add(channel)
        else:
            self._paused.discard(channel)
        open_channel = self._channels.get(channel)
        transport = open_channel.transport if open_channel is not None else None
        if transport is not None and not transport.is_closing():
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    # -- life and death ------------------------------------------------------------------------

    def _shutdown_overdue(self) -> None:
        if not self._ended.done():
            log.warning(
                "the kernel did not exit within %.0f s of its shutdown request: stopped",
                SHUTDOWN_WAIT,
            )
            self._end(ExitStatus(0, "the kernel shut down (stopped after its shutdown request)"))

    def _broken(self, status: ExitStatus) -> None:
        """A channel's stream broke: the kernel's doing, unless the engine reports another end
        meanwhile.

        A container killed from outside breaks its streams before the engine's events say so;
        the engine's word (kill, OOM) wins when it comes within :data:`EXIT_REPORT_WAIT` s.
        """
        if self._broken_by is not None or self._ended.done():
            return
        self._broken_by = status
        self._loop.call_later(EXIT_REPORT_WAIT, self._end, status)

    def _end(self, status: ExitStatus) -> None:
        if not self._ended.done():
            self._ended.set_result(status)
            if self._oom and self.settings.checkpoint_on_oom and self._checkpoints is not None:
                self._checkpoints.leave_offer(status.reason)

    async def ended(self) -> ExitStatus:
        """Wait until the kernel has ended, and say how."""
        return await asyncio.shield(self._ended)
