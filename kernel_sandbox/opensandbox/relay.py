"""The execd relay: a lean Jupyter kernel front for a sandbox that offers only execd's ``/code``.

It answers the requests a client needs on its own, without ipykernel's ``Kernel`` machinery:
``kernel_info``, ``execute`` (execd's event stream through :class:`CellTranslator` and
:class:`CellRelay`, one ``execute_reply`` per cell whatever execd sends), ``interrupt``
(execd ``DELETE /code`` and, should execd ignore it, the cell ended after ``interrupt_grace``),
``is_complete`` (IPython's rules, locally), ``comm_info`` (none), ``shutdown``; completion,
inspection and history are answered empty, a ``comm_open`` is closed again. Cells run one at a
time in arrival order; after an error, queued cells are aborted as ipykernel does
(``stop_on_error``). Messages are built here and signed by the front; the request's header
bytes are reused as the parent header, unparsed. A cell's ``busy`` and ``execute_input`` are
published once its request to execd is written, so they travel while execd runs the code
(still before any of its output); the reply and ``idle`` go out at execd's terminal event, while
the rest of its answer is read (the next cell waits for that).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..errors import CallDeadlineExceeded, OpenSandboxError, OutputLimitExceeded
from .execd import ExecdClient
from .jupyter import dumps
from .settings import OpenSandboxSettings
from .translate import CellRelay, CellTranslator
from ..canonical import PROTOCOL_VERSION
from ..launch.front import ExitStatus, Front
from ..launch.wire import new_header

log = logging.getLogger("kernel_sandbox.launch")

IMPLEMENTATION = "kernel-sandbox-opensandbox"
"""``implementation`` in the execd relay's ``kernel_info_reply``: a kernel without comms or
stdin."""
LANGUAGE_INFO = {
    "name": "python",
    "mimetype": "text/x-python",
    "file_extension": ".py",
    "pygments_lexer": "ipython3",
    "codemirror_mode": {"name": "ipython", "version": 3},
    "nbconvert_exporter": "python",
}
QUEUE_LIMIT = 1000
"""Cells waiting to run; past it a cell is answered ``aborted`` at once."""
_EMPTY = b"{}"


class ExecdRelay:
    """Serve one client's kernel requests from an execd context (see the module docstring)."""

    def __init__(
        self,
        front: Front,
        execd: ExecdClient,
        context_id: str,
        settings: OpenSandboxSettings,
        end: Callable[[ExitStatus], None],
    ) -> None:
        self.front = front
        self.execd = execd
        self.context_id = context_id
        self.settings = settings
        self._end = end
        self._session = uuid.uuid4().hex
        self.execution_count = 0
        self._queue: collections.deque[tuple[list[Any], bytes, dict[str, Any]]] = (
            collections.deque()
        )
        self._wakeup = asyncio.Event()
        self._cell: CellRelay | None = None
        self._worker = asyncio.ensure_future(self._run_cells())
        self._handlers: dict[str, Callable[[str, list[Any], bytes, dict[str, Any]], None]] = {
            "kernel_info_request": self._kernel_info,
            "is_complete_request": self._is_complete,
            "comm_info_request": self._simple("comm_info_reply", {"status": "ok", "comms": {}}),
            "history_request": self._simple("history_reply", {"status": "ok", "history": []}),
            "inspect_request": self._simple(
                "inspect_reply", {"status": "ok", "found": False, "data": {}, "metadata": {}}
            ),
            "complete_request": self._complete,
            "comm_open": self._comm_open,
            "interrupt_request": self._interrupt_request,
            "shutdown_request": self._shutdown,
            "debug_request": self._no_debugger,
        }

    # -- messages out ----------------------------------------------------------------------------

    def _message(
        self, msg_type: str, parent: bytes, content: dict[str, Any], metadata: bytes = _EMPTY
    ) -> list[bytes]:
        return [dumps(new_header(msg_type, self._session)), parent, metadata, dumps(content)]

    def publish(self, msg_type: str, parent: bytes, content: dict[str, Any]) -> None:
        """Send an IOPub message whose parent is the request with header bytes ``parent``."""
        self.front.from_kernel("iopub", [], self._message(msg_type, parent, content))

    def _reply(
        self, channel: str, idents: list[Any], parent: bytes, msg_type: str, content: dict[str, Any]
    ) -> None:
        metadata = (
            _EMPTY if msg_type != "execute_reply" else dumps({"status": content.get("status")})
        )
        self.front.from_kernel(channel, idents, self._message(msg_type, parent, content, metadata))

    def _status(self, parent: bytes, state: str) -> None:
        self.publish("status", parent, {"execution_state": state})

    # -- messages in -----------------------------------------------------------------------------

    def send(self, channel: str, idents: list[Any], parts: list[Any]) -> None:
        """Handle one verified client message (its parts unsigned)."""
        if channel not in ("shell", "control"):
            return  # stdin: nothing here ever asks for input
        try:
            header = json.loads(bytes(parts[0]))
            content = json.loads(bytes(parts[3]))  # a large frame may arrive as a memoryview
            msg_type = header["msg_type"]
        except (ValueError, KeyError, TypeError, RecursionError):
            log.warning("dropped a %s message the relay cannot read", channel)
            return
        if not isinstance(content, dict):
            return
        parent = bytes(parts[0])
        if msg_type == "execute_request" and channel == "shell":
            if len(self._queue) >= QUEUE_LIMIT:
                self._aborted(idents, parent)
                return
            self._queue.append((idents, parent, content))
            self._wakeup.set()
            return
        handler = self._handlers.get(msg_type)
        if handler is None:
            log.debug("no answer for %s on %s", msg_type, channel)
            return
        # busy/idle of a side request would hide the running cell's state
        quiet = self._cell is not None
        if not quiet:
            self._status(parent, "busy")
        handler(channel, idents, parent, content)
        if not quiet:
            self._status(parent, "idle")

    def _simple(
        self, msg_type: str, content: dict[str, Any]
    ) -> Callable[[str, list[Any], bytes, dict[str, Any]], None]:
        def answer(channel: str, idents: list[Any], parent: bytes, request: dict[str, Any]) -> None:
            self._reply(channel, idents, parent, msg_type, content)

        return answer

    def _kernel_info(
        self, channel: str, idents: list[Any], parent: bytes, content: dict[str, Any]
    ) -> None:
        self._reply(
            channel,
            idents,
            parent,
            "kernel_info_reply",
            {
                "status": "ok",
                "protocol_version": PROTOCOL_VERSION,
                "implementation": IMPLEMENTATION,
                "implementation_version": __version__,
                "language_info": LANGUAGE_INFO,
                "banner": "Python in an OpenSandbox sandbox, through execd (kernel-sandbox)",
                "help_links": [],
                "debugger": False,
                "supported_features": [],
            },
        )

    def _no_debugger(
        self, channel: str, idents: list[Any], parent: bytes, content: dict[str, Any]
    ) -> None:
        """A Debug Adapter Protocol error response: execd runs code without a debugger (the
        websocket mode has one)."""
        seq = content.get("seq")
        command = content.get("command")
        self._reply(
            channel,
            idents,
            parent,
            "debug_reply",
            {
                "type": "response",
                "seq": 0,
                "request_seq": seq if isinstance(seq, int) else 0,
                "command": command if isinstance(command, str) else "",
                "success": False,
                "message": "the execd mode has no debugger; set the OpenSandbox option mode to "
                "'websocket' for one",
            },
        )

    def _is_complete(
        self, channel: str, idents: list[Any], parent: bytes, content: dict[str, Any]
    ) -> None:
        from IPython.core.inputtransformer2 import TransformerManager

        code = content.get("code")
        status, indent = TransformerManager().check_complete(code if isinstance(code, str) else "")
        reply: dict[str, Any] = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        self._reply(channel, idents, parent, "is_complete_reply", reply)

    def _complete(
        self, channel: str, idents: list[Any], parent: bytes, content: dict[str, Any]
    ) -> None:
        cursor = content.get("cursor_pos") if isinstance(content.get("cursor_pos"), int) else 0
        reply: dict[str, Any] = {
            "status": "ok",
            "matches": [],
            "cursor_start": cursor,
            "cursor_end": cursor,
            "metadata": {},
        }
        self._reply(channel, idents, parent, "complete_reply", reply)

    def _comm_open(
        self, channel: str, idents: list[Any], parent: bytes, content: dict[str, Any]
    ) -> None:
        comm_id = content.get("comm_id")
        if isinstance(comm_id, str):
            self.publish("comm_close", parent, {"comm_id": comm_id, "data": {}})

    def _interrupt_request(
        self, channel: str, idents: list[Any], parent: bytes, content: dict[str, Any]
    ) -> None:
        async def interrupt_and_reply() -> None:
            reply: dict[str, Any] = {"status": "ok"}
            try:
                await self.interrupt()
            except OpenSandboxError as exc:
                reply = {
                    "status": "error",
                    "ename": type(exc).__name__,
                    "evalue": str(exc),
                    "traceback": [],
                }
            self._reply(channel, idents, parent, "interrupt_reply", reply)

        asyncio.ensure_future(interrupt_and_reply())

    def _shutdown(
        self, channel: str, idents: list[Any], parent: bytes, content: dict[str, Any]
    ) -> None:
        reply = {"status": "ok", "restart": bool(content.get("restart", False))}
        self._reply(channel, idents, parent, "shutdown_reply", reply)
        self.publish("shutdown_reply", parent, reply)
        self._end(ExitStatus(0, "the kernel shut down"))

    def _aborted(self, idents: list[Any], parent: bytes) -> None:
        self._status(parent, "busy")
        self._reply(
            "shell",
            idents,
            parent,
            "execute_reply",
            {"status": "aborted", "execution_count": self.execution_count},
        )
        self._status(parent, "idle")

    # -- cells -----------------------------------------------------------------------------------

    async def _run_cells(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                idents, parent, content = self._queue.popleft()
                try:
                    await self._execute(idents, parent, content)
                except Exception:
                    log.exception("the relay failed on a cell")

    def _abort_queued(self) -> None:
        """Abort the cells queued when a cell failed (those sent after its reply run)."""
        while self._queue:
            queued_idents, queued_parent, _ = self._queue.popleft()
            self._aborted(queued_idents, queued_parent)

    async def _execute(self, idents: list[Any], parent: bytes, content: dict[str, Any]) -> None:
        """Run one cell; when it fails, abort the cells queued behind it (``stop_on_error``)."""
        code = content.get("code")
        code = code if isinstance(code, str) else ""
        silent = bool(content.get("silent", False))
        if not silent:
            self.execution_count += 1
        count = self.execution_count
        announced = False

        def announce() -> None:
            nonlocal announced
            if not announced:
                announced = True
                self._status(parent, "busy")
                if not silent:
                    self.publish("execute_input", parent, {"code": code, "execution_count": count})

        def publish(msg_type: str, body: dict[str, Any]) -> None:
            announce()
            self.publish(msg_type, parent, body)

        replied = False

        def finish(reply: dict[str, Any]) -> None:
            nonlocal replied
            # the cell is over for the client (an interrupt from now on finds nothing to stop)
            self._cell = None
            announce()
            self._reply("shell", idents, parent, "execute_reply", reply)
            self._status(parent, "idle")
            replied = True
            if (
                reply["status"] == "error"
                and not silent
                and content.get("stop_on_error", True) is not False
            ):
                self._abort_queued()

        translator = CellTranslator(publish, execution_count=count, silent=silent)
        if code.strip():
            self._cell = cell = CellRelay(translator)
            # busy and execute_input go out once the request is on its way to execd, the reply at
            # its last event
            try:
                language = self.settings.language
                stream = self.execd.stream(
                    code, context_id=self.context_id, language=language, on_sent=announce
                )
                reply = await cell.run(stream, on_reply=finish)
            finally:
                self._cell = None
            if isinstance(translator.failure, (OutputLimitExceeded, CallDeadlineExceeded)):
                await self._interrupt_quietly()
        else:
            reply = translator.reply()
        if not replied:
            finish(reply)

    async def interrupt(self) -> None:
        """Interrupt the running cell, if any: execd ``DELETE /code``, and end it ourselves after
        the grace."""
        cell = self._cell
        if cell is None:
            return
        grace = self.settings.interrupt_grace
        cell.abort_later(
            grace,
            OpenSandboxError(
                f"execd did not end the cell within {grace:g} s of the interrupt; the relay "
                "stopped waiting"
            ),
        )
        await self.execd.interrupt(self.context_id)

    async def _interrupt_quietly(self) -> None:
        try:
            await self.execd.interrupt(self.context_id)
        except OpenSandboxError as exc:
            log.warning("interrupting execd context %s failed: %s", self.context_id, exc)

    def close(self) -> None:
        """Stop running cells (the sandbox goes away with the link)."""
        self._worker.cancel()
