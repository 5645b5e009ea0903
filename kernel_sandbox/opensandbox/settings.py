"""What the provisioner tells the relay kernel, passed through the relay's environment."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .client import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    ENV_API_BASE,
    ENV_API_KEY,
)

ENV_SANDBOX_ID = "KERNEL_SANDBOX_OPENSANDBOX_ID"
ENV_EXECD_URL = "KERNEL_SANDBOX_EXECD_URL"
ENV_EXECD_HEADERS = "KERNEL_SANDBOX_EXECD_HEADERS"
ENV_CONTEXT_ID = "KERNEL_SANDBOX_EXECD_CONTEXT"
ENV_LANGUAGE = "KERNEL_SANDBOX_LANGUAGE"
ENV_RENEW_SECONDS = "KERNEL_SANDBOX_RENEW_SECONDS"
ENV_RENEW_INTERVAL = "KERNEL_SANDBOX_RENEW_INTERVAL"
ENV_MAX_OUTPUT_BYTES = "KERNEL_SANDBOX_MAX_OUTPUT_BYTES"
ENV_REQUEST_TIMEOUT = "KERNEL_SANDBOX_REQUEST_TIMEOUT"
ENV_MAX_RESPONSE_BYTES = "KERNEL_SANDBOX_MAX_RESPONSE_BYTES"
ENV_INTERRUPT_GRACE = "KERNEL_SANDBOX_INTERRUPT_GRACE"
DEFAULT_INTERRUPT_GRACE = 10.0


@dataclass(frozen=True)
class RelaySettings:
    """Where the relay kernel finds its sandbox, and how it keeps the sandbox alive.

    ``renew_seconds`` > 0 makes the relay push the sandbox's expiration that far ahead every
    ``renew_interval`` seconds (0: a third of ``renew_seconds``) for as long as it runs; when the
    relay (or its parent) dies the renewals stop and the sandbox ends itself. ``interrupt_grace``:
    seconds a cell may go on after an interrupt before the relay ends it with an error itself.
    """

    execd_url: str
    context_id: str
    execd_headers: Mapping[str, str] = field(default_factory=dict)
    language: str = "python"
    sandbox_id: str = ""
    api_base: str = ""
    api_key: str = ""
    renew_seconds: int = 0
    renew_interval: float = 0.0
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    interrupt_grace: float = DEFAULT_INTERRUPT_GRACE

    def to_env(self) -> dict[str, str]:
        """Return the environment variables that carry these settings."""
        return {
            ENV_EXECD_URL: self.execd_url,
            ENV_CONTEXT_ID: self.context_id,
            ENV_EXECD_HEADERS: json.dumps(dict(self.execd_headers)),
            ENV_LANGUAGE: self.language,
            ENV_SANDBOX_ID: self.sandbox_id,
            ENV_API_BASE: self.api_base,
            ENV_API_KEY: self.api_key,
            ENV_RENEW_SECONDS: str(self.renew_seconds),
            ENV_RENEW_INTERVAL: str(self.renew_interval),
            ENV_MAX_OUTPUT_BYTES: str(self.max_output_bytes),
            ENV_REQUEST_TIMEOUT: str(self.request_timeout),
            ENV_MAX_RESPONSE_BYTES: str(self.max_response_bytes),
            ENV_INTERRUPT_GRACE: str(self.interrupt_grace),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RelaySettings:
        """Read the settings written by :meth:`to_env`; a missing execd URL or context raises KeyError."""
        env = os.environ if environ is None else environ
        return cls(
            execd_url=env[ENV_EXECD_URL],
            context_id=env[ENV_CONTEXT_ID],
            execd_headers=json.loads(env.get(ENV_EXECD_HEADERS) or "{}"),
            language=env.get(ENV_LANGUAGE) or "python",
            sandbox_id=env.get(ENV_SANDBOX_ID, ""),
            api_base=env.get(ENV_API_BASE, ""),
            api_key=env.get(ENV_API_KEY, ""),
            renew_seconds=int(env.get(ENV_RENEW_SECONDS) or 0),
            renew_interval=float(env.get(ENV_RENEW_INTERVAL) or 0),
            max_output_bytes=int(env.get(ENV_MAX_OUTPUT_BYTES) or DEFAULT_MAX_OUTPUT_BYTES),
            request_timeout=float(env.get(ENV_REQUEST_TIMEOUT) or DEFAULT_REQUEST_TIMEOUT),
            max_response_bytes=int(env.get(ENV_MAX_RESPONSE_BYTES) or DEFAULT_MAX_RESPONSE_BYTES),
            interrupt_grace=float(env.get(ENV_INTERRUPT_GRACE) or DEFAULT_INTERRUPT_GRACE),
        )
