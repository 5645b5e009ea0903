"""A LiteLLM-skills-compatible executor: ``execute(code, skill_files, requirements)``."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..execution.sync import Sandbox


class SkillsExecutor:
    """``execute(code, skill_files, requirements) -> {"success", "output", "error", "files"}``,
    the contract of LiteLLM's ``SkillsSandboxExecutor``, on one warm sandboxed kernel.

    The kernel starts on the first call and is kept (with its variables and installed packages)
    until :meth:`close`; ``timeout`` interrupts the code, ``requirements`` go through
    ``install()``. Other keywords are :class:`~kernel_sandbox.Sandbox` options.
    """

    def __init__(self, timeout: float = 60, **sandbox_options: Any) -> None:
        self.timeout = timeout
        self._options = sandbox_options
        self._sandbox: Sandbox | None = None
        self._lock = threading.Lock()

    def _kernel(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(timeout=self.timeout, **self._options).start()
        return self._sandbox

    def execute(
        self,
        code: str,
        skill_files: Mapping[str, bytes | str] | None = None,
        requirements: str | None = None,
    ) -> dict[str, Any]:
        """Run ``code`` next to ``skill_files``; never raises for what the code or the sandbox
        did (``success`` is False and ``error`` says why)."""
        with self._lock:
            try:
                sandbox = self._kernel()
            except Exception as exc:
                return {"success": False, "output": "", "error": str(exc), "files": []}
            return sandbox.run_skill(code, skill_files, requirements, timeout=self.timeout)

    def close(self) -> None:
        """Remove the kernel and its container."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()

    def __enter__(self) -> SkillsExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
