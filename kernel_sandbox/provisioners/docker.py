"""Kernel provisioner that runs each kernel in a fresh, locked-down Docker container."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import signal
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import zmq
import zmq.asyncio
from docker.models.containers import Container
from docker.utils import parse_bytes
from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Bool, CaselessStrEnum, Dict, Float, Int, List, Unicode

from ..errors import KernelLaunchError
from ..containers import (
    DEFAULT_IMAGE,
    EngineUnavailable,
    docker_client,
    owner_labels,
    remove_container,
    require_image,
    socket_root,
)

HOME_DIR = "/home/sandbox"
WORK_DIR = "/home/sandbox/work"
SOCKET_MOUNT = "/run/kernel"
CONTAINER_PORTS = (50001, 50002, 50003, 50004, 50005)
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
FORWARDED_ENV = ("JPY_SESSION_NAME",)
DEFAULT_UID = 1000


OWNER_GUARD = """
import fcntl, os, sys, time
grace, lock, cmd = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
kernel = os.getpid()
if os.fork() == 0:
    fd = os.open(lock, os.O_RDONLY)
    free_since = None
    while os.getppid() == kernel:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            free_since = None
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            free_since = free_since or time.monotonic()
            if time.monotonic() - free_since >= grace:
                os.kill(kernel, 9)
        time.sleep(1)
    os._exit(0)
os.execvp(cmd[0], cmd)
"""


def parse_mount(spec: str | dict[str, Any]) -> tuple[str, str, str]:
    """Parse ``HOST:CONTAINER[:ro|rw]`` (or a dict with host/container/mode) into a triple.

    Relative container paths are placed under the work directory; the mode defaults to ``ro``.
    """
    if isinstance(spec, dict):
        host, target, mode = spec["host"], spec.get("container", ""), spec.get("mode", "ro")
    else:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"Mount {spec!r} must look like HOST_PATH:CONTAINER_PATH[:ro|rw]")
        host, target, mode = parts[0], parts[1], parts[2] if len(parts) == 3 else "ro"
    if mode not in ("ro", "rw"):
        raise ValueError(f"Mount {spec!r}: mode must be 'ro' or 'rw', not {mode!r}")
    host_path = Path(host).expanduser().resolve()
    if not host_path.exists():
        raise ValueError(f"Mount {spec!r}: host path {host_path} does not exist")
    container_path = PurePosixPath(target or host_path.name)
    if not container_path.is_absolute():
        container_path = PurePosixPath(WORK_DIR) / container_path
    return str(host_path), str(container_path), mode


class DockerProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """Launch the kernel of a kernelspec in a new container on the local Docker engine.

    Networking is off by default (ZMQ over IPC sockets in a bind-mounted directory); the
    container runs as a non-root user with no capabilities, a read-only root filesystem and
    limits on memory, CPUs and processes.
    """

    image = Unicode(DEFAULT_IMAGE, config=True, help="Docker image that runs the kernel.")
    network = Bool(False, config=True, help="Give the kernel a network (TCP ports on 127.0.0.1).")
    memory = Unicode("512m", config=True, help="Memory limit, swap included (e.g. 512m, 2g).")
    cpus = Float(1.0, config=True, help="CPU limit, in cores.")
    pids_limit = Int(256, config=True, help="Maximum number of processes and threads.")
    user = Unicode(
        "",
        config=True,
        help="uid:gid the kernel runs as; empty means the host user's, or 1000:1000 for root.",
    )
    read_only = Bool(True, config=True, help="Mount the image's root filesystem read-only.")
    tmp_size = Unicode("256m", config=True, help="Size of the writable tmpfs at /tmp.")
    home_size = Unicode("256m", config=True, help=f"Size of the writable tmpfs at {HOME_DIR}.")
    work_size = Unicode("1g", config=True, help=f"Size of the writable work directory {WORK_DIR}.")
    mounts = List(
        Unicode(),
        config=True,
        help="Bind mounts HOST:CONTAINER[:ro|rw]; read-only unless ':rw' is given.",
    )
    mount_cwd = CaselessStrEnum(
        ["off", "ro", "rw"],
        "off",
        config=True,
        help="Mount the kernel's working directory (the notebook's folder) as the work directory.",
    )
    env = Dict(
        value_trait=Unicode(), config=True, help="Environment variables given to the kernel."
    )
    runtime = Unicode("", config=True, help="OCI runtime, e.g. 'runsc' for gVisor; empty: default.")
    launch_timeout = Float(60.0, config=True, help="Seconds to wait for the kernel to come up.")
    orphan_timeout = Float(
        300.0,
        config=True,
        help="Seconds a kernel lives on once the process that started it is gone; 0: forever.",
    )

    container_id: str | None = None
    socket_dir: Path | None = None
    exit_reason: str | None = None
    _exit_code: int | None = None
    _cwd: str | None = None
    _docker: docker.DockerClient | None = None
    _owner_lock: int | None = None

    @property
    def has_process(self) -> bool:
        """True while a container belongs to this kernel."""
        return self.container_id is not None

    def _client(self) -> docker.DockerClient:
        if self._docker is None:
            self._docker = docker_client()
        return self._docker

    def _container(self) -> Container | None:
        if self.container_id is None:
            return None
        try:
            return self._client().containers.get(self.container_id)
        except docker.errors.NotFound:
            return None

    def _run_as(self) -> str:
        if self.user:
            uid, sep, gid = self.user.partition(":")
            if not (uid.isdigit() and sep and gid.isdigit()):
                raise KernelLaunchError(f"user must be numeric UID:GID, e.g. 1000:1000, not {self.user!r}")
            if int(uid) == 0 or int(gid) == 0:
                raise KernelLaunchError("The kernel never runs as root: choose a user other than uid/gid 0")
            return self.user
        uid = os.getuid()
        return f"{uid}:{os.getgid()}" if uid != 0 else f"{DEFAULT_UID}:{DEFAULT_UID}"

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Check the engine and image, prepare the socket directory and the container command."""
        if kwargs.pop("transport_encryption", "disabled") == "required":
            raise KernelLaunchError("kernel-sandbox does not support CurveZMQ transport encryption")
        self._cwd = kwargs.pop("cwd", None)
        client = await asyncio.to_thread(self._client)
        await asyncio.to_thread(require_image, client, self.image)
        self.exit_reason = self._exit_code = None
        uid, gid = (int(part) for part in self._run_as().split(":"))
        km = self.parent
        key = km.session.key.decode() if km else uuid.uuid4().hex
        scheme = km.session.signature_scheme if km else "hmac-sha256"
        inner: dict[str, Any] = {"key": key, "signature_scheme": scheme}
        if self.network:
            inner.update(transport="tcp", ip="0.0.0.0", **dict(zip(PORT_NAMES, CONTAINER_PORTS)))
        else:
            inner.update(transport="ipc", ip=f"{SOCKET_MOUNT}/k", **dict(zip(PORT_NAMES, (1, 2, 3, 4, 5))))
        try:
            self._make_socket_dir(inner, uid, gid)
        except BaseException:
            await self._remove()
            raise
        self.connection_info = {**inner, "key": key.encode()}
        if not self.network:
            self.connection_info["ip"] = str(self.socket_dir / "k")

        substitutions = {"connection_file": f"{SOCKET_MOUNT}/connection.json", "resource_dir": ""}
        extra = kwargs.pop("extra_arguments", [])
        cmd = [arg.format(**substitutions) for arg in self.kernel_spec.argv] + list(extra)
        if self.orphan_timeout > 0:
            guard = [str(self.orphan_timeout), f"{SOCKET_MOUNT}/owner.lock"]
            cmd = ["python", "-I", "-S", "-c", OWNER_GUARD, *guard, *cmd]
        return await super().pre_launch(cmd=cmd, **kwargs)

    def _make_socket_dir(self, connection: dict[str, Any], uid: int, gid: int) -> None:
        """Create the kernel's private directory with its connection file and owner lock."""
        root = socket_root()
        root.mkdir(mode=0o711, exist_ok=True)
        self.socket_dir = root / uuid.uuid4().hex[:12]
        self.socket_dir.mkdir(mode=0o700)
        os.chown(self.socket_dir, uid, gid)
        (self.socket_dir / "owner.lock").touch(mode=0o644)
        self._take_owner_lock()
        conn_file = self.socket_dir / "connection.json"
        conn_file.write_text(json.dumps(connection))
        os.chown(conn_file, uid, gid)

    def _take_owner_lock(self) -> None:
        """Hold the lock whose release tells the container that its owner is gone.

        Another live owner (the server this one re-attached after) may hold it: try again later.
        """
        if self._owner_lock is not None or self.socket_dir is None:
            return
        lock_file = self.socket_dir / "owner.lock"
        if not lock_file.exists():
            return
        fd = os.open(lock_file, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
        else:
            self._owner_lock = fd

    def _release_owner_lock(self) -> None:
        if self._owner_lock is not None:
            os.close(self._owner_lock)
            self._owner_lock = None

    def _container_env(self, launch_env: dict[str, str]) -> dict[str, str]:
        env = {name: launch_env[name] for name in self.kernel_spec.env if name in launch_env}
        env.update({name: launch_env[name] for name in FORWARDED_ENV if name in launch_env})
        env.update(self.env)
        env.update(HOME=HOME_DIR, PYTHONUNBUFFERED="1")
        return env

    def _mount_specs(self) -> list[tuple[str, str, str]]:
        specs = [parse_mount(spec) for spec in self.mounts]
        if self.mount_cwd != "off" and self._cwd:
            specs.append(parse_mount(f"{self._cwd}:{WORK_DIR}:{self.mount_cwd}"))
        return specs

    def _run_kwargs(self, cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
        assert self.socket_dir is not None
        user = self._run_as()
        uid, gid = user.split(":")
        volumes = {str(self.socket_dir): {"bind": SOCKET_MOUNT, "mode": "rw"}}
        mounted = self._mount_specs()
        volumes.update({host: {"bind": target, "mode": mode} for host, target, mode in mounted})
        tmpfs = {
            "/tmp": f"rw,nosuid,nodev,size={self.tmp_size},mode=1777",
            HOME_DIR: f"rw,nosuid,nodev,size={self.home_size},uid={uid},gid={gid},mode=0755",
        }
        if not any(target == WORK_DIR for _, target, _ in mounted):
            tmpfs[WORK_DIR] = f"rw,nosuid,nodev,size={self.work_size},uid={uid},gid={gid},mode=0755"
        kwargs: dict[str, Any] = {
            "command": cmd,
            "name": f"kernel-sandbox-{self.kernel_id[:8]}-{uuid.uuid4().hex[:6]}",
            "hostname": "sandbox",
            "labels": owner_labels(self.kernel_id, self.socket_dir),
            "environment": env,
            "user": user,
            "working_dir": WORK_DIR,
            "init": True,
            "detach": True,
            "read_only": self.read_only,
            "tmpfs": tmpfs,
            "volumes": volumes,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "mem_limit": self.memory,
            "memswap_limit": self.memory,
            "nano_cpus": int(self.cpus * 1e9),
            "pids_limit": self.pids_limit,
            "ipc_mode": "private",
        }
        if self.runtime:
            kwargs["runtime"] = self.runtime
        if self.network:
            kwargs["ports"] = {f"{port}/tcp": ("127.0.0.1", None) for port in CONTAINER_PORTS}
        else:
            kwargs["network_mode"] = "none"
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the container and wait until the kernel's heartbeat answers."""
        env = self._container_env(kwargs.get("env", {}))
        try:
            run_kwargs = self._run_kwargs(cmd, env)
            client = await asyncio.to_thread(self._client)
            container = await asyncio.to_thread(client.containers.run, self.image, **run_kwargs)
            self.container_id = container.id
            if self.network:
                await asyncio.to_thread(container.reload)
                for name, port in zip(PORT_NAMES, CONTAINER_PORTS):
                    self.connection_info[name] = int(container.ports[f"{port}/tcp"][0]["HostPort"])
                self.connection_info["ip"] = "127.0.0.1"
            await self._wait_for_heartbeat()
        except BaseException:
            await self._remove()
            raise
        self.log.info("Kernel %s runs in container %s", self.kernel_id, container.name)
        return self.connection_info

    async def _wait_for_heartbeat(self) -> None:
        info = self.connection_info
        if info["transport"] == "ipc":
            address = f"ipc://{info['ip']}-{info['hb_port']}"
        else:
            address = f"tcp://{info['ip']}:{info['hb_port']}"
        context = zmq.asyncio.Context.instance()
        deadline = time.monotonic() + self.launch_timeout
        while time.monotonic() < deadline:
            if await self.poll() is not None:
                logs = await self._logs()
                raise KernelLaunchError(
                    f"The kernel container exited during start-up ({self.exit_reason}).\n{logs}"
                )
            if info["transport"] == "ipc" and not Path(address[6:]).exists():
                await asyncio.sleep(0.02)
                continue
            sock = context.socket(zmq.REQ)
            sock.linger = 0
            try:
                sock.connect(address)
                await sock.send(b"ping")
                if await sock.poll(200):
                    await sock.recv()
                    return
            finally:
                sock.close()
        raise KernelLaunchError(
            f"The kernel in image {self.image!r} did not answer within {self.launch_timeout:.0f} s. "
            "Check that the image runs ipykernel (`kernel-sandbox doctor`), or raise "
            "launch_timeout in the kernelspec's provisioner config.\n" + await self._logs()
        )

    async def _logs(self) -> str:
        container = await asyncio.to_thread(self._container)
        if container is None:
            return ""
        raw = await asyncio.to_thread(container.logs, tail=40)
        return raw.decode(errors="replace")

    async def poll(self) -> int | None:
        """Return None while the container runs, else the kernel's exit code."""
        if self._exit_code is not None:
            return self._exit_code
        if self.container_id is None:
            return 0
        self._take_owner_lock()
        try:
            container = await asyncio.to_thread(self._container)
        except EngineUnavailable:
            return None
        if container is None:
            self._record_exit(-1, "its container was removed")
            return self._exit_code
        state = container.attrs["State"]
        if state["Status"] in ("created", "running", "restarting", "paused"):
            return None
        if state.get("OOMKilled"):
            reason = f"out of memory, limit {parse_bytes(self.memory) // 2**20} MiB"
        else:
            reason = f"exit code {state['ExitCode']}"
        self._record_exit(int(state["ExitCode"]) or 1, reason)
        return self._exit_code

    def _record_exit(self, code: int, reason: str) -> None:
        self._exit_code = code
        self.exit_reason = reason
        self.log.error("Kernel %s ended: %s", self.kernel_id, reason)

    async def wait(self) -> int | None:
        """Wait until the container has stopped."""
        while (code := await self.poll()) is None:
            await asyncio.sleep(0.1)
        return code

    async def send_signal(self, signum: int) -> None:
        """Send a signal to the kernel (``--init`` forwards it to ipykernel)."""
        container = await asyncio.to_thread(self._container)
        if container is None or signum == 0:
            return
        try:
            await asyncio.to_thread(container.kill, signal=signal.Signals(signum).name)
        except docker.errors.APIError as exc:
            if "is not running" not in str(exc):
                raise

    async def kill(self, restart: bool = False) -> None:
        """Kill the kernel's container."""
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        """Ask the kernel to stop with SIGTERM."""
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        """Remove the container and its socket directory."""
        await self._remove()

    async def _remove(self) -> None:
        try:
            container = await asyncio.to_thread(self._container)
            if container is not None:
                await asyncio.to_thread(remove_container, container)
        finally:
            self.container_id = None
            self._release_owner_lock()
            if self.socket_dir is not None:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
                self.socket_dir = None

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """Containers need a moment longer than processes to stop."""
        return max(recommended, 5.0)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The launch already waits for the heartbeat; allow for the container's start."""
        return max(recommended, self.launch_timeout)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """Persist what a restarted server needs to re-attach to the running container."""
        info = await super().get_provisioner_info()
        info.update(
            container_id=self.container_id,
            socket_dir=str(self.socket_dir) if self.socket_dir else None,
            image=self.image,
        )
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Re-attach to the container recorded by :meth:`get_provisioner_info`."""
        await super().load_provisioner_info(provisioner_info)
        self.container_id = provisioner_info["container_id"]
        socket_dir = provisioner_info.get("socket_dir")
        self.socket_dir = Path(socket_dir) if socket_dir else None
        self._take_owner_lock()
        self.image = provisioner_info.get("image", self.image)
