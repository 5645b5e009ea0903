"""The Docker link: a kernel in a container with no network, reached through Docker exec streams.

Inside the container ipykernel binds its five ports on the container's own loopback. For each
channel the launcher opens an exec stream running :mod:`kernel_sandbox.kernelside.connector`
against that channel's port and speaks ZMTP through it (:mod:`kernel_sandbox.launch.zmtp`): one
stream per channel, so heartbeats and control messages never queue behind a flood of output.
Nothing of the host is mounted into the container for this, and no host path is involved: the
streams are the engine's (their framing: :mod:`.exec_stream`). As root on runc the launcher
connects from a thread inside the container's network namespace instead (:mod:`.netns`).

Each connector is also a lifeline: when the launcher ends, by any signal, the engine closes the
connectors' stdin and they kill every process of the container; the container removes itself
(auto-remove). The kernel can stop those processes (they run as its uid), and a container that is
not started yet has none, so a host process the kernel cannot reach stands behind them: the
launcher's :mod:`~kernel_sandbox.docker.watchdog`, which removes the container once the launcher is
gone. How the kernel ended (out of memory included) is read from the engine's events, since an
auto-removed container cannot be inspected afterwards: an OOM kill of another process of the
container (a child the kernel ran) is told apart by a heartbeat the kernel answers after it; an
engine that stops answering (its connections open, nothing moving) is noticed by a ping every
:data:`ENGINE_PROBE_INTERVAL` s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import docker
import docker.errors
import requests.exceptions

from ..egress import WINDOW_REQUEST
from ..errors import ChannelProtocolError, EngineUnavailable, KernelLaunchError, KernelSandboxError
from ..kernelside import source
from ..kernelside.boot import PORTS, SIGNATURE_SCHEME
from ..kernelside.connector import HELLO
from ..launch import egress, journal
from ..launch.checkpoints import REQUEST, CheckpointStore
from ..launch.messages import DELIM, REQUEST_CHANNELS, Signer, msg_type_of, unpack
from ..canonical import PROTOCOL_VERSION
from ..launch.front import ExitStatus, Front
from ..launch.zmtp import READ_SIZE, SUBSCRIBE_ALL, ZmtpPeer
from ..metrics import CgroupProbe, MetricsUnavailable, Usage, near_misses
from ..privdir import LAUNCHER_STATE, SECRETS, PrivateDir
from ..parsers import MiB
from . import watchdog
from .blobs import ContainerFiles
from .checks import applied_limits, check_engine, check_podman, podman_applied, podman_host
from .containers import (
    container_spec,
    for_podman,
    owner_labels,
    remove_container,
    resolve_mounts,
    run_as,
)
from .connect import (
    docker_client,
    concrete_engine,
    engine_address,
    is_podman,
    require_image,
    unpinged_client,
)
from .exec_stream import Demux, own_socket
from .proxy import kernel_env, proxy_for
from .netns import connect_in_netns, container_netns, listen_in_netns, may_enter_netns
from .settings import DockerSettings

if TYPE_CHECKING:
    from ..launch.intercept import SecretTable
    from ..launch.request import LaunchRequest

log = logging.getLogger("kernel_sandbox.launch")

ROUTING_ID = b"kernel-sandbox-launcher"
"""One routing id for the shell, control and stdin sockets, so ipykernel's stdin requests reach
us."""
PROBE = b"kernel-sandbox-probe"
OOM_PROBE = b"kernel-sandbox-oom-probe"
"""The heartbeat ping sent after each OOM event: its echo says the kernel's process lived through
it (the OOM killer took another process of the container)."""
SIGKILLED = 128 + 9
"""The init's exit code when the kernel's process was killed with SIGKILL."""
PROBE_INTERVAL = 0.5
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
ENGINE_CHECK_TIMEOUT = 10
ENGINE_PROBE_INTERVAL = 10.0
"""Seconds between two pings of the engine while the kernel runs: a hung engine (connections
open, nothing answered) reports no event, so it is asked; no answer within
:data:`ENGINE_CHECK_TIMEOUT` s ends the kernel."""
WELCOME_WAIT = 1.0
"""Seconds to wait, once the heartbeat answers, for ipykernel 7's ``iopub_welcome`` (JEP 65) to
confirm the launcher's IOPub subscription; kernels without it start after this pause."""
EXIT_REPORT_WAIT = 5.0
"""Seconds to wait for the engine's report of a kernel that died while its channels were opened."""
OUTPUT_CAP = 1 * MiB
"""Bytes of the container's own stdout/stderr held during start-up (passed on once it answers)."""
OUTPUT_TAIL_LINES = 40
TAIL_LINE_CHARS = 4096
"""Characters of each of those last lines kept for an error message."""
LIFELINE_CHANNEL = "hb"
"""The channel that always goes through an exec stream: its connector is the kernel's lifeline."""
CHANNEL_PORTS = {
    channel: PORTS[f"{channel}_port"] for channel in (*REQUEST_CHANNELS, "iopub", "hb")
}
INTERRUPT_DELAY = 0.2
"""Seconds a SIGINT for the kernel waits for a shutdown request that makes it moot (see
:meth:`DockerLink.interrupt`)."""
SHUTDOWN_WAIT = 10.0
"""Seconds a kernel has, after its ``shutdown_request``, to exit on its own before the launcher
stops it (as jupyter_client's manager kills a kernel after ``shutdown_wait_time``: an ipykernel
thread left running can keep the interpreter from exiting)."""
ENGINE_TEXT_BYTES = 1000
"""Bytes of the engine's own error text (an exec that could not start) kept for the log."""


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> None:
    """Call ``callback`` on ``loop`` from another thread; nothing when the loop is closed (the
    launcher is exiting)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class _Channel(asyncio.BufferedProtocol):
    """One kernel channel with ZMTP spoken through it: an exec stream (demultiplexed) or a socket.

    A socket is read straight into the ZMTP peer's buffers; an exec stream into a scratch
    buffer whose payloads the demultiplexer passes on, from the connector's :data:`HELLO` on:
    bytes before it are the engine's error text (the exec could not start), kept for the log.
    """

    def __init__(self, link: DockerLink, name: str, *, multiplexed: bool = True) -> None:
        self.link = link
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.peer: ZmtpPeer | None = None
        self.opened = 0.0
        self._demux = Demux(self._from_kernel, self._stderr) if multiplexed else None
        self._scratch = memoryview(bytearray(READ_SIZE)) if multiplexed else None
        self._hello: bytearray | None = bytearray() if multiplexed else None
        self.engine_text: bytes | None = None
        """What the engine wrote in place of the connector (it could not start it), if it did."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.opened = time.monotonic()
        kind = b"SUB" if self.name == "iopub" else b"DEALER"
        identity = ROUTING_ID if self.name in REQUEST_CHANNELS else b""
        self.peer = ZmtpPeer(kind, transport.write, self._message, identity=identity)
        if kind == b"SUB":
            self.peer.send([SUBSCRIBE_ALL])
        self.link._channel_open(self)

    def send(self, frames: list[Any]) -> None:
        assert self.peer is not None
        self.peer.send(frames)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._scratch is not None:
            return self._scratch
        assert self.peer is not None
        return self.peer.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        assert self.peer is not None
        try:
            if self._demux is not None:
                assert self._scratch is not None  # made with the demultiplexer
                self._demux.feed(self._scratch[:nbytes])
            else:
                self.peer.buffer_updated(nbytes)
        except ChannelProtocolError as exc:
            self.link._broken(
                ExitStatus(1, f"the kernel broke its {self.name} channel ({exc}); it was stopped")
            )
            if self.transport is not None:
                self.transport.abort()  # the connector's stdin closes: it ends the kernel

    def _from_kernel(self, data: memoryview) -> None:
        assert self.peer is not None
        if self._hello is not None:
            if self.engine_text is not None:
                self.engine_text += bytes(data[: ENGINE_TEXT_BYTES - len(self.engine_text)])
                return
            need = len(HELLO) - len(self._hello)
            self._hello += data[:need]
            if not HELLO.startswith(self._hello):
                self.engine_text, self._hello = bytes(self._hello), bytearray()
                self._from_kernel(data[need:])
                return
            if len(self._hello) < len(HELLO):
                return
            self._hello, data = None, data[need:]
        self.peer.feed(data)

    def _message(self, frames: list[Any]) -> None:
        try:
            self.link._from_kernel(self.name, frames)
        except Exception:  # whatever the kernel sent: one message is lost, never the channel
            log.exception(
                "dropped a message from the kernel's %s channel: relaying it failed", self.name
            )

    def _stderr(self, data: memoryview) -> None:
        log.debug("%s connector: %s", self.name, bytes(data[:500]).decode(errors="replace").strip())

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._channel_lost(self)

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.paused = True
        self.link._throttle(self.name, True)

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.paused = False
        self.link._throttle(self.name, False)


class _OutputStream(asyncio.Protocol):
    """The container's attached stdout and stderr, demultiplexed into a :class:`KernelOutput`."""

    def __init__(self, output: KernelOutput) -> None:
        self._demux = Demux(
            lambda data: output.write(bytes(data)), lambda data: output.write(bytes(data))
        )

    def data_received(self, data: bytes) -> None:
        self._demux.feed(data)


class KernelOutput:
    """The container's own stdout and stderr, passed to our stderr through the journal (escaped,
    within the kernel's log budget: :mod:`.journal`), the tail kept for errors.

    Until :meth:`release` (the kernel answered) output is only kept, up to ``cap`` bytes: a launch
    that fails reports it once, inside its error message.
    """

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self._cap = cap
        self.tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self._partial = ""
        self._held: list[bytes] | None = []

    def release(self) -> None:
        """Pass on what was held during start-up, and everything from now on."""
        held, self._held = self._held or [], None
        for chunk in held:
            self._pass_on(chunk)

    def write(self, data: bytes) -> None:
        """Record and pass on one chunk of the container's output."""
        text = self._partial + data.decode(errors="replace")
        *lines, partial = text.split("\n")
        self._partial = partial[-TAIL_LINE_CHARS:]  # a line without end is not gathered without end
        self.tail.extend(line[-TAIL_LINE_CHARS:] for line in lines[-OUTPUT_TAIL_LINES:])
        if self._held is not None:
            if sum(map(len, self._held)) < self._cap:
                self._held.append(data)
            return
        self._pass_on(data)

    def _pass_on(self, data: bytes) -> None:
        journal.installed().output(data)

    def text(self) -> str:
        """The last lines the container wrote."""
        return "\n".join([*self.tail, self._partial]).strip()


class DockerLink:
    """The kernel in a locked-down container on the Docker engine (see the module docstring)."""

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
        self._channels: dict[str, _Channel] = {}
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
        self._idle = True
        """What the kernel's last status said (a client's own guess: only for :meth:`interrupt`)."""
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

    # -- starting ------------------------------------------------------------------------------

    async def start(self, front: Front) -> None:
        """Create and start the container, open its channels, and return once the kernel answers."""
        self._front = front
        request, settings = self.request, self.settings
        client = self._client = await asyncio.to_thread(
            functools.partial(docker_client, engine=settings.engine)
        )
        info = await asyncio.to_thread(client.info)
        podman = await asyncio.to_thread(is_podman, client)
        self._engine = concrete_engine(settings.engine, podman)
        self._engine_is_podman = podman
        if podman:
            check_podman(await asyncio.to_thread(podman_host, client), settings)
        check_engine(info, settings)
        await asyncio.to_thread(require_image, client, settings.image)
        direct = may_enter_netns(settings, info)
        proxied = settings.network is not True
        # before the container exists: a secret whose value is missing fails the launch
        if settings.secrets:
            from ..launch.intercept import SecretTable

            self._secrets = SecretTable.load(settings.secrets, os.environ)
        kernel_secrets = self._secrets.kernel_env() if self._secrets else {}
        spec = container_spec(
            settings,
            kernel_id=request.kernel_id,
            kernel_key=self._key,
            user=run_as(settings),
            env={
                **request.env,
                **(kernel_env(settings) if proxied else {}),
                **kernel_secrets,
            },
            mounts=resolve_mounts(settings, request.cwd),
            labels=owner_labels(
                request.kernel_id,
                owner_pid=request.client_pid,
                private_dir=request.private.path if request.private else None,
            ),
        )
        if podman:
            spec = for_podman(spec)
        self._watchdog = watchdog.start(request.kernel_id, self._engine)  # before the container
        self._creating = asyncio.ensure_future(
            asyncio.to_thread(client.containers.create, settings.image, **spec)
        )
        try:
            container = await asyncio.shield(self._creating)
        except docker.errors.APIError as exc:
            reason = exc.explanation or exc
            raise KernelLaunchError(
                f"Docker refused to create the kernel's container: {reason}"
            ) from exc
        self.container_id = container.id
        if request.private is not None:
            request.private.write_json(
                LAUNCHER_STATE,
                {"pid": os.getpid(), "container_id": container.id, "engine": self._engine},
            )
        self._keep_checkpoints(front, client, container.id)
        await asyncio.to_thread(self._watch_events)
        await self._attach_output()
        try:
            await asyncio.to_thread(container.start)
        except docker.errors.APIError as exc:
            hint = ""
            if settings.runtime == "runsc":
                hint = (
                    ' (gVisor\'s runsc needs runtimeArgs ["--network=none"] here: see '
                    '`kernel-sandbox doctor`)'
                )
            raise KernelLaunchError(
                f"The kernel's container did not start: {exc.explanation or exc}{hint}"
            ) from exc
        if direct:
            self._netns = await asyncio.to_thread(container_netns, container)
        # while the kernel starts
        serving = asyncio.ensure_future(self._start_egress()) if proxied else None
        opening = [asyncio.ensure_future(self._open_channel(name)) for name in CHANNEL_PORTS]
        self.heartbeat([PROBE, b"ping"])
        try:
            await self._wait_until_ready(container, spec, opening)
            if serving is not None:
                await serving
        finally:
            for task in [*opening, *([serving] if serving is not None else [])]:
                task.cancel()
        self.output.release()
        self._probing = asyncio.ensure_future(self._probe_engine())

    def _keep_checkpoints(self, front: Front, client: Any, container_id: str) -> None:
        """Serve ``%checkpoint`` and ``%restore`` (:mod:`..launch.checkpoints`) from the kernel's
        private directory (a client that ran the kernelspec's argv has none: one of the
        launcher's own, for its life); pass on the offer a predecessor that ran out of memory
        left."""
        private = self.request.private or self.keep_dir
        if private is None:
            private = self._own_dir = PrivateDir.create()
        files = self._files = ContainerFiles(client, container_id, self.settings.image)
        settings = self.settings
        store = CheckpointStore(
            private.path,
            files,
            settings.checkpoint_max_bytes,
            settings.max_checkpoint_bytes,
            "docker",
        )
        self._checkpoints = store
        front.kernel_requests[REQUEST] = store.handle
        front.client_shell.append(store.client_sent)
        offer = store.take_offer()
        if offer is not None:
            front.notice_next_cell(offer)

    def blob_channel(self) -> ContainerFiles:
        """How blobs move into and out of the kernel's container (once it is created)."""
        if self._files is None:
            raise KernelLaunchError("the kernel has no container yet")
        return self._files

    async def _start_egress(self) -> None:
        """Serve the kernel's filtering proxy (:mod:`.egress`) on the container's loopback before
        the kernel answers, so before any of the user's code runs (nothing else holds its port
        then): listening in the container's namespace, or through a relay in the container over an
        exec stream (:mod:`.egress_stream`)."""
        front = self._front
        assert front is not None
        proxy = self._egress = proxy_for(self.settings, self._secrets)
        try:
            if self._netns is not None:
                sock = await asyncio.to_thread(listen_in_netns, self._netns, egress.PROXY_PORT)
                await proxy.serve(sock)
            else:
                from ..launch.egress_stream import RelayStream

                await proxy.serve(None)
                command = [
                    "python",
                    "-I",
                    "-S",
                    "-c",
                    source("egress_relay"),
                    str(egress.PROXY_PORT),
                ]
                exec_id, relay = await asyncio.to_thread(self._exec_socket, command)
                transport, _ = await self._loop.connect_accepted_socket(
                    lambda: RelayStream(proxy, Demux, front.notice_next_cell), relay
                )
                self._streams.append(transport)
                self._execs[exec_id] = transport
        except (OSError, docker.errors.APIError) as exc:
            raise KernelLaunchError(
                f"Could not serve the kernel's egress proxy on its port {egress.PROXY_PORT}: {exc}"
            ) from exc
        front.requests[WINDOW_REQUEST] = proxy.answer
        if self._secrets is not None:
            self._report_secrets(self._secrets)

    def _report_secrets(self, table: SecretTable) -> None:
        """Keep the secrets' names and use counts in the kernel's private directory, for
        ``kernel-sandbox ps`` and ``metrics()`` (never a value)."""
        private = self.request.private or self.keep_dir or self._own_dir
        if private is None:
            return

        def report() -> None:
            try:
                private.write_json(SECRETS, dict(table.uses))
            except OSError:
                log.debug("could not record the secrets' use", exc_info=True)

        table.on_use = report
        report()

    async def _channels_failed(self, opening: Sequence[asyncio.Future[None]]) -> None:
        """Raise when a channel could not be opened: the kernel's own end if it died, else the
        error."""
        for task in opening:
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                try:
                    await asyncio.wait_for(asyncio.shield(self._ended), EXIT_REPORT_WAIT)
                except asyncio.TimeoutError:
                    reason = getattr(exc, "explanation", None) or exc
                    raise KernelLaunchError(
                        f"Could not reach the kernel's channels: {reason}"
                    ) from exc
                raise self._start_failure() from exc

    def _start_failure(self) -> KernelLaunchError:
        status = self._ended.result()
        return KernelLaunchError(
            f"The kernel exited during start-up ({status.reason}).\n{self.output.text()}".strip()
        )

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
            lambda: _Channel(self, name, multiplexed=netns is None), sock
        )
        if exec_id is not None:
            self._execs[exec_id] = transport

    async def _attach_output(self) -> None:
        assert self._client is not None and self.container_id is not None
        params = {"stdout": 1, "stderr": 1, "stream": 1, "logs": 0}
        sdk_socket = await asyncio.to_thread(
            self._client.api.attach_socket, self.container_id, params
        )
        transport, _ = await self._loop.connect_accepted_socket(
            lambda: _OutputStream(self.output), own_socket(sdk_socket)
        )
        self._streams.append(transport)

    async def _wait_until_ready(
        self, container: Any, spec: dict[str, Any], opening: Sequence[asyncio.Future[None]]
    ) -> None:
        limits = asyncio.ensure_future(asyncio.to_thread(self._check_limits, container, spec))
        deadline = time.monotonic() + self.settings.launch_timeout
        self._ask_kernel_info()
        try:
            while not (self._ready.done() and self._informed.done()) or not all(
                task.done() for task in opening
            ):
                await self._channels_failed(opening)
                if self._ended.done():
                    raise self._start_failure()
                if time.monotonic() >= deadline:
                    raise KernelLaunchError(
                        f"The kernel in image {self.settings.image!r} did not answer within "
                        f"{self.settings.launch_timeout:g} s. Check that the image runs ipykernel "
                        "(`kernel-sandbox doctor`), or raise launch_timeout.\n" + self.output.text()
                    )
                # Only what is still pending: a finished future would end every wait at once (a busy
                # loop).
                watched: list[asyncio.Future[Any]] = [
                    self._ready,
                    self._informed,
                    self._ended,
                    *opening,
                ]
                pending = [f for f in watched if not f.done()]
                await asyncio.wait(
                    pending, timeout=PROBE_INTERVAL, return_when=asyncio.FIRST_COMPLETED
                )
                if not self._ready.done():
                    self.heartbeat([PROBE, b"ping"])
            log.debug("the kernel answers; waiting for its IOPub welcome")
            await asyncio.wait([self._welcomed], timeout=WELCOME_WAIT)
            log.debug(
                "IOPub %s",
                "welcomed" if self._welcomed.done() else "not welcomed: starting without",
            )
            await limits
        finally:
            limits.cancel()

    def _ask_kernel_info(self) -> None:
        """Send the launcher's own kernel_info_request (it waits for the shell stream to open).

        The kernel is ready when it answers: ipykernel's heartbeat and IOPub start before the rest
        of its initialisation, and a signal in between ends it with a traceback (jupyter_client
        interrupts every kernel it shuts down, so a restart right after a start would).
        """
        header = {
            "msg_id": self._info_id,
            "msg_type": "kernel_info_request",
            "username": "kernel-sandbox",
            "session": self._info_id,
            "date": "",
            "version": PROTOCOL_VERSION,
        }
        parts = [json.dumps(header).encode(), b"{}", b"{}", b"{}"]
        self._send("shell", [DELIM, self._signer.sign(parts), *parts])

    def _check_limits(self, container: Any, spec: dict[str, Any]) -> None:
        container.reload()
        if self._engine_is_podman:
            wrong = podman_applied(container.attrs, spec)
        else:
            wrong = applied_limits(container.attrs["HostConfig"], spec)
        if wrong:
            raise KernelLaunchError(
                "The Docker engine did not apply the kernel's limits: " + "; ".join(wrong)
            )
        try:
            self._cgroup = CgroupProbe.for_container(container.attrs)
        except MetricsUnavailable as exc:
            log.info("no usage figures for this kernel: %s", exc)

    # -- usage ---------------------------------------------------------------------------------

    def usage(self) -> Usage | None:
        """The container's usage now, read from its cgroup (None where the host cannot read it)."""
        if self._cgroup is None:
            return None
        try:
            return self._cgroup.read()
        except MetricsUnavailable:
            return None

    def limits_hit(self, error_text: str = "") -> list[str]:
        """The limits the kernel ran into since this was last asked, read from the host (see
        :func:`near_misses`)."""
        usage = self.usage()
        if usage is None:
            return []
        checked, self._checked = self._checked, usage
        return near_misses(checked, usage, error_text)

    # -- channels and messages -----------------------------------------------------------------

    def _channel_open(self, channel: _Channel) -> None:
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

    def _channel_lost(self, channel: _Channel) -> None:
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
            self._idle = b'"idle"' in parts[3]
        if channel == "iopub" and not self._welcomed.done() and b"iopub_welcome" in parts[0]:
            self._welcomed.set_result(None)
        if not idents and channel == "shell" and self._info_id.encode() in parts[1]:
            if not self._informed.done():
                self._informed.set_result(None)
            return  # the answer to the launcher's own request
        self._front.from_kernel(channel, idents, parts)

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """Sign a client message with the kernel's key and send it on (noting a shutdown
        request)."""
        header = parts[0]
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

    def _watch_events(self) -> None:
        """Follow the container's events from a thread (subscribed before it starts: nothing is
        missed)."""
        assert self._client is not None
        stream = self._client.events(filters={"container": self.container_id}, decode=True)
        self._events = stream
        loop = self._loop

        def follow() -> None:
            try:
                for event in stream:
                    _post(loop, self._on_event, event)
            except Exception as exc:  # the stream broke (or stop() closed it): judged on the loop
                _post(loop, self._on_events_lost, exc)
            else:
                _post(loop, self._on_events_lost, None)

        threading.Thread(target=follow, name="docker-events", daemon=True).start()

    def _on_event(self, event: dict[str, Any]) -> None:
        status = event.get("status") or event.get("Action")
        attributes = event.get("Actor", {}).get("Attributes", {})
        if status == "oom":
            self._oom_events += 1
            self.heartbeat([OOM_PROBE, str(self._oom_events).encode()])
        elif status == "kill" and not self._stopping:
            self._killed = str(attributes.get("signal", "?"))
        elif status == "exec_die":
            stream = self._execs.pop(str(attributes.get("execID")), None)
            if stream is not None:
                stream.abort()
        elif status == "die":
            code = int(attributes.get("exitCode", 1))
            # the kernel's own end, not an earlier OOM kill of another process of its container
            self._oom = code == SIGKILLED and self._oom_events > self._oom_lived
            if self._broken_by is not None and not self._oom and self._killed is None:
                self._end(self._broken_by)
            if code and self._shutdown_asked and not self._oom and self._killed is None:
                # asked to shut down, it did: an abort in the interpreter's teardown is no crash
                log.info("the kernel exited with code %d on its way out after shutdown", code)
                code = 0
            self._end(ExitStatus(code, self._ending(code)))

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

    def _ending(self, code: int) -> str:
        """How the kernel ended, in words, from what the engine reported (never from the kernel):
        out of memory only when its own process was (the init's exit says SIGKILL, and it answered
        no heartbeat after the container's last OOM kill)."""
        if self._oom:
            limit = f", limit {self.settings.memory // MiB} MiB" if self.settings.memory else ""
            return f"out of memory{limit}; raise memory"
        if self._killed is not None and self._killed not in ("2", "SIGINT"):
            return (
                f"killed through the Docker engine (signal {self._killed}: a `docker kill`, "
                "`docker stop` or `docker rm -f`)"
            )
        if code == SIGKILLED:
            return (
                "killed with SIGKILL by the container runtime or the host's kernel, not through "
                "the engine"
            )
        return "the kernel shut down" if code == 0 else f"exit code {code}"

    def _on_events_lost(self, exc: BaseException | None) -> None:
        if not (self._stopping or self._ended.done()):
            asyncio.ensure_future(self._explain_loss(exc))

    async def _explain_loss(self, exc: BaseException | None) -> None:
        """The event stream ended while the kernel should be running: find out why, in bounded
        time."""
        assert self.container_id is not None  # the events are those of its container
        try:
            client = await asyncio.to_thread(
                functools.partial(docker_client, ENGINE_CHECK_TIMEOUT, engine=self._engine)
            )
            await asyncio.to_thread(client.containers.get, self.container_id)
        except EngineUnavailable as error:
            self._end(
                ExitStatus(1, f"the Docker engine became unreachable ({error.__cause__ or error})")
            )
        except docker.errors.NotFound:
            self._end(ExitStatus(1, "the kernel's container was removed"))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            self._end(ExitStatus(1, f"the Docker engine failed: {error}"))
        else:
            self._end(ExitStatus(1, f"the Docker engine stopped reporting on the kernel ({exc})"))

    async def _probe_engine(self) -> None:
        """Ping the engine now and then; end the kernel when it stops answering.

        The ping runs in a daemon thread with its own client and timeout: a hung engine leaves
        nothing for the launcher's exit to wait for.
        """
        assert self._client is not None
        # no engine call
        client = unpinged_client(self._engine, ENGINE_CHECK_TIMEOUT, self._client.api.api_version)
        while not (self._stopping or self._ended.done()):
            await asyncio.sleep(ENGINE_PROBE_INTERVAL)
            answered: asyncio.Future[bool] = self._loop.create_future()

            def ping() -> None:
                try:
                    client.ping()
                    ok = True
                except Exception:  # any failure is the engine's: reported below as no answer
                    ok = False
                _post(self._loop, lambda: None if answered.done() else answered.set_result(ok))

            threading.Thread(target=ping, name="docker-ping", daemon=True).start()
            try:
                ok = await asyncio.wait_for(asyncio.shield(answered), ENGINE_CHECK_TIMEOUT + 1)
            except asyncio.TimeoutError:
                ok = False
            if not ok and not (self._stopping or self._ended.done()):
                self._engine_hung = True
                self._end(
                    ExitStatus(
                        1,
                        f"the {self._engine.capitalize()} engine at "
                        f"{engine_address(self._engine)} stopped answering (no reply to a ping "
                        f"within {ENGINE_CHECK_TIMEOUT} s); the kernel was stopped",
                    )
                )

    def _end(self, status: ExitStatus) -> None:
        if not self._ended.done():
            self._ended.set_result(status)
            if self._oom and self.settings.checkpoint_on_oom and self._checkpoints is not None:
                self._checkpoints.leave_offer(status.reason)

    async def ended(self) -> ExitStatus:
        """Wait until the kernel has ended, and say how."""
        return await asyncio.shield(self._ended)

    async def interrupt(self) -> None:
        """Send SIGINT to the kernel through the container's init, unless it is idle and being shut
        down.

        jupyter_client interrupts every kernel it shuts down, just before its ``shutdown_request``;
        an idle ipykernel that a SIGINT catches in the tail of a handler (the reply sent, its idle
        status not yet) logs a false ``KeyboardInterrupt caught in kernel`` error. So the signal
        waits :data:`INTERRUPT_DELAY` s, and is not sent when a shutdown was asked meanwhile and
        the kernel said it is idle; a busy kernel is interrupted, as the client means. A kernel
        that has ended has nothing to interrupt: its end is reported where it is seen.
        """
        if self._client is None or self.container_id is None:
            return
        await asyncio.sleep(INTERRUPT_DELAY)
        if (self._shutdown_asked and self._idle) or self._ended.done():
            log.debug("not interrupting a kernel that is shutting down idle or has ended")
            return
        try:
            await asyncio.to_thread(self._client.api.kill, self.container_id, "SIGINT")
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "is not running" in str(exc.explanation):
                # the container stopped before the engine's event of it came
                log.debug("not interrupting the kernel: its container is not running")
            else:
                log.warning("could not interrupt the kernel: %s", exc.explanation or exc)

    async def stop(self) -> None:  # noqa: C901
        """Close every stream, end the kernel and remove its container."""
        if self._stopping:
            return
        self._stopping = True
        self._cancel.set()
        if self._probing is not None:
            self._probing.cancel()
        for task in self._reopening:
            task.cancel()
        if self._checkpoints is not None:
            await self._checkpoints.close()
            if self._front is not None:  # a link that follows (a wake) registers its own
                with contextlib.suppress(ValueError):
                    self._front.client_shell.remove(self._checkpoints.client_sent)
        for transport in [
            *self._streams,
            *(channel.transport for channel in self._channels.values()),
        ]:
            if transport is not None:
                transport.close()
        if self.container_id is None and self._creating is not None:
            try:
                self.container_id = (await self._creating).id
            except Exception:
                pass
        removed = True
        if self._engine_hung:
            # no call to a hung engine here: the watchdog removes the container when it answers
            removed = False
        elif self._client is not None and self.container_id is not None:
            try:
                container = await asyncio.to_thread(self._client.containers.get, self.container_id)
                await asyncio.to_thread(remove_container, container)
            except docker.errors.NotFound:
                pass
            except (
                KernelSandboxError,
                docker.errors.DockerException,
                requests.exceptions.RequestException,
            ) as exc:
                removed = False
                log.error(
                    "could not remove the kernel's container %s: %s", self.container_id[:12], exc
                )
        if self._egress is not None:
            await self._egress.close()
        if self._own_dir is not None:
            self._own_dir.remove()
        watchdog.release(self._watchdog, done=removed)
        if self._events is not None:
            self._events.close()
        if self._netns is not None:
            os.close(self._netns)
            self._netns = None
