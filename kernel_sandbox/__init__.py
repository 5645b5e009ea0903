"""Jupyter kernels in disposable, locked-down containers."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXECUTION_API = (
    "AsyncSandbox",
    "AsyncSandboxPool",
    "CallTimeoutError",
    "Checkpoint",
    "CheckpointError",
    "DecodeLimits",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "FramingError",
    "NetworkDisabledError",
    "PathError",
    "ResultLimitError",
    "Sandbox",
    "SandboxError",
    "SandboxFileError",
    "SandboxPool",
    "Secret",
    "ToolResult",
    "UnsafePayloadError",
)
__all__ = ["__version__", *_EXECUTION_API]


def __getattr__(name: str) -> Any:
    """Import the execution API on first use, so ``import kernel_sandbox`` stays light."""
    if name in _EXECUTION_API:
        from . import execution

        return getattr(execution, name)
    raise AttributeError(f"module 'kernel_sandbox' has no attribute {name!r}")
