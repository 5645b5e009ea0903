"""Sessions on a sandboxed kernel: run code, move files, install packages, call tools, run
skills."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import json
import os
import posixpath
import queue
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any

import zmq
import zmq.asyncio

from ..egress import WINDOW_REQUEST
from ..errors import (
    CallTimeoutError,
    ConfigError,
    FramingError,
    MetricsUnavailable,
    NetworkDisabledError,
    PathError,
    SandboxError,
    SandboxFileError,
)
from ..metrics import CgroupProbe, Usage, near_misses
from ..policy import OutputPolicy
from ..results import Execution, ExecutionError, FileInfo, ToolResult
from .backend import DEFAULT_BACKEND, kernel_manager
from .backend import backend as backend_named
from .channel import CHUNK, VERSION, Answer, bootstrap_cell, new_marker, parse_text_frame, text_cell
from .decode import DecodeLimits, allowed_map, decode
from .files import (
    MAX_FILE_BYTES,
    MAX_SKILL_FILES_BYTES,
    MAX_STREAM_BYTES,
    NO_LIMIT,
    Content,
    chunks,
    confine,
)
from .collector import Callback, Collector
from .skills import failed_skill, figure_files, file_entry, skill_result
from .tools import body_error, check_env, tool_payload

DEFAULT_CALL_TIMEOUT = 300.0
"""The deadline of every call of a session unless one is given."""
DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024
"""Bytes of output one call keeps in memory; the rest is dropped as it arrives."""
PIP_OUTPUT_TAIL = 64 * 1024
LIVENESS_INTERVAL = 1.0
IOPUB_HWM = 32
TEXT_CHUNK = 1024 * 1024
RESTORE_GRACE = 10.0
KEEP_STATE_BYTES = 64 * 1024
REPLY_GRACE = 2.0
MAX_WINDOW = 86400.0
PIP_RETRIES = ("--retries", "5")
"""pip's own default, given explicitly: a kernel with the network off has ``PIP_RETRIES=1``."""
LAUNCHER_REPLY_WAIT = 10.0
TAMPERED = (
    "More than one answer carried this call's marker: the tool tampered with the result channel; "
    "its output is not trusted."
)


_LIVE: weakref.WeakSet[AsyncSandbox] = weakref.WeakSet()


class AsyncSandbox:
    """A kernel in a sandbox (``docker``, ``opensandbox`` or ``local``), used with ``async with``.

    Options: ``image``, ``memory`` ("512m"), ``cpus``, ``pids_limit``, ``network`` (off by default;
    True, or a list of destinations such as ``["api.example.com"]``), ``env``, ``mounts``
    ("HOST:CONTAINER[:ro|rw]"), ``timeout`` (seconds every call may take by default: 300;
    ``float("inf")`` for none), ``start_timeout``, ``max_output_bytes``, ``interrupt_grace``
    (seconds an interrupted call gets to stop before the kernel is restarted), ``allowed_classes``
    (classes whose instances tool results may hold), ``decode_limits`` (:class:`DecodeLimits` for
    tool results), ``unsafe_pickle`` (decode values the data format cannot carry from pickles: off,
    see the README), ``output_policy`` (``strict``, the default, or ``trusted``); any other keyword
    goes to the backend's provisioner config. Docker and OpenSandbox options are checked here,
    before anything starts.
    """

    def __init__(
        self,
        backend: str = DEFAULT_BACKEND,
        *,
        image: str | None = None,
        memory: str | None = None,
        cpus: float | None = None,
        pids_limit: int | None = None,
        network: bool | Sequence[str] = False,
        env: Mapping[str, str] | None = None,
        mounts: Iterable[str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        start_timeout: float = 60.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        interrupt_grace: float = 3.0,
        allowed_classes: Iterable[type] = (),
        decode_limits: DecodeLimits | None = None,
        unsafe_pickle: bool = False,
        output_policy: str | None = None,
        **backend_options: Any,
    ) -> None:
        self._backend = backend_named(backend)
        for name, value in (
            ("timeout", timeout),
            ("start_timeout", start_timeout),
            ("interrupt_grace", interrupt_grace),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(
                    f"{name} must be a positive number of seconds (float('inf') for no deadline), "
                    f"not {value!r}"
                )
        if decode_limits is not None and not isinstance(decode_limits, DecodeLimits):
            raise ConfigError(
                f"decode_limits must be a DecodeLimits, not {type(decode_limits).__name__}"
            )
        self.backend = backend
        self.network = network if isinstance(network, bool) else list(network)
        self.timeout = float(timeout)
        self.start_timeout = float(start_timeout)
        self.max_output_bytes = max_output_bytes
        self.interrupt_grace = float(interrupt_grace)
        self.allowed_classes = tuple(allowed_classes)
        self._allowed = allowed_map(self.allowed_classes)
        self.decode_limits = decode_limits or DecodeLimits()
        self.unsafe_pickle = bool(unsafe_pickle)
        self._policy = None if self._backend.sandboxed else OutputPolicy.from_name(output_policy)
        if output_policy is not None:
            OutputPolicy.from_name(output_policy)
            backend_options["output_policy"] = output_policy
        self._options: dict[str, Any] = {
            "image": image,
            "memory": memory,
            "cpus": cpus,
            "pids_limit": pids_limit,
            "network": self.network,
            "env": dict(env or {}),
            "mounts": list(mounts or []) or None,
            "launch_timeout": start_timeout,
            **backend_options,
        }
        self._backend.check(self._options)
        self._comms = self._backend.comms_known  # tool calls on a comm; else decided in _connect
        self._km: Any = None
        self._closed = False
        self._kc: Any = None
        self._context: zmq.asyncio.Context | None = None
        self._tmp: str | None = None
        self._lock: asyncio.Lock | None = None
        self._channel: str | None = None
        self._installed = False
        self._restarts = 0
        # the helper could not answer: restart the kernel before the next request
        self._unanswered = False
        self._kept_state: str | None = None
        # a per-call environment may still be set in the kernel (a cancelled call)
        self._env_set = False
        self._probe: CgroupProbe | None = None
        self._checked = Usage()  # the counters when limits were last looked at: none yet
        self.work_dir: str = ""
        if not self._backend.sandboxed:
            warnings.warn(
                f"kernel-sandbox backend {backend!r} runs an ordinary local kernel: it is NOT a "
                "sandbox (no isolation, no limits). Use it for development only.",
                stacklevel=2,
            )

    def __repr__(self) -> str:
        state = "started" if self._km is not None else "closed" if self._closed else "not started"
        return (
            f"<{type(self).__name__} backend={self.backend!r} {state} work_dir={self.work_dir!r}>"
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> AsyncSandbox:
        """Start the kernel and wait until it answers; on failure nothing is left behind."""
        if self._km is not None:
            return self
        self._closed = False
        self._lock = asyncio.Lock()
        options = dict(self._options)
        cwd = None
        if not self._backend.sandboxed:
            options.pop("launch_timeout")
            self._tmp = tempfile.mkdtemp(prefix="kernel-sandbox-local-")
            cwd = posixpath.join(self._tmp, "work")
            os.mkdir(cwd)
            options["env"] = {"HOME": self._tmp, **options["env"]}
        spec = self._backend.kernel_spec(options)
        self._km = kernel_manager(spec)
        if self._tmp:
            self._km.transport, self._km.ip = "ipc", posixpath.join(self._tmp, "k")
        _LIVE.add(self)
        try:
            await self._km.start_kernel(**({"cwd": cwd} if cwd else {}))
            await self._connect()
            async with self._lock:
                info = await self._open(time.monotonic() + self.start_timeout)
            self.work_dir = info["work"]
        except BaseException:
            await self.close()
            raise
        return self

    @classmethod
    async def attach(
        cls, kernel_id: str, backend: str = DEFAULT_BACKEND, **options: Any
    ) -> AsyncSandbox:
        """Take over the live sandboxed kernel ``kernel_id`` whose owner (another process) is gone.

        Within the kernel's ``orphan_timeout`` of its owner's end: same container, same variables.
        ``options`` are the session's own (timeouts, limits of results); the kernel keeps the
        settings it was started with. Raises KernelLaunchError when there is no such kernel of
        this user, or its record is refused (:mod:`kernel_sandbox.reattach`).
        """
        from ..reattach import attach, find

        sandbox = cls(backend, **options)
        if not sandbox._backend.sandboxed:
            raise ConfigError(f"backend {backend!r} runs no sandboxed kernel to re-attach to")
        record = find(kernel_id)
        spec = sandbox._backend.kernel_spec(sandbox._options)
        provisioner = spec.metadata["kernel_provisioner"]
        if provisioner["provisioner_name"] != record.backend:
            raise ConfigError(
                f"kernel {kernel_id} runs on {record.backend}, not on the {backend!r} backend"
            )
        provisioner["config"] = record.settings
        sandbox._lock = asyncio.Lock()
        sandbox._km = kernel_manager(spec)
        _LIVE.add(sandbox)
        try:
            await attach(kernel_id, sandbox._km)
            await sandbox._connect()
            async with sandbox._lock:
                info = await sandbox._open(time.monotonic() + sandbox.start_timeout)
            sandbox.work_dir = info["work"]
        except BaseException:
            await sandbox.close()  # shuts down only a kernel that was taken over
            raise
        return sandbox

    @property
    def kernel_id(self) -> str | None:
        """The id of the kernel (for :meth:`attach` from another process), once started."""
        return self._km.kernel_id if self._km is not None else None

    async def _connect(self) -> None:
        self._channel, self._installed, self._kept_state, self._env_set = None, False, None, False
        self._context = zmq.asyncio.Context()
        self._context.setsockopt(zmq.RCVHWM, IOPUB_HWM)
        self._kc = self._km.client(context=self._context)
        self._kc.start_channels()
        try:
            await self._kc.wait_for_ready(timeout=self.start_timeout)
        except RuntimeError as exc:
            raise SandboxError(f"The kernel did not become ready: {exc}") from exc
        # the launcher's execd relay has no comms; the websocket mode has
        if not self._backend.comms_known:
            info = await self._kc.kernel_info(reply=True, timeout=self.start_timeout)
            self._comms = self._backend.speaks_comms(info["content"])

    def _disconnect(self) -> None:
        kc, context, self._kc, self._context = self._kc, self._context, None, None
        if kc is not None:
            kc.stop_channels()
        if context is not None:
            context.destroy(linger=0)

    async def restart(self) -> None:
        """Restart the kernel: a fresh interpreter (and, on Docker, a fresh container)."""
        self._restarts += 1
        self._disconnect()
        await self._km.restart_kernel(now=True)
        await self._connect()

    async def pause(self) -> None:
        """Pause the sandbox (opensandbox backend): it keeps its memory and runs nothing until
        :meth:`resume`.

        Calls made while it is paused wait (their deadlines still count); the kernel is not dead.
        """
        self._deadline(None)
        await self._backend.pause(self._km.provisioner, True)

    async def resume(self) -> None:
        """Resume a paused sandbox and wait until it runs again."""
        self._deadline(None)
        await self._backend.pause(self._km.provisioner, False)

    async def close(self) -> None:
        """Shut the kernel down and remove everything the sandbox created. Safe to call twice."""
        km, self._km = self._km, None
        self._closed = True
        try:
            self._disconnect()
            if km is not None and km.has_kernel:
                await km.shutdown_kernel(now=True)
        finally:
            _LIVE.discard(self)
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    def _kill_now(self) -> None:
        """Last resort without an event loop (garbage collection, interpreter exit)."""
        km, self._km = self._km, None
        with contextlib.suppress(Exception):
            self._backend.kill_now(getattr(km, "provisioner", None))
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __del__(self) -> None:
        if getattr(self, "_km", None) is not None:
            self._kill_now()

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- usage -------------------------------------------------------------------------------

    async def metrics(self) -> Usage:
        """The sandbox's usage against its limits now, read by the host (never asked of the kernel).

        Raises :class:`MetricsUnavailable` where the host cannot read it (a remote engine, or a
        backend without such figures: ``opensandbox``, ``local``).
        """
        if self._km is None:
            raise MetricsUnavailable("the sandbox is not started")
        return await asyncio.to_thread(self._sample)

    def _sample(self) -> Usage:
        """One sample from the kernel's current container (found again after a restart)."""
        provisioner = self._km.provisioner if self._km is not None else None
        probe = self._probe
        if probe is None or probe.container_id != getattr(provisioner, "container_id", None):
            probe = self._probe = self._backend.probe(provisioner)
            self._checked = Usage()
        return probe.read()

    async def _name_limits(self, error: ExecutionError | None) -> None:
        """Say in ``error`` which limits the kernel hit since they were last looked at, as the host
        reads them."""
        if error is not None and error.name != "KernelDied":
            try:
                usage = await asyncio.to_thread(self._sample)
            except MetricsUnavailable:
                return
            checked, self._checked = self._checked, usage
            notes = near_misses(checked, usage, error.value)
            if notes:
                error.value = f"{error.value} [kernel-sandbox: {'; '.join(notes)}]"

    # -- the message exchange ----------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> tuple[float, float]:
        """(seconds, monotonic deadline) for a call with ``timeout`` (None: the sandbox's)."""
        if self._km is None or self._lock is None:
            if self._closed:
                raise SandboxError(
                    "This sandbox is closed: its kernel was shut down (start() starts a new one)"
                )
            raise SandboxError("The sandbox is not started (use `async with` or `await start()`)")
        seconds = self.timeout if timeout is None else timeout
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, not {seconds!r}")
        return seconds, time.monotonic() + seconds

    def _send_execute(self, code: str, *, silent: bool = False, store_history: bool = False) -> str:
        msg_id: str = self._kc.execute(
            code, silent=silent, store_history=store_history, allow_stdin=False, stop_on_error=False
        )
        return msg_id

    def _send_comm(self, request: dict[str, Any], buffers: Sequence[Any]) -> str:
        msg = self._kc.session.msg("comm_msg", {"comm_id": self._channel, "data": request})
        self._kc.session.send(self._kc.shell_channel.socket, msg, buffers=list(buffers))
        msg_id: str = msg["header"]["msg_id"]
        return msg_id

    async def _exchange(
        self,
        send: Callable[[], str],
        collector: Collector,
        seconds: float,
        deadline: float,
        *,
        reply: bool,
    ) -> Execution:
        """Send one shell message and gather what it causes until the kernel is idle again.

        Past ``deadline`` the kernel is interrupted; if it is not idle ``interrupt_grace``
        seconds later it is restarted and ``state_lost`` set. A kernel that dies is restarted
        too. Either way ``error`` says what happened. ``reply``: the message has a shell reply.
        ``collector.finished`` tells whether the kernel finished handling the message (idle), and
        ``collector.failed`` whether the host saw it fail (a timeout, a death, a reply not ``ok``).
        """
        msg_id = send()
        outcome = await self._collect(msg_id, collector, deadline)
        execution = collector.execution
        collector.finished = outcome == "idle"
        collector.failed = outcome != "idle"
        if outcome == "timeout":
            await self._km.interrupt_kernel()
            outcome = await self._collect(
                msg_id, collector, time.monotonic() + self.interrupt_grace
            )
            lost = outcome != "idle"
            collector.finished = not lost
            action = "restarted (state lost)" if lost else "interrupted"
            execution.error = ExecutionError(
                "TimeoutError",
                f"Execution exceeded the timeout of {seconds:g} s; the kernel was {action}.",
                execution.error.traceback if execution.error else "",
            )
            if lost:
                await self._recover(execution)
            elif reply:
                await self._drain_reply(msg_id, collector)
        elif outcome == "died":
            reason = (
                getattr(self._km.provisioner, "exit_reason", None) or "the kernel process ended"
            )
            execution.error = ExecutionError(
                "KernelDied", f"The kernel died ({reason}); it was restarted and its state is lost."
            )
            await self._recover(execution)
        elif reply:
            await self._drain_reply(msg_id, collector)
        await self._name_limits(execution.error)
        return await collector.finish()

    async def _collect(self, msg_id: str, collector: Collector, deadline: float) -> str:
        """Handle iopub messages of ``msg_id`` until idle ("idle"), the deadline, or kernel
        death."""
        next_check = time.monotonic() + LIVENESS_INTERVAL
        while True:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            try:
                msg = await self._kc.get_iopub_msg(
                    timeout=max(min(LIVENESS_INTERVAL, deadline - now), 0.001)
                )
            except queue.Empty:
                msg = None
            # a message that does not deserialize (bad signature, bad JSON): dropped
            except Exception:
                msg = None
            if msg is not None and msg.get("parent_header", {}).get("msg_id") == msg_id:
                if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    return "idle"
                await collector.handle(msg)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + LIVENESS_INTERVAL
                if not await self._km.is_alive():
                    return "died"

    async def _drain_reply(self, msg_id: str, collector: Collector) -> None:
        execution = collector.execution
        until = time.monotonic() + REPLY_GRACE
        while (left := until - time.monotonic()) > 0:
            try:
                reply = await self._kc.get_shell_msg(timeout=left)
            except queue.Empty:
                break
            except Exception:
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                content = reply.get("content", {})
                count = content.get("execution_count")
                if isinstance(count, int):
                    execution.execution_count = count
                collector.failed = collector.failed or content.get("status") != "ok"
                if content.get("status") == "error" and execution.error is None:
                    execution.error = ExecutionError(
                        str(content.get("ename", "Error"))[:1000],
                        str(content.get("evalue", ""))[:10000],
                    )
                return
        collector.failed = True
        if execution.error is None:
            execution.error = ExecutionError(
                "NoReply", "The kernel finished the request but sent no reply to it."
            )

    async def _recover(self, execution: Execution) -> None:
        execution.state_lost = True
        await self.restart()

    # -- the kernel-side helper --------------------------------------------------------------

    async def _open(self, deadline: float, probe: str | None = None) -> dict[str, Any]:
        """Install the helper if needed and start it serving (on a fresh channel where comms work).

        Returns what it announces: ``version``, ``work`` and ``seen`` (whether the request
        with the marker ``probe`` reached it before). A kernel too broken to start it (user
        code can break the kernel's own message handling) is restarted once.
        """
        restarted = False
        for _ in range(4):
            marker = new_marker()
            install = not self._installed
            code = bootstrap_cell(marker, self.work_dir or None, probe, self._comms, install)
            collector = Collector(self.max_output_bytes, marker=marker)
            seconds = max(deadline - time.monotonic(), 0.001)
            execution = await self._exchange(
                lambda: self._send_execute(code, silent=self._comms),
                collector,
                seconds,
                deadline,
                reply=True,
            )
            if execution.state_lost:
                continue
            if execution.error is not None:
                if not install:
                    self._installed = False
                    continue
                if execution.error.name == "TimeoutError":
                    raise CallTimeoutError(
                        f"The kernel-sandbox helper did not start in time: {execution.error.value}"
                    )
                if not restarted:
                    restarted = True
                    await self.restart()
                    continue
                raise SandboxError(
                    f"The kernel-sandbox helper could not start in the kernel: {execution.error}"
                )
            info = self._opening(collector)
            self._installed = True
            if self._comms:
                await self._settle(deadline)
            return info
        raise SandboxError(
            "The kernel-sandbox helper could not start in the kernel: the kernel kept restarting"
        )

    async def _settle(self, deadline: float) -> None:
        """One empty request on the new channel, outside any cell, so the helper can finish setting
        up."""
        collector = Collector(self.max_output_bytes, marker=new_marker(), channel=self._channel)
        request = {"op": "ready", "marker": collector.marker}
        seconds = max(deadline - time.monotonic(), 0.001)
        await self._exchange(
            lambda: self._send_comm(request, ()), collector, seconds, deadline, reply=False
        )

    def _opening(self, collector: Collector) -> dict[str, Any]:
        if collector.answers > 1:
            raise FramingError(TAMPERED)
        if self._comms:
            if collector.opened is None:
                raise FramingError("The kernel-sandbox helper started but opened no channel.")
            self._channel, info = collector.opened
        else:
            text, marker = collector.text_answer, collector.marker
            found = parse_text_frame(text, marker) if text and marker else None
            if found is None:
                raise FramingError("The kernel-sandbox helper started but sent no answer.")
            info = found[0]
        if info.get("version") != VERSION or not isinstance(info.get("work"), str):
            raise FramingError("The kernel-sandbox helper answered in an unexpected form.")
        return info

    async def _send_request(
        self,
        request: dict[str, Any],
        buffers: Sequence[Any],
        seconds: float,
        deadline: float,
        callbacks: Mapping[str, Callback] | None = None,
    ) -> Collector:
        """Send one request (its marker is made here) and gather until the kernel is idle."""
        if not self._installed or (self._comms and self._channel is None):
            await self._open(deadline)
        marker = new_marker()
        request = {**request, "marker": marker}
        collector = Collector(self.max_output_bytes, callbacks, marker, self._channel)
        if self._comms:
            await self._exchange(
                lambda: self._send_comm(request, buffers), collector, seconds, deadline, reply=False
            )
        else:
            code = text_cell(request, buffers)
            await self._exchange(
                lambda: self._send_execute(code), collector, seconds, deadline, reply=True
            )
        return collector

    def _first(self, collector: Collector) -> tuple[dict[str, Any], list[Any]] | None:
        """The answer's first message (meta, buffers); FramingError if forged.

        None if no answer came, or if the kernel never finished handling the request (it died or
        had to be restarted): an answer is final only once the helper has returned.
        """
        if collector.answers > 1:
            raise FramingError(TAMPERED)
        if collector.answers == 0 or not collector.finished:
            return None
        if self._comms:
            return collector.answer
        if collector.text_answer is None:
            raise FramingError("The answer did not come as the value of the request's cell.")
        return parse_text_frame(collector.text_answer, collector.marker or "")

    async def _request(  # noqa: C901
        self,
        request: dict[str, Any],
        buffers: Sequence[Any] = (),
        seconds: float = DEFAULT_CALL_TIMEOUT,
        deadline: float | None = None,
        *,
        callbacks: Mapping[str, Callback] | None = None,
        limits: DecodeLimits | None = None,
        allowed: Mapping[str, type] | None = None,
        allow_pickle: bool = False,
    ) -> tuple[Any, Execution]:
        """Send ``request`` to the helper and decode its answer: (body, execution).

        The body is None when no answer came (``execution.error`` says why). A request that
        provably never reached the helper (its channel was gone) is sent once more. A helper
        that still could not answer has been broken by the code it ran: the next request
        restarts the kernel first (its ``state_lost`` is set), as a call that timed out would.
        """
        deadline = time.monotonic() + seconds if deadline is None else deadline
        restarts = self._restarts
        if self._unanswered:
            self._unanswered = False
            await self.restart()
        if self._env_set and request["op"] != "env":
            await self._restore_env(Execution())
        limits = limits or DecodeLimits()
        for attempt in range(2):
            collector = await self._send_request(request, buffers, seconds, deadline, callbacks)
            execution = collector.execution
            first = self._first(collector)
            # an answer, then a timeout or a failed cell: not taken
            if first is not None and collector.failed:
                first = None
                break
            if (
                first is not None
                or execution.error is not None
                and execution.error.name in ("TimeoutError", "KernelDied")
            ):
                break
            if execution.state_lost:
                break
            if self._comms:
                self._channel = None
                try:
                    info = await self._open(deadline, probe=collector.marker)
                except SandboxError as exc:
                    execution.error = ExecutionError("NoAnswer", f"No answer came, and then: {exc}")
                    break
                if self._restarts != restarts:
                    execution.error = ExecutionError(
                        "NoAnswer",
                        "No answer came and the kernel no longer ran the kernel-sandbox helper, "
                        "so it was restarted (state lost); the request was not sent again.",
                    )
                    break
                if info.get("seen") or attempt:
                    execution.error = ExecutionError(
                        "NoAnswer",
                        "The request reached the kernel-sandbox helper but no answer came back "
                        "(the code it ran may have broken the channel); the channel was reopened.",
                    )
                    break
            else:
                if not attempt and execution.error is not None:
                    self._installed = False
                    continue
                break
        if self._restarts != restarts:
            execution.state_lost = True
        if first is None:
            if execution.error is None:
                execution.error = ExecutionError(
                    "NoAnswer", "The kernel-sandbox helper sent no answer."
                )
            if execution.error.name == "NoAnswer" and not execution.state_lost:
                self._unanswered = True
                execution.error.value += (
                    " The kernel will be restarted before the next call (state lost)."
                )
            return None, execution
        answer = Answer.first(*first, limits)
        origin = collector.marker
        while answer.missing:
            pulled = await self._send_request(
                {"op": "pull", "of": origin, "offset": answer.received}, (), seconds, deadline
            )
            chunk = self._first(pulled)
            if chunk is None or not chunk[0].get("raw") or len(chunk[1]) != 1:
                raise FramingError(
                    "Could not pull the rest of the answer "
                    f"({pulled.execution.error or 'no chunk came'})."
                )
            answer.add(chunk[1][0])
        doc, parts = answer.parts()
        body = decode(doc, parts, allowed=allowed or {}, limits=limits, allow_pickle=allow_pickle)
        return body, execution

    async def _op(
        self, request: dict[str, Any], buffers: Sequence[Any], seconds: float, deadline: float
    ) -> Any:
        """Run a helper operation (files, packages, environment); return its ``ok`` value or
        raise."""
        body, execution = await self._request(request, buffers, seconds, deadline)
        what = f"kernel-sandbox {request['op']}"
        error = execution.error
        if error is not None and error.name == "TimeoutError":
            raise CallTimeoutError(
                f"The {what} did not finish within {seconds:g} s (timeout=): {error.value}"
            )
        if body is None:
            raise SandboxError(f"The {what} failed: {error}")
        if not isinstance(body, dict):
            raise FramingError(f"The {what} answered in an unexpected form.")
        if "refused" in body:
            raise PathError(f"Refused: {body['refused']} ({self.work_dir})")
        error = body_error(body)
        if error is not None:
            if request["op"] in ("write", "read", "list", "snapshot", "wipe"):
                raise SandboxFileError(f"{error.name}: {error.value}")
            raise SandboxError(f"The {what} failed in the kernel: {error}")
        return body.get("ok")

    # -- running code ----------------------------------------------------------------------

    async def run(
        self,
        code: str,
        timeout: float | None = None,
        on_stdout: Callback = None,
        on_stderr: Callback = None,
        on_result: Callback = None,
        on_error: Callback = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> Execution:
        """Run ``code``; errors in it are returned in ``Execution.error``, not raised.

        Callbacks (plain or async) are called while the code runs. On timeout the kernel is
        interrupted; if it does not stop within ``interrupt_grace`` it is restarted and
        ``Execution.state_lost`` is True. The session stays usable either way. ``env`` sets
        environment variables for this run only; the values never appear in the cell.
        """
        callbacks = {
            "on_stdout": on_stdout,
            "on_stderr": on_stderr,
            "on_result": on_result,
            "on_error": on_error,
        }
        values = check_env(env)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            if self._env_set:
                await self._restore_env(Execution())
            if values:
                self._env_set = True  # until it is taken away again, even if this call is cancelled
                await self._op(
                    {"op": "env", "action": "set"}, [json.dumps(values).encode()], seconds, deadline
                )
            collector = Collector(self.max_output_bytes, callbacks, policy=self._policy)
            execution = await self._exchange(
                lambda: self._send_execute(code, store_history=True),
                collector,
                seconds,
                deadline,
                reply=True,
            )
            if values and not execution.state_lost:
                await self._restore_env(execution)
        return execution

    async def _restore_env(self, execution: Execution) -> None:
        """Take the per-call environment away again; restart the kernel if that fails."""
        grace = max(self.interrupt_grace, RESTORE_GRACE)
        try:
            await self._op({"op": "env", "action": "restore"}, (), grace, time.monotonic() + grace)
            self._env_set = False
        except SandboxError:
            execution.state_lost = True
            await self.restart()

    # -- files -----------------------------------------------------------------------------

    def _chunk(self) -> int:
        return CHUNK if self._comms else TEXT_CHUNK

    async def upload(
        self, files: Mapping[str, Content], *, timeout: float | None = None
    ) -> list[str]:
        """Write ``{path: content}`` under the work directory; returns the relative paths written.

        Content is ``bytes``/``str``, a host path (``pathlib.Path``) or a binary file object;
        it moves in chunks, so a file larger than memory is fine.
        """
        targets = []
        for path, content in files.items():
            rel = confine(path, self.work_dir)
            if rel == ".":
                raise PathError(f"{path!r} names the work directory itself, not a file")
            targets.append((rel, content))
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            for rel, content in targets:
                offset = 0
                for piece in chunks(content, self._chunk()):
                    request = {"op": "write", "path": rel, "offset": offset}
                    size = await self._op(request, [piece], seconds, deadline)
                    offset += len(piece)
                    if size != offset:
                        raise SandboxFileError(
                            f"{rel!r} changed in the sandbox while it was being written"
                        )
        return sorted(rel for rel, _ in targets)

    async def _read(
        self,
        path: str,
        sink: Callable[[bytes], Any],
        limit: int,
        limit_name: str,
        timeout: float | None,
    ) -> int:
        """Pass the file's chunks to ``sink``; refuse it, before ``sink`` sees a byte over it, past
        ``limit``.

        The limit is the host's: the size the kernel states is checked against it, and so is every
        byte that arrives (a kernel that patched its helper states what it likes).
        """
        rel = confine(path, self.work_dir)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        offset, total = 0, None
        async with self._lock:
            while total is None or offset < total:
                request = {"op": "read", "path": rel, "offset": offset, "size": self._chunk()}
                size, data = await self._op(request, (), seconds, deadline)
                if total is None:
                    total = size
                if type(size) is not int or size != total or not isinstance(data, bytes):
                    raise SandboxFileError(
                        f"{rel!r} changed in the sandbox while it was being read"
                    )
                if total > limit or offset + len(data) > limit:
                    raise SandboxFileError(
                        f"Refused {rel!r}: it is {max(total, offset + len(data))} bytes, over the "
                        f"limit of {limit} bytes ({limit_name}); nothing past the limit was kept."
                    )
                if len(data) != min(self._chunk(), total - offset):
                    raise SandboxFileError(
                        f"{rel!r} changed in the sandbox while it was being read"
                    )
                sink(data)
                offset += len(data)
        return offset

    async def download(self, path: str, *, timeout: float | None = None) -> bytes:
        """Read a file of the work directory into memory (up to 256 MiB; see
        :meth:`download_to`)."""
        return await self._download(
            path, MAX_FILE_BYTES, "download's ceiling; download_to streams larger files", timeout
        )

    async def _download(
        self, path: str, limit: int, limit_name: str, timeout: float | None
    ) -> bytes:
        parts: list[bytes] = []
        await self._read(path, parts.append, limit, limit_name, timeout)
        return b"".join(parts)

    async def download_to(
        self,
        path: str,
        destination: str | os.PathLike[str] | IO[bytes],
        *,
        timeout: float | None = None,
        max_bytes: int | None = MAX_STREAM_BYTES,
    ) -> int:
        """Stream a file of the work directory to a host path or binary file; returns its size.

        A file over ``max_bytes`` (2 GiB by default; None for no limit) is refused before anything
        is written: the kernel decides how big its files claim to be (a sparse file costs it
        nothing). A destination path is removed again if the download fails.
        """
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
        ):
            raise ConfigError(f"max_bytes must be a number of bytes or None, not {max_bytes!r}")
        limit = NO_LIMIT if max_bytes is None else max_bytes
        if not isinstance(destination, (str, os.PathLike)):
            return await self._read(
                path, destination.write, limit, f"max_bytes={max_bytes}", timeout
            )
        try:
            with open(destination, "wb") as handle:
                return await self._read(
                    path, handle.write, limit, f"max_bytes={max_bytes}", timeout
                )
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(destination)
            raise

    async def list_files(self, path: str = ".", *, timeout: float | None = None) -> list[FileInfo]:
        """List a directory of the work directory (symlinks are listed, not followed)."""
        rel = confine(path, self.work_dir)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            entries = await self._op({"op": "list", "path": rel}, (), seconds, deadline)
        return [FileInfo(*entry) for entry in entries]

    async def _simple(self, op: str, timeout: float | None, **params: Any) -> Any:
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            return await self._op({"op": op, **params}, (), seconds, deadline)

    # -- packages --------------------------------------------------------------------------

    async def install(
        self,
        requirements: str | Iterable[str],
        *,
        pip_args: Iterable[str] = (),
        timeout: float | None = None,
    ) -> Execution:
        """pip-install ``requirements`` (names, or requirements.txt text) inside the sandbox.

        Packages go to a directory under the sandbox's home that is put on ``sys.path``. The
        outcome is returned: pip's output in stdout/stderr, ``error`` set when pip failed. With the
        network off (or a list) the backend opens the ``package_index`` for this call alone (Docker:
        in the launcher's proxy; OpenSandbox: in the sandbox's egress policy, by the host) and
        closes it when pip ends, also on error, timeout or cancel; when it cannot,
        :class:`NetworkDisabledError` says why, without running pip.
        """
        self._check_package_index()
        text = requirements if isinstance(requirements, str) else "\n".join(requirements)
        seconds, deadline = self._deadline(timeout)
        # a network-off kernel's pip does not retry; this one may
        pip_args = [*PIP_RETRIES, *pip_args]
        request = {
            "op": "install",
            "requirements": text,
            "pip_args": pip_args,
            "tail": PIP_OUTPUT_TAIL,
        }
        assert self._lock is not None
        async with self._lock, self._package_index(seconds):
            body = await self._op(request, (), seconds, deadline)
        execution = Execution(stdout=body["stdout"], stderr=body["stderr"])
        if body["returncode"] != 0:
            execution.error = ExecutionError(
                "InstallError", f"pip exited with code {body['returncode']}", body["stderr"]
            )
        return execution

    def _check_package_index(self) -> None:
        """Refuse at once an install that cannot reach any index: network off on a backend without
        windows."""
        if self.network is False and self._backend.sandboxed and not self._backend.package_window:
            raise NetworkDisabledError(
                f"Cannot install packages: this sandbox's network is off and the {self.backend} "
                "backend cannot open the package index for one call. Create it with the index in "
                "its network list (e.g. Sandbox(network=['pypi.org', 'files.pythonhosted.org'])) "
                "or network=True."
            )

    def _package_index(self, seconds: float) -> contextlib.AbstractAsyncContextManager[None]:
        """The backend's window on the package index for one call of at most ``seconds`` (plus a
        grace)."""
        if self.network is True or not self._backend.sandboxed:
            return contextlib.nullcontext()
        window = min(seconds + REPLY_GRACE, MAX_WINDOW)
        return self._backend.index_window(self._km.provisioner, self._launcher_request, window)

    async def _launcher_request(self, content: dict[str, Any]) -> dict[str, Any]:
        """Send an egress request to the launcher on the control channel and wait for its reply."""
        msg = self._kc.session.msg(WINDOW_REQUEST, content)
        self._kc.control_channel.send(msg)
        until = time.monotonic() + LAUNCHER_REPLY_WAIT
        while (left := until - time.monotonic()) > 0:
            try:
                reply = await self._kc.control_channel.get_msg(timeout=left)
            except queue.Empty:
                break
            if reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]:
                answer = reply.get("content")
                return answer if isinstance(answer, dict) else {}
        return {}

    # -- tools -----------------------------------------------------------------------------

    async def run_tool(
        self,
        tool: Callable[..., Any] | str,
        args: Mapping[str, Any] | None = None,
        agent_state: Any = None,
        name: str | None = None,
        *,
        timeout: float | None = None,
        allowed_classes: Iterable[type] = (),
        env: Mapping[str, str] | None = None,
    ) -> ToolResult:
        """Call ``tool`` (a function, or its source with ``name``) in the kernel with ``args``.

        A tool with an ``agent_state`` parameter receives ``agent_state`` and its changes come back.
        What comes back is data only (see :mod:`.decode`): instances are rebuilt for the
        ``allowed_classes`` (and the sandbox's), anything else raises :class:`UnsafePayloadError`.
        ``env`` sets environment variables for this call only. ``status`` is ``"success"`` only if
        the tool returned, exactly one answer came, and the host saw the call end in time (an answer
        followed by a timeout, a death or a failed cell is an error).
        """
        values = check_env(env)
        call, state = tool_payload(tool, args, agent_state, name, values)
        allowed = {**self._allowed, **allowed_map(allowed_classes)}
        seconds, deadline = self._deadline(timeout)
        keep = len(state) >= KEEP_STATE_BYTES
        digest = hashlib.sha256(state).hexdigest() if keep else None
        assert self._lock is not None
        async with self._lock:
            for _ in range(2):
                send_state = not keep or digest != self._kept_state
                request = {
                    "op": "call",
                    "length": len(call),
                    "pickle": self.unsafe_pickle,
                    "state": {"length": len(state), "digest": digest, "keep": keep},
                }
                body, execution = await self._request(
                    request,
                    [call, state] if send_state else [call],
                    seconds,
                    deadline,
                    limits=self.decode_limits,
                    allowed=allowed,
                    allow_pickle=self.unsafe_pickle,
                )
                error = body_error(body)
                if not send_state and error is not None and error.name == "StateNotKept":
                    self._kept_state = None
                    continue
                self._kept_state = (
                    digest if keep and body is not None and not execution.state_lost else None
                )
                break
        result = ToolResult(
            "error",
            stdout=execution.stdout,
            stderr=execution.stderr,
            state_lost=execution.state_lost,
            truncated_bytes=execution.truncated_bytes,
        )
        if body is None:
            result.error = execution.error
            return result
        if not isinstance(body, dict) or not ("r" in body or "error" in body):
            raise FramingError("The tool call's answer holds neither a return value nor an error.")
        result.error = body_error(body)
        if execution.error is None:
            await self._name_limits(result.error)
        if result.error is None:
            result.status = "success"
            result.func_return = body["r"]
            result.agent_state = body.get("s", agent_state)
        return result

    # -- skills ----------------------------------------------------------------------------

    async def run_skill(
        self,
        code: str,
        skill_files: Mapping[str, bytes | str] | None = None,
        requirements: str | Iterable[str] | None = None,
        *,
        timeout: float | None = None,
        max_files_bytes: int = MAX_SKILL_FILES_BYTES,
    ) -> dict[str, Any]:
        """Run skill ``code`` next to ``skill_files`` (LiteLLM's skills executor contract).

        Returns ``{"success", "output", "error", "files"}``; ``files`` holds the files the code
        created or changed in the work directory (not the unchanged skill files) and the images it
        displayed (``figure_1.png``...), each ``{"name", "path", "content_base64", "mime_type"}``.
        The files together may hold ``max_files_bytes`` (256 MiB by default, counted as they
        arrive); past it the run fails with an error naming the limit.
        """
        if (
            isinstance(max_files_bytes, bool)
            or not isinstance(max_files_bytes, int)
            or max_files_bytes < 0
        ):
            raise ConfigError(f"max_files_bytes must be a number of bytes, not {max_files_bytes!r}")
        try:
            if skill_files:
                await self.upload(skill_files, timeout=timeout)
            if requirements:
                installed = await self.install(requirements, timeout=timeout)
                if installed.error is not None:
                    return failed_skill(installed.stdout, installed.stderr)
            before = await self._simple("snapshot", timeout)
            await self._simple("prepare", timeout)
            execution = await self.run(code, timeout=timeout)
            after = await self._simple("snapshot", timeout)
            files, room = [], max_files_bytes
            for path in sorted(after):
                if before.get(path) != after[path]:
                    limit = min(room, MAX_FILE_BYTES)
                    name = (
                        f"max_files_bytes={max_files_bytes}, {room} bytes left"
                        if limit == room
                        else "download's ceiling"
                    )
                    content = await self._download(path, limit, f"run_skill's {name}", timeout)
                    room -= len(content)
                    files.append(file_entry(path, content))
            files += figure_files(execution.results)
        except SandboxError as exc:
            return failed_skill("", str(exc))
        return skill_result(execution, files)

    async def reset(self) -> None:
        """Fresh interpreter and an empty work directory, for a pool's next user."""
        await self.restart()
        await self._simple("wipe", None)


@atexit.register
def _kill_leftovers() -> None:
    for sandbox in list(_LIVE):
        sandbox._kill_now()
