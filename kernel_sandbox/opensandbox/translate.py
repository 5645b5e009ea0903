"""Turn one cell's execd events into Jupyter messages, independent of any kernel class.

:class:`CellTranslator` maps events to IOPub contents (``stream``, ``execute_result``,
``display_data``, ``error``) through a ``publish(msg_type, content)`` callable and builds the
cell's one ``execute_reply``. stdout/stderr text is coalesced: held until ``flush_bytes`` are
buffered, another kind of output arrives, or ``flush_interval`` (50 ms) has passed since the
first held byte, so a flood of tiny events costs a few messages while output still streams.
An error's traceback (capped at 64 KiB) is published once, in the IOPub ``error``; the reply
repeats its name and value and only the traceback's last 2 KiB (what nbclient shows).

:func:`relay_cell` drives a translator from an event stream and returns exactly one reply
whatever the stream does: ends early, raises anything, breaks its cap, or never stops after an
interrupt (:meth:`CellRelay.abort`). All text arrives cleaned by the parser (no lone surrogates
or NULs), so every message can be serialised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..errors import KernelSandboxError
from ..results import ExecutionError
from .events import MAX_ERROR_FIELD_CHARS, REPLY_TRACEBACK_CHARS, Event, cap_traceback, clean_text
from .http import cancel_until_done

DEFAULT_FLUSH_BYTES = 64 * 1024
DEFAULT_FLUSH_INTERVAL = 0.05
STDIN_MESSAGE = "input is not supported in this sandbox"
_STDIN_ERRORS = frozenset({"StdinNotImplementedError"})

Publish = Callable[[str, dict[str, Any]], None]


def failure_error(failure: BaseException) -> ExecutionError:
    """The cell error for a failure of the relay itself (connection, cap, protocol, anything)."""
    if isinstance(failure, KernelSandboxError):
        name = type(failure).__name__
        value = str(failure) or name
    else:
        name = "SandboxError"
        value = (
            f"the relay failed while reading execd's answer: {type(failure).__name__}: {failure}"
        )
    value = clean_text(value[:MAX_ERROR_FIELD_CHARS])
    return ExecutionError(name, value, f"{name}: {value}")


@dataclass
class _Held:
    """Text of one stream held back to go out as one message: the stream, since when, the parts,
    their length."""

    name: str
    since: float = field(default_factory=time.monotonic)
    parts: list[str] = field(default_factory=list)
    size: int = 0


@dataclass(eq=False)
class CellTranslator:
    """The Jupyter side of one execute request: IOPub output as events arrive, then one reply.

    ``error`` is the cell's error once execd reported one; ``failure``, the relay's own failure
    that :meth:`reply` turned into the cell's error.
    """

    publish: Publish = field(repr=False)
    _: KW_ONLY
    execution_count: int
    silent: bool = False
    flush_bytes: int = DEFAULT_FLUSH_BYTES
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    error: ExecutionError | None = field(default=None, init=False)
    failure: BaseException | None = field(default=None, init=False)
    _held: _Held | None = field(default=None, init=False, repr=False)
    _reply: dict[str, Any] | None = field(default=None, init=False, repr=False)

    def _send(self, msg_type: str, content: dict[str, Any]) -> None:
        if not self.silent:
            self.publish(msg_type, content)

    def flush(self) -> None:
        """Publish the held stream text, if any."""
        held, self._held = self._held, None
        if held is not None:
            self._send("stream", {"name": held.name, "text": "".join(held.parts)})

    def flush_due_in(self) -> float | None:
        """Seconds until held text must be published (None when nothing is held)."""
        if self._held is None:
            return None
        return max(0.0, self._held.since + self.flush_interval - time.monotonic())

    def feed(self, event: Event) -> None:
        """Take one event (ignored once the reply is built)."""
        if self._reply is not None:
            return
        if event.type in ("stdout", "stderr"):
            if not event.text:
                return
            held = self._held
            if held is None or held.name != event.type:
                self.flush()
                held = self._held = _Held(event.type)
            held.parts.append(event.text)
            held.size += len(event.text)
            if held.size >= self.flush_bytes:
                self.flush()
            return
        if event.type == "result" and event.data:
            self.flush()
            self._send(
                "execute_result",
                {"data": event.data, "metadata": {}, "execution_count": self.execution_count},
            )
        elif event.type == "display_data" and event.data:
            self.flush()
            self._send("display_data", {"data": event.data, "metadata": {}, "transient": {}})
        elif event.type == "error" and event.error is not None and self.error is None:
            self.flush()
            self.error = event.error

    def reply(self, failure: BaseException | None = None) -> dict[str, Any]:
        """Flush, publish the error (once) and return the ``execute_reply`` content (always the same
        one)."""
        if self._reply is not None:
            return self._reply
        self.flush()
        error = self.error
        if error is None and failure is not None:
            self.failure = failure
            error = failure_error(failure)
        if error is None:
            self._reply = {
                "status": "ok",
                "execution_count": self.execution_count,
                "payload": [],
                "user_expressions": {},
            }
            return self._reply
        if error.name in _STDIN_ERRORS:
            error = ExecutionError(error.name, STDIN_MESSAGE, f"{error.name}: {STDIN_MESSAGE}")
        traceback = cap_traceback(error.traceback.split("\n") if error.traceback else [])
        self._send("error", {"ename": error.name, "evalue": error.value, "traceback": traceback})
        self._reply = {
            "status": "error",
            "execution_count": self.execution_count,
            "ename": error.name,
            "evalue": error.value,
            "traceback": cap_traceback(traceback, REPLY_TRACEBACK_CHARS),
        }
        return self._reply


_DONE = object()


class CellRelay:
    """Runs one cell: pumps events into a translator, flushing on time, until one reply is built.

    :meth:`abort` ends the cell from any thread (e.g. after an interrupt that execd ignored).
    """

    def __init__(self, translator: CellTranslator, queue_size: int = 256) -> None:
        self.translator = translator
        self._queue: asyncio.Queue[Any] = asyncio.Queue(queue_size)
        self._loop = asyncio.get_running_loop()
        self._aborted: asyncio.Future[BaseException] = self._loop.create_future()

    def abort(self, reason: BaseException) -> None:
        """End the cell with ``reason`` as its failure (thread-safe; no effect once it ended)."""
        self._loop.call_soon_threadsafe(self._abort, reason)

    def abort_later(self, delay: float, reason: BaseException) -> None:
        """Call :meth:`abort` after ``delay`` seconds unless the cell has ended by then
        (thread-safe)."""
        self._loop.call_soon_threadsafe(self._loop.call_later, delay, self._abort, reason)

    def _abort(self, reason: BaseException) -> None:
        if not self._aborted.done():
            self._aborted.set_result(reason)

    async def _pump(self, events: AsyncIterator[Event]) -> None:
        try:
            async for event in events:
                await self._queue.put(event)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 (every failure becomes the cell's error)
            await self._queue.put(exc)
        else:
            await self._queue.put(_DONE)

    def _take(self, item: Any) -> tuple[bool, BaseException | None]:
        """Feed one queued item; return (the cell ended, its failure)."""
        if item is _DONE:
            return True, None
        if isinstance(item, BaseException):
            return True, item
        try:
            self.translator.feed(item)
        except Exception as exc:  # noqa: BLE001
            return True, exc
        return item.terminal, None

    async def run(  # noqa: C901
        self, events: AsyncIterator[Event], on_reply: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Relay ``events`` and return the ``execute_reply`` content.

        ``on_reply`` gets the reply as soon as the terminal event is taken, while the stream still
        ends (what follows the terminal event is read to the end, as execd needs, before this
        returns).
        """
        translator = self.translator
        pump = asyncio.ensure_future(self._pump(events))
        failure: BaseException | None = None
        getter: asyncio.Future[Any] | None = None
        replied = False
        try:
            while True:
                # one pending get() survives a flush timeout, so no item is ever lost to a
                # cancellation
                getter = getter or asyncio.ensure_future(self._queue.get())
                done, _ = await asyncio.wait(
                    {getter, self._aborted},
                    timeout=translator.flush_due_in(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if self._aborted in done:
                    failure = self._aborted.result()
                    break
                if not done:
                    translator.flush()
                    continue
                item, getter = getter.result(), None
                ended, failure = self._take(item)
                # a burst is handled without a wait per event
                while not ended and not self._queue.empty():
                    item = self._queue.get_nowait()
                    ended, failure = self._take(item)
                if ended:
                    if on_reply is not None and failure is None and isinstance(item, Event):
                        on_reply(translator.reply())
                        replied = True
                    break
        finally:
            # the pump reads the rest of the stream and ends on its own (bounded by the client)
            if replied:
                if getter is not None:
                    getter.cancel()
                try:
                    await asyncio.wait({pump})
                except asyncio.CancelledError:
                    pump.cancel()
                    raise
            await cancel_until_done(*(task for task in (pump, getter) if task is not None))
            self._abort(asyncio.CancelledError())
            if hasattr(events, "aclose"):
                try:
                    await events.aclose()
                except Exception:  # noqa: BLE001,S110 (the stream's own cleanup must not cost the reply)
                    pass
        return translator.reply(failure)


async def relay_cell(events: AsyncIterator[Event], translator: CellTranslator) -> dict[str, Any]:
    """Relay one cell's ``events`` through ``translator``; return its one ``execute_reply``
    content."""
    return await CellRelay(translator).run(events)


__all__ = [
    "DEFAULT_FLUSH_BYTES",
    "DEFAULT_FLUSH_INTERVAL",
    "STDIN_MESSAGE",
    "CellRelay",
    "CellTranslator",
    "failure_error",
    "relay_cell",
]
