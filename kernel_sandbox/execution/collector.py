"""The output collector: the IOPub messages of one request, gathered into an Execution under a byte
cap."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..policy.output import OutputPolicy
from ..results import Execution, OutputFold
from .channel import CHUNK, TARGET

Callback = Callable[[Any], Any] | None


async def call_back(callback: Callback, value: Any) -> None:
    """Call ``callback`` with ``value`` (awaiting it when it is a coroutine function); None does
    nothing."""
    if callback is not None:
        outcome = callback(value)
        if inspect.isawaitable(outcome):
            await outcome


class Collector:
    """Gather the messages one request causes into an :class:`Execution` (through the one
    :class:`~kernel_sandbox.results.OutputFold`), keeping at most ``cap`` bytes of output in memory.

    With a ``marker``, the messages that carry it are answers (a comm message on ``channel``,
    a comm opened by the helper, or a text frame), kept apart from the output and counted.
    """

    def __init__(
        self,
        cap: int,
        callbacks: Mapping[str, Callback] | None = None,
        marker: str | None = None,
        channel: str | None = None,
        policy: OutputPolicy | None = None,
    ) -> None:
        bundle_filter = None if policy is None else lambda bundle: policy.filter_bundle(bundle)[0]
        self.fold = OutputFold(cap=cap, bundle_filter=bundle_filter)
        self.execution = self.fold.execution
        self.callbacks = dict(callbacks or {})
        self.marker = marker
        self.frame_prefix = None if marker is None else f"BEGIN-{marker} "
        self.channel = channel
        self.answers = 0
        self.answer: tuple[dict[str, Any], list[Any]] | None = None
        self.text_answer: str | None = None
        self.opened: tuple[str, dict[str, Any]] | None = None
        self.finished = False
        # the host saw the request fail: it timed out, the kernel died, its cell's reply was not ok
        self.failed = False

    def _count_answer(self) -> bool:
        self.answers += 1
        return self.answers == 1

    def _is_answer(self, kind: str, content: dict[str, Any]) -> bool:
        """Whether a result is a text frame with this request's marker (counted, never output)."""
        bundle = content.get("data")
        text = bundle.get("text/plain") if isinstance(bundle, dict) else None
        prefix = self.frame_prefix
        if prefix is None or not isinstance(text, str) or not text.startswith(prefix):
            return False
        if self._count_answer() and kind == "execute_result":
            self.text_answer = text
        return True

    async def handle(self, msg: dict[str, Any]) -> None:
        """Take one IOPub message of the request."""
        kind, content = msg["msg_type"], msg["content"]
        if not isinstance(content, dict):
            return
        found = content.get("data")
        data: dict[str, Any] = found if isinstance(found, dict) else {}
        marked = bool(data) and data.get("marker") == self.marker
        if kind == "comm_msg":
            on_channel = self.channel is not None and content.get("comm_id") == self.channel
            if on_channel and marked and self._count_answer():
                buffers = msg.get("buffers") or []
                self.answer = (data, buffers if sum(map(len, buffers)) <= 2 * CHUNK else [])
        elif kind == "comm_open":
            if content.get("target_name") == TARGET and marked and self._count_answer():
                self.opened = (str(content.get("comm_id")), data)
        elif not (kind in ("execute_result", "display_data") and self._is_answer(kind, content)):
            kept = self.fold.message(kind, content)
            if kept is not None:
                await call_back(self.callbacks.get(f"on_{kept[0]}"), kept[1])

    async def finish(self) -> Execution:
        """The :class:`Execution`, its output joined (with a note when some was dropped)."""
        note = self.fold.finish()
        if note is not None:
            await call_back(self.callbacks.get("on_stdout"), note)
        return self.execution
