"""The OpenSandbox backend's options: one model for the provisioner, the launcher, ``install`` and
programs.

:meth:`OpenSandboxSettings.from_config` checks every value before any sandbox exists, as
:class:`~kernel_sandbox.docker.settings.DockerSettings` does for Docker: a wrong type, an
out-of-range value or an unknown name raises :class:`~kernel_sandbox.errors.ConfigError` naming the
option. ``api_base`` and ``api_key`` fall back to ``OPEN_SANDBOX_API_BASE`` and
``OPEN_SANDBOX_API_KEY`` when the kernel starts (:meth:`OpenSandboxSettings.resolved`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..egress import PYPI, opensandbox_rules, parse_network
from ..errors import ConfigError
from ..settings import BackendSettings
from ..parsers import (
    UNLIMITED,
    option,
    parse_argv,
    parse_choice,
    parse_env,
    parse_flag,
    parse_orphan_seconds,
    parse_seconds,
    parse_text,
    refuse,
)
from .lifecycle import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_SANDBOX_IMAGE,
    DEFAULT_SANDBOX_TIMEOUT,
    resolve_api_base,
    resolve_api_key,
)
from .http import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_STREAM_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    Limits,
)

MODES = ("auto", "websocket", "execd")
SUSPEND_BY = ("auto", "pause", "checkpoint")
"""How the launcher reaches the kernel: the sandbox's Jupyter server (``websocket``), execd's
``/code`` (``execd``), or the first when the sandbox serves Jupyter, else the second (``auto``)."""
JUPYTER_PORT = 44771
MIN_TIMEOUT = 60
"""The published server refuses a sandbox ``timeout`` under 60 s."""
_LABEL = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def _api_base(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise refuse(
            name, value, "must be the lifecycle API's URL, e.g. http://localhost:8080/v1, or ''"
        )
    value = value.strip().rstrip("/")
    if value and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
        raise refuse(
            name, value, "must be an http:// or https:// URL, e.g. http://localhost:8080/v1"
        )
    return value


def _api_key(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise refuse(name, "***", "must be a string, or null to read $OPEN_SANDBOX_API_KEY")
    return value


def _whole(low: int, high: int) -> Any:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise refuse(name, value, f"must be a whole number from {low} to {high}")
        return value

    return parse


def _strings(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise refuse(name, value, "must be a mapping of strings to strings")
    for key, item in value.items():
        if not isinstance(key, str) or not key or not isinstance(item, str):
            raise refuse(name, value, f"{key!r}: keys and values must be non-empty strings")
    return dict(value)


def _labels(name: str, value: Any) -> dict[str, str]:
    labels = _strings(name, value)
    for key, item in labels.items():
        if not _LABEL_KEY.fullmatch(key) or key.startswith("opensandbox.io/"):
            raise refuse(
                name,
                value,
                f"{key!r} is not a label name the server accepts (opensandbox.io/ is reserved)",
            )
        if not _LABEL.fullmatch(item):
            raise refuse(
                name,
                value,
                f"the value of {key!r} must be a label value: up to 63 of A-Z a-z 0-9 - _ .",
            )
    return labels


def _policy(name: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise refuse(name, value, "must be a networkPolicy object, or null")
    return dict(value)


def _index(name: str, value: Any) -> tuple[str, ...]:
    entries = [value] if isinstance(value, str) else value
    if not isinstance(entries, (list, tuple)) or not entries:
        raise refuse(
            name, value, "must be a list of names such as ['pypi.org', 'files.pythonhosted.org']"
        )
    opensandbox_rules(name, entries)
    return tuple(entry.strip() for entry in entries)


def _network(name: str, value: Any) -> bool | tuple[str, ...]:
    network = parse_network(name, value)
    if isinstance(network, tuple):
        opensandbox_rules(name, network)
    return network


_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei)?")
_VOLUME_KEYS = {"name", "host", "pvc", "ossfs", "mountPath", "readOnly", "subPath"}
_BACKEND_KEYS = {
    "host": {"path": True},
    "pvc": {
        "claimName": True,
        "createIfNotExists": False,
        "deleteOnSandboxTermination": False,
        "storageClass": False,
        "storage": False,
        "accessModes": False,
    },
    "ossfs": {
        "bucket": True,
        "endpoint": True,
        "version": False,
        "options": False,
        "accessKeyId": True,
        "accessKeySecret": True,
    },
}
"""Each volume backend's fields as server 1.1.1's schema has them (True: required)."""
SECRET_FIELDS = frozenset({"accessKeySecret"})
EXTENSION_RENEW = "access.renew.extend.seconds"
EXTENSION_ISOLATION = "bootstrap.execd.isolation"
EXTENSION_POOL = "poolRef"


def _masked(volume: Mapping[str, Any]) -> dict[str, Any]:
    """A volume with its secrets (ossfs keys) shown as ``***``."""
    return {
        key: {k: "***" if k in SECRET_FIELDS else v for k, v in item.items()}
        if isinstance(item, Mapping)
        else item
        for key, item in volume.items()
    }


def _no_dots(path: str) -> bool:
    return ".." not in path.replace("\\", "/").split("/")


def _volume_field(where: str, key: str, item: Any, volumes: Any) -> None:
    """Check one field of a volume backend against the server's schema."""
    if key in ("createIfNotExists", "deleteOnSandboxTermination"):
        if not isinstance(item, bool):
            raise refuse(where, volumes, f"{key} must be true or false")
    elif key in ("options", "accessModes"):
        if not isinstance(item, list) or not all(
            isinstance(entry, str) and entry for entry in item
        ):
            raise refuse(where, volumes, f"{key} must be a list of non-empty strings")
    elif not isinstance(item, str) or not item.strip():
        raise refuse(where, volumes, f"{key} must be a non-empty string")
    elif key == "path" and not (item.startswith("/") and _no_dots(item)):
        raise refuse(where, volumes, "host.path must be an absolute host path without '..'")
    elif key == "claimName" and not (_NAME.fullmatch(item) and len(item) <= 253):
        raise refuse(
            where, volumes, "pvc.claimName must be a lowercase name: a-z 0-9 and '-', at most 253"
        )
    elif key == "storage" and not _QUANTITY.fullmatch(item):
        raise refuse(where, volumes, "pvc.storage must be a size such as 1Gi or 10Gi")
    elif key == "version" and item not in ("1.0", "2.0"):
        raise refuse(where, volumes, "ossfs.version must be '1.0' or '2.0'")
    elif key == "bucket" and not 3 <= len(item) <= 63:
        raise refuse(where, volumes, "ossfs.bucket must have 3 to 63 characters")


def _volumes(name: str, value: Any) -> tuple[dict[str, Any], ...]:  # noqa: C901
    """Storage mounts as server 1.1.1 takes them: a list of ``{name, host|pvc|ossfs, mountPath,
    readOnly?, subPath?}``."""
    if isinstance(value, Mapping) or not isinstance(value, (list, tuple)):
        raise refuse(
            name,
            value,
            "must be a list of volumes, e.g. [{'name': 'data', 'pvc': {'claimName': 'data'}, "
            "'mountPath': '/data'}]",
        )
    seen: set[str] = set()
    checked = []
    for index, volume in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(volume, Mapping):
            raise refuse(
                where, volume, "must be a mapping with name, one of host/pvc/ossfs, and mountPath"
            )
        volume, shown = dict(volume), _masked(volume)
        unknown = sorted(set(volume) - _VOLUME_KEYS, key=str)
        if unknown:
            raise refuse(
                where,
                shown,
                f"has no field {unknown[0]!r}; fields: {', '.join(sorted(_VOLUME_KEYS))}",
            )
        volume_name = volume.get("name")
        if (
            not isinstance(volume_name, str)
            or not _NAME.fullmatch(volume_name)
            or len(volume_name) > 63
        ):
            raise refuse(
                where,
                shown,
                "name must be a lowercase name: a-z 0-9 and '-', at most 63 characters",
            )
        if volume_name in seen:
            raise refuse(where, shown, f"the name {volume_name!r} is used twice")
        seen.add(volume_name)
        backends = [key for key in _BACKEND_KEYS if volume.get(key) is not None]
        if len(backends) != 1:
            raise refuse(where, shown, "must have exactly one of host, pvc, ossfs")
        (backend,) = backends
        fields = volume[backend]
        if not isinstance(fields, Mapping):
            raise refuse(where, shown, f"{backend} must be a mapping")
        allowed = _BACKEND_KEYS[backend]
        for key in sorted(set(fields) - set(allowed), key=str):
            raise refuse(
                where, shown, f"{backend} has no field {key!r}; fields: {', '.join(allowed)}"
            )
        for key, required in allowed.items():
            if key in fields:
                _volume_field(where, key, fields[key], shown)
            elif required:
                raise refuse(where, shown, f"{backend}.{key} is required")
        mount_path = volume.get("mountPath")
        if (
            not isinstance(mount_path, str)
            or not mount_path.startswith("/")
            or not _no_dots(mount_path)
        ):
            raise refuse(
                where, shown, "mountPath must be an absolute path in the sandbox without '..'"
            )
        if not isinstance(volume.get("readOnly", False), bool):
            raise refuse(where, shown, "readOnly must be true or false")
        sub_path = volume.get("subPath")
        if sub_path is not None and (
            not isinstance(sub_path, str) or sub_path.startswith("/") or not _no_dots(sub_path)
        ):
            raise refuse(where, shown, "subPath must be a relative path without '..'")
        checked.append(json.loads(json.dumps(dict(volume))))
    return tuple(checked)


def _extensions(name: str, value: Any) -> dict[str, str]:
    """``extensions`` as the server takes them (strings), with its well-known keys checked."""
    extensions = _strings(name, value)
    renew = extensions.get(EXTENSION_RENEW)
    if renew is not None and not (renew.strip().isdigit() and 300 <= int(renew) <= 86400):
        raise refuse(
            name, value, f"{EXTENSION_RENEW!r} must be a whole number of seconds from 300 to 86400"
        )
    if EXTENSION_ISOLATION in extensions:
        raise refuse(
            name,
            value,
            f"{EXTENSION_ISOLATION!r} is refused: the server then gives the sandbox CAP_SYS_ADMIN, "
            "which kernel-sandbox does not allow for an untrusted kernel",
        )
    pool = extensions.get(EXTENSION_POOL)
    if pool is not None and not (_NAME.fullmatch(pool) and len(pool) <= 253):
        raise refuse(name, value, f"{EXTENSION_POOL!r} must name a Pool: a-z 0-9 and '-'")
    return extensions


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise refuse(name, value, "must be a number of seconds")
    if not 0 <= value <= 86400:
        raise refuse(name, value, "must be from 0 to 86400 seconds")
    return float(value)


@dataclass(frozen=True)
class OpenSandboxSettings(BackendSettings):
    """The settings of one OpenSandbox kernel, checked; build with :meth:`from_config`."""

    title = "the OpenSandbox backend"

    api_base: str = option(
        "",
        _api_base,
        "Lifecycle API base URL, e.g. http://host:8080/v1; '': $OPEN_SANDBOX_API_BASE.",
    )
    api_key: str | None = option(
        None, _api_key, "Lifecycle API key; null: $OPEN_SANDBOX_API_KEY; '': no key."
    )
    image: str = option(
        DEFAULT_SANDBOX_IMAGE,
        parse_text,
        "Sandbox image: execd, and a Jupyter server for the websocket mode.",
    )
    entrypoint: tuple[str, ...] = option(
        list(DEFAULT_ENTRYPOINT), parse_argv, "The sandbox's entry process."
    )
    mode: str = option(
        "auto",
        parse_choice(MODES),
        "'websocket': the sandbox's Jupyter server; 'execd': execd's /code; 'auto': probe.",
    )
    jupyter_port: int = option(
        JUPYTER_PORT, _whole(1, 65535), "Port of the sandbox's Jupyter server ($JUPYTER_PORT)."
    )
    jupyter_wait: float = option(
        30.0,
        parse_seconds,
        "In 'auto' mode: seconds to wait for the Jupyter server before falling back to execd.",
    )
    kernel_name: str = option(
        "python3", parse_text, "Kernelspec the sandbox's Jupyter server starts (websocket mode)."
    )
    language: str = option("python", parse_text, "execd context language (execd mode).")
    timeout: int = option(
        DEFAULT_SANDBOX_TIMEOUT,
        _whole(MIN_TIMEOUT, 86400),
        "Sandbox lifetime in s (>= 60), renewed while the kernel lives.",
    )
    renew_interval: float = option(0.0, _non_negative, "Seconds between renewals; 0: timeout / 3.")
    resource_limits: dict[str, str] = option(
        dict(DEFAULT_RESOURCE_LIMITS),
        _strings,
        "resourceLimits, e.g. {'cpu': '1', 'memory': '2Gi'}.",
    )
    resource_requests: dict[str, str] = option(
        {}, _strings, "resourceRequests (left out when empty)."
    )
    env: dict[str, str] = option({}, parse_env, "Environment variables inside the sandbox.")
    metadata: dict[str, str] = option({}, _labels, "Extra sandbox metadata (labels).")
    network: bool | tuple[str, ...] = option(
        False,
        _network,
        "false: deny all egress; true: send no networkPolicy (open egress); or a list of names "
        "(pypi.org, *.domain) sent as networkPolicy allow rules, enforced by the deployment's "
        "egress sidecar.",
    )
    allow_internet: bool = option(
        False, parse_flag, "The same as network: true (kept for existing kernelspecs)."
    )
    network_policy: dict[str, Any] | None = option(
        None,
        _policy,
        "A networkPolicy sent as given, for full control (then network must be false).",
    )
    package_index: tuple[str, ...] = option(
        PYPI,
        _index,
        "Names install() and run_skill(requirements=) add as allow rules to a network-off "
        "sandbox's policy for the call alone (the runtime /networkpolicy API).",
    )
    secure_access: bool = option(
        False, parse_flag, "Ask the server to protect the sandbox's endpoints (secureAccess)."
    )
    volumes: tuple[dict[str, Any], ...] = option(
        [],
        _volumes,
        "Storage mounts (server schema: name, one of host/pvc/ossfs, mountPath, readOnly, "
        "subPath).",
    )
    extensions: dict[str, str] = option(
        {},
        _extensions,
        "Server extensions, e.g. {'poolRef': 'my-pool'} (Kubernetes pools), renew-on-access.",
    )
    signed_endpoints: float = option(
        0.0,
        _non_negative,
        "Ask for signed endpoints valid this many seconds (Kubernetes ingress gateway); 0: plain. "
        "A server without them is used plainly.",
    )
    use_server_proxy: bool = option(
        False, parse_flag, "Reach the sandbox through the lifecycle server's proxy."
    )
    ready_timeout: float = option(
        DEFAULT_READY_TIMEOUT,
        parse_seconds,
        "Seconds to wait for Running, each endpoint, execd and the kernel.",
    )
    poll_interval: float = option(
        DEFAULT_POLL_INTERVAL, parse_seconds, "Seconds between polls while waiting."
    )
    request_timeout: float = option(
        DEFAULT_REQUEST_TIMEOUT,
        parse_seconds,
        "Overall deadline of each HTTP call (connect, send, whole answer); the create, which "
        "the server answers once the container exists, may take what is left of ready_timeout.",
    )
    max_output_bytes: int = option(
        DEFAULT_MAX_STREAM_BYTES,
        _whole(1024, 2**40),
        "Byte cap on one execd run's stream and on one kernel message.",
    )
    max_response_bytes: int = option(
        DEFAULT_MAX_RESPONSE_BYTES,
        _whole(1024, 2**40),
        "Byte cap on every other answer from the sandbox or server.",
    )
    interrupt_grace: float = option(
        10.0,
        _non_negative,
        "Seconds a cell may go on after an interrupt before the relay ends it (execd mode).",
    )
    state_check_interval: float = option(
        5.0, parse_seconds, "Seconds between checks that the sandbox still exists."
    )
    suspend_after: float | None = option(
        UNLIMITED,
        parse_orphan_seconds,
        "Seconds of idleness (no client request, no running cell) after which the launcher "
        "pauses the sandbox (POST /sandboxes/{id}/pause: its processes and memory are kept) and "
        "resumes it at the next request that needs the kernel (or, where the server cannot pause, "
        "as suspend_by says); 'unlimited': never.",
    )
    suspend_by: str = option(
        "auto",
        parse_choice(SUSPEND_BY),
        "How an idle kernel sleeps (suspend_after): 'pause' the sandbox (the server keeps its "
        "memory); 'checkpoint' its variables on this host and delete the sandbox, as the Docker "
        "backend does (suspend_lossy, max_suspended_bytes apply); 'auto': pause, and checkpoint "
        "where the server says it cannot pause.",
        choices=SUSPEND_BY,
    )

    def __post_init__(self) -> None:
        """``network``, ``allow_internet`` and ``network_policy`` must not say different things; a
        pool needs open egress (and :class:`BackendSettings`'s)."""
        super().__post_init__()
        if EXTENSION_POOL in self.extensions and (
            self.network_policy is not None or not self.egress["allow_internet"]
        ):
            raise refuse(
                "extensions",
                self.extensions,
                "poolRef cannot be combined with a networkPolicy (the server refuses it: a pool's "
                "pods are made in advance). Set allow_internet: true and give the Pool its egress "
                "rules instead",
            )
        if self.network_policy is not None and (self.network is not False or self.allow_internet):
            raise ConfigError(
                "network_policy and network/allow_internet both set the sandbox's egress: give one"
            )
        if isinstance(self.network, tuple) and self.allow_internet:
            raise ConfigError(
                "network (a list) and allow_internet=true both set the sandbox's egress: give one"
            )

    @property
    def egress(self) -> dict[str, Any]:
        """``allow_internet`` and ``network_policy`` as the lifecycle client's ``create`` takes
        them."""
        if isinstance(self.network, tuple):
            rules = opensandbox_rules("network", self.network)
            return {
                "allow_internet": False,
                "network_policy": {"defaultAction": "deny", "egress": rules},
            }
        return {
            "allow_internet": self.allow_internet or self.network is True,
            "network_policy": self.network_policy,
        }

    def resolved(self) -> OpenSandboxSettings:
        """These settings with ``api_base`` and ``api_key`` taken from the environment where unset.

        Raises :class:`~kernel_sandbox.errors.OpenSandboxConfigError` naming
        ``OPEN_SANDBOX_API_BASE`` when there is no API base.
        """
        return dataclasses.replace(
            self,
            api_base=resolve_api_base(self.api_base or None),
            api_key=resolve_api_key(self.api_key),
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
        shown = {
            name: value for name, value in dataclasses.asdict(self).items() if name != "api_key"
        }
        shown["volumes"] = tuple(_masked(volume) for volume in self.volumes)
        key = "None" if self.api_key is None else "'***'"
        return (
            f"OpenSandboxSettings({', '.join(f'{k}={v!r}' for k, v in shown.items())}, "
            f"api_key={key})"
        )


OPTIONS: dict[str, dataclasses.Field[Any]] = OpenSandboxSettings.options()
"""Every option of the OpenSandbox backend, by name
(:meth:`~kernel_sandbox.settings.BackendSettings.options`)."""

__all__ = ["JUPYTER_PORT", "MODES", "OPTIONS", "OpenSandboxSettings"]
