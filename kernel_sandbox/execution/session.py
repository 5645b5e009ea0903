"""A session's lifecycle: its options, starting or attaching a kernel, restarting, closing.

:class:`SandboxSession` is the base of :class:`~kernel_sandbox.execution.sandbox.AsyncSandbox`:
it checks the options, starts the kernel (or takes over a live one), connects to it, runs code,
sends the launcher its requests, and removes everything it created when it closes (also at
interpreter exit). How one call travels to the kernel and back is :mod:`.exchange`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import posixpath
import queue
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from ..egress import WINDOW_REQUEST, parse_network
from ..hostsecrets import Secret, secret_values, unsupported
from ..errors import ConfigError, SandboxError
from ..metrics import CgroupProbe, Usage
from ..policy.output import OutputPolicy
from ..results import Execution
from .backend import DEFAULT_BACKEND, kernel_manager
from .adapters import adapter as backend_named
from .checkpoint import Checkpoint, restore_into
from .channel import CHUNK
from .instances import allowed_map
from .limits import DecodeLimits
from .collector import Callback, Collector
from .exchange import DEFAULT_CALL_TIMEOUT, KernelExchange
from .tools import check_env

DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024
"""Bytes of output one call keeps in memory; the rest is dropped as it arrives."""
IOPUB_HWM = 32
TEXT_CHUNK = 1024 * 1024
MAX_WINDOW = 86400.0
LAUNCHER_REPLY_WAIT = 10.0

_S = TypeVar("_S", bound="SandboxSession")
_LIVE: weakref.WeakSet[SandboxSession] = weakref.WeakSet()


def check_keywords(
    *,
    network: Any,
    env: Any,
    mounts: Any,
    max_output_bytes: Any,
    allowed_classes: Any,
    unsafe_pickle: Any,
) -> None:
    """Refuse a session keyword of the wrong type, naming it, before anything reads it: a string
    where a list or a flag belongs is never taken apart or read as true (``network="false"`` would
    be the hosts f, a, l, s, e; ``unsafe_pickle="no"`` would be on)."""
    if not isinstance(network, bool):
        parse_network("network", network)  # a list of destinations, else refused naming network
    if env is not None and not isinstance(env, Mapping):
        raise ConfigError(f"env={env!r}: must be a mapping of variable names to strings")
    if mounts is not None and not isinstance(mounts, (list, tuple)):
        raise ConfigError(f"mounts={mounts!r}: must be a list of 'HOST:CONTAINER[:ro|rw]' mounts")
    if (
        isinstance(max_output_bytes, bool)
        or not isinstance(max_output_bytes, int)
        or max_output_bytes < 1
    ):
        raise ConfigError(
            f"max_output_bytes={max_output_bytes!r}: must be a whole number of bytes from 1"
        )
    if not isinstance(allowed_classes, (list, tuple, set, frozenset)):
        raise ConfigError(
            f"allowed_classes={allowed_classes!r}: must be a list of classes, e.g. [MyResult]"
        )
    if not isinstance(unsafe_pickle, bool):
        raise ConfigError(f"unsafe_pickle={unsafe_pickle!r}: must be True or False")


class SandboxSession(KernelExchange):
    """The session under :class:`~kernel_sandbox.execution.sandbox.AsyncSandbox` (whose docstring
    lists the options): lifecycle, running code, the launcher's requests."""

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
        self._backend = backend_named(backend)
        self._secret_env = secret_values({} if secrets is None else secrets, env or {})
        if self._secret_env:
            if backend != "docker":
                raise unsupported(f"the {backend!r} backend")
            backend_options["secrets"] = [s.binding(n) for n, s in (secrets or {}).items()]
        if restore is not None and not isinstance(restore, Checkpoint):
            raise ConfigError(
                "restore must be a Checkpoint (Checkpoint.load(path) reads one), not "
                f"{type(restore).__name__}"
            )
        self._restore = restore
        for name, value in (
            ("timeout", timeout),
            ("start_timeout", start_timeout),
            ("interrupt_grace", interrupt_grace),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(
                    f"{name} must be a positive number of seconds (float('inf') for no deadline), "
                    f"not {value!r}"
                )
        if decode_limits is not None and not isinstance(decode_limits, DecodeLimits):
            raise ConfigError(
                f"decode_limits must be a DecodeLimits, not {type(decode_limits).__name__}"
            )
        check_keywords(
            network=network,
            env=env,
            mounts=mounts,
            max_output_bytes=max_output_bytes,
            allowed_classes=allowed_classes,
            unsafe_pickle=unsafe_pickle,
        )
        self.backend = backend
        self.network = network if isinstance(network, bool) else list(network)
        self.timeout = float(timeout)
        self.start_timeout = float(start_timeout)
        self.max_output_bytes = max_output_bytes
        self.interrupt_grace = float(interrupt_grace)
        self.allowed_classes = tuple(allowed_classes)
        self._allowed = allowed_map(self.allowed_classes)
        self.decode_limits = decode_limits or DecodeLimits()
        self.unsafe_pickle = unsafe_pickle
        self._policy = None if self._backend.sandboxed else OutputPolicy.from_name(output_policy)
        if output_policy is not None:
            OutputPolicy.from_name(output_policy)
            backend_options["output_policy"] = output_policy
        self._options: dict[str, Any] = {
            "image": image,
            "memory": memory,
            "cpus": cpus,
            "pids_limit": pids_limit,
            "network": self.network,
            "env": dict(env or {}),
            "mounts": list(mounts or []) or None,
            "launch_timeout": start_timeout,
            **backend_options,
        }
        self._backend.check(self._options)
        self._comms = self._backend.comms_known  # tool calls on a comm; else decided in _connect
        self._km: Any = None
        self._closed = False
        self._kc: Any = None
        self._context: zmq.asyncio.Context | None = None
        self._tmp: str | None = None
        self._lock: asyncio.Lock | None = None
        self._channel: str | None = None
        self._installed = False
        self._restarts = 0
        # the helper could not answer: restart the kernel before the next request
        self._unanswered = False
        self._kept_state: str | None = None
        # a per-call environment may still be set in the kernel (a cancelled call)
        self._env_set = False
        self._probe: CgroupProbe | None = None
        self._checked = Usage()  # the counters when limits were last looked at: none yet
        self.work_dir: str = ""
        if not self._backend.sandboxed:
            warnings.warn(
                f"kernel-sandbox backend {backend!r} runs an ordinary local kernel: it is NOT a "
                "sandbox (no isolation, no limits). Use it for development only.",
                stacklevel=2,
            )

    def __repr__(self) -> str:
        state = "started" if self._km is not None else "closed" if self._closed else "not started"
        return (
            f"<{type(self).__name__} backend={self.backend!r} {state} work_dir={self.work_dir!r}>"
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self: _S) -> _S:
        """Start the kernel and wait until it answers; on failure nothing is left behind."""
        if self._km is not None:
            return self
        self._closed = False
        self._lock = asyncio.Lock()
        options = dict(self._options)
        cwd = None
        if not self._backend.sandboxed:
            options.pop("launch_timeout")
            self._tmp = tempfile.mkdtemp(prefix="kernel-sandbox-local-")
            cwd = posixpath.join(self._tmp, "work")
            os.mkdir(cwd)
            options["env"] = {"HOME": self._tmp, **options["env"]}
        spec = self._backend.kernel_spec(options)
        self._km = kernel_manager(spec)
        if self._tmp:
            self._km.transport, self._km.ip = "ipc", posixpath.join(self._tmp, "k")
        _LIVE.add(self)
        try:
            # the launcher reads the secrets' values from its environment; the kernel never sees it
            launch_env = {"env": {**os.environ, **self._secret_env}} if self._secret_env else {}
            await self._km.start_kernel(**({"cwd": cwd} if cwd else {}), **launch_env)
            await self._connect()
            async with self._lock:
                info = await self._open(time.monotonic() + self.start_timeout)
            self.work_dir = info["work"]
            if self._restore is not None:
                await restore_into(self, self._restore)
        except BaseException:
            await self.close()
            raise
        return self

    @classmethod
    async def attach(
        cls: type[_S], kernel_id: str, backend: str = DEFAULT_BACKEND, **options: Any
    ) -> _S:
        """Take over the live sandboxed kernel ``kernel_id`` whose owner (another process) is gone.

        Within the kernel's ``orphan_timeout`` of its owner's end: same container, same variables.
        ``options`` are the session's own (timeouts, limits of results); the kernel keeps the
        settings it was started with. Raises KernelLaunchError when there is no such kernel of
        this user, or its record is refused (:mod:`kernel_sandbox.reattach`).
        """
        from ..reattach import attach, find

        sandbox = cls(backend, **options)
        if sandbox._restore is not None:
            raise ConfigError(
                "attach() takes over a live kernel with its own state; restore= is for a new "
                "sandbox"
            )
        if not sandbox._backend.sandboxed:
            raise ConfigError(f"backend {backend!r} runs no sandboxed kernel to re-attach to")
        record = find(kernel_id)
        spec = sandbox._backend.kernel_spec(sandbox._options)
        provisioner = spec.metadata["kernel_provisioner"]
        if provisioner["provisioner_name"] != record.backend:
            raise ConfigError(
                f"kernel {kernel_id} runs on {record.backend}, not on the {backend!r} backend"
            )
        provisioner["config"] = record.settings
        sandbox._lock = asyncio.Lock()
        sandbox._km = kernel_manager(spec)
        _LIVE.add(sandbox)
        try:
            await attach(kernel_id, sandbox._km)
            await sandbox._connect()
            async with sandbox._lock:
                info = await sandbox._open(time.monotonic() + sandbox.start_timeout)
            sandbox.work_dir = info["work"]
        except BaseException:
            await sandbox.close()  # shuts down only a kernel that was taken over
            raise
        return sandbox

    @property
    def kernel_id(self) -> str | None:
        """The id of the kernel (for :meth:`attach` from another process), once started."""
        return self._km.kernel_id if self._km is not None else None

    async def _connect(self) -> None:
        self._channel, self._installed, self._kept_state, self._env_set = None, False, None, False
        self._context = zmq.asyncio.Context()
        self._context.setsockopt(zmq.RCVHWM, IOPUB_HWM)
        self._kc = self._km.client(context=self._context)
        self._kc.start_channels()
        try:
            await self._kc.wait_for_ready(timeout=self.start_timeout)
        except RuntimeError as exc:
            raise SandboxError(f"The kernel did not become ready: {exc}") from exc
        # the launcher's execd relay has no comms; the websocket mode has
        if not self._backend.comms_known:
            info = await self._kc.kernel_info(reply=True, timeout=self.start_timeout)
            self._comms = self._backend.speaks_comms(info["content"])

    def _disconnect(self) -> None:
        kc, context, self._kc, self._context = self._kc, self._context, None, None
        if kc is not None:
            kc.stop_channels()
        if context is not None:
            context.destroy(linger=0)

    async def restart(self) -> None:
        """Restart the kernel: a fresh interpreter (and, on Docker, a fresh container)."""
        self._restarts += 1
        self._disconnect()
        await self._km.restart_kernel(now=True)
        await self._connect()

    async def interrupt(self) -> None:
        """Interrupt what the kernel runs now (a call its caller cancelled keeps running
        otherwise); the variables are kept."""
        if self._km is not None:
            await self._km.interrupt_kernel()

    async def close(self) -> None:
        """Shut the kernel down and remove everything the sandbox created. Safe to call twice."""
        km, self._km = self._km, None
        self._closed = True
        try:
            self._disconnect()
            if km is not None and km.has_kernel:
                shutdown = asyncio.ensure_future(km.shutdown_kernel(now=True))
                try:
                    await asyncio.shield(shutdown)
                except asyncio.CancelledError:
                    await shutdown  # cancelled, the close still ends the kernel it let go of
                    raise
        finally:
            _LIVE.discard(self)
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    def _kill_now(self) -> None:
        """Last resort without an event loop (garbage collection, interpreter exit)."""
        km, self._km = self._km, None
        with contextlib.suppress(Exception):
            self._backend.kill_now(getattr(km, "provisioner", None))
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __del__(self) -> None:
        if getattr(self, "_km", None) is not None:
            self._kill_now()

    async def __aenter__(self: _S) -> _S:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- running code ----------------------------------------------------------------------

    async def run(
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
        """Run ``code``; errors in it are returned in ``Execution.error``, not raised.

        Callbacks (plain or async) are called while the code runs. On timeout the kernel is
        interrupted; if it does not stop within ``interrupt_grace`` it is restarted and
        ``Execution.state_lost`` is True. The session stays usable either way. ``env`` sets
        environment variables for this run only; the values never appear in the cell.
        """
        callbacks = {
            "on_stdout": on_stdout,
            "on_stderr": on_stderr,
            "on_result": on_result,
            "on_error": on_error,
        }
        values = check_env(env)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            if self._env_set:
                await self._restore_env(Execution())
            if values:
                self._env_set = True  # until it is taken away again, even if this call is cancelled
                await self._op(
                    {"op": "env", "action": "set"}, [json.dumps(values).encode()], seconds, deadline
                )
            collector = Collector(self.max_output_bytes, callbacks, policy=self._policy)
            execution = await self._exchange(
                lambda: self._send_execute(code, store_history=True),
                collector,
                seconds,
                deadline,
                reply=True,
            )
            if values and not execution.state_lost:
                await self._restore_env(execution)
        return execution

    def _chunk(self) -> int:
        return CHUNK if self._comms else TEXT_CHUNK

    async def _simple(self, op: str, timeout: float | None, **params: Any) -> Any:
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            return await self._op({"op": op, **params}, (), seconds, deadline)

    async def _launcher_request(
        self,
        content: dict[str, Any],
        msg_type: str = WINDOW_REQUEST,
        wait: float = LAUNCHER_REPLY_WAIT,
    ) -> dict[str, Any]:
        """Send a request to the launcher on the control channel and wait up to ``wait`` s for its
        reply (an egress window by default)."""
        msg = self._kc.session.msg(msg_type, content)
        self._kc.control_channel.send(msg)
        until = time.monotonic() + min(wait, MAX_WINDOW)
        while (left := until - time.monotonic()) > 0:
            try:
                reply = await self._kc.control_channel.get_msg(timeout=left)
            except queue.Empty:
                break
            if reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]:
                answer = reply.get("content")
                return answer if isinstance(answer, dict) else {}
        return {}


def stop_launchers() -> None:
    """Tell the launcher of every sandbox this process started to end now, without waiting (SIGTERM:
    each removes its container or sandbox, whatever happens to this process next), as the MCP
    server's SIGTERM handler does; a kernel taken over with ``attach()`` is left to its
    ``orphan_timeout``."""
    for sandbox in list(_LIVE):
        process = getattr(getattr(sandbox._km, "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            process.terminate()


@atexit.register
def _kill_leftovers() -> None:
    for sandbox in list(_LIVE):
        sandbox._kill_now()
