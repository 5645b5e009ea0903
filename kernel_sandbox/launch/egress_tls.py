"""The egress proxy's TLS interception of a CONNECT to a host a secret is bound to: the kernel's
TLS answered as that host (with the kernel's CA) while the real host is verified, then HTTP
relayed with the secrets filled in (:func:`.intercept.relay_http`)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from .egress_grammar import HEAD_LIMIT, Refusal, Request
from .intercept import Fill, SecretTable, refuse_request, relay_http
from .tls_stream import TlsStream

Streams = tuple[
    asyncio.StreamReader, asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamWriter
]
"""The kernel's connection (reader, writer), and the one opened to the host (reader, writer)."""


async def intercept(
    request: Request,
    table: SecretTable,
    streams: Streams,
    context: ssl.SSLContext,
    touch: Callable[[], None],
    refused: Callable[[str, str], None],
    fill: Fill,
) -> None:
    """Answer the kernel's TLS as ``request``'s host while the real host is verified with
    ``context`` (at once, not in turn), then relay HTTP with the secrets ``fill`` fills in; a host
    that did not verify gets nothing, and the kernel's request is refused naming it (reported to
    ``refused``). ``touch`` marks the connection busy."""
    reader, writer, upstream_reader, upstream = streams
    host, port = request.host, request.port
    outbound = TlsStream(
        upstream_reader,
        upstream,
        context,
        server_side=False,
        server_hostname=host,
        touch=touch,
        direct=True,  # nothing has read the host's socket yet: the TLS client speaks first
    )
    verified = asyncio.ensure_future(outbound.handshake())
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    inbound = TlsStream(
        reader, writer, table.ca.server_context(host), server_side=True, touch=touch
    )
    try:
        await inbound.handshake()
    except (ssl.SSLError, OSError, asyncio.TimeoutError):
        verified.cancel()
        return
    try:
        await verified
    except (ssl.SSLError, OSError, asyncio.TimeoutError) as exc:
        why = getattr(exc, "verify_message", None) or type(exc).__name__
        refusal = Refusal(
            502,
            f"kernel-sandbox refused {host}:{port}: its TLS certificate did not verify on the "
            f"host ({why}); nothing was sent to it",
            f"{host}:{port}",
        )
        refused(refusal.name, refusal.reason)
        await refuse_request(inbound, refusal.status, refusal.reason, HEAD_LIMIT)
    else:
        await relay_http(fill, host, port, inbound, outbound, HEAD_LIMIT, refused)
    await inbound.sent()
