"""How the egress proxy reaches out: the host's resolver, :func:`open_outbound` (the one function
that connects), which addresses a name may not lead to by default, and the test run's resolver map
and loopback guard.

Tests name a map of host names to addresses in ``KERNEL_SANDBOX_TEST_RESOLVER`` (the launcher's
own environment, which the kernel cannot set): the launcher then resolves from it alone and
connects to loopback only (:func:`guarded`), writing ``PATH.guard`` if anything else was tried.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import json
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable

from ..egress import Address

log = logging.getLogger("kernel_sandbox.launch")

CONNECT_TIMEOUT = 10.0
CHUNK = 256 * 1024
TEST_RESOLVER_ENV = "KERNEL_SANDBOX_TEST_RESOLVER"

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


class GuardError(OSError):
    """A connection to an address outside 127.0.0.0/8 was attempted while the guard was on."""


def guarded(connect: Connector, fired: Callable[[str], None]) -> Connector:
    """``connect``, refusing (and reporting through ``fired``) any address outside 127.0.0.0/8."""

    async def connect_loopback(
        address: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if ipaddress.ip_address(address) not in ipaddress.ip_network("127.0.0.0/8"):
            fired(f"{address}:{port}")
            raise GuardError(f"the test guard refused {address}:{port}")
        return await connect(address, port)

    return connect_loopback


def test_hooks(
    environ: dict[str, str] | os._Environ[str] = os.environ,
) -> tuple[Resolver, Connector] | None:
    """The resolver and guarded connector of a test run (``KERNEL_SANDBOX_TEST_RESOLVER``), or None.

    The map is JSON ``{"name": ["address", ...]}`` in a file of the launcher's own user that no
    one else may write; the guard leaves ``PATH.guard`` behind when it fires.
    """
    path = environ.get(TEST_RESOLVER_ENV)
    if not path:
        return None
    info = os.stat(path)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(
            f"{TEST_RESOLVER_ENV}={path}: must be this user's file, writable by no one else"
        )

    async def resolve(host: str, port: int) -> list[str]:
        with open(path) as handle:
            table = json.load(handle)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the test's resolver map")
        return [str(address) for address in table[host]]

    def fired(where: str) -> None:
        log.error("egress guard: a connection to %s was attempted", where)
        with open(path + ".guard", "a") as handle:
            handle.write(where + "\n")

    return resolve, guarded(open_outbound, fired)


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
