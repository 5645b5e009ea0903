"""The launcher's filtering proxy, in process, over real sockets on 127.0.0.1, attacked.

Every test's proxy resolves through a stub (names → addresses, calls counted) and connects
through the loopback guard, which records any address outside 127.0.0.0/8: each test ends by
checking that the guard never fired, so nothing here can send a packet off the machine.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from kernel_sandbox.egress import Destination, parse_destinations
from kernel_sandbox.launch.egress import Egress
from kernel_sandbox.launch.egress_outbound import host_addresses, open_outbound
from support.launcher_hooks import EXEC_STREAMS_ENV, TEST_RESOLVER_ENV, guarded
from kernel_sandbox.docker.proxy import kernel_env
from kernel_sandbox.launch.egress_grammar import LOG_NAMES, Refusal, parse_head
from kernel_sandbox.docker.settings import DockerSettings

pytestmark = pytest.mark.security("attack", "egress")

OWN = ipaddress.ip_address("203.0.113.7")
"""The host's own address as the proxies here see it (a documentation address)."""


@dataclass
class Rig:
    """A proxy with a stub resolver and the guard, and an echo upstream on 127.0.0.1."""

    egress: Egress
    port: int
    upstream_port: int
    answers: dict[str, list[list[str]]]
    resolved: list[str] = field(default_factory=list)
    connected: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    received: list[bytes] = field(default_factory=list)

    async def request(self, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(data)
        return reader, writer

    async def answer(self, data: bytes) -> bytes:
        """Send ``data`` (then end the sending side) and read what comes back until the proxy closes."""
        reader, writer = await self.request(data)
        writer.write_eof()
        try:
            return await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()


@pytest.fixture
async def make_rig() -> AsyncIterator:
    rigs: list[Rig] = []
    servers: list[asyncio.AbstractServer] = []

    async def make(allowed: list[str], answers: dict[str, list[list[str]]] | None = None, **options) -> Rig:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                rig.received.append(data)
                writer.write(data)
                await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        servers.append(upstream)
        upstream_port = upstream.sockets[0].getsockname()[1]

        async def resolve(host: str, port: int) -> list[str]:
            rig.resolved.append(host)
            sequence = rig.answers.get(host)
            if not sequence:
                raise socket.gaierror(socket.EAI_NONAME, "unknown")
            return sequence.pop(0) if len(sequence) > 1 else sequence[0]

        async def connect(address: str, port: int):
            rig.connected.append(address)
            return await open_outbound(address, port)

        entries = [entry.replace("PORT", str(upstream_port)) for entry in allowed]
        egress = Egress(
            parse_destinations("network", entries), resolve=resolve,
            connect=guarded(connect, lambda where: rig.fired.append(where)), own_addresses={OWN}, **options,
        )
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        listener.setblocking(False)
        rig = Rig(egress, listener.getsockname()[1], upstream_port, answers or {})
        await egress.serve(listener)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        await rig.egress.close()
        assert rig.fired == [], f"the loopback guard fired: {rig.fired}"
    for server in servers:
        server.close()


def connect_line(host: str, port: int) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


async def test_a_listed_name_is_tunnelled_to_the_address_resolved_on_the_host(make_rig) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]})
    reader, writer = await rig.request(connect_line("index.test", rig.upstream_port))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.write(b"through the tunnel")
    assert await reader.readexactly(18) == b"through the tunnel"
    writer.close()
    assert rig.resolved == ["index.test"] and rig.connected == ["127.0.0.1"]


async def test_plain_http_goes_on_in_origin_form_with_hop_by_hop_headers_dropped(make_rig) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]})
    port = rig.upstream_port
    request = (f"GET http://index.test:{port}/simple/x/?a=1 HTTP/1.1\r\nHost: index.test:{port}\r\n"
               "Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n")
    echoed = await rig.answer(request.encode())
    assert echoed.startswith(b"GET /simple/x/?a=1 HTTP/1.1\r\n")
    assert b"Proxy-" not in echoed and b"Connection: close\r\n" in echoed and b"Accept: */*" in echoed


@pytest.mark.parametrize("target", ["elsewhere.test:443", "127.0.0.1:{port}", "[::1]:{port}", "index.test:1"])
async def test_what_is_not_listed_is_refused_with_the_option_to_change(make_rig, target: str) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]})
    answer = await rig.answer(f"CONNECT {target.format(port=rig.upstream_port)} HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403 ") and b"'network' option" in answer
    assert rig.connected == [] and rig.resolved == []


async def test_with_the_network_off_every_request_is_refused_at_once(make_rig) -> None:
    rig = await make_rig([])
    answer = await rig.answer(connect_line("pypi.org", 443))
    assert answer.startswith(b"HTTP/1.1 403 kernel-sandbox refused pypi.org:443: the kernel's network is off")
    assert b"--allow pypi.org" in answer


@pytest.mark.parametrize("address", ["10.0.0.1", "169.254.169.254", str(OWN), "127.0.0.1", "224.0.0.1",
                                     "::1", "::ffff:10.0.0.1", "fd00::1", "100.64.0.1", "0.0.0.0"])
async def test_a_listed_name_resolving_into_private_networks_is_refused(make_rig, address: str) -> None:
    rig = await make_rig(["api.example.com"], {"api.example.com": [[address]]})
    answer = await rig.answer(connect_line("api.example.com", 443))
    assert answer.startswith(b"HTTP/1.1 403 ") and b"api.example.com@" in answer
    assert rig.connected == []


async def test_one_private_answer_among_public_ones_refuses_the_name(make_rig) -> None:
    rig = await make_rig(["api.example.com"], {"api.example.com": [["93.184.216.34", "10.0.0.1"]]})
    assert (await rig.answer(connect_line("api.example.com", 443))).startswith(b"HTTP/1.1 403 ")
    assert rig.connected == []


async def test_the_address_allowance_is_for_the_listed_addresses_only(make_rig) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.2"]]})
    assert (await rig.answer(connect_line("index.test", rig.upstream_port))).startswith(b"HTTP/1.1 403 ")
    assert rig.connected == []


async def test_rebinding_a_second_answer_is_never_used_for_the_first_connection(make_rig) -> None:
    """Each connection resolves once and connects to that answer; a later, different answer is judged anew."""
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"], ["10.0.0.1"]]})
    reader, writer = await rig.request(connect_line("index.test", rig.upstream_port))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    second = await rig.answer(connect_line("index.test", rig.upstream_port))
    writer.close()
    assert second.startswith(b"HTTP/1.1 403 ") and b"10.0.0.1" in second
    assert rig.resolved == ["index.test", "index.test"] and rig.connected == ["127.0.0.1"]


async def test_a_second_request_in_the_same_bytes_goes_down_the_first_tunnel_unread(make_rig) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]})
    smuggled = b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n"
    reader, writer = await rig.request(connect_line("index.test", rig.upstream_port) + smuggled)
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    assert await reader.readexactly(len(smuggled)) == smuggled  # the listed upstream got it, as data
    writer.close()
    assert rig.resolved == ["index.test"] and rig.connected == ["127.0.0.1"]


@pytest.mark.parametrize(
    "head, status",
    [
        (b"CONNECT index.test:1 HTTP/1.1\r\nX: a\rCONNECT evil.test:443 HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT index.test:1 HTTP/1.1\nHost: evil.test\r\n\r\n", b"400"),
        (b"CONNECT index.test:1@evil.test:443 HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT  evil.test:443 HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT evil.test:443 HTTP/1.1 extra\r\n\r\n", b"400"),
        (b"CONNECT evil.test:99999 HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT evil.test HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT " + b"a" * 300 + b".test:443 HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT ev\xc3\xafl.test:443 HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT evil.test:443 HTTP/1.1\r\nX: \x00\r\n\r\n", b"400"),
        (b"GET https://evil.test/ HTTP/1.1\r\n\r\n", b"400"),
        (b"GET /relative HTTP/1.1\r\nHost: evil.test\r\n\r\n", b"400"),
        (b"GET http://user@evil.test/ HTTP/1.1\r\n\r\n", b"400"),
        (b"GET http://index.test:PORT/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", b"400"),
        (b"CONNECT evil.test:443 HTTP/2.0\r\n\r\n", b"400"),
        (b"CONNECT evil.test:443 HTTP/1.1\r\n" + b"X-A: b\r\n" * 100 + b"\r\n", b"431"),
        (b"CONNECT " + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", b"431"),
        (b"CONNECT evil.test:443 HTTP/1.1\r\nX: " + b"b" * 1_000_000 + b"\r\n\r\n", b"431"),
    ],
)
async def test_smuggling_injection_and_absurd_lengths_are_refused(make_rig, head: bytes, status: bytes) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]})
    answer = await rig.answer(head.replace(b"PORT", str(rig.upstream_port).encode()))
    assert answer.startswith(b"HTTP/1.1 " + status + b" ")
    assert rig.resolved == [] and rig.connected == []


async def test_a_thousand_connections_at_once_are_bounded(make_rig) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]},
                         max_connections=16, head_timeout=5.0)
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, len(rig.egress._clients))
            await asyncio.sleep(0.001)

    async def one() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
        try:
            return await asyncio.wait_for(reader.read(200), 60)
        except ConnectionError:
            return b""
        finally:
            writer.close()

    watcher = asyncio.ensure_future(watch())
    answers = await asyncio.gather(*(one() for _ in range(1000)))
    watcher.cancel()
    busy = sum(answer.startswith(b"HTTP/1.1 503 ") for answer in answers)
    assert most <= 16 and busy >= 1000 - 16
    assert all(answer == b"" or answer.startswith(b"HTTP/1.1 503 ") for answer in answers)
    reader, writer = await rig.request(connect_line("index.test", rig.upstream_port))
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_slowloris_client_is_cut_off_before_its_head_is_read(make_rig) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]}, head_timeout=1.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    head = connect_line("index.test", rig.upstream_port)
    closed = False
    for byte in head[:-1]:
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            closed = True
            break
        if reader.at_eof() or await _eof_within(reader, 0.3):
            closed = True
            break
    writer.close()
    assert closed and rig.resolved == []


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except asyncio.TimeoutError:
        return False
    except ConnectionError:
        return True


async def test_a_quiet_tunnel_is_closed_after_the_idle_timeout(make_rig) -> None:
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]}, idle_timeout=1.0)
    reader, writer = await rig.request(connect_line("index.test", rig.upstream_port))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    assert await _eof_within(reader, 30)
    writer.close()


async def test_the_proxy_answers_the_kernel_without_waiting_for_acks(make_rig) -> None:
    """The listening socket is made with proto 0 (as in the container's namespace), on which asyncio
    sets no TCP_NODELAY: the proxy sets it on every connection from the kernel, so a small answer after
    another small write is not held for a delayed ACK."""
    rig = await make_rig(["index.test:PORT@127.0.0.1"], {"index.test": [["127.0.0.1"]]})
    reader, writer = await rig.request(connect_line("index.test", rig.upstream_port))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    [client] = rig.egress._clients
    sock = client.get_extra_info("socket")
    assert sock.proto == 0 and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    writer.close()


async def test_an_install_window_opens_its_destinations_and_closing_it_cuts_its_connections(make_rig) -> None:
    rig = await make_rig([], {"index.test": [["127.0.0.1"]]})
    rig.egress.package_index = parse_destinations("package_index", [f"index.test:{rig.upstream_port}@127.0.0.1"])
    before = await rig.answer(connect_line("index.test", rig.upstream_port))
    assert before.startswith(b"HTTP/1.1 403 ")
    opened = rig.egress.answer({"open": 60})
    assert opened["status"] == "ok"
    reader, writer = await rig.request(connect_line("index.test", rig.upstream_port))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    assert rig.egress.answer({"close": opened["window"]}) == {"status": "ok", "closed": True}
    assert await _eof_within(reader, 10)  # the connection kept open is cut when the window closes
    writer.close()
    after = await rig.answer(connect_line("index.test", rig.upstream_port))
    assert after.startswith(b"HTTP/1.1 403 ") and rig.connected == ["127.0.0.1"]


async def test_a_window_closes_by_itself_when_its_time_is_up(make_rig) -> None:
    rig = await make_rig([], {"index.test": [["127.0.0.1"]]})
    rig.egress.package_index = parse_destinations("package_index", [f"index.test:{rig.upstream_port}@127.0.0.1"])
    assert rig.egress.answer({"open": 0.2})["status"] == "ok"
    for _ in range(100):
        if not rig.egress.windows:
            break
        await asyncio.sleep(0.1)
    assert (await rig.answer(connect_line("index.test", rig.upstream_port))).startswith(b"HTTP/1.1 403 ")


@pytest.mark.parametrize("content", [None, [], {"open": True}, {"open": -1}, {"open": 1e9}, {"what": 1}, {"close": "nope"}])
async def test_bad_window_requests_are_answered_and_open_nothing(make_rig, content) -> None:
    rig = await make_rig([])
    answer = rig.egress.answer(content)
    assert answer.get("closed") is False or answer["status"] == "error"
    assert rig.egress.windows == {}


SECRET = "sk-bind-test-value-000000000000"


@pytest.mark.parametrize(
    "content",
    [
        {"bind": [{"binding": "API_KEY@api.test", "value": SECRET}]},
        {"bind": [{"binding": "API_KEY@api.test", "value": SECRET}], "seconds": 0},
        {"bind": [{"binding": "API_KEY@api.test", "value": SECRET}], "seconds": True},
        {"bind": [], "seconds": 5},
        {"bind": {"API_KEY": SECRET}, "seconds": 5},
        {"bind": [{"binding": "API_KEY@api.test", "value": SECRET + "\r\nX-Injected: 1"}], "seconds": 5},
        {"bind": [{"binding": f"API_KEY={SECRET}@api.test", "value": SECRET}], "seconds": 5},
        {"bind": [{"binding": "PATH@api.test", "value": SECRET}], "seconds": 5},
        {"bind": [{"binding": "API_KEY@*.test", "value": SECRET}], "seconds": 5},
        {"bind": [{"binding": "API_KEY@api.test", "value": SECRET, "extra": 1}], "seconds": 5},
        {"bind": [{"binding": "K@api.test", "value": SECRET}] * 2, "seconds": 5},
    ],
)
async def test_bad_bind_requests_bind_nothing_and_never_quote_the_value(make_rig, content) -> None:
    """A tool call's ``bind`` that is malformed, out of bounds or names what a secret may not be:
    answered with an error that does not hold the value, and nothing is opened."""
    rig = await make_rig([])
    answer = rig.egress.answer(content)
    assert answer["status"] == "error" and SECRET not in answer["evalue"], answer
    assert rig.egress.windows == {}


async def test_a_bound_call_opens_its_hosts_until_it_is_closed(make_rig) -> None:
    """``bind`` answers the call's placeholders (never the value) and opens the secret's host; closing
    the window unbinds it and refuses the host again."""
    rig = await make_rig([], {"api.test": [["127.0.0.1"]]})
    binding = f"API_KEY@api.test:{rig.upstream_port}"
    answer = rig.egress.answer({"bind": [{"binding": binding, "value": SECRET}], "seconds": 60})
    assert answer["status"] == "ok" and SECRET not in str(answer) and len(answer["env"]["API_KEY"]) >= len(SECRET)
    assert "BEGIN CERTIFICATE" in answer["env"]["KERNEL_SANDBOX_CA"]
    assert rig.egress.fill("api.test", rig.upstream_port, [(b"x-key", answer["env"]["API_KEY"].encode())], b"/")[0] == [
        (b"x-key", SECRET.encode())
    ]
    assert rig.egress.answer({"close": answer["window"]}) == {"status": "ok", "closed": True}
    token = answer["env"]["API_KEY"].encode()
    assert rig.egress.fill("api.test", rig.upstream_port, [(b"x-key", token)], b"/")[0] == [(b"x-key", token)]
    assert (await rig.answer(connect_line("api.test", rig.upstream_port))).startswith(b"HTTP/1.1 403 ")


async def test_a_kernel_flooding_refusals_leaves_a_bounded_log(make_rig, caplog) -> None:
    rig = await make_rig([])
    caplog.set_level(logging.WARNING, logger="kernel_sandbox.launch")
    for index in range(3000):
        name = f"n{index % 1000}.flood.test" if index % 2 else "same.flood.test"
        await rig.answer(connect_line(name, 443))
    records = [r for r in caplog.records if r.name == "kernel_sandbox.launch"]
    assert len(records) <= LOG_NAMES + 2
    assert sum("same.flood.test" in r.getMessage() for r in records) == 1


def test_parse_head_keeps_one_request_and_the_host() -> None:
    request = parse_head(b"CONNECT PyPI.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nUser-Agent: pip\r\n\r\n")
    assert (request.host, request.port, request.connect) == ("pypi.org", 443, True)
    with pytest.raises(Refusal):
        parse_head(b"CONNECT pypi.org:443 HTTP/1.1\r\nBad Header: x\r\n\r\n")


def test_the_host_knows_its_own_addresses() -> None:
    own = host_addresses()
    assert ipaddress.ip_address("127.0.0.1") in own


def test_the_kernel_environment_points_every_client_at_the_proxy() -> None:
    env = kernel_env(DockerSettings.from_config({}))
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:10080"
    assert "PIP_INDEX_URL" not in env and "127.0.0.1" in env["NO_PROXY"]
    mirror = kernel_env(DockerSettings.from_config({"package_index": "http://index.test:8080/simple"}))
    assert mirror["PIP_INDEX_URL"] == "http://index.test:8080/simple" and mirror["PIP_TRUSTED_HOST"] == "index.test"


def test_destinations_match_names_wildcards_ports_and_addresses() -> None:
    pypi, files, api, addr = parse_destinations("network", ["pypi.org", "*.pythonhosted.org", "api.x.com:8443", "10.1.2.3:80"])
    assert pypi.matches("pypi.org", 443) and pypi.matches("pypi.org", 80) and not pypi.matches("pypi.org", 22)
    assert not pypi.matches("evil.pypi.org", 443) and not pypi.matches("pypi.org.evil.test", 443)
    assert files.matches("files.pythonhosted.org", 443) and not files.matches("pythonhosted.org", 443)
    assert not files.matches("evilpythonhosted.org", 443)
    assert api.matches("api.x.com", 8443) and not api.matches("api.x.com", 443)
    assert addr.matches("10.1.2.3", 80) and addr.permits(ipaddress.ip_address("10.1.2.3"))
    assert Destination("x.test").permits(ipaddress.ip_address("10.0.0.1")) is False


GUARD_PROBE = """
import asyncio, socket
from kernel_sandbox.launch import egress_outbound as outbound
from kernel_sandbox.launch.egress import Egress

async def probe():
    try:
        await outbound.system_resolve("localhost", 443)
    except socket.gaierror as error:
        print("resolve:", error.strerror)
    else:
        raise SystemExit("unguarded: localhost resolved from the host")
    try:
        await Egress([]).connect("192.0.2.1", 443)
    except OSError as error:
        print("connect:", error)

asyncio.run(probe())
from kernel_sandbox.docker import netns
print("direct path:", netns.may_enter_netns(None, {}))
"""
"""Stops before any connection if the guard is not in place (``localhost`` then resolves)."""


def test_the_run_s_hooks_reach_a_launcher_started_isolated(tmp_path):
    """A process started as the kernelspecs start the launcher (``python -I``) resolves from the
    test's map alone and connects to loopback only (the attempt is recorded for the session), and
    with the exec streams asked for never takes the direct path."""
    resolver = tmp_path / "resolver.json"
    resolver.write_text(json.dumps({}))
    resolver.chmod(0o600)
    env = {**os.environ, TEST_RESOLVER_ENV: str(resolver), EXEC_STREAMS_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-I", "-c", GUARD_PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "resolve: localhost is not in the test's resolver map" in done.stdout
    assert "connect: the test guard refused 192.0.2.1:443" in done.stdout
    assert (tmp_path / "resolver.json.guard").read_text() == "192.0.2.1:443\n"
    assert "direct path: False" in done.stdout
