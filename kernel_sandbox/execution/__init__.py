"""The execution API for programs: sessions, tool calls, files, skills and a warm pool."""

from .. import _EXECUTION_API
from ..errors import (  # noqa: F401 (re-exported: the names in __all__)
    CallTimeoutError,
    CheckpointError,
    FramingError,
    NetworkDisabledError,
    PathError,
    ResultLimitError,
    SandboxError,
    SandboxFileError,
    UnsafePayloadError,
)
from ..hostsecrets import Secret  # noqa: F401
from ..results import Execution, ExecutionError, FileInfo, ToolResult  # noqa: F401
from .checkpoint import Checkpoint  # noqa: F401
from .limits import DecodeLimits  # noqa: F401
from .pool import AsyncSandboxPool, SandboxPool  # noqa: F401
from .sandbox import AsyncSandbox  # noqa: F401
from .sync import Sandbox  # noqa: F401

__all__ = list(_EXECUTION_API)
