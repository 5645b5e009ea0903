"""The OpenSandbox link: a kernel in an OpenSandbox sandbox, reached through the sandbox's
endpoints.

The link creates the sandbox (labelled ``kernel-sandbox``, egress denied unless configured,
a fresh ``JUPYTER_TOKEN`` in its environment), renews its expiration while the launcher lives,
checks every ``state_check_interval`` that it still exists, and deletes it on every way out;
a SIGKILLed launcher's sandbox expires ``timeout`` seconds after its last renewal.

Two modes carry the kernel's messages (``mode``):

* **websocket** (:class:`~kernel_sandbox.opensandbox.bridge.WebsocketBridge`): a kernel of the
  sandbox's own Jupyter server, its channels websocket bridged message for message, so display
  data, comms and widgets, ``input()``, completion and inspection work as on a Docker kernel.
* **execd** (:class:`~kernel_sandbox.opensandbox.relay.ExecdRelay`): execd's ``/code`` only.

``auto`` (the default) uses the websocket when the sandbox's Jupyter server answers within
``jupyter_wait`` seconds, else execd. Whatever the mode, what the sandbox sends is capped
(``max_output_bytes`` per message or execd run, ``max_response_bytes`` per answer) and every call
has a deadline; the front applies the output policy and signs for the client.

With ``suspend_after`` the :class:`~kernel_sandbox.launch.sleep.Sleeper` around the link asks it
to pause its sandbox once the kernel has been idle that long (:meth:`OpenSandboxLink.suspend`):
``POST /sandboxes/{id}/pause`` keeps the container's processes and memory, so the kernel (or
execd's context) keeps its state whole. While it sleeps the link answers heartbeats,
``kernel_info_request`` (with the kernel's last reply) and ``interrupt_request`` itself and renews
the expiration as before; any other request resumes the sandbox, waits for execd's ``/ping`` and
passes on what waited, the first cell saying once that the sandbox was paused. The kernel's
``sleep.json`` says it sleeps (``ps``, ``metrics()``), or why a pause failed; a resume that fails
ends the kernel with the reason. Paused and quiet, the launcher lets the dormant process hold the
channels (:meth:`snapshot`), which renews the sandbox through :mod:`.renewal`; the launcher exec'd
again connects to the same kernel (:class:`~.reach.KernelReach`). A server that cannot pause
(a Kubernetes provider without pause) says so, and the sleeper then checkpoints the kernel
through its cells (:class:`~kernel_sandbox.launch.cellblobs.CellChannel`) and deletes the sandbox,
as it removes a Docker kernel's container.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING, Any, cast

from ..errors import (
    KernelLaunchError,
    KernelSandboxError,
    OpenSandboxAPIError,
    OpenSandboxError,
    SandboxNotFound,
)
from .lifecycle import note_unknown_state, OpenSandboxClient, sandbox_state, TERMINAL_STATES
from .execd import ExecdClient
from .client import keep_alive
from .gc import owner_metadata
from .http import cancel_until_done
from .bridge import WAITING_LIMIT, WebsocketBridge
from .jupyter import dumps
from ..metrics import Usage
from .settings import OpenSandboxSettings
from ..privdir import LAUNCHER_STATE, PrivateDir, note_sleep
from . import renewal
from .reach import KernelReach
from .relay import ExecdRelay
from ..launch.front import ExitStatus, Front
from ..launch.messages import launcher_note, msg_type_of, parse_part
from ..launch.wire import new_header
from ..launch.asleep import Busy, answer_idle, tell_first_cell
from ..launch.cellblobs import CellChannel

if TYPE_CHECKING:
    from ..launch.request import LaunchRequest

log = logging.getLogger("kernel_sandbox.launch")

PAUSE_STATES = frozenset({"Pausing", "Paused"})
"""States in which the sandbox answers nothing: client messages wait for ``Running`` again."""
STOP_WAIT = 30.0
"""Seconds :meth:`OpenSandboxLink.stop` waits for a create in flight to name its sandbox."""


class OpenSandboxLink:
    """The kernel in a fresh OpenSandbox sandbox (see the module docstring)."""

    def __init__(self, request: LaunchRequest) -> None:
        self.request = request
        self.keep_dir: PrivateDir | None = None
        # make_link chose this link by their type
        self.settings = cast(OpenSandboxSettings, request.settings)
        self.sandbox_id: str | None = None
        self._token = secrets.token_hex(32)
        self._front: Front | None = None
        self._client: OpenSandboxClient | None = None
        self._execd: ExecdClient | None = None
        self._reach: KernelReach | None = None
        self._bridge: WebsocketBridge | ExecdRelay | None = None
        self._waiting: collections.deque[tuple[str, list[Any], list[Any]]] = collections.deque()
        self._running = asyncio.Event()
        """Set while the sandbox is not known to be paused; cleared, client messages wait in
        ``_waiting``."""
        self._running.set()
        self._tasks: list[asyncio.Future[Any]] = []
        self._creating: asyncio.Future[Any] | None = None
        self._named = asyncio.Event()
        self._stopping = False
        self._ended: asyncio.Future[ExitStatus] = asyncio.get_running_loop().create_future()
        self.asleep = False
        """True from the moment the link pauses its idle sandbox until it has resumed it."""
        self._sleep_lock = asyncio.Lock()
        self._waking: asyncio.Future[None] | None = None
        self._busy = Busy()
        self._kernel_info: Any = None
        self._since = 0.0
        self._kept: dict[str, Any] | None = None
        """The connection a launcher before an exec left (:meth:`resume`), to be made again."""

    # -- starting --------------------------------------------------------------------------------

    async def start(self, front: Front) -> None:
        """Create the sandbox, connect in the configured mode, and return once the kernel
        answers."""
        self._front = front
        settings = self.settings
        client = self._client = self._new_client()
        reach = self._reach = KernelReach(front, settings, self._token, self._end, self._running)
        env = {
            **self.request.env,
            **settings.env,
            "JUPYTER_TOKEN": self._token,
            "JUPYTER_PORT": str(settings.jupyter_port),
        }
        self._creating = asyncio.ensure_future(
            client.create(
                image=settings.image,
                entrypoint=list(settings.entrypoint),
                timeout=settings.timeout,
                resource_limits=settings.resource_limits,
                resource_requests=settings.resource_requests,
                env=env,
                metadata={**settings.metadata, **owner_metadata(self.request.kernel_id)},
                **settings.egress,
                secure_access=settings.secure_access,
                volumes=list(settings.volumes),
                extensions=settings.extensions,
                created=self._created,
            )
        )
        try:
            sandbox = await asyncio.shield(self._creating)
        except OpenSandboxError as exc:
            raise KernelLaunchError(
                f"OpenSandbox could not start the kernel's sandbox ({type(exc).__name__}): {exc}"
            ) from exc
        assert sandbox.endpoint is not None
        self._tasks.append(asyncio.ensure_future(self._renew()))
        self._tasks.append(asyncio.ensure_future(self._watch()))
        self._execd = client.execd(sandbox.endpoint)
        try:
            self._bridge = await reach.connect(client, self._execd, sandbox.id)
        except OpenSandboxError as exc:
            raise KernelLaunchError(
                f"the kernel in sandbox {sandbox.id} did not come up: {exc}"
            ) from exc
        log.info(
            "kernel %s runs in OpenSandbox sandbox %s (%s mode)",
            self.request.kernel_id,
            sandbox.id,
            reach.mode,
        )
        front.watchers.append(self._watch_kernel)
        self._flush()

    def _new_client(self) -> OpenSandboxClient:
        settings = self.settings
        return OpenSandboxClient(
            settings.api_base,
            settings.api_key,
            use_server_proxy=settings.use_server_proxy,
            poll_interval=settings.poll_interval,
            ready_timeout=settings.ready_timeout,
            limits=settings.limits,
            signed_endpoints=settings.signed_endpoints,
        )

    def _created(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self._named.set()
        self._record(sandbox_id)

    def _record(self, sandbox_id: str | None) -> None:
        """Tell the provisioner (its private directory) which sandbox to delete should the launcher
        be killed."""
        private = self.request.private
        if private is not None:
            private.write_json(LAUNCHER_STATE, {"pid": os.getpid(), "sandbox_id": sandbox_id})

    # -- the sandbox's life ----------------------------------------------------------------------

    async def _renew(self) -> None:
        assert self._client is not None and self.sandbox_id is not None
        await keep_alive(
            self._client,
            self.sandbox_id,
            self.settings.timeout,
            interval=self.settings.renew_every,
            on_lost=lambda reason: self._end(ExitStatus(1, reason)),
        )

    async def _watch(self) -> None:
        """End the link when the sandbox is gone (404) or in a terminal state; note pauses and
        resumes.

        Paused (or Pausing) is not gone: client messages wait until it runs again. A state this
        client does not know is logged once and changes nothing.
        """
        assert self._client is not None and self.sandbox_id is not None
        unknown: set[str | None] = set()
        while True:
            await asyncio.sleep(self.settings.state_check_interval)
            try:
                state = sandbox_state(await self._client.get(self.sandbox_id))
            except SandboxNotFound:
                self._end(
                    ExitStatus(
                        1, f"sandbox {self.sandbox_id} is gone (404: it expired or was deleted)"
                    )
                )
                return
            except OpenSandboxError as exc:
                log.warning("checking sandbox %s failed: %s", self.sandbox_id, exc)
                continue
            if state in TERMINAL_STATES:
                self._end(ExitStatus(1, f"sandbox {self.sandbox_id} is {state}"))
                return
            note_unknown_state(self.sandbox_id, state, unknown)
            if state in PAUSE_STATES and self._running.is_set():
                log.warning(
                    "sandbox %s is %s: client messages wait until it is resumed",
                    self.sandbox_id,
                    state,
                )
                self._running.clear()
            elif state == "Running" and self.asleep and not self._sleep_lock.locked():
                # the link's own pause, ended by someone else
                if self._bridge is not None:
                    self._woke(None)
                elif self._waking is None:  # resumed asleep (:meth:`resume`): connect first
                    self._waking = asyncio.ensure_future(self._wake(say=False))
                    self._tasks.append(self._waking)
            elif state == "Running" and not self._running.is_set() and not self.asleep:
                log.warning(
                    "sandbox %s runs again: passing on %d waiting messages",
                    self.sandbox_id,
                    len(self._waiting),
                )
                self._running.set()
                self._flush()

    def _end(self, status: ExitStatus) -> None:
        if not self._ended.done():
            self._ended.set_result(status)

    async def ended(self) -> ExitStatus:
        """Wait until the kernel has ended, and say how."""
        return await asyncio.shield(self._ended)

    # -- messages --------------------------------------------------------------------------------

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """Pass a client message on (kept until the kernel is connected and its sandbox not
        paused); while the link has paused the idle sandbox, answered here or kept for the
        resume it starts."""
        if self.asleep:
            assert self._front is not None
            if answer_idle(self._front, channel, idents, parts, self._kernel_info):
                return
            if self._waking is None:
                self._waking = asyncio.ensure_future(self._wake())
                self._tasks.append(self._waking)
        if self._bridge is not None and self._running.is_set():
            self._bridge.send(channel, idents, parts)
        elif len(self._waiting) < WAITING_LIMIT:
            self._waiting.append((channel, idents, parts))
            if self._bridge is not None and not self.asleep:
                self._note_paused(channel, parts)
        else:
            log.warning(
                "dropped a %s message: the kernel is not connected yet or its sandbox is paused",
                channel,
            )

    def _flush(self) -> None:
        """Pass on the client messages that waited (for the connection, or for a paused sandbox)."""
        while self._waiting and self._bridge is not None and self._running.is_set():
            self._bridge.send(*self._waiting.popleft())

    def _note_paused(self, channel: str, parts: list[Any]) -> None:
        """Tell the client that its request waits for a paused sandbox: ``status: busy`` and a
        stderr note."""
        if channel != "shell" or self._front is None:
            return
        try:
            parent = json.loads(parts[0])
            session = str(parent.get("session", ""))
        except (ValueError, AttributeError, TypeError, RecursionError, IndexError):
            return
        text = (
            f"sandbox {self.sandbox_id} is paused; this request waits until it is resumed "
            "(POST /sandboxes/<id>/resume, or Sandbox.resume())"
        )
        for msg_type, content in (
            ("status", {"execution_state": "busy"}),
            ("stream", launcher_note(text)),
        ):
            header = new_header(msg_type, session, username="kernel-sandbox")
            self._front.from_kernel(
                "iopub", [], [dumps(header), bytes(parts[0]), b"{}", dumps(content)]
            )

    def heartbeat(self, frames: list[Any]) -> None:
        """Echo a ping while the kernel is reachable or only paused (its Jupyter server restarts a
        dead kernel itself)."""
        bridge = self._bridge
        reachable = (
            self.asleep
            or isinstance(bridge, ExecdRelay)
            or (bridge is not None and (bridge.alive or not self._running.is_set()))
        )
        if self._front is not None and reachable:
            self._front.heartbeat_reply(frames)

    def pause_reading(self, channel: str, paused: bool) -> None:
        """Not paused per channel (the channels share one websocket, or execd's HTTP streams): while
        a client takes nothing, the front holds up to its ``HELD_BYTES`` per channel and drops the
        rest."""

    def usage(self) -> Usage | None:
        """None: the host has no reading of a sandbox's usage (execd's ``/metrics`` is the sandbox's
        own word); while the link has paused it, ``suspended``."""
        return Usage(memory=0, source="launcher", state="suspended") if self.asleep else None

    def limits_hit(self, error_text: str = "") -> list[str]:
        """Nothing: no host-side reading of the sandbox's limits."""
        return []

    async def interrupt(self) -> None:
        """Interrupt the running cell."""
        if self._bridge is None:
            return
        try:
            await self._bridge.interrupt()
        except OpenSandboxError as exc:
            log.warning("could not interrupt the kernel: %s", exc)

    # -- sleeping: pause when idle (suspend_after) ------------------------------------------------

    def _watch_kernel(self, channel: str, idents: list[bytes], parts: list[bytes]) -> bool:
        """Note from the kernel's messages whether a cell runs, and its last kernel_info reply."""
        header = parts[0]
        if not isinstance(header, bytes):
            return False
        if channel == "iopub" and b'"status"' in header and msg_type_of(header) == "status":
            self._busy.note(parts)
        elif channel == "shell" and msg_type_of(header) == "kernel_info_reply":
            self._kernel_info = parse_part(bytes(parts[3]))
        return False

    async def suspend(self, why: str) -> dict[str, Any]:
        """Pause the sandbox; the reply says whether the kernel sleeps, or why not."""
        async with self._sleep_lock:
            if self.asleep:
                return {"status": "ok", "state": "suspended"}
            refusal = (
                "the kernel is not connected yet"
                if self._bridge is None or self._client is None or self.sandbox_id is None
                else "the sandbox is paused by someone else"
                if not self._running.is_set()
                else "a cell is running"
                if self._busy
                else None
            )
            if refusal is not None:
                note_sleep(self.request.private, {"state": "awake", "why": refusal})
                return {"status": "error", "evalue": refusal}
            assert self._client is not None and self.sandbox_id is not None
            self.asleep = True
            self._running.clear()  # from now on client messages wait, and wake it
            try:
                await self._client.pause(self.sandbox_id)
            except OpenSandboxError as exc:
                reason = f"the server did not pause sandbox {self.sandbox_id}: {exc}"
                self._woke(None)
                note_sleep(self.request.private, {"state": "awake", "why": reason})
                return {"status": "error", "evalue": reason, "unsupported": _unsupported(exc)}
            self._since = time.time()
            state = {"state": "suspended", "since": self._since, "paused": self.sandbox_id}
            note_sleep(self.request.private, {**state, "why": why})
        log.info("sandbox %s is paused (%s)", self.sandbox_id, why)
        return {"status": "ok", "state": "suspended"}

    async def wake(self) -> dict[str, Any]:
        """Resume the paused sandbox and pass on what waited; the reply says whether it runs."""
        if self.asleep and self._waking is None:
            self._waking = asyncio.ensure_future(self._wake())
            self._tasks.append(self._waking)
        if self._waking is not None:
            await asyncio.shield(self._waking)
        if self._ended.done():
            return {"status": "error", "evalue": self._ended.result().reason}
        return {"status": "ok", "state": "awake"}

    async def _wake(self, say: bool = True) -> None:
        """Resume the sandbox (unless someone else did), connect again if the launcher was
        exec'd meanwhile, wait for execd, pass on what waited (the first cell saying it woke,
        with ``say``)."""
        try:
            async with self._sleep_lock:
                if not self.asleep:
                    return
                assert self._client is not None and self.sandbox_id is not None
                settings = self.settings
                try:
                    info = await self._client.get(self.sandbox_id)
                    if sandbox_state(info) != "Running":
                        await self._client.resume(self.sandbox_id)
                    if self._bridge is None:
                        endpoint = await self._client.endpoint(self.sandbox_id)
                        self._execd = self._client.execd(endpoint)
                        assert self._reach is not None and self._kept is not None
                        self._bridge = await self._reach.connect_again(
                            self._client, self._execd, self.sandbox_id, self._kept
                        )
                    assert self._execd is not None
                    await self._execd.wait_ready(
                        settings.ready_timeout, min(settings.poll_interval, 0.2)
                    )
                except OpenSandboxError as exc:
                    reason = (
                        f"the kernel could not wake: sandbox {self.sandbox_id} did not resume "
                        f"({exc})"
                    )
                    log.error("%s", reason)
                    self._end(ExitStatus(1, reason))
                    return
                slept = time.strftime("%H:%M", time.localtime(self._since))
                text = f"The sandbox was paused from {slept} while idle and resumed as it was."
                self._woke(text if say else None)
        finally:
            self._waking = None

    def _woke(self, text: str | None) -> None:
        """Awake again: what waited passes on, the first cell saying ``text`` (if any)."""
        self.asleep = False
        note_sleep(self.request.private, None)
        if text is not None and self._front is not None:
            tell_first_cell(self._front, self._waiting, text)
        self._running.set()
        self._flush()

    # -- resting: the dormant process holds the channels while the sandbox is paused ------------

    def snapshot(self) -> dict[str, Any]:
        """What a launcher exec'd anew needs to go on with the paused sandbox (JSON), and for the
        dormant process meanwhile: the kernel that resumes is the same one (its comms and history
        are kept), and the sandbox is renewed (:mod:`.renewal`)."""
        return {
            "lost": {},
            "new_kernel": False,
            "keep": {
                "every": self.settings.renew_every,
                "argv": renewal.argv(),
                "state": {"sandbox_id": self.sandbox_id},
            },
            "sandbox_id": self.sandbox_id,
            "token": self._token,
            "kernel_info": self._kernel_info,
            "since": self._since,
            # the connection made, or the one kept since an exec (made again at the wake)
            "connection": self._kept if self._bridge is None else KernelReach.kept(self._bridge),
        }

    def quiet(self) -> bool:
        """Paused, with no resume under way and nothing waiting: the launcher may rest."""
        waking = self._waking is not None or self._sleep_lock.locked()
        return self.asleep and not waking and not self._waiting

    def blob_channel(self) -> CellChannel:
        """Blobs move through the kernel's cells (the server offers no file channel the launcher
        can use as the kernel's user); the image's name is its id."""
        return CellChannel(self.settings.image)

    def count_from(self, count: int | None) -> None:
        """execd's relay counts cells itself: its next is ``count + 1``, whatever the sleeper's
        own cells were."""
        if isinstance(self._bridge, ExecdRelay) and count is not None:
            self._bridge.execution_count = count

    async def resume(self, front: Front, kept: dict[str, Any]) -> None:
        """Go on with the sandbox a launcher before an exec paused (:meth:`snapshot`): renew it
        at once, watch it, and connect again at the next request that needs the kernel."""
        self._front = front
        self._client = self._new_client()
        self.sandbox_id, self._token = kept["sandbox_id"], kept["token"]
        self._kernel_info, self._since = kept["kernel_info"], kept["since"]
        self._kept = kept["connection"]
        self._reach = KernelReach(front, self.settings, self._token, self._end, self._running)
        self._named.set()
        self.asleep = True
        self._running.clear()
        front.watchers.append(self._watch_kernel)
        self._tasks.append(asyncio.ensure_future(self._renew()))
        self._tasks.append(asyncio.ensure_future(self._watch()))
        try:
            await self._client.renew(self.sandbox_id, self.settings.timeout)
        except SandboxNotFound:
            gone = f"sandbox {self.sandbox_id} is gone (404: it expired or was deleted)"
            self._end(ExitStatus(1, gone))
        except OpenSandboxError as exc:
            log.warning("renewing sandbox %s failed: %s", self.sandbox_id, exc)

    async def stop(self) -> None:
        """Close the connection and delete the sandbox; safe at any time, twice too."""
        if self._stopping:
            return
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._bridge is not None:
            self._bridge.close()
        creating = self._creating
        if creating is not None and not creating.done():
            if self.sandbox_id is None:  # the create is in flight: wait until it names the sandbox
                named = asyncio.ensure_future(self._named.wait())
                await asyncio.wait(
                    [creating, named], timeout=STOP_WAIT, return_when=asyncio.FIRST_COMPLETED
                )
                named.cancel()
            await cancel_until_done(creating)
        if self.sandbox_id is not None and self._client is not None:
            try:
                await self._client.delete(self.sandbox_id)
            except (KernelSandboxError, OSError) as exc:
                log.error("could not delete the kernel's sandbox %s: %s", self.sandbox_id, exc)
            else:  # nothing left for the provisioner to remove
                self._record(None)
        for closer in (self._reach, self._client):
            if closer is not None:
                await closer.aclose()


def _unsupported(exc: OpenSandboxError) -> bool:
    """Whether the server says it never pauses this sandbox (Kubernetes providers without pause:
    ``400 SANDBOX::INVALID_STATE`` "Pause is not supported for this sandbox type"; or 501)."""
    if not isinstance(exc, OpenSandboxAPIError):
        return False
    said = str(exc).lower()
    return exc.status_code == 501 or (exc.status_code == 400 and "not supported" in said)
