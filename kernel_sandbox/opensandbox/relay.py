"""The relay kernel: a local Jupyter kernel that runs every cell in an OpenSandbox sandbox.

The provisioner starts it with ``python -m kernel_sandbox.opensandbox.relay -f {connection_file}``
and passes the sandbox's execd endpoint and context in the environment (see
:class:`~kernel_sandbox.opensandbox.settings.RelaySettings`). Output events from execd are
published on IOPub as they arrive; ``interrupt_request`` (control channel, its own thread in
ipykernel 7) interrupts the execd context while the shell channel is still streaming.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from ipykernel.kernelbase import Kernel

from .. import __version__
from ..errors import CallDeadlineExceeded, OpenSandboxError, OutputLimitExceeded
from .client import ExecdClient, OpenSandboxClient, keep_alive
from .settings import RelaySettings
from .translate import STDIN_MESSAGE, CellRelay, CellTranslator

__all__ = ["STDIN_MESSAGE", "RelayKernel", "main"]


class RelayKernel(Kernel):
    """A Jupyter kernel whose code runs in an OpenSandbox execd context."""

    implementation = "kernel-sandbox-opensandbox"
    implementation_version = __version__
    banner = "Python in an OpenSandbox sandbox (kernel-sandbox relay)"
    language_info: dict[str, object] = {  # noqa: RUF012 (ipykernel declares it so)
        "name": "python",
        "mimetype": "text/x-python",
        "file_extension": ".py",
        "pygments_lexer": "ipython3",
        "codemirror_mode": {"name": "ipython", "version": 3},
        "nbconvert_exporter": "python",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.relay_settings = RelaySettings.from_env()
        self._execd = self._execd_client()
        self._cell: CellRelay | None = None
        self._renewal: asyncio.Task[None] | None = None

    def _execd_client(self, http: httpx.AsyncClient | None = None) -> ExecdClient:
        settings = self.relay_settings
        return ExecdClient(
            settings.execd_url,
            settings.execd_headers,
            http=http,
            request_timeout=settings.request_timeout,
            max_output_bytes=settings.max_output_bytes,
            max_response_bytes=settings.max_response_bytes,
        )

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The base kernel info without subshells or the debugger: the relay offers neither."""
        return {**super().kernel_info, "supported_features": []}

    async def create_subshell_request(self, socket: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Refuse subshells: one execd context runs one cell at a time."""
        if self.session is not None:
            error = {"ename": "NotImplementedError", "evalue": "subshells are not supported by this sandbox"}
            reply = {"status": "error", **error, "traceback": []}
            self.session.send(socket, "create_subshell_reply", reply, parent, ident)

    def start(self) -> None:
        """Start the kernel and, when configured, the loop that renews the sandbox's expiration."""
        super().start()
        settings = self.relay_settings
        if settings.renew_seconds > 0 and settings.sandbox_id and settings.api_base:
            self.io_loop.add_callback(self._start_renewal)

    def _start_renewal(self) -> None:
        self._renewal = asyncio.ensure_future(self._renew_forever())

    async def _renew_forever(self) -> None:
        settings = self.relay_settings
        async with OpenSandboxClient(settings.api_base, settings.api_key) as client:
            await keep_alive(
                client,
                settings.sandbox_id,
                settings.renew_seconds,
                interval=settings.renew_interval or None,
                on_lost=self._sandbox_lost,
            )

    def _sandbox_lost(self, reason: str) -> None:
        self.log.error("%s; this kernel cannot run code any more: restart it", reason)

    def _publish(self, msg_type: str, content: dict[str, Any]) -> None:
        self.send_response(self.iopub_socket, msg_type, content)

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        """Run ``code`` in the sandbox, relaying its output as it arrives; always one reply."""
        translator = CellTranslator(self._publish, execution_count=self.execution_count, silent=silent)
        if not code.strip():
            return translator.reply()
        settings = self.relay_settings
        self._cell = cell = CellRelay(translator)
        try:
            reply = await cell.run(self._execd.stream(code, context_id=settings.context_id, language=settings.language))
        finally:
            self._cell = None
        if isinstance(translator.failure, (OutputLimitExceeded, CallDeadlineExceeded)):
            await self._interrupt_quietly()
        return reply

    async def _interrupt_quietly(self) -> None:
        try:
            await self._execd.interrupt(self.relay_settings.context_id)
        except (httpx.HTTPError, OpenSandboxError) as exc:
            self.log.warning("interrupting execd context %s failed: %s", self.relay_settings.context_id, exc)

    async def do_is_complete(self, code: str) -> dict[str, Any]:
        """Judge completeness locally with IPython's input transformer."""
        from IPython.core.inputtransformer2 import TransformerManager

        status, indent = TransformerManager().check_complete(code)
        reply: dict[str, Any] = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        return reply

    async def interrupt_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Interrupt the execd context (runs on the control thread, while execute streams)."""
        content: dict[str, Any] = {"status": "ok"}
        cell = self._cell
        if cell is not None:
            try:
                async with self._execd_client() as execd:
                    await execd.interrupt(self.relay_settings.context_id)
            except OpenSandboxError as exc:
                content = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
            grace = self.relay_settings.interrupt_grace
            cell.abort_later(
                grace,
                OpenSandboxError(
                    f"execd did not end the cell within {grace:g} s of the interrupt; the relay stopped waiting"
                ),
            )
        if self.session is not None:
            self.session.send(stream, "interrupt_reply", content, parent, ident=ident)

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Stop renewing the sandbox's expiration; the provisioner removes the sandbox or context."""
        if self._renewal is not None:
            self.io_loop.add_callback(self._renewal.cancel)
        return {"status": "ok", "restart": restart}


def main() -> None:
    """Launch the relay kernel (``python -m kernel_sandbox.opensandbox.relay -f FILE``)."""
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=RelayKernel)


if __name__ == "__main__":
    main()
