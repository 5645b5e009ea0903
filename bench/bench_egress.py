"""The egress proxy's added latency: a 1 MB download through it vs direct, on the host.

Run: ``python bench/bench_egress.py [--rounds N]`` (no Docker needed). A local HTTP server on
127.0.0.1 serves 1 MiB; side by side, interleaved round by round, the same client fetches it
(d) directly, (t) through the launcher's proxy (:class:`kernel_sandbox.launch.egress.Egress`,
the same code the launcher runs for a kernel) in a ``CONNECT`` tunnel, as pip and requests do
for https, and (h) through the proxy as a plain-HTTP absolute-URI request. The proxy resolves
``index.test`` to 127.0.0.1 with a stub (no DNS), so the cost measured is the proxy's own: the
request head parsed, the decision, one more connection, and the bytes spliced. Each fetch opens
new connections, as pip does per file.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time

from bench_execution import print_table
from report import Row

from kernel_sandbox.egress import parse_destinations
from kernel_sandbox.launch.egress import Egress

ROUNDS = 100
BODY = b"x" * (1024 * 1024)


async def _serve() -> tuple[asyncio.AbstractServer, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY) + BODY)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _fetch(port: int, prelude: bytes, request: bytes) -> float:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if prelude:
        writer.write(prelude)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:100]
    body = await reader.read()
    writer.close()
    elapsed = time.perf_counter() - started
    assert len(body) == len(BODY)
    return elapsed * 1000


async def measure(rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Milliseconds per 1 MiB download: ``direct``, ``tunnel`` (CONNECT) and ``http`` (absolute URI)."""
    server, port = await _serve()

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    egress = Egress(parse_destinations("network", [f"index.test:{port}@127.0.0.1"]), resolve=resolve, own_addresses=())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    listener.setblocking(False)
    await egress.serve(listener)
    proxy = listener.getsockname()[1]
    origin = b"GET /file HTTP/1.1\r\nHost: index.test:%d\r\n\r\n" % port
    absolute = b"GET http://index.test:%d/file HTTP/1.1\r\nHost: index.test:%d\r\n\r\n" % (port, port)
    tunnel = b"CONNECT index.test:%d HTTP/1.1\r\nHost: index.test:%d\r\n\r\n" % (port, port)
    times: dict[str, list[float]] = {"direct": [], "tunnel": [], "http": []}
    try:
        for _ in range(3):  # warm up
            await _fetch(port, b"", origin)
            await _fetch(proxy, tunnel, origin)
        for _ in range(rounds):
            times["direct"].append(await _fetch(port, b"", origin))
            times["tunnel"].append(await _fetch(proxy, tunnel, origin))
            times["http"].append(await _fetch(proxy, b"", absolute))
    finally:
        await egress.close()
        server.close()
    return times


def rows(times: dict[str, list[float]]) -> list[Row]:
    """Report rows: the direct download (reference) and the two proxied ones with what they add."""
    direct = statistics.median(times["direct"])
    out = [Row("egress", "1 MiB download, direct on the host", "floor", direct, n=len(times["direct"]))]
    for key, what in (("tunnel", "through the egress proxy, CONNECT tunnel"), ("http", "through the egress proxy, plain HTTP")):
        value = statistics.median(times[key])
        out.append(Row("egress", f"1 MiB download {what}", "ours", value, n=len(times[key]),
                       reference="1 MiB download, direct on the host", note=f"adds {value - direct:.2f} ms"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    times = asyncio.run(measure(args.rounds))
    direct = statistics.median(times["direct"])
    table: list[tuple[str, str, str, str]] = [("direct (d)", "", f"{direct:.2f} ms", "")]
    for key, label in (("tunnel", "CONNECT tunnel (t)"), ("http", "plain HTTP (h)")):
        value = statistics.median(times[key])
        table.append((label, f"{direct:.2f} ms", f"{value:.2f} ms (+{value - direct:.2f})", f"{value / direct:.2f}x"))
    print(f"1 MiB download, p50 of {args.rounds} interleaved rounds")
    print_table(table)


if __name__ == "__main__":
    main()


