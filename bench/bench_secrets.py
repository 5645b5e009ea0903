"""What a secret costs: the egress proxy intercepting TLS for a bound host vs splicing it.

Run: ``python bench/bench_secrets.py [--rounds N]`` (no Docker needed). A local HTTPS server on
127.0.0.1 (its certificate from a CA the proxy's process trusts through ``SSL_CERT_FILE``) serves
1 MiB and a 2-byte answer. Side by side, interleaved round by round, the same client, on new
connections each time, as a kernel's would be:

- (s) ``CONNECT`` spliced: the proxy has no secret for the name; the client's TLS goes to the server;
- (i) ``CONNECT`` intercepted: a secret is bound to the name; the proxy verifies the server, answers
  the client's TLS with the kernel CA's certificate and relays HTTP/1.1 with h11, filling in the
  secret's placeholder (:mod:`kernel_sandbox.launch.intercept`, the code the launcher runs).

Measured for the 1 MiB download and for one small request with the secret's header (intercepted)
vs the same request without a secret (spliced). The proxy runs in a process of its own, as the
launcher does (its TLS work then runs beside the client's and the server's, not in turn with
them); the client and the server share this one. The name is resolved by a stub (no DNS); the
server's one certificate names ``bound.test``, which every client checks.

Each request is timed from its connect to its answer's last byte; then, untimed, the benchmark
waits until its connection is closed at both ends (the client's side, and the server's handler
done), and every other round takes each pair the other way round (intercepted first, secret
first). Before, the teardown of a 1 MiB download ran into the next request, always the same one,
and cost it about 0.6 ms: the intercepted download, which always came after the spliced one, and
the small spliced request, which always came after the intercepted download. What is left of
that teardown (the proxy's own) now falls on every case alike.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import ssl
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from bench_execution import print_table
from report import Measure, Row

from kernel_sandbox.egress import parse_destinations
from kernel_sandbox.hostsecrets import parse_binding
from kernel_sandbox.launch.egress import Egress
from kernel_sandbox.launch.intercept import KernelCA, SecretTable

ROUNDS = 200
"""Rounds of the four cases (about 6 s): at 50, one run in seven was over the goal by noise alone."""
BODY = b"x" * (1024 * 1024)
MEASURES = [
    Measure("secrets", "Secrets: a bound host's TLS intercepted vs spliced (1 MiB; one small request)", "ms",
            "A local HTTPS server on 127.0.0.1; the launcher's proxy code in process, the name resolved by a stub; "
            "new connections per request, interleaved (bench_secrets.py)."),
]


_answering: set[asyncio.Task[None]] = set()
"""The server's connections not yet closed."""


async def _serve(context: ssl.SSLContext) -> tuple[asyncio.AbstractServer, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        _answering.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            body = BODY if head.startswith(b"GET /big") else b"ok"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
            writer.close()
            await _closed(writer)
        finally:
            _answering.discard(task)

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    return server, server.sockets[0].getsockname()[1]


async def _closed(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.wait_closed()
    except (ConnectionError, ssl.SSLError):
        pass  # the proxy cut it


async def _fetch(proxy: int, host: str, port: int, trust: ssl.SSLContext, request: bytes, size: int) -> float:
    """Milliseconds from the connect to the answer's last byte; then, untimed, until the connection
    is closed at both ends (the next request would otherwise pay for its teardown)."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy)
    writer.write(b"CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host.encode(), port, host.encode(), port))
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    await writer.start_tls(trust, server_hostname="bound.test")  # the server's one name
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:100]
    await reader.readexactly(size)
    took = (time.perf_counter() - started) * 1000
    writer.close()
    await _closed(writer)
    if _answering:
        await asyncio.wait(list(_answering))
    return took


def _proxy(port: int, server_ca: str, answers: Connection) -> None:
    """The launcher's part, in its own process: the proxy for a kernel with a secret bound to
    ``bound.test``; sends its port, the kernel CA and the placeholder, then serves until told to
    stop and sends how often the secret was used."""

    async def serve() -> None:
        with tempfile.TemporaryDirectory() as directory:
            pem = Path(directory) / "ca.pem"
            pem.write_text(server_ca)
            os.environ["SSL_CERT_FILE"] = str(pem)  # how the proxy's process trusts the server
            binding = parse_binding("secrets", f"API_KEY@bound.test:{port}")
            table = SecretTable([binding], {"API_KEY": "sk-" + "v" * 48})

            async def resolve(host: str, port: int) -> list[str]:
                return ["127.0.0.1"]

            network = [f"plain.test:{port}@127.0.0.1", f"bound.test:{port}@127.0.0.1"]
            destinations = parse_destinations("network", network)
            egress = Egress(destinations, resolve=resolve, own_addresses=(), secrets=table)
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            listener.setblocking(False)
            await egress.serve(listener)
            token = table.kernel_env()["API_KEY"]
            answers.send((listener.getsockname()[1], table.ca.pem, token))
            await asyncio.get_running_loop().run_in_executor(None, answers.recv)
            await egress.close()
            answers.send(table.uses["API_KEY"])

    asyncio.run(serve())


async def measure(rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Milliseconds per request: ``spliced`` / ``intercepted`` 1 MiB, ``plain`` / ``secret`` small."""
    server_ca = KernelCA(["plain.test", "bound.test"])
    server, port = await _serve(server_ca.server_context("bound.test"))
    answers, theirs = multiprocessing.get_context("spawn").Pipe()
    process = multiprocessing.get_context("spawn").Process(target=_proxy, args=(port, server_ca.pem, theirs))
    process.start()
    try:
        proxy, kernel_ca, placeholder = await asyncio.to_thread(answers.recv)
        token = placeholder.encode()
        plain_trust = ssl.create_default_context(cadata=server_ca.pem)
        kernel_trust = ssl.create_default_context(cadata=kernel_ca)

        def get(path: str, host: str, auth: bytes = b"") -> bytes:
            return b"GET %s HTTP/1.1\r\nHost: %s:%d\r\n%sConnection: close\r\n\r\n" % (path.encode(), host.encode(), port, auth)

        cases = {
            "spliced": lambda: _fetch(proxy, "plain.test", port, plain_trust, get("/big", "plain.test"), len(BODY)),
            "intercepted": lambda: _fetch(proxy, "bound.test", port, kernel_trust, get("/big", "bound.test"), len(BODY)),
            "plain": lambda: _fetch(proxy, "plain.test", port, plain_trust, get("/small", "plain.test"), 2),
            "secret": lambda: _fetch(
                proxy, "bound.test", port, kernel_trust, get("/small", "bound.test", b"Authorization: Bearer %s\r\n" % token), 2
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(3):  # warm up
            for case in cases.values():
                await case()
        # every other round each pair in turn the other way: each case then comes after a 1 MiB
        # download in half of the rounds, and after a small request in the other half
        orders = [list(cases), ["intercepted", "spliced", "secret", "plain"]]
        for round_ in range(rounds):
            for name in orders[round_ % 2]:
                times[name].append(await cases[name]())
        answers.send("stop")
        uses = await asyncio.to_thread(answers.recv)
    finally:
        server.close()
        process.join(10)
        if process.is_alive():
            process.kill()
    assert uses >= rounds
    return times


PAIRS = (
    ("spliced", "intercepted", "1 MiB download through the egress proxy, CONNECT spliced (no secret)",
     "1 MiB download through the egress proxy, TLS intercepted (host with a secret)"),
    ("plain", "secret", "one small request, CONNECT spliced (no secret)",
     "one small request with the secret filled in (TLS intercepted)"),
)


def rows(times: dict[str, list[float]]) -> list[Row]:
    """Report rows: each spliced case as the reference of its intercepted one."""
    out = []
    for base, cost, base_what, cost_what in PAIRS:
        reference, value = statistics.median(times[base]), statistics.median(times[cost])
        out.append(Row("secrets", base_what, "ours", reference, n=len(times[base])))
        out.append(Row("secrets", cost_what, "ours", value, n=len(times[cost]), reference=base_what,
                       note=f"adds {value - reference:.2f} ms"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    times = asyncio.run(measure(args.rounds))
    table: list[tuple[str, str, str, str]] = []
    for base, cost, base_what, cost_what in PAIRS:
        reference, value = statistics.median(times[base]), statistics.median(times[cost])
        table.append((base_what, "", f"{reference:.2f} ms", ""))
        table.append((cost_what, f"{reference:.2f} ms", f"{value:.2f} ms (+{value - reference:.2f})", f"{value / reference:.2f}x"))
    print(f"p50 of {args.rounds} interleaved rounds")
    print_table(table)


if __name__ == "__main__":
    main()
