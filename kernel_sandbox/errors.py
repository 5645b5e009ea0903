"""Every error kernel-sandbox raises, in one tree under :class:`KernelSandboxError`.

``except KernelSandboxError`` catches all of them; errors of the libraries underneath (docker,
httpx, zmq) are wrapped, with the original kept as ``__cause__``::

    KernelSandboxError
    ├── ConfigError                  an option of a wrong type or value, or an unknown option name
    ├── EngineUnavailable            the Docker engine cannot be reached
    ├── ImageError
    │   ├── ImageMissing             the kernel image is not on the engine
    │   └── ImageBuildError          `kernel-sandbox image build` failed
    ├── KernelLaunchError            a kernel could not start (the message says why and the fix)
    │   └── KernelBudgetExceeded     no room in max_kernels / max_memory until launch_timeout
    ├── ChannelProtocolError         a kernel broke ZMTP on a channel (the launcher ends it)
    ├── SetupError                   a step of `setup` or `lab` failed (the message says the fix)
    ├── MetricsUnavailable           the host cannot read a sandbox's usage (no cgroup, not offered)
    ├── SandboxError                 the execution API (Sandbox, AsyncSandbox, pools)
    │   ├── PathError                a path leaves the work directory
    │   ├── SandboxFileError         a file operation failed inside the sandbox
    │   ├── NetworkDisabledError     the operation needs the network, which is off
    │   ├── CallTimeoutError         a call (file transfer, helper) ran past its deadline
    │   ├── UnsafePayloadError       a result from the sandbox was refused while decoding
    │   │   └── ResultLimitError     ... because it exceeds a decoding limit (``limit`` names it)
    │   ├── FramingError             a result frame was missing, duplicated or malformed
    │   └── CheckpointError          a checkpoint was refused (over its cap, tampered) or not made
    └── OpenSandboxError             the OpenSandbox clients
        ├── OpenSandboxConfigError   missing configuration (the API base URL...); also a ConfigError
        ├── OpenSandboxAPIError      a non-2xx answer from the lifecycle server or execd
        │   ├── SandboxNotFound      404 for a sandbox: never existed, deleted, or expired
        │   ├── SandboxCapacityError 429/503 to a create, still so when the launch deadline ran out
        │   └── SandboxQuotaExceeded 403 QUOTA_EXCEEDED to a create (``quota`` names the quota)
        ├── OpenSandboxProtocolError an answer of the wrong shape (named by its call)
        │   └── ResponseTooLarge     an answer went over its byte cap
        ├── OpenSandboxConnectionError  unreachable, or hung up (also mid-run)
        ├── CallDeadlineExceeded     one call took longer than its overall deadline
        ├── SandboxStateError        a sandbox reached a state it cannot run code from
        ├── SandboxTimeoutError      a sandbox or execd was not ready in time
        └── OutputLimitExceeded      an execd stream went over its byte cap
"""

from __future__ import annotations

import re
from typing import Any


class KernelSandboxError(Exception):
    """The root of every error raised by kernel-sandbox."""


class ConfigError(KernelSandboxError, ValueError):
    """An option was refused: wrong type, out of range, or unknown. The message names it."""


class EngineUnavailable(KernelSandboxError):
    """The Docker engine cannot be reached."""


class ImageError(KernelSandboxError):
    """A problem with the kernel image."""


class ImageMissing(ImageError):
    """The kernel image is not present on the Docker engine."""


class ImageBuildError(ImageError):
    """Building the kernel image failed; the message says at which step and why, and ``fix`` what
    to do when building again would not help."""

    def __init__(self, reason: str, fix: str = "") -> None:
        super().__init__(f"{reason}. Fix one of: {fix}" if fix else reason)
        self.reason, self.fix = reason, fix


class KernelLaunchError(KernelSandboxError):
    """The kernel could not be started; the message says why and what to do."""


class KernelBudgetExceeded(KernelLaunchError):
    """No room in this process's kernel budget (``max_kernels``, ``max_memory``) until the launch
    deadline; the message names the option and how full it is."""


class ChannelProtocolError(KernelSandboxError):
    """A kernel broke ZMTP on one of its channels (a bad greeting, a bound exceeded); the launcher
    ends that kernel."""


class SetupError(KernelSandboxError):
    """A step of ``kernel-sandbox setup`` or ``lab`` could not be done; the message says what to run
    instead."""


class MetricsUnavailable(KernelSandboxError):
    """A sandbox's usage cannot be read by the host: its cgroup is not here, or its backend offers
    none."""


class SandboxError(KernelSandboxError):
    """An error of the execution API."""


class PathError(SandboxError, ValueError):
    """A path was refused: it leaves the sandbox's work directory (``..``, absolute, symlink)."""


class SandboxFileError(SandboxError, OSError):
    """A file operation failed inside the sandbox (missing file, a directory, too large...)."""


class NetworkDisabledError(SandboxError):
    """The operation needs the network and the sandbox was created without it."""


class CallTimeoutError(SandboxError, TimeoutError):
    """A call of the execution API (a file transfer, a helper) did not finish before its
    deadline."""


class UnsafePayloadError(SandboxError):
    """A result from the sandbox was refused while decoding; nothing was run on the host."""


class ResultLimitError(UnsafePayloadError):
    """A result from the sandbox exceeds a decoding limit; ``limit`` names it, ``value`` is its
    value."""

    def __init__(self, message: str, *, limit: str, value: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class FramingError(SandboxError):
    """A framed result from the sandbox was missing, malformed, duplicated or failed its digest."""


class CheckpointError(SandboxError):
    """A checkpoint was refused (over ``checkpoint(max_bytes=)``, its sha256 differs) or could not
    be made or loaded."""


class OpenSandboxError(KernelSandboxError):
    """An error of the OpenSandbox clients."""


class OpenSandboxConfigError(OpenSandboxError, ConfigError):
    """The client is missing configuration (for example the API base URL); also a
    :class:`ConfigError`."""


class OpenSandboxAPIError(OpenSandboxError):
    """A non-2xx answer from the lifecycle server or execd, with its ``{code, message}`` body.

    ``response`` is the httpx response (its body already read and capped), ``status_code`` its
    status, ``code`` and ``message`` the server's (FastAPI's ``detail`` is turned into a message
    naming each refused field).
    """

    def __init__(
        self, message: str, *, response: Any, code: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.response = response
        self.status_code: int = response.status_code
        self.code = code
        self.message = detail


class SandboxNotFound(OpenSandboxAPIError):
    """The lifecycle server answered 404 for a sandbox: unknown, deleted, or expired (removed)."""


class SandboxCapacityError(OpenSandboxAPIError):
    """The server had no capacity for a new sandbox (429, or 503 with ``Retry-After``) until the
    launch deadline ran out; the message says how often and how long it was retried."""


class SandboxQuotaExceeded(OpenSandboxAPIError):
    """The deployment refused a new sandbox because a quota is used up (403 ``QUOTA_EXCEEDED``).

    ``quota`` is the quota's name as the server reported it (a Kubernetes ResourceQuota), or None.
    """

    def __init__(
        self, message: str, *, response: Any, code: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message, response=response, code=code, detail=detail)
        found = re.search(r"exceeded quota:\s*([A-Za-z0-9][-A-Za-z0-9_.]*)", detail or "")
        self.quota: str | None = found.group(1) if found else None


class OpenSandboxProtocolError(OpenSandboxError):
    """An answer the client cannot use: not JSON, the wrong JSON shape, bad values, or
    compressed."""


class ResponseTooLarge(OpenSandboxProtocolError):
    """An answer exceeded its byte cap; it was not read further. ``limit`` is the cap in bytes."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class OpenSandboxConnectionError(OpenSandboxError, ConnectionError):
    """The lifecycle server or execd could not be reached, or hung up; the message names the
    call."""


class CallDeadlineExceeded(OpenSandboxError, TimeoutError):
    """One call (connect, send, and the whole answer) took longer than its deadline."""


class SandboxStateError(OpenSandboxError):
    """A sandbox reached a state it cannot run code from (Failed, Terminated...)."""

    def __init__(self, sandbox_id: str, state: str, message: str = "") -> None:
        self.sandbox_id = sandbox_id
        self.state = state
        detail = f": {message}" if message else ""
        super().__init__(f"sandbox {sandbox_id} entered {state}{detail}")


class SandboxTimeoutError(OpenSandboxError, TimeoutError):
    """A sandbox or its execd endpoint was not ready within the ready timeout."""


class OutputLimitExceeded(OpenSandboxError):
    """An execd stream exceeded the byte cap and was aborted."""
