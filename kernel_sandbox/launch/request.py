"""A launch request: the client's connection, the kernel's settings and where they came from.

Its own module, so that the backends' links can name it without importing the launcher's
command line (:mod:`kernel_sandbox.launch`).
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import backends
from ..backends import DOCKER_PROVISIONER, provisioner_settings
from ..errors import ConfigError, KernelLaunchError
from ..privdir import PrivateDir
from ..settings import BackendSettings
from .sockets import Connection

Settings = BackendSettings
"""A backend's settings (each backend's wing has its model)."""

FORWARDED_ENV = ("JPY_SESSION_NAME",)
"""Besides the kernelspec's own ``env``, the one variable of the client's passed into the
container."""


@dataclass
class LaunchRequest:
    """Everything a launch needs: the client's connection, the settings and where they came from."""

    connection: Connection
    settings: Settings
    kernel_id: str
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    client_pid: int = field(default_factory=os.getppid)
    """The process that started the launcher, as it was when the launcher started."""
    private: PrivateDir | None = None
    """The provisioner's private directory (``--config``); None for a client that ran argv, whose
    launcher keeps nothing on disk (its container carries its pid, for ``gc``)."""


def _read_json(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise KernelLaunchError(f"cannot read the {what} {path}: {exc}") from exc


def passed_env(spec_env: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """What of the client's environment the kernel gets: the kernelspec's ``env`` names and
    :data:`FORWARDED_ENV`, never the rest of the host's environment."""
    return {name: environ[name] for name in [*spec_env, *FORWARDED_ENV] if name in environ}


def request_from_kernelspec(
    connection: Connection, connection_file: str, spec_dir: str
) -> LaunchRequest:
    """A launch by a client that ran the kernelspec's argv: the settings are kernel.json's own."""
    spec = _read_json(str(Path(spec_dir) / "kernel.json"), "kernelspec")
    provisioner = spec.get("metadata", {}).get("kernel_provisioner", {})
    settings = settings_from_config(
        provisioner.get("provisioner_name"), provisioner.get("config", {})
    )
    stem = Path(connection_file).stem
    kernel_id = stem[len("kernel-") :] if stem.startswith("kernel-") else uuid.uuid4().hex
    return LaunchRequest(
        connection=connection,
        settings=settings,
        kernel_id=kernel_id,
        env=passed_env(spec.get("env", {}), os.environ),
        cwd=os.getcwd(),
    )


def settings_from_config(provisioner_name: Any, config: Any) -> Settings:
    """The checked settings of ``provisioner_name``'s kernel (OpenSandbox's with the API base
    resolved)."""
    return provisioner_settings(provisioner_name, config).resolved()


def request_from_config(connection: Connection, config_file: str) -> LaunchRequest:
    """A launch by the provisioner: settings, kernel id, environment and cwd from its 0600 file."""
    private = PrivateDir(Path(config_file).resolve().parent)
    config = _read_json(config_file, "launcher config")
    if not isinstance(config, dict) or not isinstance(config.get("settings"), dict):
        raise ConfigError(f"{config_file} holds no 'settings' mapping")
    return LaunchRequest(
        connection=connection,
        settings=settings_from_config(
            config.get("provisioner", DOCKER_PROVISIONER), config["settings"]
        ),
        kernel_id=str(config.get("kernel_id") or uuid.uuid4().hex),
        env=dict(config.get("env") or {}),
        cwd=config.get("cwd"),
        private=private,
    )


def request_state(request: LaunchRequest) -> dict[str, Any]:
    """``request`` as JSON, for the launcher exec'd again (:mod:`.dormant`): what it was started
    with, not what the files say by then."""
    return {
        "connection": request.connection.info(),
        "provisioner": backends.for_settings(request.settings).provisioner,
        "settings": request.settings.to_config(),
        "kernel_id": request.kernel_id,
        "env": request.env,
        "cwd": request.cwd,
        "client_pid": request.client_pid,
        "private": None if request.private is None else str(request.private.path),
    }


def request_from_state(state: dict[str, Any]) -> LaunchRequest:
    """The request :func:`request_state` wrote."""
    return LaunchRequest(
        connection=Connection.from_info(state["connection"]),
        settings=settings_from_config(state["provisioner"], state["settings"]),
        kernel_id=state["kernel_id"],
        env=state["env"],
        cwd=state["cwd"],
        client_pid=state["client_pid"],
        private=None if state["private"] is None else PrivateDir(Path(state["private"])),
    )


def read_request(args: argparse.Namespace) -> LaunchRequest:
    """Build the launch request from the command line (first thing: the client is the parent
    now)."""
    connection = Connection.from_info(_read_json(args.connection_file, "connection file"))
    if args.config:
        return request_from_config(connection, args.config)
    if args.kernelspec:
        return request_from_kernelspec(connection, args.connection_file, args.kernelspec)
    raise KernelLaunchError("the launcher needs --kernelspec DIR or --config FILE")
