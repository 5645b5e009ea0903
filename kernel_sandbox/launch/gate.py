"""The client's TCP ports, open to this user's own processes only.

A client that writes a TCP connection file (VS Code, a bare ``jupyter_client``) expects the
kernel's channels on ``127.0.0.1`` ports, which every account on the host can connect to: with
plain ZMQ sockets there, another account could subscribe to IOPub and read every cell's code and
output (the key only protects what a client sends), or make the launcher hold whatever it sends
before the signature is checked. So the launcher listens on those ports itself and admits a
connection only when the other end is a live socket of the launcher's own user
(:func:`.peers.judge`: a peer that already closed, or one from another host or network namespace,
is refused).

Accepting and checking happen in one thread of their own (:class:`_Doorkeeper`), never on the
event loop: a refused connection is reset there and the loop never sees it, so a flood of knocks
from another account costs the kernel's channels a share of the interpreter, not a wait behind
every knock (connections waiting for their check are the kernel's listen backlog, bounded by it).
Each uid holds at most :data:`MAX_PER_UID` admitted connections per channel. An admitted
connection is handed to the event loop and joined byte for byte to the channel's ZMQ socket,
bound in a private 0700 directory. The provisioner's clients use IPC in a private directory and
never pass here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import selectors
import socket
import threading
from pathlib import Path
from typing import Any, cast

from ..errors import KernelLaunchError
from .journal import note
from .peers import judge, reset

log = logging.getLogger("kernel_sandbox.launch")

HIGH_WATER = 1024 * 1024
"""Bytes a joined side may have unsent before the other side stops being read."""
MAX_PER_UID = 32
"""Admitted connections one uid may hold on one channel (a client holds one)."""


class _Side(asyncio.Protocol):
    """One end of a joined pair: what it reads goes to the other end, with flow control both
    ways."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None
        self.ended = False
        """True once this end has read the end of its stream (half-closed: the other may still
        write)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=HIGH_WATER)
        transport.pause_reading()  # nothing is read before the two ends are joined

    def join(self, other: _Side) -> None:
        """Relay between this end and ``other`` from now on."""
        self.other, other.other = other, self
        for side in (self, other):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        other = self.other.transport if self.other is not None else None
        if other is not None and not other.is_closing():
            other.write(data)

    def eof_received(self) -> bool:
        self.ended = True
        other = self.other.transport if self.other is not None else None
        if other is None or other.is_closing():
            return False
        if self.other is not None and self.other.ended:  # both ways are done: the pair ends
            other.close()
            return False
        if other.can_write_eof():
            other.write_eof()
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class _Door(_Side):
    """An admitted client connection (of ``uid``, counted in by the gate), joined to the channel's
    ZMQ socket."""

    def __init__(self, gate: TcpGate, uid: int) -> None:
        super().__init__()
        self._gate = gate
        self.uid: int | None = uid

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._gate.track(asyncio.ensure_future(self._join()))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.uid is not None:
            self._gate.admitted[self.uid] -= 1
            self.uid = None

    async def _join(self) -> None:
        try:
            _, inner = await asyncio.get_running_loop().create_unix_connection(
                _Side, str(self._gate.ipc_path)
            )
        except OSError as exc:
            log.warning("could not join a %s connection to its socket: %s", self._gate.channel, exc)
            if self.transport is not None:
                self.transport.abort()
            return
        if self.transport is None or self.transport.is_closing():
            if inner.transport is not None:
                inner.transport.close()
            return
        self.join(inner)


def _refuse(conn: socket.socket, channel: str, why: str, level: int = logging.WARNING) -> None:
    """Reset ``conn`` (nothing it sent is read) and log why, once per kind and interval."""
    note(log, level, "refused a connection to the %s channel: %s", channel, why)
    reset(conn)


class _Doorkeeper:
    """The thread that accepts on every gate's port, checks each peer and refuses the others.

    Refused connections never reach the event loop; an admitted one is handed to its gate there.
    """

    BATCH = 64
    """Connections taken from one port before the others get their turn."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._changes: queue.SimpleQueue[tuple[socket.socket, TcpGate | None, threading.Event]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name="tcp-gate", daemon=True).start()

    def watch(self, sock: socket.socket, gate: TcpGate | None) -> None:
        """Start (``gate``) or stop (None: the socket is closed) accepting on ``sock``; return once
        done."""
        done = threading.Event()
        self._changes.put((sock, gate, done))
        self._wake_write.send(b"x")
        done.wait(CHANGE_WAIT)

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.fileobj is self._wake_read:
                    self._apply_changes()
                else:
                    self._accept(cast(socket.socket, key.fileobj), key.data)

    def _apply_changes(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except BlockingIOError:
            pass
        while not self._changes.empty():
            sock, gate, done = self._changes.get()
            if gate is not None:
                self._selector.register(sock, selectors.EVENT_READ, gate)
            else:
                try:
                    self._selector.unregister(sock)
                except (KeyError, ValueError):
                    pass
                sock.close()
            done.set()

    def _accept(self, listener: socket.socket, gate: TcpGate) -> None:
        for _ in range(self.BATCH):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            # out of file descriptors, say: the connection waits in the backlog
            except OSError as exc:
                note(
                    log,
                    logging.WARNING,
                    "could not accept a connection to the %s channel: %s",
                    gate.channel,
                    exc,
                )
                return
            try:
                self._decide(conn, gate)
            # whatever went wrong, the thread goes on and the connection is not admitted
            except Exception:
                log.exception("could not check a connection to the %s channel", gate.channel)
                conn.close()

    def _decide(self, conn: socket.socket, gate: TcpGate) -> None:
        """Admit ``conn`` (hand it to its gate) or refuse it, by the owner of its peer's socket."""
        why, quiet = judge(conn, gate.uid)
        if why is None:
            gate.hand_over(conn, gate.uid)
        else:
            _refuse(conn, gate.channel, why, logging.DEBUG if quiet else logging.WARNING)


CHANGE_WAIT = 5.0
"""Seconds :meth:`_Doorkeeper.watch` waits for the thread to take a change."""
_doorkeeper: _Doorkeeper | None = None


def _the_doorkeeper() -> _Doorkeeper:
    global _doorkeeper
    if _doorkeeper is None:
        _doorkeeper = _Doorkeeper()
    return _doorkeeper


class TcpGate:
    """Listen on ``ip``:``port`` and join each live connection of this user's processes to
    ``ipc_path``."""

    def __init__(
        self, channel: str, ip: str, port: int, ipc_path: Path, sock: socket.socket | None = None
    ) -> None:
        self.channel = channel
        self.ipc_path = ipc_path
        self.uid = os.geteuid()
        self.admitted: collections.Counter[int] = collections.Counter()
        self._work: set[asyncio.Future[Any]] = set()
        self._loop = asyncio.get_running_loop()
        host = "0.0.0.0" if ip in ("*", "") else ip
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            self._sock: socket.socket | None = sock or socket.create_server(
                (host, port), family=family
            )
        except OSError as exc:
            raise KernelLaunchError(
                f"cannot listen on {ip}:{port} for the {channel} channel: {exc}"
            ) from exc
        self.listener = self._sock
        """The listening socket (``sock``, one inherited across an exec, or a new one)."""
        self._sock.setblocking(False)
        _the_doorkeeper().watch(self._sock, self)

    def track(self, work: asyncio.Future[Any]) -> None:
        """Keep ``work`` (a join) until it is done; :meth:`close` cancels what is left."""
        self._work.add(work)
        work.add_done_callback(self._work.discard)

    def hand_over(self, conn: socket.socket, uid: int) -> None:
        """From the doorkeeper's thread: serve an admitted connection of ``uid`` on the event
        loop."""
        try:
            self._loop.call_soon_threadsafe(self._admit, conn, uid)
        except RuntimeError:  # the loop is closed: the launcher is ending
            conn.close()

    def _admit(self, conn: socket.socket, uid: int) -> None:
        if self._sock is None:
            conn.close()
        elif self.admitted[uid] >= MAX_PER_UID:
            _refuse(conn, self.channel, f"uid {uid} holds {MAX_PER_UID} connections to it already")
        else:
            conn.setblocking(False)
            self.admitted[uid] += 1  # counted out when the door closes, or now if it never opens
            serving = asyncio.ensure_future(
                self._loop.connect_accepted_socket(lambda: _Door(self, uid), conn)
            )
            serving.add_done_callback(lambda done: self._never_opened(done, conn, uid))
            self.track(serving)

    def _never_opened(self, serving: asyncio.Future[Any], conn: socket.socket, uid: int) -> None:
        if serving.cancelled() or serving.exception() is not None:
            self.admitted[uid] -= 1
            conn.close()

    def close(self) -> None:
        """Stop listening (joined connections end with the front's sockets)."""
        for work in list(self._work):
            work.cancel()
        if self._sock is not None:
            _the_doorkeeper().watch(self._sock, None)
        self._sock = None
