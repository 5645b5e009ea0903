"""What running code returns, on every path: :class:`Execution` (with :class:`ExecutionError`),
:class:`ToolResult` and :class:`FileInfo`, with short reprs (never a whole image).

Kept free of heavy imports: the launcher's OpenSandbox relay builds these too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
