"""The output collector: the IOPub messages of one request, gathered into an Execution under a byte
cap."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..policy import OutputPolicy
from ..results import Execution, ExecutionError
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
    """Gather the messages one request causes, keeping at most ``cap`` bytes of output in memory.

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
        self.execution = Execution()
        self.policy = policy
        self.cap = cap
        self.used = 0
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
        self._stdout: list[str] = []
        self._stderr: list[str] = []

    def _admit(self, size: int) -> bool:
        if self.used + size > self.cap:
            self.execution.truncated_bytes += size
            return False
        self.used += size
        return True

    def _fit(self, text: str) -> str:
        """Keep the part of ``text`` that fits under the cap; count the rest as dropped."""
        room = self.cap - self.used
        if text.isascii():
            kept = text[: max(room, 0)]
            self.used += len(kept)
            self.execution.truncated_bytes += len(text) - len(kept)
            return kept
        size = len(text.encode("utf-8", "replace"))
        if size <= room:
            self.used += size
            return text
        kept = text.encode("utf-8", "replace")[: max(room, 0)].decode("utf-8", "ignore")
        kept_size = len(kept.encode("utf-8"))
        self.used += kept_size
        self.execution.truncated_bytes += size - kept_size
        return kept

    def _count_answer(self) -> bool:
        self.answers += 1
        return self.answers == 1

    async def handle(self, msg: dict[str, Any]) -> None:  # noqa: C901
        """Take one IOPub message of the request."""
        kind, content = msg["msg_type"], msg["content"]
        if not isinstance(content, dict):
            return
        if kind == "stream":
            text = content.get("text", "")
            text = self._fit(text if isinstance(text, str) else str(text))
            if text:
                is_err = content.get("name") == "stderr"
                (self._stderr if is_err else self._stdout).append(text)
                await call_back(self.callbacks.get("on_stderr" if is_err else "on_stdout"), text)
        elif kind in ("execute_result", "display_data"):
            bundle = content.get("data")
            if not isinstance(bundle, dict):
                return
            text = bundle.get("text/plain")
            if (
                self.frame_prefix is not None
                and isinstance(text, str)
                and text.startswith(self.frame_prefix)
            ):
                if self._count_answer() and kind == "execute_result":
                    self.text_answer = text
                return
            size = sum(
                len(value) if isinstance(value, str) else len(str(value))
                for value in bundle.values()
            )
            if self._admit(size):
                bundle = dict(
                    bundle if self.policy is None else self.policy.filter_bundle(bundle)[0]
                )
                self.execution.results.append(bundle)
                if kind == "execute_result":
                    self.execution.main_result = bundle
                await call_back(self.callbacks.get("on_result"), bundle)
        elif kind == "error":
            error = ExecutionError(
                str(content.get("ename", ""))[:1000],
                str(content.get("evalue", ""))[:10000],
                "\n".join(str(line) for line in content.get("traceback", []))[-65536:],
            )
            if self._admit(len(error.value) + len(error.traceback)):
                self.execution.error = error
                await call_back(self.callbacks.get("on_error"), error)
        elif kind == "execute_input":
            self.execution.execution_count = content.get("execution_count")
        elif (
            kind == "comm_msg"
            and self.channel is not None
            and content.get("comm_id") == self.channel
        ):
            data = content.get("data")
            if (
                isinstance(data, dict)
                and data.get("marker") == self.marker
                and self._count_answer()
            ):
                buffers = msg.get("buffers") or []
                self.answer = (data, buffers if sum(map(len, buffers)) <= 2 * CHUNK else [])
        elif kind == "comm_open" and content.get("target_name") == TARGET:
            data = content.get("data")
            if (
                isinstance(data, dict)
                and data.get("marker") == self.marker
                and self._count_answer()
            ):
                self.opened = (str(content.get("comm_id")), data)

    async def finish(self) -> Execution:
        """The :class:`Execution`, its output joined (with a note when some was dropped)."""
        execution = self.execution
        if execution.truncated_bytes:
            note = (
                f"\n[output truncated: {execution.truncated_bytes} bytes over the cap of "
                f"{self.cap} bytes (max_output_bytes)]\n"
            )
            self._stdout.append(note)
            await call_back(self.callbacks.get("on_stdout"), note)
        execution.stdout = "".join(self._stdout)
        execution.stderr = "".join(self._stderr)
        return execution
