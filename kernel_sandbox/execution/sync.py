"""The synchronous API: :class:`Sandbox`, a thin wrapper that runs :class:`AsyncSandbox` calls
on one shared background event loop (:class:`LoopThread`)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import IO, Any, TypeVar

from ..hostsecrets import Secret
from ..metrics import Usage
from ..results import Execution, FileInfo, ToolResult
from .backend import DEFAULT_BACKEND
from .checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, Checkpoint
from .collector import Callback
from .limits import DecodeLimits
from .files import MAX_SKILL_FILES_BYTES, MAX_STREAM_BYTES, Content
from .exchange import DEFAULT_CALL_TIMEOUT
from .sandbox import AsyncSandbox
from .session import DEFAULT_MAX_OUTPUT_BYTES

T = TypeVar("T")


class LoopThread:
    """One background event loop shared by the sync wrappers."""

    _loop: asyncio.AbstractEventLoop | None = None
    _guard = threading.Lock()

    @classmethod
    def run(cls, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop (started on first use) and wait for its result."""
        with cls._guard:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="kernel-sandbox-loop", daemon=True
                ).start()
                cls._loop = loop
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, cls._loop)  # type: ignore[arg-type]
        return future.result()

    @classmethod
    def call(cls, func: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain call on the loop (it may create tasks there)."""
        assert cls._loop is not None
        cls._loop.call_soon_threadsafe(func, *args)


class Sandbox:
    """The synchronous face of :class:`AsyncSandbox` (its options written out), used with ``with``.

    Calls run on a shared background event loop; callbacks are called from that thread.
    """

    def __init__(
        self,
        backend: str = DEFAULT_BACKEND,
        *,
        image: str | None = None,
        memory: str | None = None,
        cpus: float | None = None,
        pids_limit: int | None = None,
        network: bool | Sequence[str] = False,
        env: Mapping[str, str] | None = None,
        mounts: Iterable[str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        start_timeout: float = 60.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        interrupt_grace: float = 3.0,
        allowed_classes: Iterable[type] = (),
        decode_limits: DecodeLimits | None = None,
        unsafe_pickle: bool = False,
        output_policy: str | None = None,
        restore: Checkpoint | None = None,
        secrets: Mapping[str, Secret] | None = None,
        **backend_options: Any,
    ) -> None:
        self._async = AsyncSandbox(
            backend,
            image=image,
            memory=memory,
            cpus=cpus,
            pids_limit=pids_limit,
            network=network,
            env=env,
            mounts=mounts,
            timeout=timeout,
            start_timeout=start_timeout,
            max_output_bytes=max_output_bytes,
            interrupt_grace=interrupt_grace,
            allowed_classes=allowed_classes,
            decode_limits=decode_limits,
            unsafe_pickle=unsafe_pickle,
            output_policy=output_policy,
            restore=restore,
            secrets=secrets,
            **backend_options,
        )

    @classmethod
    def wrapping(cls, sandbox: AsyncSandbox) -> Sandbox:
        """The synchronous face of a started :class:`AsyncSandbox` (as a pool hands them out)."""
        wrapper = cls.__new__(cls)
        wrapper._async = sandbox
        return wrapper

    @classmethod
    def attach(cls, kernel_id: str, backend: str = DEFAULT_BACKEND, **options: Any) -> Sandbox:
        """Take over the live sandboxed kernel ``kernel_id`` whose owner is gone
        (:meth:`AsyncSandbox.attach`)."""
        return cls.wrapping(LoopThread.run(AsyncSandbox.attach(kernel_id, backend, **options)))

    @property
    def kernel_id(self) -> str | None:
        """The id of the kernel (for :meth:`attach` from another process), once started."""
        return self._async.kernel_id

    @property
    def work_dir(self) -> str:
        """The kernel's work directory (inside the sandbox)."""
        return self._async.work_dir

    def start(self) -> Sandbox:
        """Start the kernel (``with Sandbox() as sb`` does it for you)."""
        LoopThread.run(self._async.start())
        return self

    def close(self) -> None:
        """Shut the kernel down and remove its container."""
        LoopThread.run(self._async.close())

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def run(
        self,
        code: str,
        timeout: float | None = None,
        on_stdout: Callback = None,
        on_stderr: Callback = None,
        on_result: Callback = None,
        on_error: Callback = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> Execution:
        """See :meth:`AsyncSandbox.run`."""
        return LoopThread.run(
            self._async.run(code, timeout, on_stdout, on_stderr, on_result, on_error, env=env)
        )

    def pause(self) -> None:
        """Pause the sandbox (opensandbox backend) until :meth:`resume`."""
        LoopThread.run(self._async.pause())

    def resume(self) -> None:
        """Resume a paused sandbox and wait until it runs again."""
        LoopThread.run(self._async.resume())

    def suspend(self) -> None:
        """See :meth:`AsyncSandbox.suspend`."""
        LoopThread.run(self._async.suspend())

    def wake(self) -> None:
        """See :meth:`AsyncSandbox.wake`."""
        LoopThread.run(self._async.wake())

    def metrics(self) -> Usage:
        """See :meth:`AsyncSandbox.metrics`."""
        return LoopThread.run(self._async.metrics())

    def restart(self) -> None:
        """See :meth:`AsyncSandbox.restart`."""
        LoopThread.run(self._async.restart())

    def checkpoint(
        self, *, max_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES, timeout: float | None = None
    ) -> Checkpoint:
        """See :meth:`AsyncSandbox.checkpoint`."""
        return LoopThread.run(self._async.checkpoint(max_bytes=max_bytes, timeout=timeout))

    def upload(self, files: Mapping[str, Content], *, timeout: float | None = None) -> list[str]:
        """See :meth:`AsyncSandbox.upload`."""
        return LoopThread.run(self._async.upload(files, timeout=timeout))

    def download(self, path: str, *, timeout: float | None = None) -> bytes:
        """See :meth:`AsyncSandbox.download`."""
        return LoopThread.run(self._async.download(path, timeout=timeout))

    def download_to(
        self,
        path: str,
        destination: str | os.PathLike[str] | IO[bytes],
        *,
        timeout: float | None = None,
        max_bytes: int | None = MAX_STREAM_BYTES,
    ) -> int:
        """See :meth:`AsyncSandbox.download_to`."""
        return LoopThread.run(
            self._async.download_to(path, destination, timeout=timeout, max_bytes=max_bytes)
        )

    def list_files(self, path: str = ".", *, timeout: float | None = None) -> list[FileInfo]:
        """See :meth:`AsyncSandbox.list_files`."""
        return LoopThread.run(self._async.list_files(path, timeout=timeout))

    def install(
        self,
        requirements: str | Iterable[str],
        *,
        pip_args: Iterable[str] = (),
        timeout: float | None = None,
    ) -> Execution:
        """See :meth:`AsyncSandbox.install`."""
        return LoopThread.run(self._async.install(requirements, pip_args=pip_args, timeout=timeout))

    def run_tool(
        self,
        tool: Callable[..., Any] | str,
        args: Mapping[str, Any] | None = None,
        agent_state: Any = None,
        name: str | None = None,
        *,
        timeout: float | None = None,
        allowed_classes: Iterable[type] = (),
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, Secret] | None = None,
    ) -> ToolResult:
        """See :meth:`AsyncSandbox.run_tool`."""
        return LoopThread.run(
            self._async.run_tool(
                tool,
                args,
                agent_state,
                name,
                timeout=timeout,
                allowed_classes=allowed_classes,
                env=env,
                secrets=secrets,
            )
        )

    def run_skill(
        self,
        code: str,
        skill_files: Mapping[str, bytes | str] | None = None,
        requirements: str | Iterable[str] | None = None,
        *,
        timeout: float | None = None,
        max_files_bytes: int = MAX_SKILL_FILES_BYTES,
    ) -> dict[str, Any]:
        """See :meth:`AsyncSandbox.run_skill`."""
        return LoopThread.run(
            self._async.run_skill(
                code, skill_files, requirements, timeout=timeout, max_files_bytes=max_files_bytes
            )
        )
