"""The grammar of the egress proxy's requests: a request head parsed strictly (one request, CRLF
lines, tokens only; ``CONNECT host:port`` or a plain-HTTP absolute URI), the refusal a request the
proxy does not carry is answered with, and the log of refusals (at most a line per name a
minute)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..egress import literal_address, split_host_port, valid_name

log = logging.getLogger("kernel_sandbox.launch")

HEAD_LIMIT = 16 * 1024
"""Bytes of a request line and its headers together."""
MAX_HEADERS = 64
LOG_EVERY = 60.0
LOG_NAMES = 256
"""Names whose last refusal is remembered; refusals of others are counted and summed up once per
:data:`LOG_EVERY`."""
_TOKEN = set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
}


class Refusal(Exception):
    """A request the proxy does not carry: answered with ``status`` and a one-line ``reason``."""

    def __init__(self, status: int, reason: str, name: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.name = name


class RefusalLog:
    """Log each refused name at most once per :data:`LOG_EVERY` s, remembering at most
    :data:`LOG_NAMES` names."""

    def __init__(self, every: float = LOG_EVERY, names: int = LOG_NAMES) -> None:
        self.every = every
        self.names = names
        self._last: dict[str, float] = {}
        self._unlogged = 0
        self._summary = float("-inf")

    def refused(self, name: str, reason: str) -> None:
        """Note one refusal of ``name``: logged unless that name was logged less than a minute ago;
        the others are counted, and the count logged at most once a minute."""
        now = time.monotonic()
        for old in [key for key, when in self._last.items() if now - when >= self.every]:
            del self._last[old]
        if name not in self._last and len(self._last) < self.names:
            self._last[name] = now
            log.warning("egress refused: %s", reason[:300])
            return
        self._unlogged += 1
        if now - self._summary >= self.every:
            self._summary = now
            log.warning(
                "egress: %d more refusals, not logged one by one (at most one line per name a "
                "minute)",
                self._unlogged,
            )
            self._unlogged = 0


@dataclass
class Request:
    """A parsed request head: where it goes, and for plain HTTP the head to send on."""

    host: str
    port: int
    connect: bool
    head: bytes = b""


def parse_head(raw: bytes) -> Request:  # noqa: C901
    """Parse a request head (ending in CRLF CRLF), strictly: one request, CRLF lines, tokens
    only."""
    if b"\0" in raw:
        raise Refusal(400, "kernel-sandbox proxy: NUL in the request head")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise Refusal(400, "kernel-sandbox proxy: the request head is not ASCII") from None
    lines = text[:-4].split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise Refusal(400, "kernel-sandbox proxy: a bare CR or LF in the request head")
    if len(lines) - 1 > MAX_HEADERS:
        raise Refusal(431, f"kernel-sandbox proxy: more than {MAX_HEADERS} headers")
    parts = lines[0].split(" ")
    if (
        len(parts) != 3
        or parts[2] not in ("HTTP/1.1", "HTTP/1.0")
        or not parts[0]
        or set(parts[0]) - _TOKEN
    ):
        raise Refusal(400, "kernel-sandbox proxy: malformed request line")
    method, target, version = parts
    if any(ord(ch) <= 32 or ord(ch) == 127 for ch in target):
        raise Refusal(400, "kernel-sandbox proxy: control character in the request target")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or set(name) - _TOKEN:
            raise Refusal(400, "kernel-sandbox proxy: malformed header line")
        if any(ord(ch) < 32 and ch != "\t" or ord(ch) == 127 for ch in value):
            raise Refusal(400, "kernel-sandbox proxy: control character in a header")
        headers.append((name, value.strip()))
    if method == "CONNECT":
        host_port = split_host_port(target)
        if host_port is None or host_port[1] is None or not _host_ok(host_port[0]):
            raise Refusal(400, "kernel-sandbox proxy: CONNECT needs HOST:PORT")
        return Request(host_port[0], host_port[1], True)
    if not target.startswith("http://"):
        raise Refusal(
            400, "kernel-sandbox proxy: only CONNECT and absolute http:// URIs are proxied"
        )
    authority, slash, path = target[len("http://") :].partition("/")
    host_port = split_host_port(authority)
    if host_port is None or "@" in authority or not _host_ok(host_port[0]):
        raise Refusal(400, "kernel-sandbox proxy: malformed host in the request URI")
    host, port = host_port[0], host_port[1] or 80
    for name, value in headers:
        given = split_host_port(value.lower()) if name.lower() == "host" else (host, port)
        if given is None or given[0] != host or (given[1] or 80) != port:
            raise Refusal(
                400, "kernel-sandbox proxy: the Host header differs from the request URI's host"
            )
    kept = [(name, value) for name, value in headers if name.lower() not in _HOP_BY_HOP]
    if not any(name.lower() == "host" for name, _ in kept):
        kept.insert(0, ("Host", authority.lower()))
    head = "\r\n".join(
        [
            f"{method} /{path if slash else ''} {version}",
            *(f"{n}: {v}" for n, v in kept),
            "Connection: close",
            "",
            "",
        ]
    )
    return Request(host, port, False, head.encode("ascii"))


def _host_ok(host: str) -> bool:
    return literal_address(host) is not None or valid_name(host)
