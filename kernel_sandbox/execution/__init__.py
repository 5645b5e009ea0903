"""The execution API for programs: sessions, tool calls, files, skills and a warm pool."""

from .decode import DecodeLimits
from .models import (
    CallTimeoutError,
    Execution,
    ExecutionError,
    FileInfo,
    FramingError,
    NetworkDisabledError,
    PathError,
    ResultLimitError,
    SandboxError,
    SandboxFileError,
    ToolResult,
    UnsafePayloadError,
)
from .pool import AsyncSandboxPool, SandboxPool
from .sandbox import AsyncSandbox, Sandbox

__all__ = [
    "AsyncSandbox",
    "AsyncSandboxPool",
    "CallTimeoutError",
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
    "ToolResult",
    "UnsafePayloadError",
]
