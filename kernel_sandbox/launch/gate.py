"""The client's TCP ports, open to this user's own processes only.

A client that writes a TCP connection file (VS Code, a bare ``jupyter_client``) expects the
kernel's channels on ``127.0.0.1`` ports, which every account on the host can connect to: with
plain ZMQ sockets there, another account could subscribe to IOPub and read every cell's code and
output (the key only protects what a client sends), or make the launcher hold whatever it sends
before the signature is checked. So the launcher listens on those ports itself and admits a
connection only when the process at the other end runs as the launcher's own user, as the kernel
table says (``/proc/net/tcp``, which lists the owner of every local socket); an admitted
connection is joined byte for byte to the channel's ZMQ socket, bound in a private 0700
directory. Connections from other hosts, or from other network namespaces, are refused the same
way (no local owner). The cost is one more hop on the event loop for clients over TCP (the
provisioner's clients use IPC in a private directory and never pass here).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import struct
from pathlib import Path

from ..errors import KernelLaunchError

log = logging.getLogger("kernel_sandbox.launch")

HIGH_WATER = 1024 * 1024
"""Bytes a joined side may have unsent before the other side stops being read."""


def _table_address(address: str, port: int) -> str:
    """How /proc/net/tcp{,6} writes an address: 32-bit words in host byte order, then the port."""
    packed = ipaddress.ip_address(address).packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"


def peer_uid(sock: socket.socket) -> int | None:
    """The uid owning the other end of a loopback TCP connection, or None when no local socket is it."""
    peer = sock.getpeername()[:2]
    mine = sock.getsockname()[:2]
    wanted = (_table_address(*peer), _table_address(*mine))
    table = "/proc/net/tcp6" if sock.family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if (fields[1], fields[2]) == wanted:
                    return int(fields[7])
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return None


class _Side(asyncio.Protocol):
    """One end of a joined pair: what it reads goes to the other end, with flow control both ways."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None

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
        other = self.other.transport if self.other is not None else None
        if other is not None and not other.is_closing() and other.can_write_eof():
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
    """A client's TCP connection: admitted (joined to the ZMQ socket) only for this user's processes."""

    def __init__(self, gate: TcpGate) -> None:
        super().__init__()
        self._gate = gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        uid = peer_uid(sock) if sock is not None else None
        if uid != self._gate.uid:
            log.warning(
                "refused a connection to the %s channel from %s: %s", self._gate.channel,
                transport.get_extra_info("peername"),
                "no process on this host" if uid is None else f"a process of uid {uid}, not this user's",
            )
            transport.abort()
            return
        joining = asyncio.ensure_future(self._join())
        self._gate.joining.add(joining)
        joining.add_done_callback(self._gate.joining.discard)

    async def _join(self) -> None:
        try:
            _, inner = await asyncio.get_running_loop().create_unix_connection(_Side, str(self._gate.ipc_path))
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


class TcpGate:
    """Listen on ``ip``:``port`` and join each connection of this user's processes to ``ipc_path``."""

    def __init__(self, channel: str, ip: str, port: int, ipc_path: Path) -> None:
        self.channel = channel
        self.ipc_path = ipc_path
        self.uid = os.geteuid()
        self.joining: set[asyncio.Future[None]] = set()
        host = "0.0.0.0" if ip in ("*", "") else ip
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            self._sock: socket.socket | None = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise KernelLaunchError(f"cannot listen on {ip}:{port} for the {channel} channel: {exc}") from exc
        self._server: asyncio.AbstractServer | None = None
        self._serving = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        assert self._sock is not None
        self._server = await asyncio.get_running_loop().create_server(lambda: _Door(self), sock=self._sock)

    def close(self) -> None:
        """Stop listening (joined connections end with the front's sockets)."""
        self._serving.cancel()
        for task in self.joining:
            task.cancel()
        if self._server is not None:
            self._server.close()
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
