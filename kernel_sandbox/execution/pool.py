"""Warm kernels for one configuration, handed out at once and never reused with a user's state."""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, SandboxError
from .adapters import adapter
from .backend import DEFAULT_BACKEND
from .sandbox import AsyncSandbox
from .sync import LoopThread, Sandbox


@dataclass
class _Entry:
    sandbox: AsyncSandbox
    uses: int = 0
    ready_since: float = field(default_factory=time.monotonic)


class AsyncSandboxPool:
    """Keep ``size`` started :class:`AsyncSandbox` kernels ready for ``acquire()``.

    A kernel handed back is never given to anyone else with its state: after ``max_uses``
    acquisitions (default 1) it is closed and a fresh one is started in the background; below that
    it is restarted and its work directory emptied first. A ready kernel idle for longer than
    ``idle_timeout`` seconds is replaced by a fresh one. Other keywords are :class:`AsyncSandbox`
    options; a backend may set defaults for pooled kernels (Docker: ``standby`` 0, the pool keeps
    its own ready kernels).
    """

    def __init__(
        self,
        size: int = 4,
        *,
        max_uses: int = 1,
        idle_timeout: float | None = None,
        **sandbox_options: Any,
    ) -> None:
        for name, value in (("size", size), ("max_uses", max_uses)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: must be a whole number from 1")
        if idle_timeout is not None and (
            isinstance(idle_timeout, bool)
            or not isinstance(idle_timeout, (int, float))
            or not idle_timeout > 0
        ):
            raise ConfigError(
                f"idle_timeout={idle_timeout!r}: must be a positive number of seconds, or None"
            )
        self.size = size
        self.max_uses = max_uses
        self.idle_timeout = idle_timeout
        defaults = adapter(sandbox_options.get("backend", DEFAULT_BACKEND)).pool_defaults
        self._options = {**defaults, **sandbox_options}
        with warnings.catch_warnings():  # the local backend's warning comes with each kernel
            warnings.simplefilter("ignore")
            AsyncSandbox(**self._options)  # its options are refused here, not in a background start
        self._ready: deque[_Entry] = deque()
        self._failures: deque[BaseException] = deque()
        self._in_use: set[AsyncSandbox] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting: set[asyncio.Future[AsyncSandbox]] = set()
        self._cond: asyncio.Condition | None = None
        self._initial: list[asyncio.Task[None]] = []
        self._janitor: asyncio.Task[None] | None = None
        self._closed = False

    def _begin(self) -> None:
        if self._cond is None:
            self._cond = asyncio.Condition()
            self._initial = [self._spawn(self._fresh()) for _ in range(self.size)]
            if self.idle_timeout is not None:
                self._janitor = self._spawn(self._expire_idle())

    async def start(self) -> AsyncSandboxPool:
        """Start filling the pool and wait until its first kernels are ready."""
        self._begin()
        await asyncio.gather(*self._initial)
        if self._failures and not self._ready:
            failure = self._failures.popleft()
            raise SandboxError(f"The pool could not start a kernel: {failure}") from failure
        return self

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _offer(self, entry: _Entry | None, failure: BaseException | None = None) -> None:
        assert self._cond is not None
        async with self._cond:
            if self._closed:
                if entry is not None:
                    await entry.sandbox.close()
                return
            if entry is not None:
                entry.ready_since = time.monotonic()
                self._ready.append(entry)
            else:
                assert failure is not None
                self._failures.append(failure)
            self._cond.notify_all()

    async def _fresh(self) -> None:
        sandbox = AsyncSandbox(**self._options)
        start = asyncio.ensure_future(sandbox.start())
        self._starting.add(start)
        try:
            await start
        except asyncio.CancelledError:
            if not self._closed:
                raise
            return  # close() cancelled it: start() has removed what it began
        except Exception as exc:
            await self._offer(None, exc)
            return
        finally:
            self._starting.discard(start)
        await self._offer(_Entry(sandbox))

    async def _recycle(self, entry: _Entry) -> None:
        try:
            await entry.sandbox.reset()
        except Exception:
            await entry.sandbox.close()
            await self._fresh()
            return
        await self._offer(entry)

    async def _retire(self, sandbox: AsyncSandbox) -> None:
        await sandbox.close()

    async def _expire_idle(self) -> None:
        assert self._cond is not None and self.idle_timeout is not None
        while not self._closed:
            await asyncio.sleep(max(self.idle_timeout / 4, 0.05))
            now = time.monotonic()
            async with self._cond:
                stale = [
                    entry for entry in self._ready if now - entry.ready_since > self.idle_timeout
                ]
                for entry in stale:
                    self._ready.remove(entry)
            for entry in stale:
                self._spawn(self._retire(entry.sandbox))
                self._spawn(self._fresh())

    async def _take(self) -> _Entry:
        if self._closed:
            raise SandboxError("The pool is closed")
        self._begin()
        assert self._cond is not None
        async with self._cond:
            await self._cond.wait_for(lambda: self._ready or self._failures or self._closed)
            if self._closed:
                raise SandboxError("The pool is closed")
            if not self._ready:
                failure = self._failures.popleft()
                self._spawn(self._fresh())
                raise SandboxError(f"The pool could not start a kernel: {failure}") from failure
            entry = self._ready.popleft()
        self._in_use.add(entry.sandbox)
        return entry

    def _give_back(self, entry: _Entry) -> None:
        self._in_use.discard(entry.sandbox)
        entry.uses += 1
        if self._closed:
            self._spawn(self._retire(entry.sandbox))
        elif entry.uses < self.max_uses:
            self._spawn(self._recycle(entry))
        else:
            self._spawn(self._retire(entry.sandbox))
            self._spawn(self._fresh())

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[AsyncSandbox]:
        """``async with pool.acquire() as sandbox``: a ready kernel, replaced after use."""
        entry = await self._take()
        try:
            yield entry.sandbox
        finally:
            self._give_back(entry)

    async def close(self) -> None:
        """Close every kernel of the pool, ready, in use or starting (a start is cut short)."""
        if self._closed:
            return
        self._closed = True
        if self._janitor is not None:
            self._janitor.cancel()
        for start in self._starting:
            start.cancel()
        if self._cond is not None:
            async with self._cond:
                self._cond.notify_all()
        ready, self._ready = list(self._ready), deque()
        for sandbox in [entry.sandbox for entry in ready] + list(self._in_use):
            self._spawn(self._retire(sandbox))
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def __aenter__(self) -> AsyncSandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class SandboxPool:
    """The synchronous face of :class:`AsyncSandboxPool`: ``with pool.acquire() as sandbox``."""

    def __init__(self, size: int = 4, **options: Any) -> None:
        self._async = AsyncSandboxPool(size, **options)

    def start(self) -> SandboxPool:
        """Fill the pool and wait until every kernel is ready."""
        LoopThread.run(self._async.start())
        return self

    @contextlib.contextmanager
    def acquire(self) -> Iterator[Sandbox]:
        """``with pool.acquire() as sandbox``: a ready kernel, replaced after use."""
        entry = LoopThread.run(self._async._take())
        try:
            yield Sandbox.wrapping(entry.sandbox)
        finally:
            LoopThread.call(self._async._give_back, entry)

    def close(self) -> None:
        """Close every kernel of the pool."""
        LoopThread.run(self._async.close())

    def __enter__(self) -> SandboxPool:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
