"""HTTPS servers on 127.0.0.1 for the secrets tests, with certificates from a test CA.

``api.test`` and ``other.test`` are one server (its certificate names both); ``forged.test`` is
served with a certificate from a CA nobody trusts; ``sniff.test`` is a plain TCP listener that keeps
every byte it gets. The launcher resolves the names through the test's resolver map
(``KERNEL_SANDBOX_TEST_RESOLVER``) and trusts the test CA through ``SSL_CERT_FILE``; every server
keeps what it received on the host, and answers without echoing any header back.
"""

from __future__ import annotations

import datetime
import http.server
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from support.launcher_hooks import TEST_RESOLVER_ENV

NAMES = ("api.test", "other.test", "forged.test", "sniff.test")


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_ca(title: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(title))
        .issuer_name(_name(title))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def server_context(directory: Path, ca: tuple, names: list[str], stem: str) -> ssl.SSLContext:
    """A server TLS context for ``names`` with a certificate signed by ``ca``."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    path = directory / f"{stem}.pem"
    path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(path)
    return context


@dataclass
class Servers:
    """The running servers: ports, and what each received."""

    tls_port: int
    forged_port: int
    sniff_port: int
    resolver_file: Path
    requests: list[dict] = field(default_factory=list)
    sniffed: list[bytes] = field(default_factory=list)

    def network(self) -> list[str]:
        """The ``network`` entries allowing every test name on loopback."""
        return [
            f"api.test:{self.tls_port}@127.0.0.1",
            f"other.test:{self.tls_port}@127.0.0.1",
            f"forged.test:{self.forged_port}@127.0.0.1",
            f"sniff.test:{self.sniff_port}@127.0.0.1",
            f"api.test:{self.sniff_port}@127.0.0.1",
        ]

    @property
    def guard_fired(self) -> list[str]:
        guard = Path(str(self.resolver_file) + ".guard")
        return guard.read_text().split() if guard.exists() else []


def _handler(requests: list[dict], other_port: int) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": [[k, v] for k, v in self.headers.items()],
                    "body": body.decode("latin-1"),
                }
            )
            if self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", f"https://other.test:{other_port}/echo")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.startswith("/big"):
                size = int(self.path.rpartition("/")[2])
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                chunk = b"x" * 65536
                left = size
                while left > 0:
                    self.wfile.write(chunk[: min(left, len(chunk))])
                    left -= len(chunk)
                return
            answer = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, format, *args):
            pass

    return Handler


def _serve_tls(context: ssl.SSLContext, requests: list[dict]) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(requests, 0))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


@contextmanager
def serve(directory: Path) -> Iterator[Servers]:
    """Run the servers, with the resolver map and the host's trust (``SSL_CERT_FILE``) set."""
    test_ca = make_ca("kernel-sandbox test CA")
    untrusted = make_ca("nobody trusts this CA")
    requests: list[dict] = []
    sniffed: list[bytes] = []
    good = _serve_tls(
        server_context(directory, test_ca, ["api.test", "other.test"], "good"), requests
    )
    port = good.server_address[1]
    good.RequestHandlerClass = _handler(requests, port)
    forged = _serve_tls(server_context(directory, untrusted, ["forged.test"], "forged"), requests)
    sniffer = socket.socket()
    sniffer.bind(("127.0.0.1", 0))
    sniffer.listen(16)

    def sniff() -> None:
        while True:
            try:
                conn, _ = sniffer.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                while data := conn.recv(65536):
                    sniffed.append(data)
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    )
            except OSError:
                pass
            conn.close()

    threads = [
        threading.Thread(target=good.serve_forever, daemon=True),
        threading.Thread(target=forged.serve_forever, daemon=True),
        threading.Thread(target=sniff, daemon=True),
    ]
    for thread in threads:
        thread.start()
    ca_file = directory / "test-ca.pem"
    ca_file.write_bytes(test_ca[1].public_bytes(serialization.Encoding.PEM))
    resolver = directory / "resolver.json"
    resolver.write_text(json.dumps({name: ["127.0.0.1"] for name in NAMES}))
    resolver.chmod(0o600)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(TEST_RESOLVER_ENV, str(resolver))
            env.setenv("SSL_CERT_FILE", str(ca_file))
            yield Servers(
                port, forged.server_address[1], sniffer.getsockname()[1], resolver, requests, sniffed
            )
    finally:
        good.shutdown()
        forged.shutdown()
        good.server_close()
        forged.server_close()
        sniffer.close()
