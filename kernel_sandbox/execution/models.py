"""Results and errors of the execution API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import (  # noqa: F401 (re-exported: the execution API's errors)
    CallTimeoutError,
    FramingError,
    NetworkDisabledError,
    PathError,
    ResultLimitError,
    SandboxError,
    SandboxFileError,
    UnsafePayloadError,
)


@dataclass
class ExecutionError:
    """An exception raised by code in the sandbox (or a timeout or kernel death reported as one)."""

    name: str
    value: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass
class Execution:
    """What one ``run`` produced: streams, rich results, the error and the execution count."""

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


@dataclass
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


@dataclass
class FileInfo:
    """One entry of ``list_files``: name, path relative to the work directory, size, kind."""

    name: str
    path: str
    size: int
    is_dir: bool
