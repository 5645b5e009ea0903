"""A Letta-compatible tool runner: tool source, arguments and agent state in; the tool's return,
the changed state, its output and a status out."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import KernelSandboxError
from ..execution.sync import Sandbox


@dataclass
class ToolExecutionResult:
    """What Letta's ``ToolExecutionSandbox.run`` returns: ``status`` ("success" or "error"),
    ``func_return`` (on error, the friendly message), ``agent_state``, ``stdout``/``stderr``
    (lists of text)."""

    status: str
    func_return: Any = None
    agent_state: Any = None
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


class ToolRunner:
    """Run Letta tools (their source) in one warm sandboxed kernel.

    The agent state travels as data both ways (never unpickled on the host): give the classes it
    may hold in ``allowed_classes``. ``timeout`` interrupts a tool. Other keywords are
    :class:`~kernel_sandbox.Sandbox` options.
    """

    def __init__(
        self, timeout: float = 60, allowed_classes: Iterable[type] = (), **sandbox_options: Any
    ) -> None:
        self.timeout = timeout
        self._options = {"allowed_classes": tuple(allowed_classes), **sandbox_options}
        self._sandbox: Sandbox | None = None
        self._lock = threading.Lock()

    def run(
        self,
        source_code: str,
        tool_name: str,
        args: Mapping[str, Any],
        agent_state: Any = None,
        additional_env_vars: Mapping[str, str] | None = None,
    ) -> ToolExecutionResult:
        """Call ``tool_name`` defined by ``source_code`` with ``args`` (and ``agent_state`` when
        the tool takes one); ``additional_env_vars`` are set for this call only."""
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox(timeout=self.timeout, **self._options).start()
            try:
                result = self._sandbox.run_tool(
                    source_code,
                    dict(args),
                    agent_state,
                    name=tool_name,
                    env=additional_env_vars,
                    timeout=self.timeout,
                )
            except KernelSandboxError as exc:  # a result refused on the host (not data, too big)
                message = f"Error executing function {tool_name}: {type(exc).__name__}: {exc}"
                return ToolExecutionResult("error", message)
        stdout = [result.stdout] if result.stdout else []
        stderr = [result.stderr] if result.stderr else []
        if result.status == "success":
            return ToolExecutionResult(
                "success", result.func_return, result.agent_state, stdout, stderr
            )
        error = result.error
        message = (
            f"Error executing function {tool_name}: {error.name}: {error.value}"
            if error is not None
            else f"Error executing function {tool_name}"
        )
        return ToolExecutionResult("error", message, None, stdout, stderr)

    def close(self) -> None:
        """Remove the kernel and its container."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
