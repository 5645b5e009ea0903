"""How the OpenSandbox link reaches its sandbox's kernel (``mode``): a kernel of the sandbox's own
Jupyter server over its websocket (:class:`~.bridge.WebsocketBridge`), or execd's ``/code``
(:class:`~.relay.ExecdRelay`); the first time, or again after the launcher was exec'd while the
sandbox was paused (the same kernel, by its id or its execd context)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..errors import OpenSandboxError
from ..launch.front import ExitStatus, Front
from .bridge import WebsocketBridge
from .execd import ExecdClient
from .jupyter import JupyterServer
from .lifecycle import OpenSandboxClient
from .relay import ExecdRelay
from .settings import OpenSandboxSettings

log = logging.getLogger("kernel_sandbox.launch")

Connection = WebsocketBridge | ExecdRelay


class KernelReach:
    """The connections to one sandbox's kernel, made by the link with ``token`` (the sandbox's
    ``JUPYTER_TOKEN``); ``end`` ends the kernel, ``running`` is set while the sandbox is not
    paused."""

    def __init__(
        self,
        front: Front,
        settings: OpenSandboxSettings,
        token: str,
        end: Callable[[ExitStatus], None],
        running: asyncio.Event,
    ) -> None:
        self.front, self.settings, self.token = front, settings, token
        self.end, self.running = end, running
        self.mode: str | None = None
        """``websocket`` or ``execd`` once connected."""
        self.jupyter: JupyterServer | None = None

    async def connect(
        self, client: OpenSandboxClient, execd: ExecdClient, sandbox_id: str
    ) -> Connection:
        """Connect in the configured mode (``auto``: the websocket when the sandbox's Jupyter
        server answers within ``jupyter_wait`` seconds, else execd) to a new kernel."""
        settings = self.settings
        if settings.mode == "websocket":
            await self._find_jupyter(client, sandbox_id, settings.ready_timeout)
        elif settings.mode == "auto":
            try:
                await asyncio.wait_for(
                    self._find_jupyter(client, sandbox_id, settings.jupyter_wait),
                    settings.jupyter_wait,
                )
            except (OpenSandboxError, asyncio.TimeoutError) as exc:
                reason = str(exc) or f"no answer within jupyter_wait ({settings.jupyter_wait:g} s)"
                log.warning(
                    "the sandbox's Jupyter server (port %d) was not found: %s; using execd's "
                    "/code instead (mode 'execd': no display data, comms, stdin)",
                    settings.jupyter_port,
                    reason,
                )
                self.jupyter = None
        if self.jupyter is not None:
            self.mode = "websocket"
            bridge = WebsocketBridge(self.front, self.jupyter, settings, self.end, self.running)
            await bridge.start()
            return bridge
        self.mode = "execd"
        context_id = await execd.create_context(settings.language, timeout=settings.ready_timeout)
        return ExecdRelay(self.front, execd, context_id, settings, self.end)

    async def connect_again(
        self, client: OpenSandboxClient, execd: ExecdClient, sandbox_id: str, kept: dict[str, Any]
    ) -> Connection:
        """Connect to the kernel ``kept`` names (:meth:`kept`), in the mode it was reached in."""
        self.mode = kept["mode"]
        if self.mode == "websocket":
            await self._find_jupyter(client, sandbox_id, self.settings.ready_timeout)
            assert self.jupyter is not None
            bridge = WebsocketBridge(
                self.front, self.jupyter, self.settings, self.end, self.running
            )
            await bridge.attach(str(kept["kernel_id"]))
            return bridge
        relay = ExecdRelay(self.front, execd, str(kept["context_id"]), self.settings, self.end)
        relay.execution_count = int(kept["count"] or 0)
        return relay

    @staticmethod
    def kept(connection: Connection) -> dict[str, Any]:
        """What :meth:`connect_again` needs to reach the same kernel (JSON)."""
        relay = connection if isinstance(connection, ExecdRelay) else None
        return {
            "mode": "execd" if relay is not None else "websocket",
            "kernel_id": connection.kernel_id if isinstance(connection, WebsocketBridge) else None,
            "context_id": relay.context_id if relay is not None else None,
            "count": relay.execution_count if relay is not None else None,
        }

    async def _find_jupyter(self, client: OpenSandboxClient, sandbox_id: str, wait: float) -> None:
        """Look up the Jupyter port's endpoint and wait for its server (``self.jupyter`` once it
        answers)."""
        settings = self.settings
        endpoint = await client.endpoint(sandbox_id, settings.jupyter_port)
        jupyter = JupyterServer(endpoint.url, self.token, endpoint.headers, limits=client.limits)
        try:
            await jupyter.wait_ready(wait, min(settings.poll_interval, 0.2))
        except BaseException:
            await jupyter.aclose()
            raise
        self.jupyter = jupyter

    async def aclose(self) -> None:
        """Close the Jupyter server's client, if any."""
        if self.jupyter is not None:
            await self.jupyter.aclose()
