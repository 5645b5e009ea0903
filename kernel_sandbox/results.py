"""What running code returns, on every path: :class:`Execution` (with :class:`ExecutionError`),
:class:`ToolResult` and :class:`FileInfo`, with short reprs (never a whole image); and
:class:`OutputFold`, the one fold from a run's messages to its :class:`Execution`.

Kept free of heavy imports: the launcher's OpenSandbox relay builds these too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

_SHORT = 60


def short(value: Any, limit: int = _SHORT) -> str:
    """``repr(value)``, cut to about ``limit`` characters with a note of the length left out."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more)"


def bundle_repr(bundle: dict[str, Any]) -> str:
    """A MIME bundle in a few words: its text/plain (short), the other types by name only."""
    kinds = [key for key in bundle if key != "text/plain"]
    text = [short(bundle["text/plain"], 40)] if "text/plain" in bundle else []
    return "{" + ", ".join(text + kinds) + "}"


@dataclass(repr=False)
class ExecutionError:
    """An exception raised by code in the sandbox (or a timeout, kernel death or relay failure
    reported as one).

    ``traceback`` is the whole traceback as one text (lines joined with newlines).
    """

    name: str
    value: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"

    def __repr__(self) -> str:
        lines = len(self.traceback.splitlines())
        return f"ExecutionError({self.name}: {short(self.value)}, traceback: {lines} lines)"


class HostError(ExecutionError):
    """An error the host itself reports (a timeout, a dead kernel, no answer), never the kernel.

    The subclass fixes ``name``; an exception of the same name raised in the sandbox stays a
    plain :class:`ExecutionError`, so the host never mistakes one for the other.
    """

    NAME: ClassVar[str] = "HostError"

    def __init__(self, value: str, traceback: str = "") -> None:
        super().__init__(self.NAME, value, traceback)


class TimedOut(HostError):
    """The call passed its deadline; the kernel was interrupted (or restarted: ``state_lost``)."""

    NAME = "TimeoutError"


class KernelDied(HostError):
    """The kernel died during the call; it was restarted and its state is lost."""

    NAME = "KernelDied"


class NoAnswer(HostError):
    """The kernel-side helper sent no answer to a request."""

    NAME = "NoAnswer"


class NoReply(HostError):
    """The kernel finished a request but sent no shell reply to it."""

    NAME = "NoReply"


@dataclass(repr=False)
class Execution:
    """What one run of code produced: streams, rich results, the error and the execution count.

    Every path returns it: the execution API, ``kernel-sandbox exec``, and OpenSandbox execd runs.
    """

    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None
    state_lost: bool = False
    truncated_bytes: int = 0
    main_result: dict[str, Any] | None = None

    @property
    def text(self) -> str | None:
        """The text/plain of the execute_result (the value of the last expression), if any."""
        return None if self.main_result is None else self.main_result.get("text/plain")

    def __repr__(self) -> str:
        parts = [f"stdout={short(self.stdout)}", f"stderr={short(self.stderr)}"]
        if self.results:
            parts.append("results=[" + ", ".join(bundle_repr(b) for b in self.results) + "]")
        if self.error is not None:
            parts.append(f"error={self.error}")
        if self.execution_count is not None:
            parts.append(f"execution_count={self.execution_count}")
        if self.state_lost:
            parts.append("state_lost=True")
        if self.truncated_bytes:
            parts.append(f"truncated_bytes={self.truncated_bytes}")
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(repr=False)
class ToolResult:
    """The outcome of ``run_tool``: status, the function's return value and the agent state.

    ``status`` is ``"success"`` only when the tool returned and its one answer arrived;
    ``state_lost`` is True when the kernel had to be restarted during the call.
    """

    status: str
    func_return: Any = None
    agent_state: Any = None
    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    state_lost: bool = False
    truncated_bytes: int = 0

    def __repr__(self) -> str:
        parts = [f"status={self.status!r}", f"func_return={short(self.func_return)}"]
        if self.agent_state is not None:
            parts.append(f"agent_state={short(self.agent_state)}")
        parts += [f"stdout={short(self.stdout)}", f"stderr={short(self.stderr)}"]
        if self.error is not None:
            parts.append(f"error={self.error}")
        if self.state_lost:
            parts.append("state_lost=True")
        return f"ToolResult({', '.join(parts)})"


@dataclass
class FileInfo:
    """One entry of ``list_files``: name, path relative to the work directory, size, kind."""

    name: str
    path: str
    size: int
    is_dir: bool


DROP_NOTE = re.compile(
    r"\[kernel-sandbox\] (\d{1,19}) output messages \((\d{1,19}) bytes\) were dropped"
)
"""How a drop note begins (:func:`drop_note`); numbers of at most 19 digits (a 64-bit count), so
that a forged note cannot make ``int()`` refuse a number of thousands of digits."""


def drop_note(messages: int, size: int) -> str:
    """The stderr text that tells a cell's clients that ``messages`` of its output messages
    (``size`` bytes) were dropped."""
    return (
        f"[kernel-sandbox] {messages} output messages ({size} bytes) were dropped: the client "
        "took them slower than the kernel sent them\n"
    )


def dropped_bytes(text: str) -> int:
    """The bytes a drop note at the start of ``text`` says were dropped (0 for any other text)."""
    found = DROP_NOTE.match(text)
    return int(found.group(2)) if found else 0


class OutputFold:
    """The one fold from a run's output to its :class:`Execution`, keeping at most ``cap`` bytes.

    Every path folds through it: the execution API and ``kernel-sandbox exec`` (IOPub messages,
    :meth:`message`), and OpenSandbox execd runs (events, through the other methods). Output past
    ``cap`` (None: no cap) is dropped as it arrives and counted in ``truncated_bytes``;
    ``bundle_filter`` (the output policy) rewrites each kept MIME bundle. Each method returns what
    it kept, for the caller to stream on (None when nothing was kept).
    """

    def __init__(
        self,
        execution: Execution | None = None,
        cap: int | None = None,
        bundle_filter: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.execution = Execution() if execution is None else execution
        self.cap = cap
        self.bundle_filter = bundle_filter
        self.used = 0
        self._out: list[str] = []
        self._err: list[str] = []
        self._noted = False

    def _admit(self, size: int) -> bool:
        if self.cap is None:
            return True
        if self.used + size > self.cap:
            self.execution.truncated_bytes += size
            return False
        self.used += size
        return True

    def _fit(self, text: str) -> str:
        """Keep the part of ``text`` that fits under the cap; count the rest as dropped."""
        if self.cap is None:
            return text
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

    def stream(self, name: str, text: Any) -> str | None:
        """Fold text of the stream ``name`` (``stderr``, else stdout); return the part kept.

        The bytes a launcher's drop note says it dropped count as truncated too.
        """
        text = text if isinstance(text, str) else str(text)
        if name == "stderr":
            self.execution.truncated_bytes += dropped_bytes(text)
        kept = self._fit(text)
        if not kept:
            return None
        (self._err if name == "stderr" else self._out).append(kept)
        return kept

    def result(self, bundle: dict[str, Any], main: bool) -> dict[str, Any] | None:
        """Fold a MIME bundle; ``main`` for the execute_result (the last expression: ``text``)."""
        if self.cap is not None:
            size = sum(len(v) if isinstance(v, str) else len(str(v)) for v in bundle.values())
            if not self._admit(size):
                return None
        kept = dict(bundle if self.bundle_filter is None else self.bundle_filter(bundle))
        self.execution.results.append(kept)
        if main:
            self.execution.main_result = kept
        return kept

    def error(self, error: ExecutionError) -> ExecutionError | None:
        """Fold the run's error (the last one kept wins)."""
        if not self._admit(len(error.value) + len(error.traceback)):
            return None
        self.execution.error = error
        return error

    def count(self, execution_count: Any) -> None:
        """Fold the run's execution count."""
        self.execution.execution_count = execution_count

    def message(self, kind: str, content: dict[str, Any]) -> tuple[str, Any] | None:
        """Fold one IOPub message; return ``(what, kept)``: stdout, stderr, result or error."""
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            text = self.stream(name, content.get("text", ""))
            return None if text is None else (name, text)
        if kind in ("execute_result", "display_data"):
            bundle = content.get("data")
            if not isinstance(bundle, dict):
                return None
            kept = self.result(bundle, kind == "execute_result")
            return None if kept is None else ("result", kept)
        if kind == "error":
            lines = content.get("traceback")
            lines = lines if isinstance(lines, list) else []
            error = self.error(
                ExecutionError(
                    str(content.get("ename", ""))[:1000],
                    str(content.get("evalue", ""))[:10000],
                    "\n".join(str(line) for line in lines)[-65536:],
                )
            )
            return None if error is None else ("error", error)
        if kind == "execute_input":
            self.count(content.get("execution_count"))
        return None

    def finish(self) -> str | None:
        """Join the output into the :class:`Execution` (also again, after more output).

        Returns the note added once to stdout when output was dropped, else None.
        """
        note = None
        if self.execution.truncated_bytes and not self._noted:
            self._noted = True
            note = (
                f"\n[output truncated: {self.execution.truncated_bytes} bytes over the cap of "
                f"{self.cap} bytes (max_output_bytes)]\n"
            )
            self._out.append(note)
        self._out[:] = ["".join(self._out)]
        self._err[:] = ["".join(self._err)]
        self.execution.stdout, self.execution.stderr = self._out[0], self._err[0]
        return note
