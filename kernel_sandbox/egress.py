"""Egress by name: the ``network`` option's destinations, as both backends read them.

``network`` is ``false`` (no network: the default), ``true`` (the backend's open network), or a
list of destinations the kernel may reach, each spelt ``HOST[:PORT][@ADDRESSES]``:

- ``pypi.org``: that name; ``*.pythonhosted.org``: any name below that domain (not the domain
  itself);
- ``:443``: that port only; without a port, 80 and 443 (:data:`DEFAULT_PORTS`);
- ``@10.1.2.0/24`` (comma-separated networks or addresses): the name may resolve to these
  loopback, private or link-local addresses. Without it, a name that resolves to any address
  that is not global (loopback, private, link-local, multicast, reserved) or to the host's own
  is refused: a listed name cannot be pointed into the host's networks. A company mirror on a
  private address is listed as ``pypi.corp.example@10.1.2.3``;
- an address itself (``10.1.2.3:8080``, ``[fd00::1]:443``) allows that address, private or not.

:func:`parse_destinations` checks a list (a malformed entry is a :class:`ConfigError` naming it)
and :class:`Destination` matches a request; the launcher (:mod:`.launch.egress`) decides with
them. The package index (option ``package_index``) is PyPI's two hosts unless a mirror is named;
an index URL on a loopback address is refused (:data:`LOCALHOST`): in the sandbox it is the
sandbox.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union
from urllib.parse import urlsplit

from .errors import ConfigError

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

DEFAULT_PORTS = (80, 443)
"""The ports a destination without ``:PORT`` allows."""
PYPI = ("pypi.org", "files.pythonhosted.org")
"""The package index ``install()`` opens by default: PyPI's pages and its files."""
MAX_ENTRIES = 256
LOCALHOST = ("localhost", "localhost.localdomain", "ip6-localhost")
"""Names of the loopback: an index URL naming one (or a loopback address) can never be reached."""
WINDOW_REQUEST = "kernel_sandbox_egress_request"
"""The control message by which a client holding the connection key asks the launcher to open the
package index for one call (``{"open": SECONDS}``) and to close it (``{"close": ID}``)."""
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_PORT = re.compile(r"[0-9]{1,5}")


def _refuse(option: str, entry: Any, why: str) -> ConfigError:
    return ConfigError(f"{option}: {entry!r} {why}")


def _refuse_value(option: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{option}={value!r}: {why}")


def valid_name(host: str) -> bool:
    """True for a DNS name of letters, digits and hyphens (labels of 1-63, 253 in all)."""
    return len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.split("."))


def literal_address(host: str) -> Address | None:
    """The address ``host`` spells (``10.0.0.1``, ``[::1]`` or ``::1``), or None for a name."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def split_host_port(text: str) -> tuple[str, int | None] | None:
    """``HOST[:PORT]`` (``[V6]:PORT`` for IPv6) as (lower-case host, port or None); None if
    malformed."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        host, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        host, port_text = text, None  # a bare IPv6 address
    else:
        host, _, port_text = text.partition(":")
        port_text = port_text if ":" in text else None
    port = None
    if port_text is not None:
        if not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    return host.lower(), port


@dataclass(frozen=True)
class Destination:
    """One allowed destination: a name, ``*.domain`` or an address; a port or the default ones;
    the non-global networks it may resolve to."""

    host: str
    port: int | None = None
    allow: tuple[Network, ...] = ()

    @property
    def wildcard(self) -> bool:
        """True for ``*.domain``: any name below the domain."""
        return self.host.startswith("*.")

    @property
    def address(self) -> Address | None:
        """The address this destination spells, or None for a name."""
        return literal_address(self.host)

    def matches(self, host: str, port: int) -> bool:
        """True when a request for ``host:port`` (a normalised name or address) falls under this
        entry."""
        if port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        if self.wildcard:
            return host.endswith(self.host[1:]) and literal_address(host) is None
        own = self.address
        if own is not None:
            return literal_address(host) == own
        return host == self.host

    def permits(self, address: Address) -> bool:
        """True when this entry lets its name resolve to the non-global ``address``."""
        return address == self.address or any(address in network for network in self.allow)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        text = host if self.port is None else f"{host}:{self.port}"
        return text + ("@" + ",".join(map(str, self.allow)) if self.allow else "")


def parse_destination(option: str, entry: Any) -> Destination:
    """Check one entry ``HOST[:PORT][@ADDRESSES]`` (see the module docstring)."""
    if not isinstance(entry, str) or not entry.strip() or len(entry) > 1000:
        raise _refuse(
            option,
            entry,
            "must be a host name such as 'pypi.org', '*.example.com' or 'api.example.com:443'",
        )
    text, at, allowed = entry.strip().partition("@")
    if any(ch.isspace() for ch in text) or "/" in text:
        raise _refuse(
            option, entry, "must be a host name, not a URL: write 'pypi.org' or 'pypi.org:443'"
        )
    parts = split_host_port(text)
    if parts is None:
        raise _refuse(
            option, entry, "has a malformed port: write HOST:PORT with a port from 1 to 65535"
        )
    host, port = parts
    address = literal_address(host)
    if address is not None:
        host = str(address)
    elif host.startswith("*."):
        if not valid_name(host[2:]) or host.count(".") < 2:
            raise _refuse(
                option,
                entry,
                "is too broad or malformed: a wildcard is '*.' and a domain of two labels or more",
            )
    elif not valid_name(host) or host.replace(".", "").isdigit():
        raise _refuse(
            option, entry, "is not a host name (letters, digits, hyphens and dots) or an IP address"
        )
    networks: list[Network] = []
    if at:
        if not allowed:
            raise _refuse(option, entry, "names no address after '@' (e.g. 'mirror.corp@10.1.2.3')")
        for item in allowed.split(","):
            try:
                networks.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError:
                raise _refuse(
                    option, entry, f"has {item!r} after '@', which is not an address or network"
                ) from None
    return Destination(host, port, tuple(networks))


def parse_destinations(option: str, value: Iterable[Any]) -> tuple[Destination, ...]:
    """Check a list of entries; the same destination twice is kept once."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _refuse_value(
            option,
            value,
            "must be true, false or a list of destinations such as ['pypi.org', "
            "'*.example.com:443']",
        )
    if len(value) > MAX_ENTRIES:
        raise ConfigError(f"{option}: at most {MAX_ENTRIES} destinations, not {len(value)}")
    return tuple(dict.fromkeys(parse_destination(option, entry) for entry in value))


def parse_network(option: str, value: Any) -> bool | tuple[str, ...]:
    """The ``network`` option: true, false, or the canonical spelling of each destination (an empty
    list is false)."""
    if isinstance(value, bool):
        return value
    destinations = parse_destinations(option, value)
    return tuple(map(str, destinations)) or False


@dataclass(frozen=True)
class PackageIndex:
    """Where pip finds packages: the destinations to open, and the index URL to give pip (None:
    PyPI)."""

    destinations: tuple[Destination, ...]
    url: str | None = None


def parse_package_index(option: str, value: Any) -> tuple[str, ...]:
    """The ``package_index`` option: destinations, and at most one index URL
    (``https://mirror/simple``).

    A URL opens its host and port (``@ADDRESSES`` entries for the same host let it be private).
    Kept as given, checked; :func:`package_index` reads it.
    """
    entries = [value] if isinstance(value, str) else value
    if not isinstance(entries, (list, tuple)) or not entries:
        raise _refuse_value(
            option,
            value,
            "must be a package index URL or a list of destinations such as ['pypi.org']",
        )
    package_index(option, entries)
    return tuple(entry.strip() for entry in entries)


def package_index(option: str, entries: str | Sequence[str]) -> PackageIndex:
    """The package index that ``entries`` (a checked ``package_index``, or one URL) name."""
    if isinstance(entries, str):
        entries = [entries]
    urls = [entry for entry in entries if isinstance(entry, str) and "://" in entry]
    if len(urls) > 1:
        raise _refuse(option, list(entries), "names more than one index URL; give pip one")
    destinations = [parse_destination(option, entry) for entry in entries if entry not in urls]
    url = None
    if urls:
        url = urls[0].strip()
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.username
            or port == -1
        ):
            raise _refuse(
                option,
                url,
                "must be an http:// or https:// index URL such as https://mirror.example/simple",
            )
        loopback = literal_address(parts.hostname)
        if (loopback is not None and loopback.is_loopback) or parts.hostname in LOCALHOST:
            raise _refuse(
                option,
                url,
                "names a loopback address, which inside the sandbox is the sandbox itself: give "
                "the index's name or an address the host reaches it at, with that address after "
                "'@' when it is private (['http://devpi.lan:3141/simple', "
                "'devpi.lan:3141@192.168.1.5'])",
            )
        default = 443 if parts.scheme == "https" else 80
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        destinations.insert(0, parse_destination(option, f"{host}:{port or default}"))
    return PackageIndex(tuple(dict.fromkeys(destinations)), url)


def opensandbox_rules(option: str, entries: Sequence[str]) -> list[dict[str, str]]:
    """The destinations as OpenSandbox ``networkPolicy`` egress rules (names only: the sidecar
    filters by DNS name)."""
    rules = []
    for entry in entries:
        destination = parse_destination(option, entry)
        if destination.port is not None or destination.allow or destination.address is not None:
            raise _refuse(
                option,
                entry,
                "cannot be enforced on OpenSandbox, whose egress rules take names and "
                "'*.domain' only: drop the port, address or '@'",
            )
        rules.append({"action": "allow", "target": destination.host})
    return rules
