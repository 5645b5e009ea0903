"""The OpenSandbox backend's options: one model for the provisioner, the launcher, ``install`` and programs.

:meth:`OpenSandboxSettings.from_config` checks every value before any sandbox exists, as
:class:`~kernel_sandbox.settings.DockerSettings` does for Docker: a wrong type, an out-of-range
value or an unknown name raises :class:`~kernel_sandbox.errors.ConfigError` naming the option.
``api_base`` and ``api_key`` fall back to ``OPEN_SANDBOX_API_BASE`` and ``OPEN_SANDBOX_API_KEY``
when the kernel starts (:meth:`OpenSandboxSettings.resolved`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..egress import opensandbox_rules, parse_network
from ..errors import ConfigError
from ..settings import BackendSettings, _argv, _choice, _env, _flag, _option, _refuse, _seconds, _text
from .client import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_STREAM_BYTES,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_SANDBOX_IMAGE,
    DEFAULT_SANDBOX_TIMEOUT,
    Limits,
    resolve_api_base,
    resolve_api_key,
)

MODES = ("auto", "websocket", "execd")
"""How the launcher reaches the kernel: the sandbox's Jupyter server (``websocket``), execd's
``/code`` (``execd``), or the first when the sandbox serves Jupyter, else the second (``auto``)."""
JUPYTER_PORT = 44771
MIN_TIMEOUT = 60
"""The published server refuses a sandbox ``timeout`` under 60 s."""
_LABEL = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _api_base(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _refuse(name, value, "must be the lifecycle API's URL, e.g. http://localhost:8080/v1, or ''")
    value = value.strip().rstrip("/")
    if value and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
        raise _refuse(name, value, "must be an http:// or https:// URL, e.g. http://localhost:8080/v1")
    return value


def _api_key(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _refuse(name, "***", "must be a string, or null to read $OPEN_SANDBOX_API_KEY")
    return value


def _whole(low: int, high: int) -> Any:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _refuse(name, value, f"must be a whole number from {low} to {high}")
        return value

    return parse


def _strings(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _refuse(name, value, "must be a mapping of strings to strings")
    for key, item in value.items():
        if not isinstance(key, str) or not key or not isinstance(item, str):
            raise _refuse(name, value, f"{key!r}: keys and values must be non-empty strings")
    return dict(value)


def _labels(name: str, value: Any) -> dict[str, str]:
    labels = _strings(name, value)
    for key, item in labels.items():
        if not _LABEL_KEY.fullmatch(key) or key.startswith("opensandbox.io/"):
            raise _refuse(name, value, f"{key!r} is not a label name the server accepts (opensandbox.io/ is reserved)")
        if not _LABEL.fullmatch(item):
            raise _refuse(name, value, f"the value of {key!r} must be a label value: up to 63 of A-Z a-z 0-9 - _ .")
    return labels


def _policy(name: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _refuse(name, value, "must be a networkPolicy object, or null")
    return dict(value)


def _network(name: str, value: Any) -> bool | tuple[str, ...]:
    network = parse_network(name, value)
    if isinstance(network, tuple):
        opensandbox_rules(name, network)
    return network


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _refuse(name, value, "must be a number of seconds")
    if not 0 <= value <= 86400:
        raise _refuse(name, value, "must be from 0 to 86400 seconds")
    return float(value)


@dataclass(frozen=True)
class OpenSandboxSettings(BackendSettings):
    """The settings of one OpenSandbox kernel, checked; build with :meth:`from_config`."""

    title = "the OpenSandbox backend"

    api_base: str = _option("", _api_base, "Lifecycle API base URL, e.g. http://host:8080/v1; '': $OPEN_SANDBOX_API_BASE.")
    api_key: str | None = _option(None, _api_key, "Lifecycle API key; null: $OPEN_SANDBOX_API_KEY; '': no key.")
    image: str = _option(DEFAULT_SANDBOX_IMAGE, _text, "Sandbox image: execd, and a Jupyter server for the websocket mode.")
    entrypoint: tuple[str, ...] = _option(list(DEFAULT_ENTRYPOINT), _argv, "The sandbox's entry process.")
    mode: str = _option(
        "auto", _choice(MODES), "'websocket': the sandbox's Jupyter server; 'execd': execd's /code; 'auto': probe."
    )
    jupyter_port: int = _option(JUPYTER_PORT, _whole(1, 65535), "Port of the sandbox's Jupyter server ($JUPYTER_PORT).")
    jupyter_wait: float = _option(
        30.0, _seconds, "In 'auto' mode: seconds to wait for the Jupyter server before falling back to execd."
    )
    kernel_name: str = _option("python3", _text, "Kernelspec the sandbox's Jupyter server starts (websocket mode).")
    language: str = _option("python", _text, "execd context language (execd mode).")
    timeout: int = _option(
        DEFAULT_SANDBOX_TIMEOUT, _whole(MIN_TIMEOUT, 86400), "Sandbox lifetime in s (>= 60), renewed while the kernel lives."
    )
    renew_interval: float = _option(0.0, _non_negative, "Seconds between renewals; 0: timeout / 3.")
    resource_limits: dict[str, str] = _option(
        dict(DEFAULT_RESOURCE_LIMITS), _strings, "resourceLimits, e.g. {'cpu': '1', 'memory': '2Gi'}."
    )
    resource_requests: dict[str, str] = _option({}, _strings, "resourceRequests (left out when empty).")
    env: dict[str, str] = _option({}, _env, "Environment variables inside the sandbox.")
    metadata: dict[str, str] = _option({}, _labels, "Extra sandbox metadata (labels).")
    network: bool | tuple[str, ...] = _option(
        False, _network,
        "false: deny all egress; true: send no networkPolicy (open egress); or a list of names "
        "(pypi.org, *.domain) sent as networkPolicy allow rules, enforced by the deployment's egress sidecar.",
    )
    allow_internet: bool = _option(False, _flag, "The same as network: true (kept for existing kernelspecs).")
    network_policy: dict[str, Any] | None = _option(
        None, _policy, "A networkPolicy sent as given, for full control (then network must be false)."
    )
    secure_access: bool = _option(False, _flag, "Ask the server to protect the sandbox's endpoints (secureAccess).")
    use_server_proxy: bool = _option(False, _flag, "Reach the sandbox through the lifecycle server's proxy.")
    ready_timeout: float = _option(
        DEFAULT_READY_TIMEOUT, _seconds, "Seconds to wait for Running, each endpoint, execd and the kernel."
    )
    poll_interval: float = _option(DEFAULT_POLL_INTERVAL, _seconds, "Seconds between polls while waiting.")
    request_timeout: float = _option(
        DEFAULT_REQUEST_TIMEOUT, _seconds, "Overall deadline of each HTTP call (connect, send, whole answer)."
    )
    max_output_bytes: int = _option(
        DEFAULT_MAX_STREAM_BYTES, _whole(1024, 2**40), "Byte cap on one execd run's stream and on one kernel message."
    )
    max_response_bytes: int = _option(
        DEFAULT_MAX_RESPONSE_BYTES, _whole(1024, 2**40), "Byte cap on every other answer from the sandbox or server."
    )
    interrupt_grace: float = _option(
        10.0, _non_negative, "Seconds a cell may go on after an interrupt before the relay ends it (execd mode)."
    )
    state_check_interval: float = _option(5.0, _seconds, "Seconds between checks that the sandbox still exists.")

    def __post_init__(self) -> None:
        """``network``, ``allow_internet`` and ``network_policy`` must not say different things."""
        if self.network_policy is not None and (self.network is not False or self.allow_internet):
            raise ConfigError("network_policy and network/allow_internet both set the sandbox's egress: give one")
        if isinstance(self.network, tuple) and self.allow_internet:
            raise ConfigError("network (a list) and allow_internet=true both set the sandbox's egress: give one")

    @property
    def egress(self) -> dict[str, Any]:
        """``allow_internet`` and ``network_policy`` as the lifecycle client's ``create`` takes them."""
        if isinstance(self.network, tuple):
            rules = opensandbox_rules("network", self.network)
            return {"allow_internet": False, "network_policy": {"defaultAction": "deny", "egress": rules}}
        return {"allow_internet": self.allow_internet or self.network is True, "network_policy": self.network_policy}

    def resolved(self) -> OpenSandboxSettings:
        """These settings with ``api_base`` and ``api_key`` taken from the environment where unset.

        Raises :class:`~kernel_sandbox.errors.OpenSandboxConfigError` naming ``OPEN_SANDBOX_API_BASE`` when there is no API base.
        """
        return dataclasses.replace(
            self, api_base=resolve_api_base(self.api_base or None), api_key=resolve_api_key(self.api_key)
        )

    @property
    def limits(self) -> Limits:
        """What one call to the server or the sandbox may cost, as the clients take it."""
        return Limits(
            request_timeout=self.request_timeout,
            max_response_bytes=self.max_response_bytes,
            max_output_bytes=self.max_output_bytes,
        )

    @property
    def renew_every(self) -> float:
        """Seconds between renewals of the sandbox's expiration."""
        return self.renew_interval or self.timeout / 3

    def __repr__(self) -> str:
        shown = {name: value for name, value in dataclasses.asdict(self).items() if name != "api_key"}
        key = "None" if self.api_key is None else "'***'"
        return f"OpenSandboxSettings({', '.join(f'{k}={v!r}' for k, v in shown.items())}, api_key={key})"


OPTIONS: dict[str, dataclasses.Field[Any]] = OpenSandboxSettings.options()
"""Every option of the OpenSandbox backend, by name (:meth:`~kernel_sandbox.settings.BackendSettings.options`)."""

__all__ = ["JUPYTER_PORT", "MODES", "OPTIONS", "OpenSandboxSettings"]
