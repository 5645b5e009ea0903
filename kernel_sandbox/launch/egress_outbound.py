"""How the egress proxy reaches out: the host's resolver (:func:`system_resolve`, the one place
the launcher asks DNS), :func:`open_outbound` (the one function that connects), and which addresses
a name may not lead to by default."""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Awaitable, Callable

from ..egress import Address

CONNECT_TIMEOUT = 10.0
CHUNK = 256 * 1024

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolve a host name to its addresses (``host``, ``port``): the one place the launcher asks
DNS."""
Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's resolver (getaddrinfo), TCP answers only."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def open_outbound(
    address: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to ``address:port``: every outbound connection of the proxy is made here."""
    return await asyncio.wait_for(
        asyncio.open_connection(address, port, limit=CHUNK), CONNECT_TIMEOUT
    )


def host_addresses() -> frozenset[Address]:
    """The host's own addresses: its interfaces' (IPv4 by ioctl, IPv6 from /proc) and its name's."""
    found: set[Address] = set()
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                # SIOCGIFADDR
                packed = fcntl.ioctl(
                    probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15])
                )
                found.add(ipaddress.ip_address(packed[20:24]))
            except OSError:
                pass
    finally:
        probe.close()
    try:
        with open("/proc/net/if_inet6") as handle:
            found.update(
                ipaddress.ip_address(bytes.fromhex(line.split()[0]))
                for line in handle
                if line.strip()
            )
    except OSError:
        pass
    try:
        found.update(
            ipaddress.ip_address(a) for a in socket.gethostbyname_ex(socket.gethostname())[2]
        )
    except OSError:
        pass
    return frozenset(found)


def refused_address(address: Address, own: frozenset[Address]) -> str | None:
    """Why ``address`` may not be reached by default (None: it is a global address of someone
    else)."""
    if address in own:
        return "is this host's own address"
    if address.is_multicast:
        return "is a multicast address"
    if address.is_loopback:
        return "is a loopback address"
    if address.is_link_local:
        return "is a link-local address"
    if not address.is_global:
        return "is a private or reserved address"
    return None
