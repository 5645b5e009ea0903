"""Calling a tool (a function) in a session's kernel: its payload, its agent state kept between
calls, its secrets bound for the call alone, and its data-only result."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from ..hostsecrets import Secret, secret_values, unsupported
from ..errors import ConfigError, FramingError, SandboxError
from ..kernelside.toolhost import STATE_NOT_KEPT
from ..results import ToolResult
from .instances import allowed_map
from .exchange import REPLY_GRACE
from .tools import body_error, check_env, tool_payload
from .session import MAX_WINDOW, SandboxSession

KEEP_STATE_BYTES = 64 * 1024


class ToolCalls(SandboxSession):
    """``run_tool``: one tool call in the kernel."""

    async def run_tool(
        self,
        tool: Callable[..., Any] | str,
        args: Mapping[str, Any] | None = None,
        agent_state: Any = None,
        name: str | None = None,
        *,
        timeout: float | None = None,
        allowed_classes: Iterable[type] = (),
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, Secret] | None = None,
    ) -> ToolResult:
        """Call ``tool`` (a function, or its source with ``name``) in the kernel with ``args``.

        A tool with an ``agent_state`` parameter receives ``agent_state`` and its changes come back.
        What comes back is data only (see :mod:`.decode`): instances are rebuilt for the
        ``allowed_classes`` (and the sandbox's), anything else raises :class:`UnsafePayloadError`.
        ``env`` sets environment variables for this call only; ``secrets`` (Docker) binds
        :class:`Secret` values for this call only: the tool sees placeholders, the egress proxy
        fills them in toward the secrets' hosts until the call ends. ``status`` is ``"success"``
        only if the tool returned, exactly one answer came, and the host saw the call end in time
        (an answer followed by a timeout, a death or a failed cell is an error).
        """
        values = check_env(env)
        if secrets:
            secret_values(secrets, values)
            if self.backend != "docker":
                raise unsupported(f"the {self.backend!r} backend")
            if self.network is True:
                raise ConfigError(
                    "run_tool: secrets need the filtering proxy, which network=True bypasses: "
                    "give the sandbox's network a list of destinations (or False: a call's "
                    "secrets' hosts are allowed for the call anyway)"
                )
        allowed = {**self._allowed, **allowed_map(allowed_classes)}
        seconds, deadline = self._deadline(timeout)
        async with self._call_secrets(secrets or {}, seconds) as placeholders:
            call, state = tool_payload(tool, args, agent_state, name, {**values, **placeholders})
            return await self._call_tool(call, state, agent_state, allowed, seconds, deadline)

    @contextlib.asynccontextmanager
    async def _call_secrets(
        self, secrets: Mapping[str, Secret], seconds: float
    ) -> AsyncIterator[dict[str, str]]:
        """Bind ``secrets`` in the launcher's proxy for one call (at most ``seconds`` and a grace),
        yielding the call's variables; unbound after it, also on error, timeout or cancel."""
        if not secrets:
            yield {}
            return
        window = min(seconds + REPLY_GRACE, MAX_WINDOW)
        bind = [secret.for_call(name) for name, secret in secrets.items()]
        reply = await self._launcher_request({"bind": bind, "seconds": window})
        if reply.get("status") != "ok":
            raise SandboxError(
                "run_tool: the launcher did not bind the call's secrets "
                f"({reply.get('evalue', 'no answer')}); the tool was not called"
            )
        try:
            yield dict(reply["env"])
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._launcher_request({"close": reply["window"]}))

    async def _call_tool(
        self,
        call: bytes,
        state: bytes,
        agent_state: Any,
        allowed: dict[str, type],
        seconds: float,
        deadline: float,
    ) -> ToolResult:
        keep = len(state) >= KEEP_STATE_BYTES
        digest = hashlib.sha256(state).hexdigest() if keep else None
        assert self._lock is not None
        async with self._lock:
            for _ in range(2):
                send_state = not keep or digest != self._kept_state
                request = {
                    "op": "call",
                    "length": len(call),
                    "pickle": self.unsafe_pickle,
                    "state": {"length": len(state), "digest": digest, "keep": keep},
                }
                body, execution = await self._request(
                    request,
                    [call, state] if send_state else [call],
                    seconds,
                    deadline,
                    limits=self.decode_limits,
                    allowed=allowed,
                    allow_pickle=self.unsafe_pickle,
                )
                if not send_state and isinstance(body, dict) and body.get(STATE_NOT_KEPT) is True:
                    self._kept_state = None
                    continue
                self._kept_state = (
                    digest if keep and body is not None and not execution.state_lost else None
                )
                break
        result = ToolResult(
            "error",
            stdout=execution.stdout,
            stderr=execution.stderr,
            state_lost=execution.state_lost,
            truncated_bytes=execution.truncated_bytes,
        )
        if body is None:
            result.error = execution.error
            return result
        if not isinstance(body, dict) or not ("r" in body or "error" in body):
            raise FramingError("The tool call's answer holds neither a return value nor an error.")
        result.error = body_error(body)
        if execution.error is None:
            await self._name_limits(result.error)
        if result.error is None:
            result.status = "success"
            result.func_return = body["r"]
            result.agent_state = body.get("s", agent_state)
        return result
