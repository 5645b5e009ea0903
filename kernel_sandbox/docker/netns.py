"""The direct path to the kernel's ports, for root on runc: sockets made from a thread inside the
container's network namespace, connected to (or listening on) the container's own loopback."""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from ..kernelside.connector import MAX_RETRY_SECONDS, RETRY_SECONDS, connect
from .connect import engine_address

if TYPE_CHECKING:
    from .settings import DockerSettings

CLONE_NEWNET = 0x40000000


def may_enter_netns(settings: DockerSettings, info: dict[str, Any]) -> bool:
    """The direct path needs root on the engine's own host and runc (gVisor keeps its own network
    stack)."""
    runtime = settings.runtime or info.get("DefaultRuntime") or "runc"
    return os.geteuid() == 0 and runtime == "runc" and engine_address().startswith("unix://")


def container_netns(container: Any) -> int | None:
    """An open handle on the container's network namespace, or None when it cannot be had safely.

    The namespace is found through the container's init pid; the engine is asked again after
    opening it, so a pid that was reused meanwhile is never taken for the container's.
    """
    container.reload()
    pid = container.attrs["State"]["Pid"]
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # not in the engine's pid namespace (say, a launcher inside a container)
    container.reload()
    if container.attrs["State"]["Pid"] != pid or not container.attrs["State"]["Running"]:
        os.close(fd)
        return None
    return fd


def connect_in_netns(  # noqa: C901
    netns: int, port: int, wait_seconds: float, cancel: threading.Event
) -> asyncio.Future[socket.socket]:
    """A TCP connection to ``port`` on the container's own loopback, made from inside its namespace.

    A fresh thread enters the namespace (setns changes only the calling thread) and connects,
    retrying while the kernel starts, until ``wait_seconds`` pass or ``cancel`` is set; the
    socket stays in that namespace wherever it is used afterwards.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[socket.socket] = loop.create_future()

    def settle(sock: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled: the launcher stopped meanwhile
            if sock is not None:
                sock.close()
        elif error is not None:
            future.set_exception(error)
        else:
            ours = socket.socket(fileno=sock.detach())
            ours.setblocking(False)
            future.set_result(ours)

    def enter_and_connect() -> None:
        deadline = time.monotonic() + wait_seconds
        error: OSError | None
        try:
            if _libc().setns(netns, CLONE_NEWNET) != 0:
                raise OSError(
                    ctypes.get_errno(), "setns into the kernel's network namespace failed"
                )
            delay = RETRY_SECONDS
            while True:
                try:
                    sock = connect(port, 0)
                    break
                except OSError:
                    if cancel.is_set() or time.monotonic() >= deadline:
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_SECONDS)
        except OSError as exc:
            sock, error = None, exc
        else:
            error = None
        try:
            loop.call_soon_threadsafe(settle, sock, error)
        except RuntimeError:  # the loop is closed: the launch ended meanwhile, nobody waits
            if sock is not None:
                sock.close()

    threading.Thread(target=enter_and_connect, name="netns-connect", daemon=True).start()
    return future


def listen_in_netns(netns: int, port: int) -> socket.socket:
    """A listening socket on ``port`` of the container's own loopback, made by a fresh thread inside
    its namespace (setns changes only the calling thread); the socket stays in that namespace."""
    made: dict[str, Any] = {}

    def enter_and_listen() -> None:
        try:
            if _libc().setns(netns, CLONE_NEWNET) != 0:
                raise OSError(
                    ctypes.get_errno(), "setns into the kernel's network namespace failed"
                )
            sock = made["sock"] = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
        except OSError as exc:
            made["error"] = exc

    thread = threading.Thread(target=enter_and_listen, name="netns-listen", daemon=True)
    thread.start()
    thread.join()
    if "error" in made:
        if "sock" in made:
            made["sock"].close()
        raise made["error"]
    made["sock"].setblocking(False)
    return cast(socket.socket, made["sock"])


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)
