"""The egress proxy's secrets: placeholders for the kernel, values put in on the way out.

For each secret (:mod:`kernel_sandbox.hostsecrets`) the kernel gets a random placeholder in its
environment. A ``CONNECT`` to a bound destination is not spliced: the proxy opens its own TLS
connection to the real host (verified with the host's trust store, or the launcher's
``SSL_CERT_FILE``, before anything is relayed) and answers the kernel's TLS with a certificate
for that name from a CA made for this kernel alone (:class:`KernelCA`: its key only in the
launcher's memory, its certificate in the kernel's trust, constrained to the bound names) and
relays HTTP/1.1 with h11 (:func:`relay_http`), putting each value in place of its placeholder in
the request's headers (and, opted in, its query string), never in a body. Any other destination,
plain HTTP included, sees the placeholder.
"""

from __future__ import annotations

import datetime
import os
import secrets
import ssl
import string
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import h11
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..egress import Destination
from ..errors import ConfigError
from ..hostsecrets import MAX_SECRETS, Binding, check_value, parse_binding
from ..kernelside.trust import BUNDLE, CA_ENV, TRUST_ENV
from .tls_stream import CHUNK, TlsStream

LONG_BODY = 64 * 1024
"""An answer's body this long or longer is copied to the kernel as it comes, not event by event
through h11 (whose buffer copies every byte several times); its connection closes after it."""
VALID_DAYS = 400
PLACEHOLDER_MIN = 40
_ALPHABET = string.ascii_letters + string.digits
_DROPPED = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"trailer",
    b"upgrade",
    b"http2-settings",
    b"expect",
}
"""Hop-by-hop headers and those h11 writes itself: never relayed (so no upgrade to HTTP/2 or a
WebSocket, and no ``Expect`` the proxy does not answer itself)."""


class KernelCA:
    """A CA made for one kernel: EC P-256, its key in memory only, its names constrained to
    ``hosts``."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before = now - datetime.timedelta(hours=1)
        self._not_after = now + datetime.timedelta(days=VALID_DAYS)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kernel-sandbox egress CA")])
        self._name = name
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.NameConstraints(
                    permitted_subtrees=[x509.DNSName(host) for host in sorted(set(hosts))],
                    excluded_subtrees=None,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self._contexts: dict[str, ssl.SSLContext] = {}

    def __repr__(self) -> str:
        return "<KernelCA key=<hidden>>"

    @property
    def pem(self) -> str:
        """The CA certificate (never its key), PEM."""
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS context that answers the kernel as ``host``: a leaf certificate signed by this
        CA, HTTP/1.1 by ALPN."""
        context = self._contexts.get(host)
        if context is None:
            context = self._contexts[host] = self._leaf_context(host)
        return context

    def _leaf_context(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        # ssl loads a key from a file only: encrypted with a password that never leaves memory,
        # in a 0700 directory, removed at once
        password = secrets.token_bytes(32)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        with tempfile.TemporaryDirectory(prefix="kernel-sandbox-tls-") as directory:
            path = Path(directory) / "leaf.pem"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(leaf.public_bytes(serialization.Encoding.PEM))
                handle.write(
                    key.private_bytes(
                        serialization.Encoding.PEM,
                        serialization.PrivateFormat.PKCS8,
                        serialization.BestAvailableEncryption(password),
                    )
                )
            context.load_cert_chain(path, password=password)
        return context


def upstream_context() -> ssl.SSLContext:
    """How the proxy verifies a bound host: the host's trust store (``SSL_CERT_FILE`` of the
    launcher's environment honoured), HTTP/1.1."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


def make_placeholder(value: str) -> str:
    """An opaque random token, as long as ``value`` (at least :data:`PLACEHOLDER_MIN`)."""
    length = max(PLACEHOLDER_MIN, len(value))
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


@dataclass(frozen=True)
class _Held:
    binding: Binding
    placeholder: str


class SecretTable:
    """One kernel's secrets: placeholders, values (never shown), the CA, and how often each was
    used."""

    def __init__(self, bindings: Sequence[Binding], values: Mapping[str, str]) -> None:
        self._held = [_Held(b, make_placeholder(values[b.name])) for b in bindings]
        self._values = {held.placeholder: values[held.binding.name] for held in self._held}
        self.ca = KernelCA([d.host for b in bindings for d in b.hosts])
        self.uses: Counter[str] = Counter({b.name: 0 for b in bindings})
        self.on_use: Callable[[], None] = lambda: None
        """Called after a request used a secret (the launcher writes :attr:`uses` for ``ps``)."""

    @classmethod
    def load(cls, entries: Sequence[str], environ: Mapping[str, str]) -> SecretTable | None:
        """The table of the ``secrets`` option's ``entries``, values read from ``environ`` or
        files; None when there are none. Raises ConfigError naming a missing one."""
        if not entries:
            return None
        bindings = [parse_binding("secrets", entry) for entry in entries]
        return cls(bindings, {b.name: b.value(environ) for b in bindings})

    @classmethod
    def for_call(cls, entries: Any) -> SecretTable:
        """The table of one tool call's secrets, ``[{"binding": "NAME@HOST...", "value": ...}]``
        (:meth:`..hostsecrets.Secret.for_call`). Raises ConfigError, never quoting a value."""
        if not isinstance(entries, list) or not entries or len(entries) > MAX_SECRETS:
            raise ConfigError(
                f"'bind' must be a list of 1 to {MAX_SECRETS} secrets, each "
                '{"binding": "NAME@HOST", "value": ...}'
            )
        bindings, values = [], {}
        for entry in entries:
            if not isinstance(entry, dict) or set(entry) != {"binding", "value"}:
                raise ConfigError('each secret to bind must be {"binding": ..., "value": ...}')
            binding = parse_binding("secrets", entry["binding"])
            if binding.path is not None or binding.name in values:
                raise ConfigError(f"secrets: {binding.name}: one value each, from the caller")
            check_value(f"secrets: {binding.name}", entry["value"])
            bindings.append(binding)
            values[binding.name] = entry["value"]
        return cls(bindings, values)

    def __repr__(self) -> str:
        return f"<SecretTable names={self.names!r} values=<hidden>>"

    @property
    def names(self) -> list[str]:
        """The secrets' names."""
        return [held.binding.name for held in self._held]

    @property
    def destinations(self) -> tuple[Destination, ...]:
        """Every bound destination (allowed implicitly)."""
        return tuple(dict.fromkeys(d for held in self._held for d in held.binding.hosts))

    def bound(self, host: str, port: int) -> bool:
        """True when a secret is bound to ``host:port`` (its CONNECT is intercepted)."""
        return any(d.matches(host, port) for held in self._held for d in held.binding.hosts)

    def kernel_env(self) -> dict[str, str]:
        """The kernel's variables: each placeholder under its name, the CA and the trust
        variables."""
        env = {held.binding.name: held.placeholder for held in self._held}
        env[CA_ENV] = self.ca.pem
        env.update(dict.fromkeys(TRUST_ENV, BUNDLE))
        return env

    def call_env(self) -> dict[str, str]:
        """One tool call's variables: each placeholder under its name, and the CA (the kernel
        writes the call's trust bundle: :func:`..kernelside.trust.call_env`)."""
        env = {held.binding.name: held.placeholder for held in self._held}
        env[CA_ENV] = self.ca.pem
        return env

    def fill(
        self, host: str, port: int, headers: Sequence[tuple[bytes, bytes]], target: bytes
    ) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """The request's headers and target with each placeholder of a secret bound to
        ``host:port`` replaced by its value (the target's query only for secrets that opt in)."""
        used: set[str] = set()
        out: list[tuple[bytes, bytes]] = []
        mine = [h for h in self._held if any(d.matches(host, port) for d in h.binding.hosts)]
        for name, value in headers:
            if name.lower() != b"host":
                for held in mine:
                    if held.placeholder.encode() in value:
                        value = value.replace(
                            held.placeholder.encode(), self._values[held.placeholder].encode()
                        )
                        used.add(held.binding.name)
            out.append((name, value))
        path, question, query = target.partition(b"?")
        for held in mine:
            if held.binding.query and held.placeholder.encode() in query:
                query = query.replace(
                    held.placeholder.encode(), self._values[held.placeholder].encode()
                )
                used.add(held.binding.name)
        if used:
            self.uses.update(used)
            self.on_use()
        return out, path + question + query


async def _next(conn: h11.Connection, stream: TlsStream) -> object:
    """The next event; a quiet connection is ended by the proxy's sweeper (both of its sides)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.read())


async def _send(conn: h11.Connection, stream: TlsStream, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.write(data)


def _kept(headers: h11._headers.Headers) -> list[tuple[bytes, bytes]]:
    """The end-to-end headers, as the sender spelled their names."""
    return [(name, value) for name, value in headers.raw_items() if name.lower() not in _DROPPED]


async def _refuse(conn: h11.Connection, stream: TlsStream, status: int, reason: str) -> None:
    """Answer ``status`` with ``reason`` in the status line (clients show it) and the body."""
    body = (reason + "\n").encode()
    try:
        await _send(
            conn,
            stream,
            h11.Response(
                status_code=status,
                headers=[
                    ("content-type", "text/plain"),
                    ("content-length", str(len(body))),
                    ("connection", "close"),
                ],
                reason=reason[:400].encode("ascii", "replace"),
            ),
        )
        await _send(conn, stream, h11.Data(data=body))
        await _send(conn, stream, h11.EndOfMessage())
    except (h11.LocalProtocolError, ConnectionError, OSError, ssl.SSLError):
        pass


def _long_body(request: h11.Request, answer: h11.Response) -> int | None:
    """The length of an answer's body to copy as it is (:func:`_copy_body`): one that h11 frames
    by its ``Content-Length`` alone and that is at least :data:`LONG_BODY` bytes; else None."""
    if request.method == b"HEAD" or answer.status_code in (204, 304):
        return None
    lengths = [v for n, v in answer.headers if n == b"content-length"]
    if not lengths or any(n == b"transfer-encoding" for n, _ in answer.headers):
        return None
    length = int(lengths[0])  # h11 checked it: digits, and the same in every copy
    return length if length >= LONG_BODY else None


async def _copy_body(
    head: bytes, buffered: bytes, length: int, upstream: TlsStream, kernel: TlsStream
) -> None:
    """Send the kernel the answer's ``head`` and ``length`` bytes of body: those h11 holds already
    (in one write with the head: one record and one send fewer), then the upstream's as they come,
    decrypted into one buffer and encrypted from it (what follows them, if anything, is dropped:
    the connection then closes)."""
    first = buffered[:length]
    await kernel.write(head + first)
    length -= len(first)
    buffer = memoryview(bytearray(min(CHUNK, length)))
    while length:
        size = await upstream.read_into(buffer[: min(CHUNK, length)])
        if not size:
            return
        # write() encrypts the whole chunk before it returns: the buffer is free again
        await kernel.write(buffer[:size])
        length -= size


async def refuse_request(stream: TlsStream, status: int, reason: str, head_limit: int) -> None:
    """Read the kernel's request on ``stream`` and refuse it (nothing is relayed)."""
    server = h11.Connection(h11.SERVER, max_incomplete_event_size=head_limit)
    try:
        await _next(server, stream)
    except h11.RemoteProtocolError:
        pass
    await _refuse(server, stream, status, reason)


Fill = Callable[
    [str, int, list[tuple[bytes, bytes]], bytes], tuple[list[tuple[bytes, bytes]], bytes]
]
"""Put the values of the secrets bound to ``host:port`` in a request's headers and target
(:meth:`.egress.Egress.fill`)."""


async def relay_http(  # noqa: C901
    fill: Fill,
    host: str,
    port: int,
    kernel: TlsStream,
    upstream: TlsStream,
    head_limit: int,
    refused: Callable[[str, str], None],
) -> None:
    """Relay HTTP/1.1 requests from the kernel to ``host:port`` with the secrets filled in, and
    the answers back, until either side closes (or the proxy ends a quiet connection). A request
    whose ``Host`` is not ``host:port`` is refused (and reported to ``refused(name, reason)``); a
    redirect is passed back, never followed."""
    server = h11.Connection(h11.SERVER, max_incomplete_event_size=head_limit)
    client = h11.Connection(h11.CLIENT, max_incomplete_event_size=head_limit)
    authorities = {host.encode(), f"{host}:{port}".encode()}
    while True:
        try:
            event = await _next(server, kernel)
        except h11.RemoteProtocolError as exc:
            await _refuse(server, kernel, 400, f"kernel-sandbox proxy: malformed request ({exc})")
            return
        if not isinstance(event, h11.Request):
            return
        hosts = [value.lower() for name, value in event.headers if name == b"host"]
        if event.http_version not in (b"1.0", b"1.1"):
            # h11 reads any N.N version: HTTP/2's preface (PRI * HTTP/2.0) is not a request here
            await _refuse(server, kernel, 505, "kernel-sandbox proxy: HTTP/1.1 only")
            return
        if not event.target.startswith(b"/") and event.target != b"*":
            # an absolute URI could name another host to the server or a proxy behind it
            await _refuse(server, kernel, 400, "kernel-sandbox proxy: request targets are paths")
            return
        if len(hosts) != 1 or hosts[0] not in authorities:
            reason = (
                f"kernel-sandbox proxy: this connection is to {host}:{port}; its requests must "
                "name that host, once, in their Host header"
            )
            refused(f"{host}:{port}", reason)
            await _refuse(server, kernel, 421, reason)
            return
        headers, target = fill(host, port, _kept(event.headers), event.target)
        if server.they_are_waiting_for_100_continue:
            await _send(server, kernel, h11.InformationalResponse(status_code=100, headers=[]))
        try:
            request = h11.Request(method=event.method, target=target, headers=headers)
        except h11.LocalProtocolError:  # its message may quote a value: never passed on
            await _refuse(server, kernel, 400, "kernel-sandbox proxy: a malformed request")
            return
        await _send(client, upstream, request)
        try:
            while True:
                part = await _next(server, kernel)
                if isinstance(part, h11.EndOfMessage):
                    await _send(client, upstream, h11.EndOfMessage())
                    break
                if not isinstance(part, h11.Data):
                    return
                await _send(client, upstream, h11.Data(data=part.data))
        except h11.RemoteProtocolError:
            return
        try:
            answer = await _next(client, upstream)
            while isinstance(answer, h11.InformationalResponse):
                answer = await _next(client, upstream)
        except h11.RemoteProtocolError:
            await _refuse(server, kernel, 502, f"kernel-sandbox: {host} sent a malformed answer")
            return
        if not isinstance(answer, h11.Response):
            await _refuse(server, kernel, 502, f"kernel-sandbox: {host} closed without answering")
            return
        headers = _kept(answer.headers)
        length = _long_body(event, answer)
        if length is not None:
            headers.append((b"connection", b"close"))
        response = h11.Response(
            status_code=answer.status_code, headers=headers, reason=answer.reason
        )
        if length is not None:
            head = server.send(response)
            assert head is not None  # a Response always has a head
            await _copy_body(head, client.trailing_data[0], length, upstream, kernel)
            return
        await _send(server, kernel, response)
        try:
            while True:
                part = await _next(client, upstream)
                if isinstance(part, h11.EndOfMessage):
                    await _send(server, kernel, h11.EndOfMessage())
                    break
                if not isinstance(part, h11.Data):
                    return
                await _send(server, kernel, h11.Data(data=part.data))
        except h11.RemoteProtocolError:
            return
        if h11.MUST_CLOSE in (server.our_state, client.our_state, client.their_state):
            return
        try:
            server.start_next_cycle()
            client.start_next_cycle()
        except h11.LocalProtocolError:
            return
