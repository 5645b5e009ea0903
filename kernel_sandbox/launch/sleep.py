"""Kernels that sleep when idle and wake on the next message, with their variables
(``suspend_after``).

A :class:`Sleeper` stands between the front and the backend's links, one link per container. When
the kernel has been idle for ``suspend_after`` seconds (no client request on shell or control, no
cell running, no open widget), a link that can pause its sandbox (OpenSandbox) does, keeping it
whole; otherwise (Docker; ``suspend_by: checkpoint``; a server that cannot pause) the sleeper runs
cells of its own (:mod:`.owncells`: no client sees them) that save the kernel's state, pulls the
blob into the same :class:`~.checkpoints.CheckpointStore` as ``%checkpoint`` (same caps, a slot of
its own: :data:`~kernel_sandbox.privdir.SLEEP_SLOT`; all the user's sleeping kernels' blobs
together within ``max_suspended_bytes``), through the backend's channel or through cells
(:mod:`.cellblobs`), and removes the container (the blob goes once the kernel is awake again).
Asleep, the launcher answers heartbeats, ``kernel_info_request`` (with the live kernel's last
reply), ``comm_info_request`` and ``history_request`` (as the woken kernel will: no comms, no
history), the debugger's ``debugInfo`` (while it was off), ``interrupt_request`` and
``shutdown_request`` itself. Any other request wakes the kernel: a new container of the same
settings, the blob put back and loaded (only if its sha256 is the one kept at sleep),
``execution_count`` set where it was, then the requests that waited pass on, and the first cell's
output starts with one line saying the kernel woke up and what was not kept. The client keeps its
connection, kernel id and connection file.

Nothing is lost silently: a kernel whose checkpoint would leave names behind (sockets, threads,
generators...) or that has open widgets stays awake unless ``suspend_lossy``; a checkpoint refused
(over its cap, the store or ``max_suspended_bytes`` full) or failed leaves the container running;
a request that comes while the checkpoint is taken abandons the sleep. Each refusal is written,
with its reason, to the kernel's ``sleep.json`` (``kernel-sandbox ps``). A wake that fails ends
the kernel with the reason and where the blob is kept.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import backends
from ..errors import CheckpointError, KernelLaunchError, KernelSandboxError
from ..kernelside.boot import EXTENSION
from ..metrics import Usage
from ..privdir import (
    LAUNCHER_LOCK,
    SLEEP_SLOT,
    SUSPEND_REQUEST,
    WAKE_REQUEST,
    PrivateDir,
    kept_checkpoint,
    note_sleep,
)
from .asleep import (
    DEBUG_INFO_MAX,
    Busy,
    PausingLink,
    SleepableLink,
    Widgets,
    answer_idle,
    answer_shutdown,
    answer_woken,
    cells,
    debug_command,
    failure,
    give_back_memory,
    kept_debug_info,
    listed,
    tell_first_cell,
)
from .cellblobs import CellChannel
from .checkpoints import CheckpointStore
from .front import Answer, ExitStatus, Front
from .owncells import OwnCells
from .messages import msg_type_of, parse_part

if TYPE_CHECKING:
    from .request import LaunchRequest

CHECK_EVERY = 1.0
"""Seconds between two looks at the idle clock, at most."""
DORMANT_AFTER = 2.0
"""Seconds a sleeping kernel stays quiet before its launcher makes way for the small process that
holds the channels meanwhile (:mod:`.dormant`)."""
log = logging.getLogger("kernel_sandbox.launch")


class Sleeper:
    """A :class:`KernelLink` that puts its kernel to sleep when idle (see the module docstring)."""

    def __init__(self, request: LaunchRequest, make: Callable[[], SleepableLink]) -> None:
        self.request = request
        settings: Any = request.settings
        self._settings = settings
        self.after: float = settings.suspend_after
        self.lossy: bool = settings.suspend_lossy
        self._make = make
        self._pauses = getattr(settings, "suspend_by", "checkpoint") != "checkpoint"
        """The link pauses when idle, as long as its server can (``suspend_by``)."""
        self._loop = asyncio.get_running_loop()
        self._link: SleepableLink | None = None
        self._front: Front | None = None
        self._ended: asyncio.Future[ExitStatus] = self._loop.create_future()
        self.state = "awake"
        """``awake``, ``suspending``, ``asleep`` or ``waking``."""
        self._last = self._loop.time()
        self._busy = Busy()
        self._interrupt_on: set[str] = set()
        """The cells that waited for a wake when an interrupt came: the first to run gets it."""
        self._abandon = False
        """Set by a wake asked while the checkpoint is taken: the sleep is abandoned."""
        self._suspended: asyncio.Future[None] | None = None
        """Done when the sleep being taken is over (asleep, or abandoned)."""
        self._widgets = Widgets()
        self._cells = OwnCells(lambda: self._link)
        self._queue: collections.deque[tuple[str, list[Any], list[Any]]] = collections.deque()
        self._kernel_info: Any = None
        self._debug_info: dict[str, Any] | None = None
        """The kernel's last ``debugInfo`` answer while its debugger was off (None: none, or the
        debugger was used since)."""
        self._count: int | None = None
        self._lost: dict[str, str] = {}
        self._kept_sha: str | None = None
        """The sha256 of the checkpoint kept at the last sleep (the only one a wake restores)."""
        self._since = 0.0
        self._saved: int | None = None
        self._own_dir: PrivateDir | None = None
        self._dir = request.private
        self._store: CheckpointStore | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._handlers: dict[str, Callable[[Any], Answer]] = {}
        """The links' own answers to launcher requests, by type (the latest link's)."""
        self._wrapped: dict[str, Callable[[Any], Answer]] = {}
        self._wake_task: asyncio.Future[None] | None = None
        self.resting: asyncio.Future[None] = self._loop.create_future()
        """Done once the kernel has slept quietly for :data:`DORMANT_AFTER` seconds and
        :attr:`may_rest` says yes: the launcher may then exec the dormant process."""
        self.may_rest: Callable[[], bool] = lambda: False

    # -- the link's life -----------------------------------------------------------------------

    async def start(self, front: Front) -> None:
        """Start the first container; from now on, watch for idleness."""
        self._attach(front)
        if self._dir is None:
            self._dir = self._own_dir = PrivateDir.create()
            self._dir.hold(LAUNCHER_LOCK)
        await self._start_link()
        self._spawn(self._idle_clock())

    def _attach(self, front: Front) -> None:
        self._front = front
        front.watchers.append(self._watch)
        front.requests[SUSPEND_REQUEST] = lambda content: self.suspend("asked by a client")
        front.requests[WAKE_REQUEST] = lambda content: self._wake_request()

    async def resume(self, front: Front, kept: dict[str, Any]) -> None:
        """Go on asleep as the launcher before an exec left off (:meth:`snapshot`)."""
        self._attach(front)
        if kept["own_dir"] is not None:
            path, fd = kept["own_dir"]
            self._dir = self._own_dir = PrivateDir(Path(path))
            self._own_dir.adopt(LAUNCHER_LOCK, fd)
        if kept.get("paused"):  # the link's own sleep: it goes on with its sandbox
            link = self._make()
            link.keep_dir = self._own_dir
            self._link = link
            await cast(PausingLink, link).resume(front, kept)
            self._took(link)
            self._spawn(self._idle_clock())
            return
        self._kernel_info, self._debug_info = kept["kernel_info"], kept["debug_info"]
        self._count, self._lost, self._kept_sha = kept["count"], kept["lost"], kept["kept_sha"]
        self._since, self._saved = kept["since"], kept["saved"]
        for name in kept["requests"]:  # the link's own, registered again at the wake
            self._wrapped[name] = front.requests[name] = self._waking_handler(name)
        self.state = "asleep"
        self._spawn(self._idle_clock())

    def own_dir(self) -> PrivateDir | None:
        """The directory made for a kernel whose client ran argv (None: the provisioner's)."""
        return self._own_dir

    def snapshot(self) -> dict[str, Any]:
        """What a launcher exec'd anew needs to go on with this sleeping kernel (JSON; the own
        directory's lock descriptor is to be inherited)."""
        own = self._own_dir
        own_dir = None if own is None else [str(own.path), own.lock_fd(LAUNCHER_LOCK)]
        paused = self._paused()
        if paused is not None:
            return {**paused.snapshot(), "paused": True, "own_dir": own_dir}
        return {
            "own_dir": own_dir,
            "kernel_info": self._kernel_info,
            "debug_info": self._debug_info,
            "count": self._count,
            "lost": self._lost,
            "kept_sha": self._kept_sha,
            "since": self._since,
            "saved": self._saved,
            "requests": list(self._handlers),
        }

    async def _start_link(self) -> None:
        assert self._front is not None
        link = self._make()
        link.keep_dir = self._own_dir
        self._link = link
        await link.start(self._front)
        self._took(link)

    def _took(self, link: SleepableLink) -> None:
        """Move blobs through ``link``'s channel; its requests wake the kernel; its end (unless
        let go to sleep) is the kernel's."""
        assert self._dir is not None
        settings = self._settings
        channel = link.blob_channel()
        if isinstance(channel, CellChannel):
            channel.call = self._cells.call
        if self._store is None:
            self._store = CheckpointStore(
                self._dir.path,
                channel,
                settings.checkpoint_max_bytes,
                settings.max_checkpoint_bytes,
                backends.for_settings(settings).name,
                slot=SLEEP_SLOT,
            )
            self._store.vet = self._vet
            if settings.max_suspended_bytes is not None:
                self._store.slot_cap = (settings.max_suspended_bytes, "max_suspended_bytes")
        self._store.channel = channel
        self._wrap_requests()
        self._spawn(self._follow(link))

    def _paused(self) -> PausingLink | None:
        """The link, while it sleeps on its own (paused)."""
        link = self._link
        return cast(PausingLink, link) if getattr(link, "asleep", False) else None

    def _wrap_requests(self) -> None:
        """Make the requests the new link answers itself (its egress window) wake a sleeping
        kernel first: what they prepare is for the container that runs next."""
        assert self._front is not None
        requests = self._front.requests
        for name, handler in list(requests.items()):
            if name in (SUSPEND_REQUEST, WAKE_REQUEST, "usage_request"):
                continue  # the sleeper's own, and the front's
            if handler is self._wrapped.get(name):
                continue  # wrapped already: the new link did not answer it anew
            self._handlers[name] = handler
            self._wrapped[name] = requests[name] = self._waking_handler(name)

    def _waking_handler(self, name: str) -> Callable[[Any], Answer]:
        def answer(content: Any) -> Answer:
            if self.state == "awake":
                return self._handlers[name](content)
            return self._after_wake(name, content)

        return answer

    async def _after_wake(self, name: str, content: Any) -> dict[str, Any]:
        woke = await self._wake_request()
        if woke.get("status") != "ok":
            return woke
        answer = self._handlers[name](content)
        return answer if isinstance(answer, dict) else await answer

    async def _follow(self, link: SleepableLink) -> None:
        """The kernel's end is the sleeper's, unless the link was let go to sleep."""
        status = await link.ended()
        if link is self._link:
            self._end(status)

    def _end(self, status: ExitStatus) -> None:
        if not self._ended.done():
            self._ended.set_result(status)

    async def ended(self) -> ExitStatus:
        """Wait until the kernel has ended (never by a sleep), and say how."""
        return await asyncio.shield(self._ended)

    async def stop(self) -> None:
        """End the kernel: stop the container if it is awake, drop its sleep's checkpoint."""
        for task in list(self._tasks):
            task.cancel()
        link, self._link = self._link, None
        if link is not None:
            await link.stop()
        clean = not self._ended.done() or self._ended.result().code == 0
        if self._store is not None:
            await self._store.close()
            if clean:
                self._store.path.unlink(missing_ok=True)
        elif clean and self._dir is not None:  # resumed asleep (:meth:`resume`): no store yet
            kept_checkpoint(self._dir.path, SLEEP_SLOT).unlink(missing_ok=True)
        if self._own_dir is not None:
            self._own_dir.remove()

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- messages ------------------------------------------------------------------------------

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """A client's message: passed on while awake; asleep, answered here or queued for the
        wake."""
        if channel != "stdin":
            self._last = self._loop.time()
            if channel == "shell" and b"comm_close" in parts[0]:
                self._widgets.note(parts, from_client=True)
            elif channel == "control" and b"debug_request" in parts[0]:
                if debug_command(parts) != "debugInfo":
                    self._debug_info = None  # the debugger is in use: only the kernel answers
        if self.state == "awake" and self._link is not None:
            self._link.send(channel, idents, parts)
            return
        msg_type = msg_type_of(bytes(parts[0])) or ""
        if msg_type == "interrupt_request" and self.state == "suspending" and self._link:
            self._link.send(channel, idents, parts)  # a cell runs: its checkpoint, or a client's
            return
        if msg_type == "interrupt_request" and self.state in ("waking", "asleep"):
            assert self._front is not None
            self._interrupt_on.update(cells(self._queue))  # see :meth:`interrupt`
            answer_idle(self._front, channel, idents, parts, None)
            return
        if self.state == "asleep" and self._answer_asleep(channel, idents, parts, msg_type):
            return
        self._queue.append((channel, idents, parts))
        if self.state == "asleep" and self._wake_task is None:
            self._wake_task = self._spawn(self._wake())

    def _answer_asleep(self, channel: str, idents: list[Any], parts: list[Any], kind: str) -> bool:
        """Answer a request that needs no kernel (True), while it sleeps."""
        front = self._front
        assert front is not None
        if answer_idle(front, channel, idents, parts, self._kernel_info):
            return True
        if answer_woken(front, channel, idents, parts, self._debug_info):
            return True
        if kind == "shutdown_request":
            answer_shutdown(front, channel, idents, parts)
            self._end(ExitStatus(0, "the kernel shut down (asleep)"))
            return True
        return False

    def heartbeat(self, frames: list[Any]) -> None:
        """Pass a ping to the kernel; asleep or waking, the launcher answers it."""
        if self._link is not None and self.state in ("awake", "suspending"):
            self._link.heartbeat(frames)
        elif self._front is not None:
            self._front.heartbeat_reply(frames)

    def pause_reading(self, channel: str, paused: bool) -> None:
        """Pass flow control on to the container's link, if any."""
        if self._link is not None:
            self._link.pause_reading(channel, paused)

    async def interrupt(self) -> None:
        """Interrupt the running cell (its checkpoint's too); the first cell that waits for the
        kernel to wake is interrupted as soon as it starts (SIGINT reaches an ipykernel only while
        a cell runs: sent before, it would be lost)."""
        if self._link is not None and self.state in ("awake", "suspending"):
            await self._link.interrupt()
        else:
            self._interrupt_on.update(cells(self._queue))

    def usage(self) -> Usage | None:
        """The container's usage; asleep, no memory and state ``suspended``."""
        if self.state in ("asleep", "waking"):
            return Usage(memory=0, source="launcher", state="suspended", saved=self._saved)
        return self._link.usage() if self._link is not None else None

    def limits_hit(self, error_text: str = "") -> list[str]:
        """The limits the kernel hit (read from its current container)."""
        return self._link.limits_hit(error_text) if self._link is not None else []

    def _watch(self, channel: str, idents: list[bytes], parts: list[bytes]) -> bool:
        """See each kernel message first: take the replies to the launcher's own cells, note the
        kernel's state (running, open widgets, last count, kernel_info) from the others."""
        header, parent = parts[0], parts[1]
        if not isinstance(header, bytes) or not isinstance(parent, bytes):
            return False
        if self._cells.take(channel, parts):
            return True
        if channel == "iopub":
            if b'"status"' in header and msg_type_of(header) == "status":
                self._status(parts)
            elif b'"comm_' in header and msg_type_of(header) in ("comm_open", "comm_close"):
                # never a comm_msg: its content (widget data) may be megabytes
                self._widgets.note(parts, from_client=False)
        elif channel == "control" and b"debug_reply" in header:
            if msg_type_of(header) == "debug_reply" and len(parts[3]) < DEBUG_INFO_MAX:
                self._debug_info = kept_debug_info(parse_part(bytes(parts[3])), self._debug_info)
        elif channel == "shell":
            if b"kernel_info_reply" in header and msg_type_of(header) == "kernel_info_reply":
                self._kernel_info = parse_part(bytes(parts[3]))
            elif b"execute_reply" in header and msg_type_of(header) == "execute_reply":
                content = parse_part(bytes(parts[3]))
                count = content.get("execution_count") if isinstance(content, dict) else None
                if type(count) is int and 0 <= count < 2**31:
                    self._count = count
        return False

    def _status(self, parts: list[bytes]) -> None:
        """Note whether a cell runs; interrupt the one that waited for the wake, if asked."""
        started = self._busy.note(parts)
        self._last = self._loop.time()
        if started is not None and started in self._interrupt_on:
            self._interrupt_on.clear()
            if self._link is not None:
                self._spawn(self._link.interrupt())

    # -- sleeping ------------------------------------------------------------------------------

    async def _idle_clock(self) -> None:
        """Put the kernel to sleep once it has been idle ``suspend_after`` seconds."""
        while True:
            if self.state == "asleep" or self._paused() is not None:
                self._rest_if_quiet()
                await asyncio.sleep(CHECK_EVERY / 4)
                continue
            left = self._last + self.after - self._loop.time()
            if left > 0:
                await asyncio.sleep(min(left, CHECK_EVERY))
                continue
            if self.state == "awake" and not self._busy:
                result = await self.suspend(f"idle for {self.after:g} s")
                if result.get("status") != "ok":
                    log.info("the kernel stays awake: %s", result.get("evalue"))
            self._last = self._loop.time()

    def _rest_if_quiet(self) -> None:
        assert self._front is not None
        paused = self._paused()
        busy = self._front.answering() or self._wake_task is not None or bool(self._queue)
        busy = busy or (paused is not None and not paused.quiet())
        quiet = not busy and self._loop.time() - self._last >= DORMANT_AFTER
        if quiet and not self.resting.done() and self.may_rest():
            self.resting.set_result(None)

    async def suspend(self, why: str) -> dict[str, Any]:
        """Pause the link where it can (``suspend_by``), else checkpoint the kernel and remove its
        container; the reply says whether it sleeps, or why not (the container then runs on)."""
        if self.state == "asleep":
            return {"status": "ok", "state": "suspended", "not_kept": self._lost}
        if self._pauses and self._link is not None and self.state == "awake":
            paused = await cast(PausingLink, self._link).suspend(why)
            if not paused.get("unsupported") or self._settings.suspend_by == "pause":
                return paused
            self._pauses = False  # the server never pauses this sandbox: checkpoints from now on
            log.info("%s; the kernel sleeps by checkpoint instead", paused.get("evalue"))
        refusal = self._refusal()
        if refusal is not None:
            note_sleep(self.request.private, {"state": "awake", "why": refusal})
            return {"status": "error", "evalue": refusal}
        self.state = "suspending"
        self._abandon = False
        self._suspended = self._loop.create_future()
        try:
            self._kept_sha = await self._checkpoint()
            if self._queue or self._abandon:
                raise CheckpointError("a client's request came while the checkpoint was taken")
        except Exception as exc:  # whatever failed, the kernel runs on (the kernel's answers too)
            reason = failure(exc)
            if self._store is not None:  # awake, the kernel holds no sleep's disk
                self._store.path.unlink(missing_ok=True)
            if self._link is not None:  # before the cells that waited go on
                self._link.count_from(self._count)
            self._awake()
            note_sleep(self.request.private, {"state": "awake", "why": reason})
            return {"status": "error", "evalue": reason}
        finally:
            self._suspended.set_result(None)
        link, self._link = self._link, None
        self.state = "asleep"
        self._since = time.time()
        assert link is not None and self._store is not None
        size = self._store.path.stat().st_size if self._store.path.exists() else 0
        held = link.usage()
        self._saved = held.memory if held is not None else None
        # said before the container goes: whoever finds it gone finds the kernel asleep
        state = {"state": "suspended", "since": self._since, "bytes": size, "saved": self._saved}
        note_sleep(self.request.private, {**state, "why": why})
        await link.stop()
        self._last = self._loop.time()  # quiet from now on: its reply is yet to go
        give_back_memory()
        log.info("the kernel sleeps (%s); its checkpoint is %d bytes", why, size)
        if self._queue and self._wake_task is None:
            self._wake_task = self._spawn(self._wake())
        return {"status": "ok", "state": "suspended", "bytes": size, "not_kept": self._lost}

    def _refusal(self) -> str | None:
        if self.state != "awake" or self._link is None:
            return f"the kernel is {self.state}"
        if self._busy:
            return "a cell is running"
        if self._widgets and not self.lossy:
            return (
                f"{len(self._widgets)} widget(s) are open and a sleep closes them (set "
                "suspend_lossy: true to suspend it anyway)"
            )
        return None

    def _vet(self, header: dict[str, Any]) -> None:
        """Refuse a sleep's checkpoint that would leave names behind (unless ``suspend_lossy``)."""
        lost = {**header["not_saved"], **header["files_not_saved"]}
        if header["not_saved"] and not self.lossy:
            raise CheckpointError(
                f"its checkpoint would leave behind {listed(header['not_saved'])}; the kernel "
                "stays awake (set suspend_lossy: true to suspend it anyway)"
            )
        self._lost = lost

    async def _checkpoint(self) -> str:
        """Keep the kernel's state on the host (the sleep's slot of the store); its sha256."""
        assert self._store is not None
        await self._install()
        try:
            report, _ = await self._cells.call("sleep_save")
            kept = await self._store.keep(report)
        finally:
            with contextlib.suppress(KernelSandboxError, asyncio.TimeoutError):
                await self._cells.run(f"__import__({EXTENSION!r}).sleep_drop()")
        return str(kept["sha256"])

    async def _install(self) -> None:
        """Install the sleep's kernel side where the blob moves through cells."""
        if isinstance(self._store and self._store.channel, CellChannel):
            await self._cells.install()

    def _awake(self) -> None:
        """Back to awake with the container that runs; what waited meanwhile passes on."""
        self.state = "awake"
        self._last = self._loop.time()
        while self._queue and self._link is not None:
            self._link.send(*self._queue.popleft())

    # -- waking --------------------------------------------------------------------------------

    async def _wake_request(self) -> dict[str, Any]:
        if (paused := self._paused()) is not None:
            return await paused.wake()
        if self.state == "suspending" and self._suspended is not None:
            self._abandon = True  # a request that needs the kernel: the sleep is abandoned
            await asyncio.shield(self._suspended)
        if self.state == "awake":
            return {"status": "ok", "state": "awake"}
        if self._wake_task is None:
            self._wake_task = self._spawn(self._wake())
        await asyncio.shield(self._wake_task)
        if self._ended.done():
            return {"status": "error", "evalue": self._ended.result().reason}
        return {"status": "ok", "state": "awake"}

    async def _wake(self) -> None:
        """Start a new container, restore the sleep's checkpoint into it, pass on what waited."""
        try:
            if self.state != "asleep":
                return
            self.state = "waking"
            try:
                await self._start_link()
                assert self._store is not None and self._link is not None
                await self._install()
                self._store.expected = self._kept_sha
                blob, _ = await self._cells.call("sleep_path")
                await self._store.give(blob)
                count = None if self._count is None else self._count + 1
                await self._cells.call("sleep_load", self._kept_sha, count)
                self._link.count_from(self._count)
            except Exception as exc:  # whatever failed, the kernel ends saying why
                assert self._dir is not None
                kept = kept_checkpoint(self._dir.path, SLEEP_SLOT)
                reason = (
                    f"the kernel could not wake from sleep ({failure(exc)}); its checkpoint is "
                    f"kept at {kept}"
                )
                log.error("%s", reason)
                self._end(ExitStatus(1, reason, KernelLaunchError.__name__))
                return
            self._store.path.unlink(missing_ok=True)  # awake, it holds no sleep's disk
            note_sleep(self.request.private, None)
            self._tell_first_cell()
            self._awake()
        finally:
            self._wake_task = None

    def _tell_first_cell(self) -> None:
        assert self._front is not None
        if self._count is None and not self._lost:
            return  # no cell ran before the sleep (a standby's, say): nothing was there to keep
        slept = time.strftime("%H:%M", time.localtime(self._since))
        text = f"The kernel slept from {slept} and woke up in a new container with its variables."
        if self._lost:
            text += f" Not kept: {listed(self._lost)}."
        tell_first_cell(self._front, self._queue, text)
