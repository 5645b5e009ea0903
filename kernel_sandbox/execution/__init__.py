"""The execution API for programs: sessions, tool calls, files, skills and a warm pool."""

from .models import (
    Execution,
    ExecutionError,
    FileInfo,
    FramingError,
    NetworkDisabledError,
    PathError,
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
    "Execution",
    "ExecutionError",
    "FileInfo",
    "FramingError",
    "NetworkDisabledError",
    "PathError",
    "Sandbox",
    "SandboxError",
    "SandboxFileError",
    "SandboxPool",
    "ToolResult",
    "UnsafePayloadError",
]
