"""The client's TCP ports, open to this user's own processes only.

A client that writes a TCP connection file (VS Code, a bare ``jupyter_client``) expects the
kernel's channels on ``127.0.0.1`` ports, which every account on the host can connect to: with
plain ZMQ sockets there, another account could subscribe to IOPub and read every cell's code and
output (the key only protects what a client sends), or make the launcher hold whatever it sends
before the signature is checked. So the launcher listens on those ports itself and admits a
connection only when the other end is a live socket of the launcher's own user: the kernel is
asked about that one socket by its exact four addresses and ports (``NETLINK_SOCK_DIAG``; on a
kernel without it, ``/proc/net/tcp{,6}`` is read, matched the same way), and the answer must
say ESTABLISHED and the launcher's uid. A peer that already closed (its socket half-closed, or a
``TIME_WAIT`` row, which has no owner and reads as uid 0) is refused, as are connections from
other hosts or network namespaces (no local socket is theirs).

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
import ipaddress
import logging
import os
import queue
import selectors
import socket
import struct
import threading
from pathlib import Path
from typing import Any, cast

from ..errors import KernelLaunchError
from .journal import note

log = logging.getLogger("kernel_sandbox.launch")

HIGH_WATER = 1024 * 1024
"""Bytes a joined side may have unsent before the other side stops being read."""
MAX_PER_UID = 32
"""Admitted connections one uid may hold on one channel (a client holds one)."""
ESTABLISHED = 1
"""The kernel's TCP state number for a live connection (``/proc/net/tcp`` writes it ``01``)."""
LETTING_GO = (4, 5, 11)
"""FIN_WAIT1, FIN_WAIT2, CLOSING: a socket its process closed first, which still names its uid (a
TIME_WAIT row, 6, names none: it reads as uid 0)."""
PEER_ENDED = (7, 8)
"""CLOSE, CLOSE_WAIT: our end of a connection its peer reset or closed."""
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NO_COOKIE = 0xFFFFFFFF
_NLMSG = struct.Struct("=IHHII")
_DIAG_REQUEST = struct.Struct("=BBBxI")
_PORTS = struct.Struct(">HH")
_DIAG_TAIL = struct.Struct("=III")
_DIAG_REPLY = struct.Struct("=BBBB")
_DIAG_OWNER = struct.Struct("=IIIII")
DIAG_TIMEOUT = 1.0
"""Seconds the worker waits for the kernel's answer about one socket."""


def _endpoint(address: tuple[str, int]) -> tuple[int, bytes, int]:
    """The family, packed address and port of a socket name (IPv4-mapped IPv6 read as IPv4)."""
    ip = ipaddress.ip_address(address[0].split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (socket.AF_INET if ip.version == 4 else socket.AF_INET6), ip.packed, int(address[1])


def diag_owner(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
    """The TCP state and owner uid of the socket bound to ``local`` and connected to ``remote``.

    One ``SOCK_DIAG_BY_FAMILY`` request for exactly that socket; None when there is none. Raises
    OSError when the kernel offers no such lookup.
    """
    family, src, sport = _endpoint(local)
    _, dst, dport = _endpoint(remote)
    request = (
        _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF)
        + _PORTS.pack(sport, dport)
        + src.ljust(16, b"\0")
        + dst.ljust(16, b"\0")
        + _DIAG_TAIL.pack(0, NO_COOKIE, NO_COOKIE)
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(DIAG_TIMEOUT)
        diag.sendto(
            _NLMSG.pack(_NLMSG.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
            + request,
            (0, 0),
        )
        answer = diag.recv(65536)
    _, kind, _, _, _ = _NLMSG.unpack_from(answer)
    body = _NLMSG.size
    if kind == NLMSG_ERROR:
        error = -struct.unpack_from("=i", answer, body)[0]
        if error == 2:  # ENOENT: no such socket
            return None
        raise OSError(error, os.strerror(error))
    if kind != SOCK_DIAG_BY_FAMILY:
        raise OSError(f"sock_diag answered message type {kind}")
    got_family, state, _, _ = _DIAG_REPLY.unpack_from(answer, body)
    got_sport, got_dport = _PORTS.unpack_from(answer, body + 4)
    got_src = answer[body + 8 : body + 8 + len(src)]
    got_dst = answer[body + 24 : body + 24 + len(dst)]
    if (got_family, got_sport, got_dport, got_src, got_dst) != (family, sport, dport, src, dst):
        return None  # another socket (say, a listener found instead): not the one asked about
    uid = _DIAG_OWNER.unpack_from(answer, body + 52)[3]  # after the id: expires, queues, uid, inode
    return state, uid


def _table_address(family: int, packed: bytes, port: int) -> str:
    """How /proc/net/tcp{,6} writes an address: 32-bit words in host byte order, then the port."""
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"


def table_owner(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
    """:func:`diag_owner` read from ``/proc/net/tcp{,6}`` (the row matched by both ends), for
    kernels without sock_diag."""
    family, mine, my_port = _endpoint(local)
    _, theirs, their_port = _endpoint(remote)
    wanted = (_table_address(family, mine, my_port), _table_address(family, theirs, their_port))
    table = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    with open(table) as rows:
        next(rows)
        for row in rows:
            fields = row.split()
            if (fields[1], fields[2]) == wanted:
                return int(fields[3], 16), int(fields[7])
    return None


def peer_owner(sock_name: tuple[str, int], peer_name: tuple[str, int]) -> tuple[int, int] | None:
    """State and uid of the local socket at the other end of our connection ``sock_name`` ↔
    ``peer_name``.

    None when no local socket is it, or it cannot be told (read as "refuse").
    """
    try:
        try:
            return diag_owner(peer_name, sock_name)
        except OSError:
            return table_owner(peer_name, sock_name)
    except (OSError, ValueError, IndexError, StopIteration, struct.error):
        return None


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
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    conn.close()


def _let_go(conn: socket.socket) -> bool:
    """Whether the peer has ended the connection already: ours has its FIN (CLOSE_WAIT) or its
    reset (CLOSE)."""
    try:
        state = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return False
    return state in PEER_ENDED


_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: close() resets the connection."""


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
        try:
            owner = peer_owner(conn.getsockname()[:2], conn.getpeername()[:2])
        except OSError:  # the peer is gone already
            owner = None
        if owner is None and _let_go(conn):
            # its socket is gone (reset, or closed and reaped under load) with nothing read of it:
            # whoever it was can do nothing more, and a warning could not say whose it was
            _refuse(conn, gate.channel, "the peer let go before the check", logging.DEBUG)
        elif owner is None:
            _refuse(conn, gate.channel, "no live socket of this host is its peer")
        elif owner[0] != ESTABLISHED:
            why = f"the peer's socket is not connected (TCP state {owner[0]})"
            # this user's own client let go before the check (jupyter_client's heartbeat makes a
            # new connection after a missed beat, as a launcher starting under load misses some):
            # nothing of it was read and nothing is wrong; another uid's, or a TIME_WAIT row's
            # (uid 0, whoever made it), is warned of
            own = owner[1] == gate.uid and owner[0] in LETTING_GO
            _refuse(conn, gate.channel, why, logging.DEBUG if own else logging.WARNING)
        elif owner[1] != gate.uid:
            _refuse(conn, gate.channel, f"a process of uid {owner[1]}, not this user's")
        else:
            gate.hand_over(conn, owner[1])


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

    def __init__(self, channel: str, ip: str, port: int, ipc_path: Path) -> None:
        self.channel = channel
        self.ipc_path = ipc_path
        self.uid = os.geteuid()
        self.admitted: collections.Counter[int] = collections.Counter()
        self._work: set[asyncio.Future[Any]] = set()
        self._loop = asyncio.get_running_loop()
        host = "0.0.0.0" if ip in ("*", "") else ip
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            self._sock: socket.socket | None = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise KernelLaunchError(
                f"cannot listen on {ip}:{port} for the {channel} channel: {exc}"
            ) from exc
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
