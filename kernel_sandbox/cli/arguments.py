"""What several commands share: the options that shape a sandbox, and a command's help text."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..egress import PYPI, package_index
from ..errors import ConfigError


def _config_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def install_config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name in ("image", "memory", "cpus", "pids_limit", "mount_cwd"):
        if getattr(args, name) is not None:
            config[name] = getattr(args, name)
    if args.network is not None:
        config["network"] = args.network
    if args.mount:
        config["mounts"] = args.mount
    if args.env:
        config["env"] = dict(item.split("=", 1) for item in args.env)
    if args.secret:
        config["secrets"] = args.secret
    for item in args.set:
        key, _, value = item.partition("=")
        config[key] = _config_value(value)
    allowed = list(args.allow)
    if args.allow_package_index:
        allowed += [
            str(d)
            for d in package_index("package_index", config.get("package_index", PYPI)).destinations
        ]
    if allowed:
        if args.network is not None:
            raise ConfigError(
                "--network/--no-network and --allow/--allow-package-index both set the network: "
                "give one"
            )
        config["network"] = allowed
    return config


def sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that shape a sandbox (image, limits, network, mounts, environment)."""
    parser.add_argument("--image", help="kernel image")
    parser.add_argument("--memory", help="memory limit, e.g. 1g")
    parser.add_argument("--cpus", type=float, help="CPU limit in cores")
    parser.add_argument("--pids-limit", type=int, help="process limit")
    net = parser.add_mutually_exclusive_group()
    net.add_argument(
        "--network", dest="network", action="store_true", default=None, help="turn networking on"
    )
    net.add_argument(
        "--no-network", dest="network", action="store_false", help="keep networking off"
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="HOST",
        help="let the kernel reach HOST[:PORT][@ADDRESSES] (or *.domain) through the launcher's "
        "filtering proxy; repeatable",
    )
    parser.add_argument(
        "--allow-package-index",
        action="store_true",
        help="let the kernel reach the package index (package_index: PyPI by default), e.g. for "
        "%%pip install",
    )
    parser.add_argument(
        "--mount", action="append", default=[], help="bind mount HOST:CONTAINER[:ro|rw]"
    )
    parser.add_argument(
        "--mount-cwd", choices=["off", "ro", "rw"], help="mount the notebook's folder"
    )
    parser.add_argument(
        "--env", action="append", default=[], help="environment variable NAME=VALUE"
    )
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME@HOST",
        help="NAME[=FILE]@HOST[,HOST...]: the kernel's NAME holds a placeholder that the egress "
        "proxy replaces, in requests to HOST only, with the value of NAME in the environment of "
        "the process that launches the kernel (the Jupyter server, or this command) or FILE's "
        "content; kernel.json never holds the value; repeatable",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="any provisioner option KEY=VALUE (JSON)"
    )


def doc(command: Callable[[argparse.Namespace], int]) -> str:
    """A command's docstring, the start of its ``--help`` description (empty under ``python
    -OO``)."""
    return command.__doc__ or ""
