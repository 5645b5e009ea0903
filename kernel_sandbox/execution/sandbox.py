"""Sessions on a sandboxed kernel: run code, move files, install packages, call tools, run skills."""

from __future__ import annotations

import asyncio
import atexit
import base64
import hashlib
import inspect
import mimetypes
import os
import posixpath
import queue
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from .backends import BACKENDS, kernel_manager, kernel_spec
from .files import FILES_SRC, MAX_FILE_BYTES, confine
from .models import (
    Execution,
    ExecutionError,
    FileInfo,
    NetworkDisabledError,
    PathError,
    SandboxError,
    SandboxFileError,
    ToolResult,
)
from .tools import (
    CHANNEL_LOST,
    CHANNEL_SRC,
    JSON_MAIN,
    TOOL_CHANNEL_MAIN,
    TOOL_SRC,
    TOOL_TEXT_MAIN,
    ChannelFrames,
    decode_value,
    extract_frame,
    helper_key,
    kernel_call,
    tool_error,
    tool_params,
)

DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024
PIP_OUTPUT_TAIL = 64 * 1024
INLINE_PAYLOAD_BYTES = 32 * 1024
LIVENESS_INTERVAL = 1.0
T = TypeVar("T")
Callback = Callable[[Any], Any] | None
IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg"}

WORK_DIR_SRC = r'''
def _main_dict():
    import os
    return {"work": os.path.realpath(os.getcwd())}
'''

PREPARE_SRC = r'''
def _main_dict():
    import os, sys
    os.chdir(_work)
    if _work not in sys.path:
        sys.path.insert(0, _work)
    return {}
'''

WIPE_SRC = r'''
def _main_dict():
    import os, shutil
    for entry in os.scandir(_work):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)
    return {}
'''

INSTALL_SRC = r'''
def _main_dict():
    import importlib, os, subprocess, sys, tempfile
    target = os.path.join(os.path.expanduser("~"), ".local", "kernel-sandbox-packages")
    os.makedirs(target, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(_requirements)
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           "--target", target, "-r", handle.name, *_pip_args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_work)
    finally:
        os.unlink(handle.name)
    if proc.returncode == 0:
        if target not in sys.path:
            sys.path.insert(0, target)
        importlib.invalidate_caches()
    return {"returncode": proc.returncode, "stdout": proc.stdout[-_tail:], "stderr": proc.stderr[-_tail:]}
'''


async def _call(callback: Callback, value: Any) -> None:
    if callback is not None:
        outcome = callback(value)
        if inspect.isawaitable(outcome):
            await outcome


class _Collector:
    """Gather one execution's messages, keeping at most ``cap`` bytes of output in memory.

    With a ``marker``, text frames carrying it are exempt from the cap. Messages on the tool
    ``channel`` (a comm id) go to ``channel_frames``, never to the output.
    """

    def __init__(
        self,
        cap: int,
        callbacks: dict[str, Callback],
        marker: str | None = None,
        channel: str | None = None,
    ) -> None:
        self.execution = Execution()
        self.cap = cap
        self.used = 0
        self.callbacks = callbacks
        self.marker = marker
        self.frame_prefix = None if marker is None else f"BEGIN-{marker} "
        self.channel = channel
        self.channel_frames = ChannelFrames(marker or "")
        self._stdout: list[str] = []
        self._stderr: list[str] = []

    def _admit(self, size: int) -> bool:
        if self.used + size > self.cap:
            self.execution.truncated_bytes += size
            return False
        self.used += size
        return True

    def _fit(self, text: str) -> str:
        """Keep the part of ``text`` that fits under the cap; count the rest as dropped."""
        size = len(text.encode("utf-8", "replace"))
        room = self.cap - self.used
        if size <= room:
            self.used += size
            return text
        kept = text.encode("utf-8", "replace")[: max(room, 0)].decode("utf-8", "ignore")
        kept_size = len(kept.encode("utf-8"))
        self.used += kept_size
        self.execution.truncated_bytes += size - kept_size
        return kept

    async def handle(self, msg: dict[str, Any]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text = self._fit(content.get("text", ""))
            if text:
                is_err = content.get("name") == "stderr"
                (self._stderr if is_err else self._stdout).append(text)
                await _call(self.callbacks["on_stderr" if is_err else "on_stdout"], text)
        elif kind in ("execute_result", "display_data"):
            bundle = dict(content.get("data", {}))
            size = sum(len(value) if isinstance(value, str) else len(str(value)) for value in bundle.values())
            main = kind == "execute_result"
            text = bundle.get("text/plain")
            is_frame = self.frame_prefix is not None and isinstance(text, str) and text.startswith(self.frame_prefix)
            if is_frame or self._admit(size):
                self.execution.results.append(bundle)
                if main:
                    self.execution.main_result = bundle
                await _call(self.callbacks["on_result"], bundle)
        elif kind == "error":
            error = ExecutionError(
                content.get("ename", ""), content.get("evalue", ""), "\n".join(content.get("traceback", []))
            )
            self.execution.error = error
            await _call(self.callbacks["on_error"], error)
        elif kind == "execute_input":
            self.execution.execution_count = content.get("execution_count")
        elif kind == "comm_msg" and self.channel is not None and content.get("comm_id") == self.channel:
            data = content.get("data")
            if isinstance(data, dict):
                self.channel_frames.add(data, msg.get("buffers") or [])

    async def finish(self) -> Execution:
        execution = self.execution
        if execution.truncated_bytes:
            note = (
                f"\n[output truncated: {execution.truncated_bytes} bytes over the cap of "
                f"{self.cap} bytes (max_output_bytes)]\n"
            )
            self._stdout.append(note)
            await _call(self.callbacks["on_stdout"], note)
        execution.stdout = "".join(self._stdout)
        execution.stderr = "".join(self._stderr)
        return execution


_LIVE: weakref.WeakSet[AsyncSandbox] = weakref.WeakSet()


class AsyncSandbox:
    """A kernel in a sandbox (``docker``, ``opensandbox`` or ``local``), used with ``async with``.

    Options: ``image``, ``memory`` ("512m"), ``cpus``, ``pids_limit``, ``network`` (off by
    default), ``env``, ``mounts`` ("HOST:CONTAINER[:ro|rw]"), ``timeout`` (default seconds per
    ``run``), ``start_timeout``, ``max_output_bytes``, ``interrupt_grace`` (seconds an interrupted
    run gets to stop before the kernel is restarted), ``allowed_classes`` (extra types pickled
    tool results may contain); any other keyword goes to the backend's provisioner config.
    """

    def __init__(
        self,
        backend: str = "docker",
        *,
        image: str | None = None,
        memory: str | None = None,
        cpus: float | None = None,
        pids_limit: int | None = None,
        network: bool = False,
        env: Mapping[str, str] | None = None,
        mounts: Iterable[str] | None = None,
        timeout: float | None = None,
        start_timeout: float = 60.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        interrupt_grace: float = 3.0,
        allowed_classes: Iterable[type] = (),
        **backend_options: Any,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"Unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.network = network
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.max_output_bytes = max_output_bytes
        self.interrupt_grace = interrupt_grace
        self.allowed_classes = tuple(allowed_classes)
        self._options: dict[str, Any] = {
            "image": image, "memory": memory, "cpus": cpus, "pids_limit": pids_limit,
            "network": network, "env": dict(env or {}), "mounts": list(mounts or []) or None,
            "launch_timeout": start_timeout, **backend_options,
        }
        self._km: Any = None
        self._kc: Any = None
        self._tmp: str | None = None
        self._lock: asyncio.Lock | None = None
        self._cached_helpers: set[str] = set()
        self._channel: str | None = None
        self.work_dir: str = ""
        if backend == "local":
            warnings.warn(
                "kernel-sandbox backend 'local' runs an ordinary local kernel: it is NOT a sandbox "
                "(no isolation, no limits). Use it for development only.",
                stacklevel=2,
            )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> AsyncSandbox:
        """Start the kernel and wait until it answers; on failure nothing is left behind."""
        if self._km is not None:
            return self
        self._lock = asyncio.Lock()
        options = dict(self._options)
        cwd = None
        if self.backend == "local":
            options.pop("launch_timeout")
            self._tmp = tempfile.mkdtemp(prefix="kernel-sandbox-local-")
            cwd = posixpath.join(self._tmp, "work")
            os.mkdir(cwd)
            options["env"] = {"HOME": self._tmp, **options["env"]}
        spec = kernel_spec(self.backend, options)
        self._km = kernel_manager(spec)
        if self._tmp:
            self._km.transport, self._km.ip = "ipc", posixpath.join(self._tmp, "k")
        _LIVE.add(self)
        try:
            await self._km.start_kernel(**({"cwd": cwd} if cwd else {}))
            await self._connect()
            body = await self._internal(WORK_DIR_SRC, {}, self.start_timeout)
            self.work_dir = body["work"]
        except BaseException:
            await self.close()
            raise
        return self

    async def _connect(self) -> None:
        self._cached_helpers.clear()
        self._channel = None
        self._kc = self._km.client()
        self._kc.start_channels()
        try:
            await self._kc.wait_for_ready(timeout=self.start_timeout)
        except RuntimeError as exc:
            raise SandboxError(f"The kernel did not become ready: {exc}") from exc

    async def restart(self) -> None:
        """Restart the kernel: a fresh interpreter (and, on Docker, a fresh container)."""
        if self._kc is not None:
            self._kc.stop_channels()
        await self._km.restart_kernel(now=True)
        await self._connect()

    async def close(self) -> None:
        """Shut the kernel down and remove everything the sandbox created. Safe to call twice."""
        km, kc, self._km, self._kc = self._km, self._kc, None, None
        try:
            if kc is not None:
                kc.stop_channels()
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
        provisioner = getattr(km, "provisioner", None)
        try:
            if getattr(provisioner, "container_id", None):
                from ..containers import docker_client, remove_container

                client = docker_client()
                remove_container(client.containers.get(provisioner.container_id))
            process = getattr(provisioner, "process", None)
            if process is not None and process.poll() is None:
                process.kill()
        except Exception:
            pass
        private = getattr(provisioner, "private", None)
        for path in (getattr(private, "path", None), self._tmp):
            if path:
                shutil.rmtree(path, ignore_errors=True)

    def __del__(self) -> None:
        if getattr(self, "_km", None) is not None:
            self._kill_now()

    async def __aenter__(self) -> AsyncSandbox:
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
    ) -> Execution:
        """Run ``code``; errors in it are returned in ``Execution.error``, not raised.

        Callbacks (plain or async) are called while the code runs. On timeout the kernel is
        interrupted; if it does not stop within ``interrupt_grace`` it is restarted and
        ``Execution.state_lost`` is True. The session stays usable either way.
        """
        callbacks = {"on_stdout": on_stdout, "on_stderr": on_stderr, "on_result": on_result, "on_error": on_error}
        collector = _Collector(self.max_output_bytes, callbacks)
        return await self._execute(code, timeout, collector, store_history=True)

    async def _execute(
        self,
        code: str,
        timeout: float | None,
        collector: _Collector,
        *,
        store_history: bool = False,
        comm_msg: tuple[dict[str, Any], bytes] | None = None,
    ) -> Execution:
        """Run ``code``, gathering into ``collector``; ``comm_msg`` (content, buffer) is sent just before."""
        if self._km is None or self._lock is None:
            raise SandboxError("The sandbox is not started (use `async with` or `await start()`)")
        timeout = self.timeout if timeout is None else timeout
        async with self._lock:
            if comm_msg is not None:
                content, buffer = comm_msg
                self._kc.session.send(
                    self._kc.shell_channel.socket, self._kc.session.msg("comm_msg", content), buffers=[buffer]
                )
            msg_id = self._kc.execute(code, store_history=store_history, allow_stdin=False, stop_on_error=False)
            deadline = None if timeout is None else time.monotonic() + timeout
            outcome = await self._collect(msg_id, collector, deadline)
            execution = collector.execution
            if outcome == "timeout":
                await self._km.interrupt_kernel()
                outcome = await self._collect(msg_id, collector, time.monotonic() + self.interrupt_grace)
                lost = outcome != "idle"
                action = "restarted (state lost)" if lost else "interrupted"
                execution.error = ExecutionError(
                    "TimeoutError",
                    f"Execution exceeded the timeout of {timeout:g} s; the kernel was {action}.",
                    execution.error.traceback if execution.error else "",
                )
                if lost:
                    await self._recover(execution)
                else:
                    await self._drain_reply(msg_id, execution)
            elif outcome == "died":
                reason = getattr(self._km.provisioner, "exit_reason", None) or "the kernel process ended"
                execution.error = ExecutionError(
                    "KernelDied", f"The kernel died ({reason}); it was restarted and its state is lost."
                )
                await self._recover(execution)
            else:
                await self._drain_reply(msg_id, execution)
            return await collector.finish()

    async def _collect(self, msg_id: str, collector: _Collector, deadline: float | None) -> str:
        """Handle iopub messages of ``msg_id`` until idle ("idle"), the deadline, or kernel death."""
        next_check = time.monotonic() + LIVENESS_INTERVAL
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return "timeout"
            wait = LIVENESS_INTERVAL if deadline is None else min(LIVENESS_INTERVAL, deadline - now)
            try:
                msg = await self._kc.get_iopub_msg(timeout=max(wait, 0.001))
            except queue.Empty:
                msg = None
            if msg is not None and msg.get("parent_header", {}).get("msg_id") == msg_id:
                if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    return "idle"
                await collector.handle(msg)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + LIVENESS_INTERVAL
                if not await self._km.is_alive():
                    return "died"

    async def _drain_reply(self, msg_id: str, execution: Execution) -> None:
        while True:
            try:
                reply = await self._kc.get_shell_msg(timeout=self.start_timeout)
            except queue.Empty:
                return
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                count = reply["content"].get("execution_count")
                if count is not None:
                    execution.execution_count = count
                return

    async def _recover(self, execution: Execution) -> None:
        execution.state_lost = True
        await self.restart()

    async def _helper(
        self, src: str, params: dict[str, Any], timeout: float | None, payload: bytes | None = None
    ) -> tuple[Execution, _Collector]:
        """Run a kernel-side helper; returns its execution and the collector holding its frames.

        A ``payload`` goes ahead of the cell on the tool channel, tagged with the call's marker.
        """
        key = helper_key(src)
        cached = key in self._cached_helpers
        code, marker = kernel_call(src, params, cached, as_display=self.backend != "opensandbox")
        callbacks: dict[str, Callback] = dict.fromkeys(("on_stdout", "on_stderr", "on_result", "on_error"))
        collector = _Collector(self.max_output_bytes, callbacks, marker, self._channel)
        comm_msg = None
        if payload is not None:
            data = {"call": marker, "sha256": hashlib.sha256(payload).hexdigest()}
            comm_msg = ({"comm_id": self._channel, "data": data}, payload)
        execution = await self._execute(code, timeout, collector, comm_msg=comm_msg)
        if execution.error is None:
            self._cached_helpers.add(key)
        elif cached and execution.error.name == "KeyError" and not execution.results:
            self._cached_helpers.discard(key)
            return await self._helper(src, params, timeout, payload)
        return execution, collector

    async def _internal(self, src: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        execution, collector = await self._helper(src + JSON_MAIN, {"_work": self.work_dir, **params}, timeout)
        if execution.error is not None:
            raise SandboxError(f"A kernel-sandbox helper failed in the kernel: {execution.error}")
        return extract_frame(execution, collector.marker)

    async def _tool_on_channel(
        self, params: dict[str, Any], payload: bytes, timeout: float | None
    ) -> tuple[Execution, dict[str, Any] | None]:
        """Call a tool over the channel (opened on first use); returns the execution and frame body.

        A pickle of up to :data:`INLINE_PAYLOAD_BYTES` rides in the cell instead, which saves a message.
        """
        inline = len(payload) <= INLINE_PAYLOAD_BYTES
        params = {**params, "_payload": base64.b64encode(payload).decode("ascii") if inline else None}
        for _ in range(2):
            if self._channel is None:
                self._channel = (await self._internal(CHANNEL_SRC, {}, timeout))["channel"]
            execution, collector = await self._helper(
                TOOL_SRC + TOOL_CHANNEL_MAIN, {**params, "_channel": self._channel}, timeout, None if inline else payload
            )
            if execution.error is None or execution.error.value != CHANNEL_LOST:
                break
            self._channel = None
        if execution.error is not None:
            return execution, None
        return execution, collector.channel_frames.body()

    # -- files -----------------------------------------------------------------------------

    async def _file_op(self, op: str, **params: Any) -> Any:
        body = await self._internal(FILES_SRC, {"_op": op, "_path": ".", "_limit": MAX_FILE_BYTES, **params})
        if "refused" in body:
            raise PathError(f"Refused: {body['refused']} ({self.work_dir})")
        if "error" in body:
            raise SandboxFileError(body["error"])
        return body["ok"]

    async def upload(self, files: Mapping[str, bytes | str]) -> list[str]:
        """Write ``{path: content}`` under the work directory; returns the relative paths written."""
        encoded = {}
        for path, content in files.items():
            rel = confine(path, self.work_dir)
            if rel == ".":
                raise PathError(f"{path!r} names the work directory itself, not a file")
            data = content.encode() if isinstance(content, str) else bytes(content)
            encoded[rel] = base64.b64encode(data).decode("ascii")
        written: list[str] = await self._file_op("upload", _files=encoded)
        return written

    async def download(self, path: str) -> bytes:
        """Read a file from the work directory."""
        data: str = await self._file_op("download", _path=confine(path, self.work_dir))
        return base64.b64decode(data)

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        """List a directory of the work directory (symlinks are listed, not followed)."""
        entries = await self._file_op("list", _path=confine(path, self.work_dir))
        return [FileInfo(*entry) for entry in entries]

    # -- packages --------------------------------------------------------------------------

    async def install(
        self, requirements: str | Iterable[str], *, pip_args: Iterable[str] = (), timeout: float | None = None
    ) -> Execution:
        """pip-install ``requirements`` (names, or requirements.txt text) inside the sandbox.

        Packages go to a directory under the sandbox's home that is put on ``sys.path``. The
        outcome is returned: pip's output in stdout/stderr, ``error`` set when pip failed. With the
        network off this raises :class:`NetworkDisabledError` at once, without running pip.
        """
        if not self.network and self.backend != "local":
            raise NetworkDisabledError(
                "Cannot install packages: this sandbox's network is off. Create it with "
                "network=True (e.g. Sandbox(network=True)) to let pip reach a package index."
            )
        text = requirements if isinstance(requirements, str) else "\n".join(requirements)
        params = {"_requirements": text, "_pip_args": list(pip_args), "_tail": PIP_OUTPUT_TAIL}
        body = await self._internal(INSTALL_SRC, params, timeout)
        execution = Execution(stdout=body["stdout"], stderr=body["stderr"])
        if body["returncode"] != 0:
            execution.error = ExecutionError(
                "InstallError", f"pip exited with code {body['returncode']}", body["stderr"]
            )
        return execution

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
    ) -> ToolResult:
        """Call ``tool`` (a function, or its source with ``name``) in the kernel with ``args``.

        A tool with an ``agent_state`` parameter receives ``agent_state`` and its changes come
        back. The result is framed with a fresh marker (see :mod:`.tools`); JSON values come back
        as JSON, others through the restricted unpickler, which allows ``allowed_classes`` (and
        the sandbox's) besides plain types and raises :class:`UnsafePayloadError` otherwise.
        """
        params, payload = tool_params(tool, dict(args or {}), agent_state, name)
        if self.backend == "opensandbox":
            params["_payload"] = base64.b64encode(payload).decode("ascii")
            execution, collector = await self._helper(TOOL_SRC + TOOL_TEXT_MAIN, params, timeout)
            body = None if execution.error is not None else extract_frame(execution, collector.marker)
        else:
            execution, body = await self._tool_on_channel(params, payload, timeout)
        result = ToolResult("error", stdout=execution.stdout, stderr=execution.stderr)
        if body is None:
            result.error = execution.error
            return result
        result.error = tool_error(body)
        if result.error is None:
            allowed = (*self.allowed_classes, *allowed_classes)
            result.func_return = decode_value(body["func_return"], allowed)
            result.agent_state = (
                decode_value(body["agent_state"], allowed) if "agent_state" in body else agent_state
            )
            result.status = "success"
        return result

    # -- skills ----------------------------------------------------------------------------

    async def run_skill(
        self,
        code: str,
        skill_files: Mapping[str, bytes | str] | None = None,
        requirements: str | Iterable[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Run skill ``code`` next to ``skill_files`` (LiteLLM's skills executor contract).

        Returns ``{"success", "output", "error", "files"}``; ``files`` holds the files the code
        created or changed in the work directory (not the unchanged skill files) and the images
        it displayed (``figure_1.png``...), each ``{"name", "path", "content_base64", "mime_type"}``.
        """
        try:
            if skill_files:
                await self.upload(skill_files)
            if requirements:
                installed = await self.install(requirements, timeout=timeout)
                if installed.error is not None:
                    return {"success": False, "output": installed.stdout, "error": installed.stderr, "files": []}
            before = await self._file_op("snapshot")
            await self._internal(PREPARE_SRC, {})
            execution = await self.run(code, timeout=timeout)
            after = await self._file_op("snapshot")
            files = []
            for path in sorted(after):
                if before.get(path) != after[path]:
                    content = await self.download(path)
                    files.append(_file_entry(posixpath.basename(path), path, content))
            figure = 0
            for bundle in execution.results:
                for mime, ext in IMAGE_TYPES.items():
                    if mime in bundle:
                        figure += 1
                        data = bundle[mime]
                        encoded = base64.b64encode(data.encode()).decode() if ext == "svg" else data.strip()
                        files.append({"name": f"figure_{figure}.{ext}", "path": f"figure_{figure}.{ext}",
                                      "content_base64": encoded, "mime_type": mime})
                        break
        except SandboxError as exc:
            return {"success": False, "output": "", "error": str(exc), "files": []}
        error = execution.stderr
        if execution.error is not None:
            error += execution.error.traceback or str(execution.error)
        return {"success": execution.error is None, "output": execution.stdout, "error": error, "files": files}

    async def _reset(self) -> None:
        """Fresh interpreter and an empty work directory, for a pool's next user."""
        await self.restart()
        await self._internal(WIPE_SRC, {})


def _file_entry(name: str, path: str, content: bytes) -> dict[str, str]:
    return {
        "name": name,
        "path": path,
        "content_base64": base64.b64encode(content).decode("ascii"),
        "mime_type": mimetypes.guess_type(name)[0] or "application/octet-stream",
    }


@atexit.register
def _kill_leftovers() -> None:
    for sandbox in list(_LIVE):
        sandbox._kill_now()


class _LoopThread:
    """One background event loop shared by the sync wrappers."""

    _loop: asyncio.AbstractEventLoop | None = None
    _guard = threading.Lock()

    @classmethod
    def run(cls, coro: Awaitable[T]) -> T:
        with cls._guard:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="kernel-sandbox-loop", daemon=True).start()
                cls._loop = loop
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, cls._loop)  # type: ignore[arg-type]
        return future.result()

    @classmethod
    def call(cls, func: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain call on the loop (it may create tasks there)."""
        assert cls._loop is not None
        cls._loop.call_soon_threadsafe(func, *args)


class Sandbox:
    """The synchronous face of :class:`AsyncSandbox` (same options), used with ``with``.

    Calls run on a shared background event loop; callbacks are called from that thread.
    """

    def __init__(self, backend: str = "docker", **options: Any) -> None:
        self._async = AsyncSandbox(backend, **options)

    @classmethod
    def _wrap(cls, sandbox: AsyncSandbox) -> Sandbox:
        wrapper = cls.__new__(cls)
        wrapper._async = sandbox
        return wrapper

    @property
    def work_dir(self) -> str:
        """The kernel's work directory (inside the sandbox)."""
        return self._async.work_dir

    def start(self) -> Sandbox:
        """Start the kernel (``with Sandbox() as sb`` does it for you)."""
        _LoopThread.run(self._async.start())
        return self

    def close(self) -> None:
        """Shut the kernel down and remove its container."""
        _LoopThread.run(self._async.close())

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
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
    ) -> Execution:
        """See :meth:`AsyncSandbox.run`."""
        return _LoopThread.run(self._async.run(code, timeout, on_stdout, on_stderr, on_result, on_error))

    def restart(self) -> None:
        """See :meth:`AsyncSandbox.restart`."""
        _LoopThread.run(self._async.restart())

    def upload(self, files: Mapping[str, bytes | str]) -> list[str]:
        """See :meth:`AsyncSandbox.upload`."""
        return _LoopThread.run(self._async.upload(files))

    def download(self, path: str) -> bytes:
        """See :meth:`AsyncSandbox.download`."""
        return _LoopThread.run(self._async.download(path))

    def list_files(self, path: str = ".") -> list[FileInfo]:
        """See :meth:`AsyncSandbox.list_files`."""
        return _LoopThread.run(self._async.list_files(path))

    def install(
        self, requirements: str | Iterable[str], *, pip_args: Iterable[str] = (), timeout: float | None = None
    ) -> Execution:
        """See :meth:`AsyncSandbox.install`."""
        return _LoopThread.run(self._async.install(requirements, pip_args=pip_args, timeout=timeout))

    def run_tool(
        self,
        tool: Callable[..., Any] | str,
        args: Mapping[str, Any] | None = None,
        agent_state: Any = None,
        name: str | None = None,
        *,
        timeout: float | None = None,
        allowed_classes: Iterable[type] = (),
    ) -> ToolResult:
        """See :meth:`AsyncSandbox.run_tool`."""
        return _LoopThread.run(
            self._async.run_tool(tool, args, agent_state, name, timeout=timeout, allowed_classes=allowed_classes)
        )

    def run_skill(
        self,
        code: str,
        skill_files: Mapping[str, bytes | str] | None = None,
        requirements: str | Iterable[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """See :meth:`AsyncSandbox.run_skill`."""
        return _LoopThread.run(self._async.run_skill(code, skill_files, requirements, timeout=timeout))
