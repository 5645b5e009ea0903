"""``kernel-sandbox mcp``: the MCP server whose tools run code in sandboxed kernels."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from ..errors import ConfigError
from ..hostsecrets import Secret, parse_binding
from .arguments import doc, install_config, sandbox_arguments


async def _serve_stdio(server: Any) -> None:
    """Serve on stdin and stdout until stdin ends or SIGTERM comes.

    An MCP client that stops its server closes stdin, sends SIGTERM 2 s later and SIGKILL 2 s after
    that; a service manager starts at SIGTERM. At SIGTERM every kernel's launcher is told to end at
    once (each removes its container and, its owner gone, its directory), then the server ends as
    SIGTERM ends a process: a thread reading an open stdin would otherwise hold it.
    """
    from ..execution.session import stop_launchers

    loop = asyncio.get_running_loop()

    def terminate() -> None:
        stop_launchers()
        loop.remove_signal_handler(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    loop.add_signal_handler(signal.SIGTERM, terminate)
    await server.run_stdio_async()


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve an MCP server whose tools run code in a sandboxed kernel, one per MCP session."""
    try:
        from .. import mcpserver
    except ImportError as exc:
        raise ConfigError(
            f"kernel-sandbox mcp needs the MCP SDK ({exc}): pip install 'kernel-sandbox[mcp]'"
        ) from exc
    options: dict[str, Any] = {"backend": args.backend, **install_config(args)}
    if "secrets" in options:  # the values come from this server's environment, as Secrets
        bindings = [parse_binding("--secret", entry) for entry in options.pop("secrets")]
        options["secrets"] = {
            b.name: Secret(b.value(os.environ), [str(h) for h in b.hosts], query=b.query)
            for b in bindings
        }
    if args.timeout is not None:
        options["timeout"] = args.timeout
    if args.max_output_bytes is not None:
        options["max_output_bytes"] = args.max_output_bytes
    if args.http is None:
        server = mcpserver.build_server(options, pool_size=args.pool_size)
        asyncio.run(_serve_stdio(server))
        return 0
    host, _, port = args.http.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--http takes HOST:PORT (e.g. 127.0.0.1:8765), not {args.http!r}")
    host = host.strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1") and not args.allow_remote:
        raise ConfigError(
            f"--http {args.http} would listen beyond this machine: give --allow-remote as well "
            "(and put TLS in front of it), or use 127.0.0.1"
        )
    token = os.environ.get(mcpserver.TOKEN_ENV) or mcpserver.new_token()
    if mcpserver.TOKEN_ENV not in os.environ:
        print(
            f"kernel-sandbox mcp: bearer token (set {mcpserver.TOKEN_ENV} to choose one): {token}",
            file=sys.stderr,
            flush=True,
        )
    print(f"kernel-sandbox mcp: serving http://{args.http}/mcp", file=sys.stderr, flush=True)
    server = mcpserver.build_server(options, pool_size=args.pool_size)
    asyncio.run(mcpserver.serve_http(server, host, int(port), token, args.allow_host))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this module's commands to ``kernel-sandbox``'s parser."""
    mcp = sub.add_parser(
        "mcp",
        help=cmd_mcp.__doc__,
        description=doc(cmd_mcp)
        + (
            " Speaks MCP on stdin/stdout unless --http is given. Needs the MCP SDK: "
            "pip install 'kernel-sandbox[mcp]'."
        ),
    )
    mcp.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio, behind a bearer "
        "token (the environment's KERNEL_SANDBOX_MCP_TOKEN, else one printed on stderr)",
    )
    mcp.add_argument(
        "--allow-remote",
        action="store_true",
        help="let --http listen on an address other than loopback",
    )
    mcp.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="another Host header (and http:// Origin) --http accepts; repeatable",
    )
    mcp.add_argument(
        "--backend", default="docker", help="docker (the default), opensandbox or local"
    )
    mcp.add_argument(
        "--pool-size", type=int, default=1, help="kernels kept started for new sessions (1)"
    )
    mcp.add_argument(
        "--timeout", type=float, help="seconds any call may take at most (default 300)"
    )
    mcp.add_argument(
        "--max-output-bytes", type=int, help="output one run_code keeps (default 4 MiB)"
    )
    sandbox_arguments(mcp)
    mcp.set_defaults(func=cmd_mcp)
