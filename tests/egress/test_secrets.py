"""Secrets that never enter the sandbox, for real: Docker kernels, the launcher's proxy, HTTPS servers on
127.0.0.1 (:mod:`support.secrets_servers`).

The kernel holds a placeholder in ``API_KEY``; the proxy puts the value in the headers of requests
to ``api.test`` (its TLS answered with the kernel's own CA, the real server verified with the test
CA the host trusts) and nowhere else. Every test checks what the servers received on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.docker.settings import DockerSettings
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import Sandbox, Secret
from kernel_sandbox.kernelspecs import install as install_kernelspec
from kernel_sandbox.launch.egress import PROXY_PORT, Egress
from support.kernel import run_cell
from support.secrets_servers import Servers, serve

pytestmark = pytest.mark.security("attack", "egress")

VALUE = "sk-test-Zq8vX1-real-value-that-must-stay-on-the-host"
OTHER_VALUE = "sk-test-other-kernel-value-0000000000000000"
QUERY_VALUE = "q-test-value-for-the-query-string-only-000000"
QUERY_VALUE = "q-test-value-for-the-query-string-only-000000"

REQUEST = """
import os, ssl, urllib.request
req = urllib.request.Request({url!r}, data={data}, headers={headers})
context = None if {verify} else ssl._create_unverified_context()
try:
    answer = urllib.request.urlopen(req, timeout=30, context=context)
    print(answer.status, answer.read().decode())
except Exception as exc:
    print('refused', getattr(exc, 'code', None), exc)
"""

RAW = f"PROXY_PORT = {PROXY_PORT}\n" + """
import os, socket, ssl, time
def raw(connect, parts, tls=True, context=None):
    sock = socket.create_connection(('127.0.0.1', PROXY_PORT), timeout=20)
    sock.sendall(f'CONNECT {connect} HTTP/1.1\\r\\nHost: {connect}\\r\\n\\r\\n'.encode())
    head = b''
    while b'\\r\\n\\r\\n' not in head:
        head += sock.recv(1)
    if not head.startswith(b'HTTP/1.1 200'):
        return head.decode(errors='replace').splitlines()[0]
    if tls:
        try:
            sock = (context or ssl.create_default_context()).wrap_socket(sock, server_hostname=connect.split(':')[0])
        except ssl.SSLError as exc:
            return repr(exc)
    for part in parts:
        sock.sendall(part)
        time.sleep(0.2)
    out = b''
    try:
        while data := sock.recv(65536):
            out += data
    except Exception as exc:
        out += repr(exc).encode()
    return out.decode(errors='replace')
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with serve(tmp_path_factory.mktemp("secrets")) as running:
        yield running
        assert running.guard_fired == []


def secret_for(servers: Servers, value: str = VALUE) -> Secret:
    return Secret(
        value,
        hosts=[
            f"api.test:{servers.tls_port}",
            f"forged.test:{servers.forged_port}",
            f"api.test:{servers.sniff_port}",
        ],
    )


@pytest.fixture(scope="module")
def sandbox(docker_engine, servers: Servers) -> Iterator[Sandbox]:
    query = Secret(QUERY_VALUE, hosts=[f"api.test:{servers.tls_port}"], query=True)
    with Sandbox(
        network=servers.network(),
        secrets={"API_KEY": secret_for(servers), "Q_KEY": query},
        timeout=120,
    ) as sb:
        yield sb


def fetch(
    sb: Sandbox,
    url: str,
    *,
    data: str = "None",
    headers: str = "{'Authorization': 'Bearer ' + os.environ['API_KEY']}",
    verify: bool = True,
) -> str:
    """Request ``url`` from the kernel (``verify``: with its default trust; else the kernel checks no
    certificate, as for the test servers' own names, which only the host trusts)."""
    return sb.run(REQUEST.format(url=url, data=data, headers=headers, verify=verify)).stdout


def placeholder(sb: Sandbox) -> str:
    return sb.run("import os; print(os.environ['API_KEY'])").stdout.strip()


def test_the_bound_host_receives_the_value_and_the_kernel_only_a_placeholder(
    sandbox: Sandbox, servers: Servers
) -> None:
    """A request from the kernel to the bound host carries the value; the kernel never had it."""
    before = len(servers.requests)
    out = fetch(sandbox, f"https://api.test:{servers.tls_port}/echo")
    assert out.startswith("200 ok"), out
    got = servers.requests[before]
    assert ["Authorization", f"Bearer {VALUE}"] in got["headers"]
    token = placeholder(sandbox)
    assert token != VALUE and len(token) >= len(VALUE) and VALUE not in out


def test_the_value_is_not_in_the_kernel_its_files_or_a_checkpoint(
    sandbox: Sandbox, servers: Servers
) -> None:
    """The kernel's environment, /proc/*/environ, every file it can read, a checkpoint blob hold no
    trace of the value (nor any private key); the launcher's log: see the verification test."""
    fetch(sandbox, f"https://api.test:{servers.tls_port}/echo")
    search = f"""
def search():
    import os
    value = {VALUE[::-1]!r}[::-1].encode()  # the code is kept in the kernel's history: not the value
    found = []
    if value in repr(dict(os.environ)).encode(): found.append('os.environ')
    paths = [f'/proc/{{pid}}/{{name}}' for pid in os.listdir('/proc') if pid.isdigit() for name in ('environ', 'cmdline')]
    for root in ['/tmp', '/home', os.getcwd(), '/etc', '/dev/shm']:
        paths += [os.path.join(top, name) for top, _, files in os.walk(root) for name in files]
    for path in paths:
        try:
            with open(path, 'rb') as handle: data = handle.read(1 << 22)
        except OSError: continue
        if value in data or b'PRIVATE' + b' KEY-----' in data: found.append(path)
    print('found', found, len(paths) > 10)
search()
del search
"""
    result = sandbox.run(search)
    assert result.stdout.strip() == "found [] True", result.error
    sandbox.run("import os; token = os.environ['API_KEY']")
    assert VALUE.encode() not in sandbox.checkpoint().data


def test_the_placeholder_goes_nowhere_else(sandbox: Sandbox, servers: Servers) -> None:
    """The placeholder sent to another listed host, in a body, in a URL path, over plain HTTP to a bound
    host: the value is never sent."""
    token = placeholder(sandbox)
    before = len(servers.requests)
    fetch(sandbox, f"https://other.test:{servers.tls_port}/echo", verify=False)
    fetch(
        sandbox,
        f"https://api.test:{servers.tls_port}/echo",
        data="os.environ['API_KEY'].encode()",
        headers="{}",
    )
    fetch(sandbox, f"https://api.test:{servers.tls_port}/path/" + token, headers="{}")
    fetch(sandbox, f"http://api.test:{servers.sniff_port}/plain")
    new = servers.requests[before:]
    assert VALUE not in str(new) and VALUE.encode() not in b"".join(servers.sniffed)
    assert ["Authorization", f"Bearer {token}"] in new[0]["headers"]
    assert new[1]["body"] == token and new[2]["path"] == "/path/" + token
    assert token.encode() in b"".join(servers.sniffed)


def test_a_redirect_to_another_host_is_never_followed_with_the_value(
    sandbox: Sandbox, servers: Servers
) -> None:
    """The bound host redirects to another host: the proxy passes the redirect back; the kernel's own
    follow-up carries the placeholder."""
    before = len(servers.requests)
    fetch(sandbox, f"https://api.test:{servers.tls_port}/redirect", verify=False)
    new = servers.requests[before:]
    assert [r["path"] for r in new] == ["/redirect", "/echo"]
    assert ["Authorization", f"Bearer {VALUE}"] in new[0]["headers"]
    assert (
        VALUE not in str(new[1]) and ["Host", f"other.test:{servers.tls_port}"] in new[1]["headers"]
    )


def test_a_host_that_fails_verification_gets_nothing(
    docker_engine, servers: Servers, capfd
) -> None:
    """A bound host whose certificate chain the host does not trust: refused naming it, nothing sent;
    the launcher logs the refusal, and its log never holds the value (its own kernel: its stderr is
    this test's)."""
    with Sandbox(
        network=servers.network(), secrets={"API_KEY": secret_for(servers)}, timeout=120
    ) as sb:
        assert fetch(sb, f"https://api.test:{servers.tls_port}/logged").startswith("200 ok")
        before = len(servers.requests)
        out = fetch(sb, f"https://forged.test:{servers.forged_port}/echo")
        assert "forged.test" in out and "did not verify" in out, out
        assert len(servers.requests) == before
        logged = ""
        for _ in range(100):  # the launcher's stderr reaches the capture a moment later
            logged += capfd.readouterr().err
            if "egress refused" in logged:
                break
            time.sleep(0.1)
    logged += capfd.readouterr().err
    assert "egress refused" in logged and "forged.test" in logged and VALUE not in logged


def test_a_tunnel_with_the_kernels_own_tls_never_gets_the_value(
    sandbox: Sandbox, servers: Servers
) -> None:
    """CONNECT by hand with TLS that trusts only the public CAs: the handshake with the proxy fails;
    to an unbound listed name the tunnel is spliced and the placeholder arrives as it was."""
    head = f"GET /hand HTTP/1.1\r\nHost: api.test:{servers.tls_port}\r\nAuthorization: Bearer {{os.environ['API_KEY']}}\r\nConnection: close\r\n\r\n"
    code = (
        RAW
        + f"""
import ssl
public = ssl.create_default_context(cafile='/etc/ssl/certs/ca-certificates.crt')
print(raw('api.test:{servers.tls_port}', [f{head!r}.encode()], context=public))
"""
    )
    out = sandbox.run(code).stdout
    assert "CERTIFICATE_VERIFY_FAILED" in out or "SSLCertVerificationError" in out, out
    assert not any(r["path"] == "/hand" for r in servers.requests)


def smuggle(
    sandbox: Sandbox, servers: Servers, parts: list[str], connect: str | None = None
) -> str:
    """Send ``parts`` (f-strings evaluated in the kernel) one write each through a CONNECT the kernel
    opens by hand; a name without a secret is spliced, so its server's certificate is not checked."""
    connect = connect or f"api.test:{servers.tls_port}"
    context = "None" if connect.startswith("api.test") else "ssl._create_unverified_context()"
    code = RAW + "\nprint(raw({connect!r}, [{parts}], context={context}))".format(
        connect=connect, parts=", ".join(f"f{part!r}.encode()" for part in parts), context=context
    )
    return sandbox.run(code).stdout


def test_header_smuggling_gets_nothing(sandbox: Sandbox, servers: Servers) -> None:
    """Duplicate Host headers, a bare CR in a value, obs-fold, a Host naming another host than the CONNECT,
    a Host naming the bound host inside another host's tunnel: never the value elsewhere, never a second
    request."""
    port = servers.tls_port
    auth = "Authorization: Bearer {os.environ['API_KEY']}\r\n"
    before = len(servers.requests)
    dup = smuggle(
        sandbox,
        servers,
        [f"GET /dup HTTP/1.1\r\nHost: api.test:{port}\r\nHost: other.test:{port}\r\n{auth}\r\n"],
    )
    cr = smuggle(
        sandbox,
        servers,
        [f"GET /cr HTTP/1.1\r\nHost: api.test:{port}\r\nX-A: a\rGET /x\r\n{auth}\r\n"],
    )
    folded = smuggle(
        sandbox,
        servers,
        [
            f"GET /fold HTTP/1.1\r\nHost: api.test:{port}\r\nX-A: a\r\n X-Injected: b\r\n{auth}Connection: close\r\n\r\n"
        ],
    )
    other = smuggle(
        sandbox, servers, [f"GET /other HTTP/1.1\r\nHost: other.test:{port}\r\n{auth}\r\n"]
    )
    inside = smuggle(
        sandbox,
        servers,
        [f"GET /inside HTTP/1.1\r\nHost: api.test:{port}\r\n{auth}Connection: close\r\n\r\n"],
        connect=f"other.test:{port}",
    )
    assert dup.startswith("HTTP/1.1 4") and cr.startswith("HTTP/1.1 4"), (dup, cr)
    assert other.startswith("HTTP/1.1 421"), other
    absolute = smuggle(
        sandbox,
        servers,
        [f"GET https://other.test:{port}/abs HTTP/1.1\r\nHost: api.test:{port}\r\n{auth}\r\n"],
    )
    assert absolute.startswith("HTTP/1.1 400"), absolute
    assert folded.startswith("HTTP/1.1 "), folded  # unfolded into one header, or refused
    new = servers.requests[before:]
    assert {r["path"] for r in new} <= {"/fold", "/inside"}, new
    assert all("X-Injected" not in [k for k, _ in r["headers"]] for r in new)
    inside_request = [r for r in new if r["path"] == "/inside"]
    assert inside_request and VALUE not in str(inside_request), inside
    assert VALUE not in str([r for r in new if r["path"] != "/fold"])


def test_upgrade_and_expect_are_handled_by_the_proxy(sandbox: Sandbox, servers: Servers) -> None:
    """An HTTP/2 upgrade attempt goes out as plain HTTP/1.1 (no Upgrade header); Expect: 100-continue
    is answered by the proxy and the body follows."""
    port = servers.tls_port
    auth = "Authorization: Bearer {os.environ['API_KEY']}\r\n"
    before = len(servers.requests)
    upgrade = smuggle(
        sandbox,
        servers,
        [
            f"GET /h2c HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n{auth}Connection: close\r\n\r\n"
        ],
    )
    expect = smuggle(
        sandbox,
        servers,
        [
            f"POST /expect HTTP/1.1\r\nHost: api.test:{port}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n{auth}Connection: close\r\n\r\n",
            "hello",
        ],
    )
    assert upgrade.startswith("HTTP/1.1 200") and "101" not in upgrade.splitlines()[0], upgrade
    assert expect.startswith("HTTP/1.1 100") and "HTTP/1.1 200" in expect, expect
    new = {r["path"]: r for r in servers.requests[before:]}
    assert {k.lower() for k, _ in new["/h2c"]["headers"]}.isdisjoint({"upgrade", "http2-settings"})
    assert new["/expect"]["body"] == "hello"
    assert "expect" not in {k.lower() for k, _ in new["/expect"]["headers"]}


H2 = f"PROXY_PORT = {PROXY_PORT}\n" + """
import socket, ssl
sock = socket.create_connection(('127.0.0.1', PROXY_PORT), timeout=20)
sock.sendall(b'CONNECT api.test:{port} HTTP/1.1\\r\\nHost: api.test:{port}\\r\\n\\r\\n')
head = b''
while not head.endswith(b'\\r\\n\\r\\n'):
    head += sock.recv(1)
context = ssl.create_default_context()
context.set_alpn_protocols(['h2'])
tls = context.wrap_socket(sock, server_hostname='api.test')
tls.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n' + b'\\0' * 9)
answer = b''
try:
    while data := tls.recv(65536):
        answer += data
except OSError:
    pass
print(tls.selected_alpn_protocol(), answer.split(b'\\r\\n')[0].decode())
"""


def test_http2_by_alpn_is_not_spoken(sandbox: Sandbox, servers: Servers) -> None:
    """A kernel that offers only ``h2`` in ALPN and sends HTTP/2's preface: the proxy picks no protocol,
    answers the preface 505 and relays nothing."""
    before = len(servers.requests)
    out = sandbox.run(H2.format(port=servers.tls_port))
    assert out.stdout.split()[:3] == ["None", "HTTP/1.1", "505"], out
    assert len(servers.requests) == before


def test_a_placeholder_split_across_two_writes_is_still_filled_in_only_for_the_bound_host(
    sandbox: Sandbox, servers: Servers
) -> None:
    """The head arrives in two writes cut inside the placeholder: the bound host gets the value."""
    port = servers.tls_port
    before = len(servers.requests)
    token = placeholder(sandbox)
    half = len(token) // 2
    out = smuggle(
        sandbox,
        servers,
        [
            f"GET /split HTTP/1.1\r\nHost: api.test:{port}\r\nAuthorization: Bearer {{os.environ['API_KEY'][:{half}]}}",
            f"{{os.environ['API_KEY'][{half}:]}}\r\nConnection: close\r\n\r\n",
        ],
    )
    assert out.startswith("HTTP/1.1 200"), out
    assert ["Authorization", f"Bearer {VALUE}"] in servers.requests[before]["headers"]


def test_another_kernels_placeholder_gets_nothing(
    docker_engine, sandbox: Sandbox, servers: Servers
) -> None:
    """Each kernel has its own placeholder: one kernel replaying another's sends that placeholder, not
    either value."""
    with Sandbox(
        network=servers.network(),
        secrets={"API_KEY": secret_for(servers, OTHER_VALUE)},
        timeout=120,
    ) as other:
        mine, theirs = placeholder(sandbox), placeholder(other)
        assert mine != theirs
        before = len(servers.requests)
        fetch(
            other,
            f"https://api.test:{servers.tls_port}/replay",
            headers=f"{{'Authorization': 'Bearer {mine}'}}",
        )
        got = servers.requests[before]
        assert ["Authorization", f"Bearer {mine}"] in got["headers"]
        assert VALUE not in str(got) and OTHER_VALUE not in str(got)


CLIENTS = ("certifi", "requests", "urllib3", "idna", "charset_normalizer", "httpx", "httpcore")
CLIENTS += ("h11", "anyio", "sniffio", "typing_extensions")


def client_packages() -> bytes:
    """The host's requests, httpx and certifi (and what they import), zipped for the kernel's work
    directory: the kernel image has none of them, and the tests reach no package index."""
    import importlib
    import io
    import zipfile

    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        for name in CLIENTS:
            origin = Path(importlib.import_module(name).__file__ or "")
            if origin.name != "__init__.py":
                archive.write(origin, origin.name)
                continue
            for path in origin.parent.rglob("*"):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, str(path.relative_to(origin.parent.parent)))
    return data.getvalue()


CLIENT_REQUESTS = """
import os, sys, ssl, zipfile, urllib.request
zipfile.ZipFile('clients.zip').extractall('clients')
sys.path.insert(0, os.path.abspath('clients'))
import certifi, requests, httpx
url, auth = {url!r}, {{'Authorization': 'Bearer ' + os.environ['API_KEY']}}
pinned = ssl.create_default_context(cafile=certifi.where())
answers = [
    requests.get(url + '/requests', headers=auth).text,
    requests.get(url + '/requests-certifi', headers=auth, verify=certifi.where()).text,
    httpx.get(url + '/httpx', headers=auth).text,
    httpx.get(url + '/httpx-certifi', headers=auth, verify=pinned).text,
    urllib.request.urlopen(urllib.request.Request(url + '/urllib-certifi', headers=auth), context=pinned).read().decode(),
    str(certifi.where() == os.environ['SSL_CERT_FILE'] and certifi.contents() == open(certifi.where()).read()),
]
print(*answers)
"""


def test_python_clients_trust_the_kernels_ca_with_no_setting(
    sandbox: Sandbox, servers: Servers
) -> None:
    """requests, httpx and urllib, with the environment's trust or with certifi's bundle
    (``certifi.where()``, which the kernel's boot makes follow the sandbox's bundle), all reach the
    bound host through the proxy, the value filled in; nothing of certifi's own files changes."""
    sandbox.upload({"clients.zip": client_packages()})
    before = len(servers.requests)
    out = sandbox.run(CLIENT_REQUESTS.format(url=f"https://api.test:{servers.tls_port}"))
    assert out.stdout.split() == ["ok"] * 5 + ["True"], out.stdout + str(out.error)
    new = servers.requests[before:]
    assert [r["path"] for r in new] == [
        "/requests",
        "/requests-certifi",
        "/httpx",
        "/httpx-certifi",
        "/urllib-certifi",
    ]
    assert all(["Authorization", f"Bearer {VALUE}"] in r["headers"] for r in new)
    pristine = sandbox.run(
        "import certifi, importlib.resources as r\n"
        "print('kernel-sandbox' in r.files('certifi').joinpath('cacert.pem').read_text())"
    )
    assert pristine.stdout.strip() == "False", pristine


KEEP_ALIVE = f"PROXY_PORT = {PROXY_PORT}\n" + """
import http.client, ssl
conn = http.client.HTTPSConnection('127.0.0.1', PROXY_PORT, context=ssl.create_default_context(), timeout=30)
conn.set_tunnel('api.test', {port})
sizes = []
for path in ['/echo', '/echo', '/big/{size}', '/echo', '/big/{size}']:
    conn.request('GET', path, headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}})
    answer = conn.getresponse()
    sizes.append((answer.status, len(answer.read()), answer.getheader('Connection')))
print(sizes)
"""


def test_a_long_body_comes_whole_and_short_ones_keep_the_connection(
    sandbox: Sandbox, servers: Servers
) -> None:
    """An answer of 1 MiB from the bound host is copied to the kernel as it comes (not through h11's
    buffer) and its connection closes after it; short answers keep the connection for the next
    request; every request carries the value."""
    import ast

    size = 1 << 20
    before = len(servers.requests)
    out = sandbox.run("import os\n" + KEEP_ALIVE.format(port=servers.tls_port, size=size))
    got = ast.literal_eval(out.stdout.strip())
    assert got == [
        (200, 2, None),
        (200, 2, None),
        (200, size, "close"),
        (200, 2, None),
        (200, size, "close"),
    ], out
    new = servers.requests[before:]
    assert len(new) == 5 and all(["Authorization", f"Bearer {VALUE}"] in r["headers"] for r in new)


@contextlib.asynccontextmanager
async def api_host(tmp_path: Path, monkeypatch, answer) -> AsyncIterator[int]:
    """A TLS server named ``api.test`` on 127.0.0.1 whose connections ``answer`` handles, its
    certificate trusted by this process (``SSL_CERT_FILE``, as the proxy's); yields its port."""
    from kernel_sandbox.launch.intercept import KernelCA

    server_ca = KernelCA(["api.test"])
    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ca.server_context("api.test"))
    (tmp_path / "ca.pem").write_text(server_ca.pem)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@contextlib.asynccontextmanager
async def proxy_to(port: int, send_buffer: int | None = None, **options) -> AsyncIterator[tuple[Egress, int]]:
    """The launcher's proxy with ``api.test:port`` on its list (resolved to 127.0.0.1 by a stub) and
    ``options``, served on 127.0.0.1 (``send_buffer``: its connections' send buffer); yields it and
    its port."""
    from kernel_sandbox.egress import parse_destinations

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    network = parse_destinations("network", [f"api.test:{port}@127.0.0.1"])
    egress = Egress(network, resolve=resolve, own_addresses=(), **options)
    listener = socket.socket()
    if send_buffer is not None:  # the connections accepted inherit it
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    await egress.serve(listener)
    try:
        yield egress, listener.getsockname()[1]
    finally:
        await egress.close()


async def connected(proxy: int, port: int, open_connection=asyncio.open_connection) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A CONNECT to ``api.test:port`` through the proxy on port ``proxy``, established (the kernel's
    connection made by ``open_connection(address, port)``)."""
    reader, writer = await open_connection("127.0.0.1", proxy)
    writer.write(f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    return reader, writer


async def tunnel(proxy: int, port: int, trust: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """:func:`connected`, then TLS trusting the CA ``trust`` (PEM)."""
    reader, writer = await connected(proxy, port)
    await writer.start_tls(ssl.create_default_context(cadata=trust), server_hostname="api.test")
    return reader, writer


async def test_a_quiet_bound_host_is_cut_off_after_the_idle_timeout(tmp_path: Path, monkeypatch) -> None:
    """The kernel's request reaches a bound host that never answers: the proxy's sweeper ends both
    sides of the intercepted connection after ``idle_timeout`` (no timer per read)."""
    from kernel_sandbox.hostsecrets import parse_binding
    from kernel_sandbox.launch.intercept import SecretTable

    heard: list[bytes] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heard.append(await reader.read(65536))
        heard.append(await reader.read())  # b"" once the proxy gives up

    async with api_host(tmp_path, monkeypatch, silent) as port:
        table = SecretTable([parse_binding("secrets", f"API_KEY@api.test:{port}")], {"API_KEY": VALUE})
        async with proxy_to(port, secrets=table, idle_timeout=1.0) as (egress, proxy):
            reader, writer = await tunnel(proxy, port, table.ca.pem)
            writer.write(f"GET /quiet HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode())
            assert await asyncio.wait_for(reader.read(), 30) == b""
            for _ in range(300):
                if len(heard) == 2:
                    break
                await asyncio.sleep(0.1)
            assert heard[0].startswith(b"GET /quiet ") and heard[1] == b"" and not egress._clients
            writer.close()


async def test_a_calls_connection_closes_with_the_call_even_when_the_list_allows_its_host(
    tmp_path: Path, monkeypatch
) -> None:
    """A tool call's secret for a host the kernel's list allows anyway: when the call ends its
    intercepted connection is cut (the list let it through, not the call's window) and the call's
    table, which holds the value, is no longer referenced."""
    import gc

    from kernel_sandbox.kernelside.trust import CA_ENV
    from kernel_sandbox.launch.intercept import SecretTable

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with api_host(tmp_path, monkeypatch, answer) as port, proxy_to(port) as (egress, proxy):
        bound = egress.bind([{"binding": f"CALL_KEY@api.test:{port}", "value": VALUE}], 60)
        token = bound["env"]["CALL_KEY"]
        reader, writer = await tunnel(proxy, port, bound["env"][CA_ENV])
        writer.write(f"GET / HTTP/1.1\r\nHost: api.test:{port}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        assert egress.close_window(bound["window"])
        assert await asyncio.wait_for(reader.read(), 10) == b"", "the call's connection is cut"
        for _ in range(50):
            gc.collect()
            if not [t for t in gc.get_objects() if isinstance(t, SecretTable)]:
                break
            await asyncio.sleep(0.1)
        assert [t for t in gc.get_objects() if isinstance(t, SecretTable)] == [], "the call's table is let go"
        writer.close()


SMALL_BUFFER = 64 * 1024
"""The socket buffers of the flow-control tests (explicit, so not grown by the kernel's autotuning):
all of them together hold a few MiB at most, far less than what the tests send."""


async def small_buffers(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection with a small receive buffer (the proxy's to a host, or a kernel's to the proxy)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (address, port))
    return await asyncio.open_connection(sock=sock)


async def settled(amount, seconds: float = 10.0) -> int:
    """``amount()`` once it stopped changing for half a second (at most ``seconds``)."""
    last, since, deadline = amount(), time.monotonic(), time.monotonic() + seconds
    while time.monotonic() < deadline and time.monotonic() - since < 0.5:
        await asyncio.sleep(0.05)
        if (now := amount()) != last:
            last, since = now, time.monotonic()
    return last


async def test_a_long_answer_is_read_from_the_host_only_as_fast_as_the_kernel_takes_it(
    tmp_path: Path, monkeypatch
) -> None:
    """A bound host sends 32 MiB that the kernel does not read yet: the proxy stops reading the host
    after a bounded amount (its TLS reads the socket straight into the TLS object, without asyncio's
    stream reader and its limit), so the host can send little of the answer (the sockets' buffers
    are small); then, as the kernel reads, the answer comes whole. Its end too: the proxy used to
    cut the connection once it had written the last chunk, and what its socket's transport still
    held (16 to 114 KiB here) was lost."""
    import hashlib

    from kernel_sandbox.hostsecrets import parse_binding
    from kernel_sandbox.launch.intercept import SecretTable

    size = 32 << 20
    body = bytes(range(256)) * (size // 256)
    sent = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for start in range(0, size, 1 << 16):  # a piece at a time: counts what was taken
            writer.write(body[start : start + (1 << 16)])
            await writer.drain()
            sent[0] = start + (1 << 16)

    async with api_host(tmp_path, monkeypatch, answer) as port:
        table = SecretTable([parse_binding("secrets", f"API_KEY@api.test:{port}")], {"API_KEY": VALUE})
        async with proxy_to(port, SMALL_BUFFER, secrets=table, connect=small_buffers) as (egress, proxy):
            reader, writer = await connected(proxy, port, small_buffers)  # the kernel reads slowly
            await writer.start_tls(ssl.create_default_context(cadata=table.ca.pem), server_hostname="api.test")
            writer.write(f"GET /big HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode())
            taken = await settled(lambda: sent[0])
            assert 0 < taken < size // 4, f"the host could send {taken} bytes the kernel did not read"
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            digest, left = hashlib.sha256(), size
            while left:
                data = await asyncio.wait_for(reader.read(min(left, 1 << 20)), 30)
                assert data, f"{left} bytes missing"
                digest.update(data)
                left -= len(data)
            assert digest.digest() == hashlib.sha256(body).digest()
            writer.close()


async def test_a_long_request_goes_to_the_host_only_as_fast_as_it_takes_it(
    tmp_path: Path, monkeypatch
) -> None:
    """The kernel sends a bound host a 32 MiB body that the host does not read yet: the proxy holds
    a bounded amount for the host (its writes still wait for the socket, now that the proxy's own
    protocol reads that socket and passes its pauses on), and once the host reads, it gets the body
    whole and answers."""
    import hashlib

    from kernel_sandbox.hostsecrets import parse_binding
    from kernel_sandbox.launch.intercept import SecretTable

    size = 32 << 20
    body = bytes(range(256)) * (size // 256)
    gate = asyncio.Event()
    received: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await gate.wait()
        digest, left = hashlib.sha256(), size
        while left and (data := await reader.read(min(left, 1 << 20))):
            digest.update(data)
            left -= len(data)
        received.append(digest.digest())
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async with api_host(tmp_path, monkeypatch, answer) as port:
        table = SecretTable([parse_binding("secrets", f"API_KEY@api.test:{port}")], {"API_KEY": VALUE})
        async with proxy_to(port, secrets=table) as (egress, proxy):
            reader, writer = await tunnel(proxy, port, table.ca.pem)
            writer.write(
                f"POST /up HTTP/1.1\r\nHost: api.test:{port}\r\nContent-Length: {size}\r\n\r\n".encode()
            )
            writer.write(body)
            await asyncio.sleep(0.5)
            (upstream,) = egress._upstreams.values()
            most = 0
            for _ in range(20):
                most = max(most, upstream.transport.get_write_buffer_size())
                await asyncio.sleep(0.05)
            assert most <= 1 << 20, f"the proxy held {most} bytes for a host that did not read them"
            gate.set()
            head = await asyncio.wait_for(reader.readuntil(b"ok"), 30)
            assert head.startswith(b"HTTP/1.1 200")
            assert received == [hashlib.sha256(body).digest()]
            writer.close()


def test_a_calls_trust_bundle_adds_its_ca_to_the_kernels_and_certifi_follows_it(
    tmp_path: Path, monkeypatch
) -> None:
    """The kernel side, run on the host: a call's bundle holds the trust ``SSL_CERT_FILE`` named and
    the call's CA, certifi (imported after the hook, as ``%pip`` would bring it) names that bundle
    while the call's variables are set and its own file otherwise, and the bundle goes after the
    call."""
    import importlib
    import os
    import sys

    from kernel_sandbox.kernelside import trust

    (tmp_path / "certifi").mkdir()
    (tmp_path / "certifi" / "__init__.py").write_text(
        "def where():\n    return 'own.pem'\n\ndef contents():\n    return 'own'\n"
    )
    (tmp_path / "mine.pem").write_text("MINE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "mine.pem"))
    monkeypatch.delitem(sys.modules, "certifi", raising=False)
    saved = list(sys.meta_path)
    try:
        values = trust.call_env({"API_KEY": "placeholder", trust.CA_ENV: "CALL CA\n"})
        certifi = importlib.import_module("certifi")
        assert trust.CA_ENV not in values and values["API_KEY"] == "placeholder"
        assert {values[name] for name in trust.TRUST_ENV} == {values["SSL_CERT_FILE"]}
        assert certifi.where() == "own.pem"
        monkeypatch.setenv("SSL_CERT_FILE", values["SSL_CERT_FILE"])
        assert certifi.where() == values["SSL_CERT_FILE"] and certifi.contents() == "MINE\nCALL CA\n"
        assert os.stat(values["SSL_CERT_FILE"]).st_mode & 0o777 == 0o444
        trust.drop_call_bundle(values)
        assert not os.path.exists(values["SSL_CERT_FILE"])
    finally:
        sys.meta_path[:] = saved
        sys.modules.pop("certifi", None)


def call_api(url: str, name: str = "CALL_KEY") -> dict:
    """A tool: one request to ``url`` with the call's secret (the kernel's default trust), and what
    the kernel held meanwhile."""
    import os
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + os.environ[name]})
    with urllib.request.urlopen(request, timeout=30) as answer:
        body = answer.read().decode()
    return {"body": body, "token": os.environ[name], "trust": os.environ.get("SSL_CERT_FILE")}


def test_a_tool_calls_secret_is_bound_for_that_call_only(
    docker_engine, servers: Servers, capsys
) -> None:
    """``run_tool(secrets=...)`` in a kernel without secrets of its own: during the call the bound host
    gets the value (its TLS answered by the call's CA, which the kernel trusts for the call); after it,
    the kernel holds neither the placeholder nor the call's trust, and the same placeholder sent again
    reaches the host as it is. ``metrics()`` and ``ps`` count the call's use of its secret, not the
    replay."""
    from kernel_sandbox.cli import main

    secret = Secret(VALUE, hosts=[f"api.test:{servers.tls_port}"])
    url = f"https://api.test:{servers.tls_port}/call"
    with Sandbox(network=servers.network(), timeout=120) as sb:
        before = len(servers.requests)
        result = sb.run_tool(call_api, {"url": url}, secrets={"CALL_KEY": secret})
        assert result.status == "success", result.error
        assert result.func_return["body"] == "ok" and VALUE not in repr(result)
        assert ["Authorization", f"Bearer {VALUE}"] in servers.requests[before]["headers"]
        token, trust = result.func_return["token"], result.func_return["trust"]
        after = sb.run(
            "import os; print('CALL_KEY' in os.environ, os.environ.get('SSL_CERT_FILE'), "
            f"os.path.exists({trust!r}))"
        ).stdout
        assert after.split() == ["False", "None", "False"], after
        before = len(servers.requests)
        replay = fetch(sb, url, headers=f"{{'Authorization': 'Bearer {token}'}}", verify=False)
        assert replay.startswith("200 ok"), replay
        assert ["Authorization", f"Bearer {token}"] in servers.requests[before]["headers"]
        assert VALUE not in str(servers.requests[before:])
        assert dict(sb.metrics().secrets) == {"CALL_KEY": 1}
        capsys.readouterr()
        assert main(["ps"]) == 0
        listing = capsys.readouterr().out
        assert f"kernel {sb.kernel_id}" in listing and "secrets CALL_KEY:1" in listing
        assert VALUE not in listing and token not in listing
        with pytest.raises(ConfigError, match="in env too"):
            sb.run_tool(call_api, {"url": url}, env={"CALL_KEY": "x"}, secrets={"CALL_KEY": secret})
        with pytest.raises(ConfigError, match="must be a Secret"):
            sb.run_tool(call_api, {"url": url}, secrets={"CALL_KEY": VALUE})  # type: ignore[dict-item]


def test_a_tool_calls_secret_and_the_kernels_own_are_both_filled_in(
    sandbox: Sandbox, servers: Servers
) -> None:
    """A call's secret bound to a host the kernel's own secret is bound to too: one request carries
    both values; another call without it sends its old placeholder as it is."""
    secret = Secret(OTHER_VALUE, hosts=[f"api.test:{servers.tls_port}"])
    source = """
def both(url):
    import os, urllib.request
    request = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + os.environ['API_KEY'], 'X-Call': os.environ.get('CALL_KEY', 'none')})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read().decode(), os.environ.get('CALL_KEY')
"""
    url = f"https://api.test:{servers.tls_port}/both"
    before = len(servers.requests)
    first = sandbox.run_tool(source, {"url": url}, name="both", secrets={"CALL_KEY": secret})
    assert first.status == "success", first.error
    headers = servers.requests[before]["headers"]
    assert ["Authorization", f"Bearer {VALUE}"] in headers and ["X-Call", OTHER_VALUE] in headers
    token = first.func_return[1]
    replay = sandbox.run_tool(source, {"url": url}, name="both", env={"CALL_KEY": token})
    assert replay.status == "success", replay.error
    assert ["X-Call", token] in servers.requests[before + 1]["headers"]
    assert OTHER_VALUE not in str(servers.requests[before + 1])


def test_a_secret_never_shows_its_value() -> None:
    """Secret's repr, str and pickling never show the value; a bare string is refused."""
    secret = Secret(VALUE, hosts=["api.openai.com"])
    assert VALUE not in repr(secret) + str(secret) + repr([secret])
    with pytest.raises(TypeError):
        pickle.dumps(secret)
    for bad in (" sk-padded", "sk-line\r\nX-Injected: 1"):
        with pytest.raises(ConfigError, match="printable ASCII") as refused:
            Secret(bad, hosts=["api.openai.com"])
        assert bad.strip() not in str(refused.value)
    with pytest.raises(ConfigError, match="must be a Secret"):
        Sandbox(secrets={"API_KEY": VALUE})
    with pytest.raises(ConfigError, match="opensandbox"):
        Sandbox("opensandbox", secrets={"API_KEY": secret}, api_base="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="network=True bypasses"):
        Sandbox(network=True).run_tool(call_api, {"url": "x"}, secrets={"API_KEY": secret})
    with pytest.warns(UserWarning), pytest.raises(ConfigError, match="'local' backend"):
        Sandbox("local").run_tool(call_api, {"url": "x"}, secrets={"API_KEY": secret})


async def run_in_kernelspec(name: str, code: str) -> str:
    """Start the kernelspec ``name`` as a Jupyter server does, run ``code``, return its stdout."""
    manager = AsyncKernelManager(kernel_name=name)
    await manager.start_kernel()
    try:
        out, _ = await run_cell(manager, code, timeout=60, ready_timeout=60)
        return out
    finally:
        await manager.shutdown_kernel(now=True)


def install_with_secret(jupyter_prefix: Path, servers: Servers, name: str, binding: str) -> Path:
    install_kernelspec(
        "sandboxed-python",
        prefix=str(jupyter_prefix.parent.parent),
        install_as=name,
        config={"network": servers.network(), "secrets": [binding], "standby": 0},
    )
    return jupyter_prefix / "kernels" / name / "kernel.json"


async def test_a_kernelspec_secret_comes_from_the_servers_environment(
    docker_engine, jupyter_prefix: Path, servers: Servers, monkeypatch
) -> None:
    """``--secret API_KEY@api.test:PORT``: kernel.json names the binding only; the value is the
    server's API_KEY at launch."""
    spec = install_with_secret(
        jupyter_prefix, servers, "sandboxed-python-secret", f"API_KEY@api.test:{servers.tls_port}"
    )
    monkeypatch.setenv("API_KEY", VALUE)
    before = len(servers.requests)
    code = REQUEST.format(
        url=f"https://api.test:{servers.tls_port}/spec",
        data="None",
        headers="{'Authorization': 'Bearer ' + os.environ['API_KEY']}",
        verify=True,
    )
    out = await run_in_kernelspec("sandboxed-python-secret", code)
    assert out.startswith("200 ok"), out
    assert ["Authorization", f"Bearer {VALUE}"] in servers.requests[before]["headers"]
    assert VALUE not in spec.read_text() and "API_KEY@api.test" in spec.read_text()


async def test_a_kernelspec_secret_from_a_file(
    docker_engine, jupyter_prefix: Path, servers: Servers, tmp_path: Path, monkeypatch
) -> None:
    """``--secret API_KEY=FILE@HOST``: the value is the file's, read at launch."""
    value_file = tmp_path / "api-key"
    value_file.write_text(OTHER_VALUE + "\n")
    value_file.chmod(0o600)
    monkeypatch.delenv("API_KEY", raising=False)
    install_with_secret(
        jupyter_prefix,
        servers,
        "sandboxed-python-secret-file",
        f"API_KEY={value_file}@api.test:{servers.tls_port}",
    )
    before = len(servers.requests)
    code = REQUEST.format(
        url=f"https://api.test:{servers.tls_port}/file",
        data="None",
        headers="{'X-Key': os.environ['API_KEY']}",
        verify=True,
    )
    out = await run_in_kernelspec("sandboxed-python-secret-file", code)
    assert out.startswith("200 ok"), out
    assert ["X-Key", OTHER_VALUE] in servers.requests[before]["headers"]


async def test_a_missing_secret_fails_the_launch_naming_it(
    docker_engine, jupyter_prefix: Path, servers: Servers, monkeypatch
) -> None:
    """No API_KEY in the server's environment: the kernel does not start, and the error says what to set."""
    install_with_secret(
        jupyter_prefix,
        servers,
        "sandboxed-python-secret-missing",
        f"API_KEY@api.test:{servers.tls_port}",
    )
    monkeypatch.delenv("API_KEY", raising=False)
    manager = AsyncKernelManager(kernel_name="sandboxed-python-secret-missing")
    with pytest.raises(Exception, match="variable API_KEY is not set"):
        await manager.start_kernel()


def test_opensandbox_refuses_secrets_saying_so() -> None:
    """An OpenSandbox kernelspec with secrets is refused (at install and at launch alike), never run
    without them."""
    from kernel_sandbox.opensandbox.settings import OpenSandboxSettings

    with pytest.raises(ConfigError, match="only the Docker backend"):
        OpenSandboxSettings.from_config({"secrets": ["API_KEY@api.openai.com"]})
    with pytest.raises(ConfigError, match="absolute path") as refused:
        DockerSettings.from_config({"secrets": ["API_KEY=sk-oops@api.openai.com"]})
    assert "sk-oops" not in str(refused.value)


def test_the_exec_stream_relay_intercepts_the_same_way(
    docker_engine, servers: Servers, monkeypatch
) -> None:
    """As any user but root on runc gets it: TLS to the kernel over the relay's exec stream."""
    from support.launcher_hooks import EXEC_STREAMS_ENV

    monkeypatch.setenv(EXEC_STREAMS_ENV, "1")
    with Sandbox(
        network=servers.network(), secrets={"API_KEY": secret_for(servers)}, timeout=120
    ) as sb:
        before = len(servers.requests)
        assert fetch(sb, f"https://api.test:{servers.tls_port}/relay").startswith("200 ok")
        assert ["Authorization", f"Bearer {VALUE}"] in servers.requests[before]["headers"]
        assert fetch(sb, f"https://other.test:{servers.tls_port}/relay", verify=False).startswith(
            "200 ok"
        )
        assert VALUE not in str(servers.requests[before + 1])


def test_ps_and_metrics_name_the_secrets_and_count_their_use(
    sandbox: Sandbox, servers: Servers, capsys
) -> None:
    """``metrics()`` and ``kernel-sandbox ps`` show the secret's name and how many requests used it, never
    its value."""
    from kernel_sandbox.cli import main

    uses = dict(sandbox.metrics().secrets)["API_KEY"]
    fetch(sandbox, f"https://api.test:{servers.tls_port}/count")
    fetch(
        sandbox, f"https://other.test:{servers.tls_port}/count", verify=False
    )  # the placeholder: not a use
    usage = sandbox.metrics()
    assert dict(usage.secrets)["API_KEY"] == uses + 1 and VALUE not in repr(usage)
    assert main(["ps"]) == 0
    listing = capsys.readouterr().out
    assert f"kernel {sandbox.kernel_id}" in listing and f"secrets API_KEY:{uses + 1}" in listing
    assert VALUE not in listing


def test_a_query_parameter_is_filled_in_only_for_a_secret_that_opts_in(
    sandbox: Sandbox, servers: Servers
) -> None:
    """``Secret(..., query=True)``: its placeholder in the URL's query becomes the value; another secret's
    placeholder in the query, or this one's in the path, stays as it is."""
    token, query_token = (
        placeholder(sandbox),
        sandbox.run("import os; print(os.environ['Q_KEY'])").stdout.strip(),
    )
    before = len(servers.requests)
    url = f"https://api.test:{servers.tls_port}/q/{query_token}?key={query_token}&other={token}"
    assert fetch(sandbox, url, headers="{}").startswith("200 ok")
    path = servers.requests[before]["path"]
    assert path == f"/q/{query_token}?key={QUERY_VALUE}&other={token}"


def test_a_restarted_kernel_gets_new_placeholders_and_the_secret_still_works(
    docker_engine, servers: Servers
) -> None:
    """A restart is a new container and a new launcher: it holds the secret again, under a new placeholder."""
    with Sandbox(
        network=servers.network(), secrets={"API_KEY": secret_for(servers)}, timeout=120
    ) as sb:
        first = placeholder(sb)
        sb.restart()
        assert placeholder(sb) != first
        before = len(servers.requests)
        assert fetch(sb, f"https://api.test:{servers.tls_port}/restarted").startswith("200 ok")
        assert ["Authorization", f"Bearer {VALUE}"] in servers.requests[before]["headers"]


def test_a_pool_gives_each_of_its_kernels_the_secret(docker_engine, servers: Servers) -> None:
    """``SandboxPool(secrets=...)``: every kernel it hands out holds the secret, each under its own
    placeholder."""
    from kernel_sandbox.execution import SandboxPool

    with SandboxPool(
        size=1, network=servers.network(), secrets={"API_KEY": secret_for(servers)}, timeout=120
    ) as pool:
        seen = []
        for _ in range(2):
            with pool.acquire() as sb:
                seen.append(placeholder(sb))
                before = len(servers.requests)
                assert fetch(sb, f"https://api.test:{servers.tls_port}/pool").startswith("200 ok")
                assert ["Authorization", f"Bearer {VALUE}"] in servers.requests[before]["headers"]
        assert seen[0] != seen[1]


def test_install_secret_writes_the_binding_only_and_opensandbox_refuses_it(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """``kernel-sandbox install --secret``: kernel.json holds ``NAME@HOST`` even with the variable set;
    for the OpenSandbox kernelspec the command fails saying why, and installs nothing."""
    import json

    from kernel_sandbox.cli import main

    monkeypatch.setenv("API_KEY", VALUE)
    argv = ["install", "--prefix", str(tmp_path), "--name", "with-secret"]
    assert main([*argv, "--secret", "API_KEY@api.openai.com"]) == 0
    spec = tmp_path / "share" / "jupyter" / "kernels" / "with-secret" / "kernel.json"
    config = json.loads(spec.read_text())["metadata"]["kernel_provisioner"]["config"]
    assert config["secrets"] == ["API_KEY@api.openai.com"] and VALUE not in spec.read_text()
    capsys.readouterr()
    refused = ["install", "--prefix", str(tmp_path), "--kernel", "sandboxed-python-opensandbox"]
    assert main([*refused, "--secret", "API_KEY@api.openai.com"]) == 1
    assert "only the Docker backend" in capsys.readouterr().err
    assert not (
        tmp_path / "share" / "jupyter" / "kernels" / "sandboxed-python-opensandbox"
    ).exists()


@pytest.mark.security("fuzz", "egress")
@settings(max_examples=300, deadline=None)
@given(
    entry=st.text(alphabet="AK_=/@.:,;qeury-1x ", max_size=40),
    host=st.sampled_from(
        ["api.test", "API.TEST", "api.test.", "other.test", "api.tes", "10.0.0.1"]
    ),
    port=st.sampled_from([443, 8443, 80]),
    junk=st.binary(max_size=40),
)
def test_the_fill_never_sends_a_value_toward_another_destination(
    entry: str, host: str, port: int, junk: bytes
) -> None:
    """Any ``secrets`` entry is parsed or refused with ConfigError; a request toward anything but
    ``api.test:8443`` keeps every placeholder, wherever in the head it sits."""
    from kernel_sandbox.hostsecrets import parse_binding
    from kernel_sandbox.launch.intercept import SecretTable

    try:
        parse_binding("secrets", entry)
    except ConfigError:
        pass
    table = SecretTable(
        [parse_binding("secrets", "API_KEY@api.test:8443;query")], {"API_KEY": VALUE}
    )
    token = table.kernel_env()["API_KEY"].encode()
    headers = [
        (b"authorization", b"Bearer " + token + junk),
        (b"x-" + junk[:3].hex().encode(), junk + token),
    ]
    out, target = table.fill(host, port, headers, b"/p/" + token + b"?k=" + token + junk)
    sent = b"".join(name + value for name, value in out) + target
    bound = (host, port) == ("api.test", 8443)
    assert (VALUE.encode() in sent) is bound and (b"/p/" + token) in target


async def test_a_spliced_answer_comes_whole_to_a_kernel_that_closed_its_sending_side() -> None:
    """A spliced connection (no secret) whose kernel sent its request and shut its sending side, as
    some clients do, then reads the long answer slower than the host sends: the proxy cut it once both
    directions had ended, and its transport dropped the end it still held."""
    import hashlib

    size = 8 << 20
    body = bytes(range(256)) * (size // 256)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with proxy_to(port, SMALL_BUFFER) as (_, proxy):
            reader, writer = await connected(proxy, port, small_buffers)  # the kernel reads slowly
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            writer.write_eof()
            digest, got = hashlib.sha256(), 0
            while data := await asyncio.wait_for(reader.read(1 << 16), 30):
                digest.update(data)
                got += len(data)
                await asyncio.sleep(0.001)  # slower than the host sends
            assert got == size and digest.digest() == hashlib.sha256(body).digest(), f"{size - got} bytes lost"
            writer.close()
    finally:
        server.close()
