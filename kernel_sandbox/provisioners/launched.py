"""What both provisioners share: they run the launcher (:mod:`kernel_sandbox.launch`) as a local
process.

The launcher is the one code path that sandboxes. :class:`LaunchedProvisioner` runs it as
``LocalProvisioner`` runs a kernel, and adds what a provisioner-aware client can use: the
client's channels as IPC sockets in a private 0700 directory, the effective settings (traitlets
config and kernel.json) checked before anything starts and handed over in a 0600 file, the
reason a kernel ended, interrupt as SIGINT to the launcher, re-attach after a server restart
while the launcher waits ``orphan_timeout`` for its owner, and standby kernels: a first start adopts
a launcher of the same configuration that was started ahead of need (:mod:`.standby`), a restart
starts a fresh one at the kernel's same addresses. A subclass names its backend and its settings
model, says what its standbys are made of, and removes what a killed launcher left behind.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import queue
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Any as AnyTrait
from traitlets import CaselessStrEnum, TraitType, Undefined

from .. import errors
from ..errors import ConfigError, KernelLaunchError, KernelSandboxError
from ..launch.request import passed_env
from ..privdir import (
    ADOPTED,
    CONFIG,
    EXIT,
    LAUNCHER_LOCK,
    LAUNCHER_STATE,
    OWNER_LOCK,
    RECORD,
    PrivateDir,
    sleeping,
)
from ..settings import BackendSettings
from .budget import BUDGET, Claim, Reservation
from .process import launcher_command, read_status, start_launcher, write_launcher_config
from .standby import POOL, Recipe, Standby

_BASE_KWARGS = {"kernel_id", "kernel_spec", "parent", "config", "log"}


class _Option(AnyTrait):
    """A trait of any value whose default is a fresh copy for every provisioner (dicts, lists)."""

    default_value = Undefined

    def __init__(self, default: Any, help: str) -> None:
        self._initial = default
        super().__init__(allow_none=True, config=True, help=help)

    def make_dynamic_default(self) -> Any:
        return copy.deepcopy(self._initial)

    def default_value_repr(self) -> str:
        return repr(self._initial)


def _option_trait(option: dataclasses.Field[Any]) -> TraitType[Any, Any]:
    """A configurable trait for one option of a settings model: an enum of its ``choices`` when it
    has them (a wrong one is a TraitError on assignment), else any value, checked by the model."""
    metadata = option.metadata
    if "choices" in metadata:
        return CaselessStrEnum(
            metadata["choices"],
            default_value=metadata["default"],
            config=True,
            help=metadata["help"],
        )
    return _Option(metadata["default"], metadata["help"])


class LaunchedProvisioner(LocalProvisioner):
    """Run the launcher for a kernelspec of ``backend`` (see the module docstring)."""

    backend: ClassVar[str]
    """The provisioner name the launcher knows the settings by."""
    settings_model: ClassVar[type[BackendSettings]]
    """The backend's settings; each of its options is also a trait of the subclass."""

    private: PrivateDir | None = None
    exit_reason: str | None = None
    _exit_code: int | None = None
    _status_fd: int | None = None
    _stopping = False
    _recipe: Recipe | None = None
    _adopting: Standby | None = None
    _reservation: Reservation | None = None
    """This kernel's share of the process's kernel budget (:mod:`.budget`), held until its launcher
    ended."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Declare a configurable trait for every option of ``settings_model`` the subclass does not
        define.

        So ``c.DockerProvisioner.memory = "2g"`` and a kernel.json provisioner config both set
        options, with the model's help and default. traitlets' metaclass calls ``class_init`` only
        on the traits of the class body; these are set later (this runs inside ``type.__new__``), so
        they get it here.
        """
        super().__init_subclass__(**kwargs)
        for name, option in cls.settings_model.options().items():
            if name not in vars(cls):
                trait = _option_trait(option)
                trait.class_init(cls, name)
                setattr(cls, name, trait)

    def __init__(self, **kwargs: Any) -> None:
        self.settings_model.check_names(
            {key: value for key, value in kwargs.items() if key not in _BASE_KWARGS}
        )
        super().__init__(**kwargs)
        self.settings_model.check_names(self.config.get(type(self).__name__, {}))

    def settings(self) -> Any:
        """The effective settings: traitlets configuration and kernel.json, checked, and resolved
        from the environment."""
        options = self.settings_model.options()
        return self.settings_model.from_config(
            {name: getattr(self, name) for name in options}
        ).resolved()

    def prepare(self, settings: Any, cwd: str | None) -> None:
        """Check what only the host can tell before the launcher starts (mounts exist...)."""

    async def remove_leftover(self, state: dict[str, Any]) -> None:
        """Remove what a launcher that could not clean up left (its ``launcher.json`` state; ``pid``
        is the launcher's, also when it was killed before it wrote the state)."""
        raise NotImplementedError

    @property
    def has_process(self) -> bool:
        """True while a launcher runs this kernel (started here, or found again by re-attach)."""
        return self.process is not None or (self.pid is not None and self.private is not None)

    @property
    def launcher_state(self) -> dict[str, Any]:
        """What the launcher recorded about its kernel (its pid, the container or sandbox id)."""
        state = self.private.read_json(LAUNCHER_STATE) if self.private else None
        return state if isinstance(state, dict) else {}

    async def standby_image(self, settings: Any, launcher_env: Mapping[str, str]) -> str | None:
        """What the settings' image stands for now, for standbys (Docker: its id); None: no
        standby."""
        return None

    def standby_context(self, settings: Any, cwd: str | None) -> Any:
        """What else a kernel of ``settings`` started in ``cwd`` is made of (Docker: its mounts)."""
        return cwd

    def standby_cleanup(
        self, launcher_env: Mapping[str, str]
    ) -> Callable[[dict[str, Any]], bool] | None:
        """What removes the container or sandbox a standby's launcher left (given its state); None:
        nothing."""
        return None

    def budget_claim(self, settings: Any) -> Claim | None:
        """What a kernel of ``settings`` takes from this process's kernel budget; None: it is not
        counted."""
        return None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Check the settings; take a standby of this configuration, or prepare a cold start."""
        if kwargs.pop("transport_encryption", "disabled") == "required":
            raise KernelLaunchError("kernel-sandbox does not offer CurveZMQ transport encryption")
        settings = self.settings()
        kwargs.pop("extra_arguments", None)
        kernel_env = passed_env(self.kernel_spec.env, kwargs.get("env", {}))
        cwd = kwargs.pop("cwd", None)
        self.prepare(settings, cwd)
        kwargs = await KernelProvisionerBase.pre_launch(self, **kwargs)
        km = self.parent
        # jupyter_client's kernel manager makes itself its provisioner's parent
        assert km is not None
        self.exit_reason = self._exit_code = None
        self._stopping = False
        self._recipe = await self._standby_recipe(settings, kernel_env, kwargs["env"], cwd)
        if self.private is None and self._recipe is not None:  # a restart keeps its addresses: cold
            self._adopting = await self._take_standby(
                self._recipe, kernel_env.get("JPY_SESSION_NAME")
            )
            if self._adopting is not None:
                # a standby is taken once its launcher runs
                assert self._adopting.process is not None
                self._reserve(self._adopting.take_reservation())
                km.cleanup_connection_file()
                return {**kwargs, "cmd": self._adopting.process.args}
        claim = self.budget_claim(settings)
        if claim is not None and self._reservation is None:  # a restart keeps its share
            self._reserve(await BUDGET.acquire(claim, settings.launch_timeout, POOL.evict_one))
        if self.private is None:
            self.private = PrivateDir.create()
            self.private.hold(OWNER_LOCK)
            km.cleanup_connection_file()
        (self.private / EXIT).unlink(missing_ok=True)
        (self.private / LAUNCHER_STATE).unlink(missing_ok=True)
        km.transport = "ipc"
        km.ip = str(self.private / "k")
        km.write_connection_file(jupyter_session=kernel_env.get("JPY_SESSION_NAME", ""))
        self.connection_info = km.get_connection_info()
        config_file = write_launcher_config(
            self.private, self.backend, settings.to_config(), self.kernel_id, kernel_env, cwd
        )
        self._status_reader, self._status_fd = os.pipe()
        cmd = launcher_command(os.path.realpath(km.connection_file), config_file, self._status_fd)
        return {**kwargs, "cmd": cmd, "cwd": str(self.private.path)}

    async def _standby_recipe(
        self,
        settings: Any,
        kernel_env: dict[str, str],
        launcher_env: dict[str, str],
        cwd: str | None,
    ) -> Recipe | None:
        count = getattr(settings, "standby", 0)
        if not count or getattr(settings, "secrets", None):
            # a launcher holding secrets' values is started for its kernel only, never kept idle
            return None
        image = await self.standby_image(settings, launcher_env)
        if image is None:
            return None
        return Recipe.make(
            backend=self.backend,
            settings=settings.to_config(),
            image=image,
            context=self.standby_context(settings, cwd),
            kernel_env=kernel_env,
            launcher_env=launcher_env,
            cwd=cwd,
            count=count,
            log=self.log,
            cleanup=self.standby_cleanup(launcher_env),
            claim=self.budget_claim(settings),
        )

    async def _take_standby(self, recipe: Recipe, session_name: str | None) -> Standby | None:
        """A standby of ``recipe`` ready to be adopted, named after the client's session; None:
        start cold."""
        standby = await POOL.take(recipe)
        if standby is not None and session_name:
            _name_session(
                standby.connection_info, session_name, self.get_stable_start_time(), self.log
            )
        return standby

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Adopt the standby, or run the launcher and wait until its kernel answers (else raise its
        reason)."""
        if self._adopting is not None:
            return await self._adopt(self._adopting)
        assert self._status_fd is not None
        kwargs = self._scrub_kwargs(kwargs)
        try:
            self.process = start_launcher(cmd, self._status_fd, **kwargs)
        finally:
            self._status_fd = None
        self.pid = self.process.pid
        self.pgid = os.getpgid(self.pid)
        self.cwd = kwargs.get("cwd")
        try:
            ready = await asyncio.to_thread(read_status, self._status_reader)
        except asyncio.CancelledError:
            # the start was given up (a client's timeout): the launcher stops, removing what it
            # made, and its end closes the pipe the thread reads
            self.process.terminate()
            await asyncio.shield(self._end_failed_launch())
            raise
        if not ready:
            recorded, reason = await self._end_failed_launch()
            raise _launch_error(recorded, reason)
        self._refill()
        await self._write_record()
        return self.connection_info

    async def _end_failed_launch(self) -> tuple[Any, str]:
        """After a launch that did not become ready: wait for the launcher's end, remove what a
        killed one left, forget the kernel; return its recorded exit and the reason."""
        assert self.process is not None
        code = await asyncio.to_thread(self.process.wait)
        reason = self._read_exit(code)
        recorded = self.private.read_json(EXIT) if self.private else None
        if code < 0:  # killed: it could not remove its container or sandbox itself
            await self.remove_leftover({**self.launcher_state, "pid": self.pid})
        await self._forget()
        assert self.parent is not None
        self.parent.cleanup_connection_file()
        return recorded, reason

    async def _adopt(self, standby: Standby) -> KernelConnectionInfo:
        """Make a standby this provisioner's kernel: its directory (owner lock held), launcher and
        addresses."""
        self._adopting = None
        assert standby.private is not None and standby.process is not None
        self.private, self.process = standby.private, standby.process
        self.pid = self.pgid = self.process.pid  # the launcher leads its own session
        self.cwd = str(self.private.path)
        self.private.write_json(ADOPTED, {"kernel_id": self.kernel_id})
        self.connection_info = standby.connection_info
        self._refill()
        await self._write_record()
        return self.connection_info

    async def _write_record(self) -> None:
        """Leave in the private directory what a later owner needs to re-attach
        (:mod:`kernel_sandbox.reattach`)."""
        km = self.parent
        assert self.private is not None and km is not None
        self.private.write_json(
            RECORD,
            {
                "kernel_id": self.kernel_id,
                "kernel_name": getattr(km, "kernel_name", ""),
                "runtime_dir": os.path.dirname(os.path.realpath(km.connection_file))
                if km.connection_file
                else "",
                "provisioner_info": _as_json(await self.get_provisioner_info()),
            },
        )

    def _refill(self) -> None:
        if self._recipe is not None:
            POOL.refill(self._recipe)

    def _read_exit(self, code: int) -> str:
        recorded = self.private.read_json(EXIT) if self.private else None
        if isinstance(recorded, dict) and "reason" in recorded:
            return str(recorded["reason"])
        if code < 0:
            return f"the launcher was killed by {signal.Signals(-code).name}"
        return f"the launcher exited with code {code} (its messages are in this server's log)"

    async def poll(self) -> int | None:
        """None while the launcher runs, else its exit code (0: a clean shutdown)."""
        if self._exit_code is not None:
            return self._exit_code
        if self.process is not None:
            code = self.process.poll()
        elif self.pid is not None and self.private is not None:
            self.private.hold(OWNER_LOCK)
            recorded = self.private.read_json(EXIT)
            code = (
                None if self.private.held(LAUNCHER_LOCK) else int((recorded or {}).get("code", 1))
            )
        else:
            return 0
        if code is not None:
            self._exit_code = code
            self.exit_reason = self._read_exit(code)
            if code and not self._stopping:
                self.log.error("Kernel %s ended: %s", self.kernel_id, self.exit_reason)
        return code

    async def wait(self) -> int | None:
        """Wait until the launcher has ended."""
        while (code := await self.poll()) is None:
            await asyncio.sleep(0.1)
        if self.process is not None:
            self.process.wait()
            self.process = None
        return code

    async def send_signal(self, signum: int) -> None:
        """Signal the launcher: SIGINT interrupts the cell, SIGTERM ends the kernel cleanly."""
        if signum in (signal.SIGTERM, signal.SIGKILL):
            self._stopping = True
        if self.process is None and self.pid is not None and self.private is not None:
            if self.private.held(LAUNCHER_LOCK):
                os.kill(self.pid, signum)
            return
        await super().send_signal(signum)

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL the launcher (its watchdog and :meth:`cleanup` remove the container), also one
        found by re-attach."""
        if self.process is None:
            await self.send_signal(signal.SIGKILL)
        else:
            await super().kill(restart)

    async def terminate(self, restart: bool = False) -> None:
        """SIGTERM the launcher (it removes its container and ends), also one found by re-attach."""
        if self.process is None:
            await self.send_signal(signal.SIGTERM)
        else:
            await super().terminate(restart)

    async def cleanup(self, restart: bool = False) -> None:
        """Make sure the container or sandbox is gone; unless restarting, remove the private
        directory too."""
        state = self.launcher_state
        if state and (self.private is None or not self.private.held(LAUNCHER_LOCK)):
            await self.remove_leftover(state)
        self.pid = self.pgid = None
        if not restart:
            await self._forget()

    def _reserve(self, reservation: Reservation | None) -> None:
        if self._reservation is not None and self._reservation is not reservation:
            self._reservation.release()
        self._reservation = reservation
        if reservation is not None:
            reservation.asleep = lambda: self.private is not None and sleeping(self.private.path)

    async def _forget(self) -> None:
        self._reserve(None)
        if self.private is not None:
            self.private.remove()
            self.private = None
        self.pid = self.pgid = None
        self.process = None

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """Containers and sandboxes need a moment longer than processes to stop."""
        return max(recommended, 5.0)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """What a restarted server needs to re-attach: the private directory and the launcher's
        pid."""
        info = await super().get_provisioner_info()
        info.update(private_dir=str(self.private.path) if self.private else None)
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Re-attach to the launcher recorded by :meth:`get_provisioner_info` and become its owner.

        The previous owner may still hold the owner lock (a server that is shutting down): the lock
        is taken again at each :meth:`poll` until it is free.
        """
        await super().load_provisioner_info(provisioner_info)
        private_dir = provisioner_info.get("private_dir")
        if not private_dir:
            raise ConfigError("provisioner info without a private_dir: nothing to re-attach to")
        private = PrivateDir(Path(private_dir))
        self.check_orphan(private.read_json(LAUNCHER_STATE) or {}, private)
        self.private = private
        self.private.hold(OWNER_LOCK)
        config = private.read_json(CONFIG)
        self.hold_share(config.get("settings") if isinstance(config, dict) else None)

    def hold_share(self, started_with: Any) -> None:
        """Count a kernel that runs already (found again by re-attach) in this process's budget,
        room or not, with the ``memory`` of the settings it was started with (``started_with``,
        its launcher's config; else this kernelspec's): later launches then wait for room as they
        would had this process started it."""
        if self._reservation is not None:
            return
        try:
            settings = self.settings_model.from_config(started_with)
        except ConfigError:  # not a config this model reads: the kernelspec's own settings
            settings = self.settings()
        claim = self.budget_claim(settings)
        if claim is not None:
            self._reserve(BUDGET.hold(claim))

    def check_orphan(self, state: dict[str, Any], private: PrivateDir) -> None:
        """Raise KernelLaunchError unless the launcher's ``state`` names this backend's resource of
        this kernel's launcher in ``private`` (Docker: the container's labels); blocking, a few
        ms."""

    def detach(self) -> None:
        """Let go of the kernel without stopping it: its launcher waits ``orphan_timeout`` for a new
        owner.

        Its share of this process's budget goes back: the kernel is no longer this process's.
        """
        self._reserve(None)
        if self.private is not None:
            self.private.release(OWNER_LOCK)
        self.private = None
        self.pid = self.pgid = None
        self.process = None


def _as_json(info: dict[str, Any]) -> dict[str, Any]:
    """Provisioner info as JSON can hold it: the connection info's key as text."""
    connection = dict(info.get("connection_info") or {})
    if isinstance(connection.get("key"), bytes):
        connection["key"] = connection["key"].decode()
    return {**info, "connection_info": connection}


def _launch_error(recorded: Any, reason: str) -> KernelSandboxError:
    """The error the launcher reported (same class: ImageMissing, ConfigError...), or a launch
    error."""
    name = recorded.get("error", "") if isinstance(recorded, dict) else ""
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, KernelSandboxError):
        try:
            return kind(reason)
        except TypeError:  # a class that needs more than a message
            pass
    return KernelLaunchError(reason)


_NAMINGS: set[asyncio.Task[None]] = set()
"""Session namings waiting for their reply (the reference keeps each task alive)."""


def _name_session(info: KernelConnectionInfo, name: str, timeout: float, log: Any) -> None:
    """Give an adopted kernel the client's ``JPY_SESSION_NAME`` (a cold one has it from its
    environment).

    One silent execute that stores no history: ``__session__`` as ipykernel sets it, and the
    variable. It is sent before the launch returns, and not waited for (that would cost the start
    one more round trip): the kernel handles shell requests in the order they reach it, so the
    client's requests, sent later, run after it. A refusal or no reply within ``timeout`` is logged.
    """
    code = f"__session__ = {name!r}; __import__('os').environ['JPY_SESSION_NAME'] = __session__"
    client = AsyncKernelClient(context=zmq.asyncio.Context.instance())
    client.load_connection_info(info)
    client.start_channels(iopub=False, stdin=False, hb=False, control=False)
    msg_id = client.execute(code, silent=True, store_history=False, allow_stdin=False)
    task = asyncio.ensure_future(_named(client, msg_id, timeout, log))
    _NAMINGS.add(task)
    task.add_done_callback(_NAMINGS.discard)


async def _named(client: AsyncKernelClient, msg_id: str, timeout: float, log: Any) -> None:
    """Wait for the reply to a session naming; log what went wrong."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            reply = await client.get_shell_msg(timeout=max(deadline - time.monotonic(), 0))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
    except queue.Empty:
        log.warning(
            "kernel-sandbox: an adopted standby did not confirm its session name within %g s",
            timeout,
        )
        return
    finally:
        client.stop_channels()
    if reply["content"].get("status") != "ok":
        log.warning(
            "kernel-sandbox: an adopted standby refused its session name (%s)",
            reply["content"].get("evalue"),
        )
