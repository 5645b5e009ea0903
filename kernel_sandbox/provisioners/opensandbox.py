"""Kernel provisioner that runs kernels in OpenSandbox sandboxes through a local relay kernel.

The relay is an ordinary local kernel process (launched like :class:`LocalProvisioner` launches
any kernel) that forwards every request to the sandbox's execd. This provisioner creates the
sandbox and an execd context before the relay starts, hands both to the relay through its
environment, follows the sandbox's state in :meth:`poll`, and deletes the sandbox at shutdown,
at cleanup and after a failed launch.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Dict, Float, Integer, List, Unicode

from ..errors import OpenSandboxError, SandboxNotFound
from ..opensandbox.client import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_IMAGE,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_TIMEOUT,
    TERMINAL_STATES,
    Endpoint,
    ExecdClient,
    OpenSandboxClient,
    resolve_api_base,
    resolve_api_key,
    sandbox_state,
)
from ..opensandbox.settings import DEFAULT_INTERRUPT_GRACE, RelaySettings

SANDBOX_GONE_EXIT_CODE = 1


class OpenSandboxProvisioner(LocalProvisioner):  # type: ignore[misc]
    """Start a relay kernel locally whose code runs in a fresh OpenSandbox sandbox.

    Every option can be set in the kernelspec's ``metadata.kernel_provisioner.config`` or as
    traitlets configuration (``c.OpenSandboxProvisioner.image = ...``); ``api_base`` and
    ``api_key`` fall back to ``OPEN_SANDBOX_API_BASE`` and ``OPEN_SANDBOX_API_KEY``.
    """

    api_base = Unicode(
        "", config=True, help="Lifecycle API base URL, e.g. http://host:8080/v1 (env OPEN_SANDBOX_API_BASE)."
    )
    api_key = Unicode(
        None,
        allow_none=True,
        config=True,
        help="Lifecycle API key (env OPEN_SANDBOX_API_KEY); empty sends no key header.",
    )
    image = Unicode(
        DEFAULT_IMAGE, config=True, help="Sandbox image; it must run execd and a Jupyter server (code-interpreter)."
    )
    entrypoint = List(Unicode(), default_value=list(DEFAULT_ENTRYPOINT), config=True, help="Sandbox entry process.")
    timeout = Integer(
        DEFAULT_TIMEOUT,
        min=60,
        config=True,
        help="Sandbox lifetime in seconds; the relay renews it while alive, so an orphaned sandbox ends itself.",
    )
    renew_interval = Float(
        0.0, min=0.0, config=True, help="Seconds between the relay's expiration renewals; 0 means timeout / 3."
    )
    resource_limits = Dict(
        default_value=dict(DEFAULT_RESOURCE_LIMITS),
        config=True,
        help="resourceLimits, e.g. {'cpu': '1', 'memory': '2Gi'}.",
    )
    resource_requests = Dict(default_value={}, config=True, help="resourceRequests (omitted when empty).")
    env = Dict(default_value={}, config=True, help="Environment variables set inside the sandbox.")
    metadata = Dict(
        default_value={}, config=True, help="Extra sandbox metadata (labels); 'kernel-sandbox': 'true' is always added."
    )
    allow_internet = Bool(
        False, config=True, help="Allow outbound network (omits networkPolicy); default deny-all egress."
    )
    network_policy = Dict(
        default_value=None,
        allow_none=True,
        config=True,
        help="A custom networkPolicy, used as given (overrides allow_internet).",
    )
    secure_access = Bool(
        False, config=True, help="Ask the server to protect sandbox endpoints with access tokens (secureAccess)."
    )
    use_server_proxy = Bool(False, config=True, help="Reach execd through the lifecycle server's proxy.")
    ready_timeout = Float(
        DEFAULT_READY_TIMEOUT, config=True, help="Seconds to wait for Running and for the execd endpoint."
    )
    poll_interval = Float(
        DEFAULT_POLL_INTERVAL, config=True, help="Seconds between state/endpoint polls while waiting."
    )
    request_timeout = Float(
        DEFAULT_REQUEST_TIMEOUT, config=True, help="Timeout of single HTTP calls (streams of running code have none)."
    )
    max_output_bytes = Integer(DEFAULT_MAX_OUTPUT_BYTES, config=True, help="Byte cap on one execution's event stream.")
    max_response_bytes = Integer(
        DEFAULT_MAX_RESPONSE_BYTES,
        config=True,
        help="Byte cap on every other answer (lifecycle and execd, errors included).",
    )
    interrupt_grace = Float(
        DEFAULT_INTERRUPT_GRACE,
        min=0.0,
        config=True,
        help="Seconds a cell may go on after an interrupt before the relay ends it with an error itself.",
    )
    state_check_interval = Float(5.0, config=True, help="Minimum seconds between sandbox state checks in poll().")
    fresh_sandbox_on_restart = Bool(
        False, config=True, help="Restart into a new sandbox instead of a new context in the same sandbox."
    )
    language = Unicode("python", config=True, help="execd context language.")

    sandbox_id: str | None = None
    endpoint: Endpoint | None = None
    context_id: str | None = None
    _sandbox_gone = False
    _last_state_check = 0.0

    def _client(self) -> OpenSandboxClient:
        return OpenSandboxClient(
            self.api_base or None,
            self.api_key,
            use_server_proxy=self.use_server_proxy,
            poll_interval=self.poll_interval,
            ready_timeout=self.ready_timeout,
            request_timeout=self.request_timeout,
            max_output_bytes=self.max_output_bytes,
            max_response_bytes=self.max_response_bytes,
        )

    def _execd(self) -> ExecdClient:
        assert self.endpoint is not None
        return ExecdClient(
            self.endpoint.url,
            self.endpoint.headers,
            request_timeout=self.request_timeout,
            max_response_bytes=self.max_response_bytes,
        )

    async def _create_sandbox(self) -> None:
        metadata = {**self.metadata}
        if self.kernel_id:
            metadata.setdefault("kernel-sandbox-kernel-id", str(self.kernel_id))
        async with self._client() as client:
            sandbox = await client.create(
                image=self.image,
                entrypoint=list(self.entrypoint),
                timeout=self.timeout,
                resource_limits=self.resource_limits,
                resource_requests=self.resource_requests,
                env=self.env,
                metadata=metadata,
                allow_internet=self.allow_internet,
                network_policy=self.network_policy,
                secure_access=self.secure_access,
            )
        self.sandbox_id, self.endpoint = sandbox.id, sandbox.endpoint
        self._sandbox_gone = False
        self._last_state_check = time.monotonic()
        self.log.info("OpenSandbox sandbox %s is running (kernel %s)", sandbox.id, self.kernel_id)

    async def _sandbox_running(self) -> bool:
        if self.sandbox_id is None or self._sandbox_gone:
            return False
        async with self._client() as client:
            try:
                return sandbox_state(await client.get(self.sandbox_id)) == "Running"
            except SandboxNotFound:
                return False

    async def _delete_sandbox(self) -> None:
        sandbox_id, self.sandbox_id, self.endpoint, self.context_id = self.sandbox_id, None, None, None
        if sandbox_id is None:
            return
        async with self._client() as client:
            try:
                await client.delete(sandbox_id)
            except OpenSandboxError as exc:
                self.log.warning("deleting OpenSandbox sandbox %s failed: %s", sandbox_id, exc)

    async def _delete_context(self) -> None:
        context_id, self.context_id = self.context_id, None
        if context_id is None or self.endpoint is None:
            return
        async with self._execd() as execd:
            try:
                await execd.delete_context(context_id)
            except OpenSandboxError as exc:
                self.log.warning("deleting execd context %s failed: %s", context_id, exc)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Create (or reuse, on restart) the sandbox, create a fresh context and pass both to the relay."""
        resolve_api_base(self.api_base or None)
        kwargs = await super().pre_launch(**kwargs)
        kwargs["cmd"] = [sys.executable, "-m", "kernel_sandbox.opensandbox.relay", "-f", self.parent.connection_file]
        try:
            if not await self._sandbox_running():
                await self._delete_sandbox()
                await self._create_sandbox()
            async with self._execd() as execd:
                self.context_id = await execd.create_context(self.language)
        except BaseException:
            await asyncio.shield(self._delete_sandbox())
            raise
        assert self.endpoint is not None and self.sandbox_id is not None
        settings = RelaySettings(
            execd_url=self.endpoint.url,
            execd_headers=self.endpoint.headers,
            context_id=self.context_id,
            language=self.language,
            sandbox_id=self.sandbox_id,
            api_base=resolve_api_base(self.api_base or None),
            api_key=resolve_api_key(self.api_key),
            renew_seconds=self.timeout,
            renew_interval=self.renew_interval,
            max_output_bytes=self.max_output_bytes,
            request_timeout=self.request_timeout,
            max_response_bytes=self.max_response_bytes,
            interrupt_grace=self.interrupt_grace,
        )
        kwargs["env"] = {**kwargs.get("env", {}), **settings.to_env()}
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the relay process; delete the sandbox when that fails."""
        try:
            return await super().launch_kernel(cmd, **kwargs)
        except BaseException:
            await asyncio.shield(self._delete_sandbox())
            raise

    async def poll(self) -> int | None:
        """None while the relay runs and its sandbox is usable; an exit code otherwise.

        The sandbox is checked at most every ``state_check_interval`` seconds. When it is gone
        or in a terminal state the relay is killed, so the kernel restarter can start a fresh one.
        """
        ret = await super().poll()
        if ret is not None or self.sandbox_id is None:
            return ret
        if not self._sandbox_gone and time.monotonic() - self._last_state_check >= self.state_check_interval:
            self._last_state_check = time.monotonic()
            self._sandbox_gone = await self._sandbox_is_gone()
        if not self._sandbox_gone:
            return None
        await self.kill()
        return SANDBOX_GONE_EXIT_CODE

    async def _sandbox_is_gone(self) -> bool:
        assert self.sandbox_id is not None
        async with self._client() as client:
            try:
                state = sandbox_state(await client.get(self.sandbox_id))
            except SandboxNotFound:
                self.log.warning(
                    "OpenSandbox sandbox %s is gone (404: expired or deleted); its kernel is dead", self.sandbox_id
                )
                return True
            except OpenSandboxError as exc:
                self.log.warning("checking OpenSandbox sandbox %s failed: %s", self.sandbox_id, exc)
                return False
        if state in TERMINAL_STATES:
            self.log.warning("OpenSandbox sandbox %s is %s; its kernel is dead", self.sandbox_id, state)
            return True
        return False

    async def send_signal(self, signum: int) -> None:
        """SIGINT interrupts the execd context; other signals go to the relay process."""
        if signum == signal.SIGINT and self.endpoint is not None and self.context_id is not None:
            async with self._execd() as execd:
                await execd.interrupt(self.context_id)
            return
        await super().send_signal(signum)

    async def cleanup(self, restart: bool = False) -> None:
        """On restart drop only the context (unless a fresh sandbox is wanted); otherwise delete the sandbox."""
        await super().cleanup(restart=restart)
        if restart and not self.fresh_sandbox_on_restart and not self._sandbox_gone:
            await self._delete_context()
            return
        await self._delete_sandbox()

    async def get_provisioner_info(self) -> dict[str, Any]:
        """Add the sandbox id, execd endpoint and context to the persisted information."""
        info = await super().get_provisioner_info()
        info.update(
            sandbox_id=self.sandbox_id,
            context_id=self.context_id,
            execd_url=self.endpoint.url if self.endpoint else None,
            execd_headers=dict(self.endpoint.headers) if self.endpoint else None,
        )
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Restore what :meth:`get_provisioner_info` saved."""
        await super().load_provisioner_info(provisioner_info)
        self.sandbox_id = provisioner_info.get("sandbox_id")
        self.context_id = provisioner_info.get("context_id")
        url = provisioner_info.get("execd_url")
        self.endpoint = Endpoint(url, provisioner_info.get("execd_headers") or {}) if url else None
