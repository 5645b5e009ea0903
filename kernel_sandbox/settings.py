"""What every backend's options share: :class:`BackendSettings`, the kernel's paths and mounts.

A backend's model (:class:`~kernel_sandbox.docker.settings.DockerSettings`, OpenSandbox's) checks
every value before any container exists: a wrong type, an out-of-range or empty value, a combination
that cannot hold, or an unknown name raises :class:`~kernel_sandbox.errors.ConfigError` naming the
option. The parsers of option values, and the rules they follow, are :mod:`kernel_sandbox.parsers`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, ClassVar, TypeVar

from .egress import PYPI, parse_package_index
from .errors import ConfigError
from .parsers import (
    UNLIMITED,
    option,
    parse_flag,
    parse_max_memory,
    parse_names,
    parse_orphan_seconds,
    parse_size,
    refuse,
)
from .policy.output import MODES as POLICY_MODES, OutputPolicy

HOME_DIR = "/home/sandbox"
WORK_DIR = "/home/sandbox/work"
PACKAGES_DIR = "/home/sandbox/.packages"
"""Where pip installs in a Docker kernel (``PIP_TARGET``, on ``PYTHONPATH``; the image is
read-only): a tmpfs of its own, the one writable place mounted ``exec``, directly under the home
(a mount point deeper would make its parents the engine's, owned by root)."""


@dataclass(frozen=True)
class Mount:
    """A bind mount as written by the user; the host path is checked when the kernel starts."""

    host: str
    container: str
    mode: str = "ro"

    @property
    def target(self) -> str:
        """The absolute path inside the container (relative ones sit under the work directory)."""
        path = PurePosixPath(self.container or PurePosixPath(self.host).name)
        return str(path if path.is_absolute() else PurePosixPath(WORK_DIR) / path)

    def __str__(self) -> str:
        return f"{self.host}:{self.container}:{self.mode}"


def parse_mount(name: str, spec: Any) -> Mount:
    """Parse ``HOST:CONTAINER[:ro|rw]`` (or a dict with host/container/mode); read-only by
    default."""
    if isinstance(spec, Mount):
        return spec
    if isinstance(spec, Mapping):
        host, target, mode = spec.get("host"), spec.get("container", ""), spec.get("mode", "ro")
    elif isinstance(spec, str):
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise refuse(name, spec, "a mount must look like HOST_PATH:CONTAINER_PATH[:ro|rw]")
        host, target, mode = parts[0], parts[1], parts[2] if len(parts) == 3 else "ro"
    else:
        raise refuse(name, spec, "a mount must be 'HOST:CONTAINER[:ro|rw]' or a dict")
    if (
        not isinstance(host, str)
        or not host
        or not isinstance(target, str)
        or "\0" in host + target
    ):
        raise refuse(name, spec, "a mount needs a host path")
    if mode not in ("ro", "rw"):
        raise refuse(name, spec, f"mode must be 'ro' or 'rw', not {mode!r}")
    return Mount(host, target, mode)


def parse_mounts(name: str, value: Any) -> tuple[Mount, ...]:
    """A list of mounts, each as :func:`parse_mount` reads it."""
    if isinstance(value, (str, Mapping)) or not isinstance(value, (list, tuple)):
        raise refuse(name, value, "must be a list of mounts")
    return tuple(parse_mount(name, spec) for spec in value)


def parse_output_policy(name: str, value: Any) -> str:
    """An output policy mode (:data:`~kernel_sandbox.policy.output.MODES`)."""
    if not isinstance(value, str):
        raise refuse(name, value, f"must be one of {', '.join(POLICY_MODES)}")
    try:
        return OutputPolicy.from_name(value).mode
    except ConfigError:
        raise refuse(name, value, f"must be one of {', '.join(POLICY_MODES)}") from None


_Settings = TypeVar("_Settings", bound="BackendSettings")


@dataclass(frozen=True)
class BackendSettings:
    """What the settings of every backend share: the launcher's options, and reading and writing
    config.

    A backend's model subclasses this (its own options follow these) and names itself in ``title``.
    """

    title: ClassVar[str]
    """The backend as error messages name it, e.g. ``the Docker backend``."""

    orphan_timeout: float | None = option(
        30.0,
        parse_orphan_seconds,
        "Seconds the kernel outlives the process that started it (to re-attach), or 'unlimited'.",
    )
    output_policy: str = option(
        "strict",
        parse_output_policy,
        "What the kernel's outputs may do in the browser: 'strict' (default) cleans HTML, "
        "Markdown and SVG, drops JavaScript and unknown MIME types and refuses widgets that carry "
        "code; 'trusted' passes everything, so the kernel's outputs can run any script in the "
        "user's browser.",
        choices=POLICY_MODES,
    )
    allow_mime_types: tuple[str, ...] = option(
        (),
        parse_names,
        "MIME types the strict output policy passes unchanged besides its own list (renderers you "
        "trust).",
    )
    allow_widget_modules: tuple[str, ...] = option(
        (),
        parse_names,
        "Widget modules the strict output policy allows besides @jupyter-widgets/* (extensions "
        "you trust).",
    )
    allow_help_links: tuple[str, ...] = option(
        (),
        parse_names,
        "URLs a kernel may put in JupyterLab's Help menu (kernel_info help_links); any other is "
        "dropped, in both output policies.",
    )
    package_index: tuple[str, ...] = option(
        PYPI,
        parse_package_index,
        "Where pip finds packages: install() opens it for the call alone; an index URL "
        "(https://mirror.example/simple) or destinations; default PyPI's two hosts.",
    )
    suspend_lossy: bool = option(
        False,
        parse_flag,
        "Let an idle kernel sleep by checkpoint (suspend_after) even when its checkpoint would "
        "leave names behind (open sockets, threads, generators...) or it has open widgets; false: "
        "such a kernel stays awake.",
    )
    max_suspended_bytes: int | None = option(
        UNLIMITED,
        parse_max_memory,
        "The most disk the checkpoints of sleeping kernels (suspend_after) may take, all kernels "
        "of the host user together (e.g. 4g); a kernel whose sleep would go past it stays awake, "
        "and ps says why. 'unlimited': only max_checkpoint_bytes bounds them.",
    )
    checkpoint_max_bytes: int = option(
        "1g",
        parse_size,
        "The largest checkpoint the host keeps for one kernel, %checkpoint's or a sleep's (e.g. "
        "512m, 2g).",
    )
    max_checkpoint_bytes: int = option(
        "2g",
        parse_size,
        "The most disk the checkpoints the host keeps (%checkpoint's and sleeps') may take, all "
        "kernels of the host user together (partial ones and a kernel's previous one until "
        "replaced included); 2g lets one kernel at the default checkpoint_max_bytes replace its "
        "own.",
    )

    def __post_init__(self) -> None:
        """A kernel's checkpoint must fit in all kernels'."""
        if self.checkpoint_max_bytes > self.max_checkpoint_bytes:
            raise ConfigError(
                f"checkpoint_max_bytes={self.checkpoint_max_bytes} does not fit in "
                f"max_checkpoint_bytes={self.max_checkpoint_bytes} (all kernels' checkpoints on "
                "the host together): lower checkpoint_max_bytes or raise max_checkpoint_bytes"
            )

    @classmethod
    def options(cls) -> dict[str, dataclasses.Field[Any]]:
        """Every option, by name; ``metadata`` holds its ``help``, ``default``, ``parse`` (and enum
        ``choices``)."""
        return {option.name: option for option in dataclasses.fields(cls)}

    @classmethod
    def check_names(cls, config: Mapping[str, Any]) -> None:
        """Refuse names in ``config`` that are not options of this backend, suggesting the closest
        one."""
        options = cls.options()
        unknown = sorted(set(config) - set(options), key=str)
        if "secrets" in unknown:
            from .hostsecrets import unsupported

            raise unsupported(cls.title)
        if unknown:
            name = unknown[0]
            close = difflib.get_close_matches(str(name), options, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{cls.title} has no option {name!r}{hint}; its options are {', '.join(options)}"
            )

    @classmethod
    def from_config(cls: type[_Settings], config: Mapping[str, Any]) -> _Settings:
        """Check ``config`` (option name → value) and return the settings; unset options keep their
        defaults."""
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"{cls.title}'s config must be a mapping, not {type(config).__name__}"
            )
        cls.check_names(config)
        options = cls.options()
        return cls(
            **{name: options[name].metadata["parse"](name, value) for name, value in config.items()}
        )

    def resolved(self: _Settings) -> _Settings:
        """These settings with what a backend takes from the environment filled in (nothing
        here)."""
        return self

    def to_config(self) -> dict[str, Any]:
        """The settings as JSON-ready config that :meth:`from_config` reads back to equal
        settings."""
        config = dataclasses.asdict(self)
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in config.items()
        }
