"""Who is at the other end of a TCP connection to a kernel's port: a live socket of which uid.

The check of :mod:`.gate` (the awake launcher's) and of :mod:`.dormant` (a sleeping kernel's):
the kernel is asked about that one socket by its exact four addresses and ports
(``NETLINK_SOCK_DIAG``; on a kernel without it, ``/proc/net/tcp{,6}`` is read, matched the same
way), and only an ESTABLISHED socket of the launcher's own uid is admitted. Standard library only:
the dormant process imports it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

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


def judge(conn: socket.socket, uid: int) -> tuple[str | None, bool]:
    """Whether to admit ``conn``: (None, _) when its peer is a live socket of ``uid``; else why
    not, and whether that is quiet (this user's own client that let go, or a peer gone with
    nothing read: nothing to warn of)."""
    try:
        owner = peer_owner(conn.getsockname()[:2], conn.getpeername()[:2])
    except OSError:  # the peer is gone already
        owner = None
    if owner is None and _let_go(conn):
        # its socket is gone (reset, or closed and reaped under load) with nothing read of it:
        # whoever it was can do nothing more, and a warning could not say whose it was
        return "the peer let go before the check", True
    if owner is None:
        return "no live socket of this host is its peer", False
    if owner[0] != ESTABLISHED:
        # this user's own client let go before the check (jupyter_client's heartbeat makes a
        # new connection after a missed beat, as a launcher starting under load misses some):
        # nothing of it was read and nothing is wrong; another uid's, or a TIME_WAIT row's
        # (uid 0, whoever made it), is warned of
        own = owner[1] == uid and owner[0] in LETTING_GO
        return f"the peer's socket is not connected (TCP state {owner[0]})", own
    if owner[1] != uid:
        return f"a process of uid {owner[1]}, not this user's", False
    return None, False


def reset(conn: socket.socket) -> None:
    """Close ``conn`` with a reset (nothing it sent is read)."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    conn.close()


_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: close() resets the connection."""
