"""The request/retry state machine between the host and a sandboxed kernel.

One call of the execution API is one exchange: a cell or a request to the kernel-side helper
(:mod:`kernel_sandbox.kernelside.toolhost`) is sent, and what it causes is gathered until the
kernel is idle again. Past the call's deadline the kernel is interrupted, then restarted when it
does not stop; a dead kernel is restarted too; a request that provably never reached the helper
is sent once more, and a helper that could not answer has the kernel restarted before the next
call. The outcome the host itself decides is a type (:class:`~kernel_sandbox.results.HostError`)
or a kernel-side constant, never an error name the kernel could also send. :class:`AsyncSandbox`
(:mod:`.sandbox`) is the public API on top of it.
"""

from __future__ import annotations

import abc
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import (
    CallTimeoutError,
    ConfigError,
    FramingError,
    PathError,
    SandboxError,
    SandboxFileError,
)
from ..results import Execution, ExecutionError, KernelDied, NoAnswer, NoReply, TimedOut
from .channel import VERSION, Answer, bootstrap_cell, new_marker, parse_text_frame, text_cell
from .collector import Callback, Collector
from .decode import decode
from .limits import DecodeLimits
from .tools import body_error

DEFAULT_CALL_TIMEOUT = 300.0
"""The deadline of every call of a session unless one is given."""
LIVENESS_INTERVAL = 1.0
RESTORE_GRACE = 10.0
REPLY_GRACE = 2.0
TAMPERED = (
    "More than one answer carried this call's marker: the tool tampered with the result channel; "
    "its output is not trusted."
)


class KernelExchange(abc.ABC):
    """Calls on a started kernel: deadlines, one message's exchange, the helper's requests, retries.

    The session (:class:`~kernel_sandbox.execution.sandbox.AsyncSandbox`) starts the kernel,
    connects ``_kc`` and sets the options and the state below; it provides :meth:`restart` and
    :meth:`_name_limits`.
    """

    timeout: float
    interrupt_grace: float
    max_output_bytes: int
    work_dir: str
    _km: Any
    _kc: Any
    _lock: Any
    _closed: bool
    _comms: bool  # requests travel on a comm channel (else as text cells)
    _channel: str | None  # the helper's comm id, once opened
    _installed: bool  # the helper is installed in the kernel
    _restarts: int
    _unanswered: bool  # the helper could not answer: restart the kernel before the next request
    _env_set: bool  # a per-call environment may still be set in the kernel (a cancelled call)

    @abc.abstractmethod
    async def restart(self) -> None:
        """Restart the kernel: a fresh interpreter (and, on Docker, a fresh container)."""

    @abc.abstractmethod
    async def _name_limits(self, error: ExecutionError | None) -> None:
        """Say in ``error`` which limits the kernel hit during the call."""

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
            execution.error = TimedOut(
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
            execution.error = KernelDied(
                f"The kernel died ({reason}); it was restarted and its state is lost."
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
            execution.error = NoReply("The kernel finished the request but sent no reply to it.")

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
                if isinstance(execution.error, TimedOut):
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
            text, marker = collector.text_answer, collector.marker or ""
            found = parse_text_frame(text, marker) if text else None
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

    async def _request(
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
            if first is not None and collector.failed:  # an answer, then a timeout or a failed cell
                first = None
                break
            host_ended = execution.state_lost or isinstance(execution.error, (TimedOut, KernelDied))
            if first is not None or host_ended:
                break
            if self._comms:
                stop = await self._reopen(collector.marker, deadline, restarts, attempt)
                if stop is not None:
                    execution.error = stop
                    break
            elif not attempt and execution.error is not None:
                self._installed = False
            else:
                break
        if self._restarts != restarts:
            execution.state_lost = True
        if first is None:
            self._unanswerable(execution)
            return None, execution
        answer = await self._whole(
            Answer.first(*first, limits), collector.marker, seconds, deadline
        )
        doc, parts = answer.parts()
        body = decode(doc, parts, allowed=allowed or {}, limits=limits, allow_pickle=allow_pickle)
        return body, execution

    async def _reopen(
        self, probe: str | None, deadline: float, restarts: int, attempt: int
    ) -> NoAnswer | None:
        """Open the helper's channel again after a request got no answer; None: send it once more.

        Otherwise the error to end the call with: the helper could not start, the kernel had to
        be restarted for it, or the request had reached it (``probe`` was seen) or was sent twice.
        """
        self._channel = None
        try:
            info = await self._open(deadline, probe=probe)
        except SandboxError as exc:
            return NoAnswer(f"No answer came, and then: {exc}")
        if self._restarts != restarts:
            return NoAnswer(
                "No answer came and the kernel no longer ran the kernel-sandbox helper, so it was "
                "restarted (state lost); the request was not sent again.",
            )
        if info.get("seen") or attempt:
            return NoAnswer(
                "The request reached the kernel-sandbox helper but no answer came back (the code "
                "it ran may have broken the channel); the channel was reopened.",
            )
        return None

    def _unanswerable(self, execution: Execution) -> None:
        """A request without an answer: say so; restart the kernel before the next one (unless it
        was)."""
        if execution.error is None:
            execution.error = NoAnswer("The kernel-sandbox helper sent no answer.")
        if isinstance(execution.error, NoAnswer) and not execution.state_lost:
            self._unanswered = True
            execution.error.value += (
                " The kernel will be restarted before the next call (state lost)."
            )

    async def _whole(
        self, answer: Answer, origin: str | None, seconds: float, deadline: float
    ) -> Answer:
        """Pull the rest of an answer larger than one message, chunk by chunk."""
        while answer.missing:
            request = {"op": "pull", "of": origin, "offset": answer.received}
            pulled = await self._send_request(request, (), seconds, deadline)
            chunk = self._first(pulled)
            if chunk is None or not chunk[0].get("raw") or len(chunk[1]) != 1:
                error = pulled.execution.error or "no chunk came"
                raise FramingError(f"Could not pull the rest of the answer ({error}).")
            answer.add(chunk[1][0])
        return answer

    async def _op(
        self, request: dict[str, Any], buffers: Sequence[Any], seconds: float, deadline: float
    ) -> Any:
        """Run a helper operation (files, packages, environment); return its ``ok`` value or
        raise."""
        body, execution = await self._request(request, buffers, seconds, deadline)
        what = f"kernel-sandbox {request['op']}"
        error = execution.error
        if isinstance(error, TimedOut):
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

    async def _restore_env(self, execution: Execution) -> None:
        """Take the per-call environment away again; restart the kernel if that fails."""
        grace = max(self.interrupt_grace, RESTORE_GRACE)
        try:
            await self._op({"op": "env", "action": "restore"}, (), grace, time.monotonic() + grace)
            self._env_set = False
        except SandboxError:
            execution.state_lost = True
            await self.restart()
