"""Sessions on a sandboxed kernel: run code, move files, install packages, call tools, run skills.

The public API (:class:`AsyncSandbox`): its lifecycle, options and calls. How one call travels
to the kernel and back, with its deadline and retries, is :mod:`.exchange`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import queue
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import IO, Any

import zmq
import zmq.asyncio

from ..egress import WINDOW_REQUEST, parse_network
from ..hostsecrets import Secret, read_uses, secret_values, unsupported
from ..errors import (
    ConfigError,
    FramingError,
    KernelLaunchError,
    MetricsUnavailable,
    NetworkDisabledError,
    PathError,
    SandboxError,
    SandboxFileError,
)
from ..metrics import CgroupProbe, Usage, near_misses
from ..privdir import SUSPEND_REQUEST, WAKE_REQUEST, sleeping
from ..policy.output import OutputPolicy
from ..kernelside.toolhost import STATE_NOT_KEPT
from ..results import Execution, ExecutionError, FileInfo, KernelDied, ToolResult
from .backend import DEFAULT_BACKEND, kernel_manager
from .adapters import adapter as backend_named
from .checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, Checkpoint, restore_into, take
from .channel import CHUNK
from .decode import DecodeLimits, allowed_map
from .files import (
    MAX_FILE_BYTES,
    MAX_SKILL_FILES_BYTES,
    MAX_STREAM_BYTES,
    NO_LIMIT,
    Content,
    Gathered,
    chunks,
    confine,
)
from .collector import Callback, Collector
from .exchange import DEFAULT_CALL_TIMEOUT, REPLY_GRACE, KernelExchange
from .skills import (
    Encoder,
    failed_skill,
    figure_files,
    file_entry,
    largest_encodable,
    skill_result,
)
from .tools import body_error, check_env, tool_payload

DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024
"""Bytes of output one call keeps in memory; the rest is dropped as it arrives."""
PIP_OUTPUT_TAIL = 64 * 1024
IOPUB_HWM = 32
TEXT_CHUNK = 1024 * 1024
KEEP_STATE_BYTES = 64 * 1024
MAX_WINDOW = 86400.0
PIP_RETRIES = ("--retries", "5")
"""pip's own default, given explicitly: a kernel with the network off has ``PIP_RETRIES=1``."""
LAUNCHER_REPLY_WAIT = 10.0


_LIVE: weakref.WeakSet[AsyncSandbox] = weakref.WeakSet()


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


class AsyncSandbox(KernelExchange):
    """A kernel in a sandbox (``docker``, ``opensandbox`` or ``local``), used with ``async with``.

    Options: ``image``, ``memory`` ("512m"), ``cpus``, ``pids_limit``, ``network`` (off by default;
    True, or a list of destinations such as ``["api.example.com"]``), ``env``, ``mounts``
    ("HOST:CONTAINER[:ro|rw]"), ``timeout`` (seconds every call may take by default: 300;
    ``float("inf")`` for none), ``start_timeout``, ``max_output_bytes``, ``interrupt_grace``
    (seconds an interrupted call gets to stop before the kernel is restarted), ``allowed_classes``
    (classes whose instances tool results may hold), ``decode_limits`` (:class:`DecodeLimits` for
    tool results), ``unsafe_pickle`` (decode values the data format cannot carry from pickles: off,
    see the README), ``output_policy`` (``strict``, the default, or ``trusted``), ``restore`` (a
    :class:`Checkpoint` the new kernel loads at start: same image only), ``secrets`` (Docker: a
    mapping of variable name to :class:`Secret`, whose value the egress proxy adds to requests to
    its hosts while the kernel sees a placeholder); any other keyword goes to
    the backend's provisioner config. Docker and OpenSandbox options are checked here, before
    anything starts.
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

    async def start(self) -> AsyncSandbox:
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
        cls, kernel_id: str, backend: str = DEFAULT_BACKEND, **options: Any
    ) -> AsyncSandbox:
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

    async def pause(self) -> None:
        """Pause the sandbox (opensandbox backend): it keeps its memory and runs nothing until
        :meth:`resume`.

        Calls made while it is paused wait (their deadlines still count); the kernel is not dead.
        """
        self._deadline(None)
        await self._backend.pause(self._km.provisioner, True)

    async def resume(self) -> None:
        """Resume a paused sandbox and wait until it runs again."""
        self._deadline(None)
        await self._backend.pause(self._km.provisioner, False)

    async def suspend(self) -> None:
        """Put the kernel to sleep now (Docker, started with ``suspend_after``): its variables are
        checkpointed on the host and its container removed; the next call, or :meth:`wake`, wakes
        it in a new container with them.

        Raises :class:`SandboxError` saying why when it stays awake (names its checkpoint would
        leave behind without ``suspend_lossy``, a checkpoint over its cap...): it then runs on.
        """
        await self._sleep_request(SUSPEND_REQUEST)

    async def wake(self) -> None:
        """Wake a sleeping kernel now and wait until it runs with its variables again (nothing
        when it is awake); raises :class:`KernelLaunchError` naming the reason (and where its
        checkpoint is kept) when it cannot: the kernel has then ended, and the next call says
        so."""
        await self._sleep_request(WAKE_REQUEST)

    async def _sleep_request(self, msg_type: str) -> None:
        self._deadline(None)
        if getattr(self._km.provisioner.settings(), "suspend_after", None) is None:
            raise ConfigError(
                "suspend() and wake() need a kernel that may sleep: start the Sandbox with "
                "suspend_after (seconds of idleness before it sleeps by itself, e.g. 1800)"
            )
        assert self._lock is not None
        async with self._lock:
            reply = await self._launcher_request({}, msg_type, self.timeout)
        if reply.get("status") != "ok":
            why = reply.get("evalue") or "the launcher did not answer"
            if msg_type == WAKE_REQUEST:
                raise KernelLaunchError(f"The kernel could not wake: {why}")
            raise SandboxError(f"The kernel was not suspended: {why}")
        self._channel, self._installed = None, False  # the helper is opened again in the new kernel

    async def close(self) -> None:
        """Shut the kernel down and remove everything the sandbox created. Safe to call twice."""
        km, self._km = self._km, None
        self._closed = True
        try:
            self._disconnect()
            if km is not None and km.has_kernel:
                await km.shutdown_kernel(now=True)
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

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- usage -------------------------------------------------------------------------------

    async def metrics(self) -> Usage:
        """The sandbox's usage against its limits now, read by the host (never asked of the kernel).

        Raises :class:`MetricsUnavailable` where the host cannot read it (a remote engine, or a
        backend without such figures: ``opensandbox``, ``local``).
        """
        if self._km is None:
            raise MetricsUnavailable("the sandbox is not started")
        return await asyncio.to_thread(self._sample)

    def _sample(self) -> Usage:
        """One sample from the kernel's current container (found again after a restart)."""
        provisioner = self._km.provisioner if self._km is not None else None
        private = getattr(provisioner, "private", None)
        if private is not None and sleeping(private.path):
            return Usage(memory=0, source="launcher", state="suspended")
        probe = self._probe
        if probe is None or probe.container_id != getattr(provisioner, "container_id", None):
            probe = self._probe = self._backend.probe(provisioner)
            self._checked = Usage()
        usage = probe.read()
        held = read_uses(getattr(getattr(provisioner, "private", None), "path", None))
        return dataclasses.replace(usage, secrets=held) if held else usage

    async def _name_limits(self, error: ExecutionError | None) -> None:
        """Say in ``error`` which limits the kernel hit since they were last looked at, as the host
        reads them."""
        if error is not None and not isinstance(error, KernelDied):
            try:
                usage = await asyncio.to_thread(self._sample)
            except MetricsUnavailable:
                return
            checked, self._checked = self._checked, usage
            notes = near_misses(checked, usage, error.value)
            if notes:
                error.value = f"{error.value} [kernel-sandbox: {'; '.join(notes)}]"

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

    # -- files -----------------------------------------------------------------------------

    def _chunk(self) -> int:
        return CHUNK if self._comms else TEXT_CHUNK

    async def upload(
        self, files: Mapping[str, Content], *, timeout: float | None = None
    ) -> list[str]:
        """Write ``{path: content}`` under the work directory; returns the relative paths written.

        Content is ``bytes``/``str``, a host path (``pathlib.Path``) or a binary file object;
        it moves in chunks, so a file larger than memory is fine.
        """
        targets = []
        for path, content in files.items():
            rel = confine(path, self.work_dir)
            if rel == ".":
                raise PathError(f"{path!r} names the work directory itself, not a file")
            targets.append((rel, content))
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            for rel, content in targets:
                offset = 0
                for piece in chunks(content, self._chunk()):
                    request = {"op": "write", "path": rel, "offset": offset}
                    size = await self._op(request, [piece], seconds, deadline)
                    offset += len(piece)
                    if size != offset:
                        raise SandboxFileError(
                            f"{rel!r} changed in the sandbox while it was being written"
                        )
        return sorted(rel for rel, _ in targets)

    async def _read(
        self,
        path: str,
        sink: Callable[[bytes], Any],
        limit: int,
        limit_name: str,
        timeout: float | None,
        sized: Callable[[int], Any] | None = None,
    ) -> int:
        """Pass the file's chunks to ``sink``; refuse it, before ``sink`` sees a byte over it, past
        ``limit``. ``sized`` is told the size the kernel states (within ``limit``) before the first
        chunk.

        The limit is the host's: the size the kernel states is checked against it, and so is every
        byte that arrives (a kernel that patched its helper states what it likes).
        """
        rel = confine(path, self.work_dir)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        offset, total = 0, None
        async with self._lock:
            while total is None or offset < total:
                request = {"op": "read", "path": rel, "offset": offset, "size": self._chunk()}
                size, data = await self._op(request, (), seconds, deadline)
                if total is None:
                    total = size
                if type(size) is not int or size != total or not isinstance(data, bytes):
                    raise SandboxFileError(
                        f"{rel!r} changed in the sandbox while it was being read"
                    )
                if total > limit or offset + len(data) > limit:
                    raise SandboxFileError(
                        f"Refused {rel!r}: it is {max(total, offset + len(data))} bytes, over the "
                        f"limit of {limit} bytes ({limit_name}); nothing past the limit was kept."
                    )
                if len(data) != min(self._chunk(), total - offset):
                    raise SandboxFileError(
                        f"{rel!r} changed in the sandbox while it was being read"
                    )
                if offset == 0 and sized is not None:
                    sized(total)
                sink(data)
                offset += len(data)
        return offset

    async def download(self, path: str, *, timeout: float | None = None) -> bytes:
        """Read a file of the work directory into memory (up to 256 MiB; see
        :meth:`download_to`)."""
        return await self._download(
            path, MAX_FILE_BYTES, "download's ceiling; download_to streams larger files", timeout
        )

    async def _download(
        self, path: str, limit: int, limit_name: str, timeout: float | None
    ) -> bytes:
        gathered = Gathered()
        await self._read(path, gathered.write, limit, limit_name, timeout, gathered.reserve)
        return gathered.value()

    async def download_to(
        self,
        path: str,
        destination: str | os.PathLike[str] | IO[bytes],
        *,
        timeout: float | None = None,
        max_bytes: int | None = MAX_STREAM_BYTES,
    ) -> int:
        """Stream a file of the work directory to a host path or binary file; returns its size.

        A file over ``max_bytes`` (2 GiB by default; None for no limit) is refused before anything
        is written: the kernel decides how big its files claim to be (a sparse file costs it
        nothing). A destination path is removed again if the download fails.
        """
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
        ):
            raise ConfigError(f"max_bytes must be a number of bytes or None, not {max_bytes!r}")
        limit = NO_LIMIT if max_bytes is None else max_bytes
        if not isinstance(destination, (str, os.PathLike)):
            return await self._read(
                path, destination.write, limit, f"max_bytes={max_bytes}", timeout
            )
        try:
            with open(destination, "wb") as handle:
                return await self._read(
                    path, handle.write, limit, f"max_bytes={max_bytes}", timeout
                )
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(destination)
            raise

    async def list_files(self, path: str = ".", *, timeout: float | None = None) -> list[FileInfo]:
        """List a directory of the work directory (symlinks are listed, not followed)."""
        rel = confine(path, self.work_dir)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            entries = await self._op({"op": "list", "path": rel}, (), seconds, deadline)
        return [FileInfo(*entry) for entry in entries]

    async def _simple(self, op: str, timeout: float | None, **params: Any) -> Any:
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            return await self._op({"op": op, **params}, (), seconds, deadline)

    # -- packages --------------------------------------------------------------------------

    async def install(
        self,
        requirements: str | Iterable[str],
        *,
        pip_args: Iterable[str] = (),
        timeout: float | None = None,
    ) -> Execution:
        """pip-install ``requirements`` (names, or requirements.txt text) inside the sandbox.

        Packages go to a directory under the sandbox's home that is put on ``sys.path`` (Docker: a
        tmpfs of ``packages_size`` where compiled extensions load). The outcome is returned: pip's
        output in stdout/stderr, ``error`` set when pip failed, naming what the launcher's proxy
        refused and the option that allows it. With the
        network off (or a list) the backend opens the ``package_index`` for this call alone (Docker:
        in the launcher's proxy; OpenSandbox: in the sandbox's egress policy, by the host) and
        closes it when pip ends, also on error, timeout or cancel; when it cannot,
        :class:`NetworkDisabledError` says why, without running pip.
        """
        self._check_package_index()
        text = requirements if isinstance(requirements, str) else "\n".join(requirements)
        seconds, deadline = self._deadline(timeout)
        # a network-off kernel's pip does not retry; this one may
        pip_args = [*PIP_RETRIES, *pip_args]
        request = {
            "op": "install",
            "requirements": text,
            "pip_args": pip_args,
            "tail": PIP_OUTPUT_TAIL,
        }
        assert self._lock is not None
        async with self._lock, self._package_index(seconds):
            body = await self._op(request, (), seconds, deadline)
        refused = [str(reason) for reason in body.get("refused", ())]
        stderr = body["stderr"] + "".join(f"[kernel-sandbox] {reason}\n" for reason in refused)
        execution = Execution(stdout=body["stdout"], stderr=stderr)
        if body["returncode"] != 0:
            why = f"pip exited with code {body['returncode']}"
            execution.error = ExecutionError(
                "InstallError", "; ".join([why, *refused]), execution.stderr
            )
        return execution

    def _check_package_index(self) -> None:
        """Refuse at once an install that cannot reach any index: network off on a backend without
        windows."""
        if self.network is False and self._backend.sandboxed and not self._backend.package_window:
            raise NetworkDisabledError(
                f"Cannot install packages: this sandbox's network is off and the {self.backend} "
                "backend cannot open the package index for one call. Create it with the index in "
                "its network list (e.g. Sandbox(network=['pypi.org', 'files.pythonhosted.org'])) "
                "or network=True."
            )

    def _package_index(self, seconds: float) -> contextlib.AbstractAsyncContextManager[None]:
        """The backend's window on the package index for one call of at most ``seconds`` (plus a
        grace)."""
        if self.network is True or not self._backend.sandboxed:
            return contextlib.nullcontext()
        window = min(seconds + REPLY_GRACE, MAX_WINDOW)
        return self._backend.index_window(self._km.provisioner, self._launcher_request, window)

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

    # -- tools -----------------------------------------------------------------------------

    async def run_tool(
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
        """Call ``tool`` (a function, or its source with ``name``) in the kernel with ``args``.

        A tool with an ``agent_state`` parameter receives ``agent_state`` and its changes come back.
        What comes back is data only (see :mod:`.decode`): instances are rebuilt for the
        ``allowed_classes`` (and the sandbox's), anything else raises :class:`UnsafePayloadError`.
        ``env`` sets environment variables for this call only; ``secrets`` (Docker) binds
        :class:`Secret` values for this call only: the tool sees placeholders, the egress proxy
        fills them in toward the secrets' hosts until the call ends. ``status`` is ``"success"``
        only if the tool returned, exactly one answer came, and the host saw the call end in time
        (an answer followed by a timeout, a death or a failed cell is an error).
        """
        values = check_env(env)
        if secrets:
            secret_values(secrets, values)
            if self.backend != "docker":
                raise unsupported(f"the {self.backend!r} backend")
            if self.network is True:
                raise ConfigError(
                    "run_tool: secrets need the filtering proxy, which network=True bypasses: "
                    "give the sandbox's network a list of destinations (or False: a call's "
                    "secrets' hosts are allowed for the call anyway)"
                )
        allowed = {**self._allowed, **allowed_map(allowed_classes)}
        seconds, deadline = self._deadline(timeout)
        async with self._call_secrets(secrets or {}, seconds) as placeholders:
            call, state = tool_payload(tool, args, agent_state, name, {**values, **placeholders})
            return await self._call_tool(call, state, agent_state, allowed, seconds, deadline)

    @contextlib.asynccontextmanager
    async def _call_secrets(
        self, secrets: Mapping[str, Secret], seconds: float
    ) -> AsyncIterator[dict[str, str]]:
        """Bind ``secrets`` in the launcher's proxy for one call (at most ``seconds`` and a grace),
        yielding the call's variables; unbound after it, also on error, timeout or cancel."""
        if not secrets:
            yield {}
            return
        window = min(seconds + REPLY_GRACE, MAX_WINDOW)
        bind = [secret.for_call(name) for name, secret in secrets.items()]
        reply = await self._launcher_request({"bind": bind, "seconds": window})
        if reply.get("status") != "ok":
            raise SandboxError(
                "run_tool: the launcher did not bind the call's secrets "
                f"({reply.get('evalue', 'no answer')}); the tool was not called"
            )
        try:
            yield dict(reply["env"])
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._launcher_request({"close": reply["window"]}))

    async def _call_tool(
        self,
        call: bytes,
        state: bytes,
        agent_state: Any,
        allowed: dict[str, type],
        seconds: float,
        deadline: float,
    ) -> ToolResult:
        keep = len(state) >= KEEP_STATE_BYTES
        digest = hashlib.sha256(state).hexdigest() if keep else None
        assert self._lock is not None
        async with self._lock:
            for _ in range(2):
                send_state = not keep or digest != self._kept_state
                request = {
                    "op": "call",
                    "length": len(call),
                    "pickle": self.unsafe_pickle,
                    "state": {"length": len(state), "digest": digest, "keep": keep},
                }
                body, execution = await self._request(
                    request,
                    [call, state] if send_state else [call],
                    seconds,
                    deadline,
                    limits=self.decode_limits,
                    allowed=allowed,
                    allow_pickle=self.unsafe_pickle,
                )
                if not send_state and isinstance(body, dict) and body.get(STATE_NOT_KEPT) is True:
                    self._kept_state = None
                    continue
                self._kept_state = (
                    digest if keep and body is not None and not execution.state_lost else None
                )
                break
        result = ToolResult(
            "error",
            stdout=execution.stdout,
            stderr=execution.stderr,
            state_lost=execution.state_lost,
            truncated_bytes=execution.truncated_bytes,
        )
        if body is None:
            result.error = execution.error
            return result
        if not isinstance(body, dict) or not ("r" in body or "error" in body):
            raise FramingError("The tool call's answer holds neither a return value nor an error.")
        result.error = body_error(body)
        if execution.error is None:
            await self._name_limits(result.error)
        if result.error is None:
            result.status = "success"
            result.func_return = body["r"]
            result.agent_state = body.get("s", agent_state)
        return result

    # -- skills ----------------------------------------------------------------------------

    async def run_skill(
        self,
        code: str,
        skill_files: Mapping[str, bytes | str] | None = None,
        requirements: str | Iterable[str] | None = None,
        *,
        timeout: float | None = None,
        max_files_bytes: int = MAX_SKILL_FILES_BYTES,
    ) -> dict[str, Any]:
        """Run skill ``code`` next to ``skill_files`` (LiteLLM's skills executor contract).

        Returns ``{"success", "output", "error", "files"}``; ``files`` holds the files the code
        created or changed in the work directory (not the unchanged skill files) and the images it
        displayed (``figure_1.png``...), each ``{"name", "path", "content_base64", "mime_type"}``.
        The files together may hold ``max_files_bytes`` (256 MiB by default) of base64 text, what
        the answer holds (4/3 of their bytes), counted as they arrive; past it the run fails with an
        error naming the limit.
        """
        if (
            isinstance(max_files_bytes, bool)
            or not isinstance(max_files_bytes, int)
            or max_files_bytes < 0
        ):
            raise ConfigError(f"max_files_bytes must be a number of bytes, not {max_files_bytes!r}")
        try:
            if skill_files:
                await self.upload(skill_files, timeout=timeout)
            if requirements:
                installed = await self.install(requirements, timeout=timeout)
                if installed.error is not None:
                    return failed_skill(installed.stdout, installed.stderr)
            before = await self._simple("snapshot", timeout)
            await self._simple("prepare", timeout)
            execution = await self.run(code, timeout=timeout)
            after = await self._simple("snapshot", timeout)
            files, room = [], max_files_bytes
            for path in sorted(after):
                if before.get(path) != after[path]:
                    limit = min(largest_encodable(room), MAX_FILE_BYTES)
                    name = (
                        f"max_files_bytes={max_files_bytes} of base64, {room} left"
                        if limit < MAX_FILE_BYTES
                        else "download's ceiling"
                    )
                    encoder = Encoder()
                    try:
                        await self._read(path, encoder.write, limit, f"run_skill's {name}", timeout)
                        text = encoder.text()
                    finally:
                        encoder.close()
                    room -= len(text)
                    files.append(file_entry(path, text))
            files += figure_files(execution.results)
        except SandboxError as exc:
            return failed_skill("", str(exc))
        return skill_result(execution, files)

    async def checkpoint(
        self, *, max_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES, timeout: float | None = None
    ) -> Checkpoint:
        """The kernel's state as a :class:`Checkpoint`, for ``AsyncSandbox(restore=...)`` in a new
        kernel.

        The kernel pickles the names the user defined and packs the work directory's files; the host
        keeps the blob unopened. Names that cannot be pickled are in ``not_saved`` with why. A blob
        over ``max_bytes`` (1 GiB by default) is refused (:class:`CheckpointError`) before it is
        pulled.
        """
        return await take(self, max_bytes, timeout)

    async def reset(self) -> None:
        """Fresh interpreter and an empty work directory, for a pool's next user."""
        await self.restart()
        await self._simple("wipe", None)


@atexit.register
def _kill_leftovers() -> None:
    for sandbox in list(_LIVE):
        sandbox._kill_now()
