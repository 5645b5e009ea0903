"""What every backend's options share: :class:`BackendSettings` and the parsers of option values.

A backend's model (:class:`~kernel_sandbox.docker.settings.DockerSettings`, OpenSandbox's) checks
every value before any container exists: a wrong type, an out-of-range or empty value, a combination
that cannot hold, or an unknown name raises :class:`~kernel_sandbox.errors.ConfigError` naming the
option. A limit is lifted only when asked for in so many words: ``None`` or ``"unlimited"``; ``0``,
negative and empty values are refused. The Docker backend's own options moved to
:mod:`kernel_sandbox.docker.settings`; ``DockerSettings`` and ``OPTIONS`` stay importable from here
for one release.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from fractions import Fraction
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, ClassVar, TypeVar

from .egress import PYPI, parse_package_index
from .errors import ConfigError
from .policy.output import MODES as POLICY_MODES, OutputPolicy

HOME_DIR = "/home/sandbox"
WORK_DIR = "/home/sandbox/work"
PACKAGES_DIR = "/home/sandbox/.packages"
"""Where pip installs in a Docker kernel (``PIP_TARGET``, on ``PYTHONPATH``; the image is
read-only): a tmpfs of its own, the one writable place mounted ``exec``, directly under the home
(a mount point deeper would make its parents the engine's, owned by root)."""
UNLIMITED = "unlimited"
MiB = 2**20
MIN_MEMORY = 32 * MiB
MAX_SIZE = 2**50
"""The largest memory limit or tmpfs size (1 PiB, more than any machine has; the engine refuses past
2**63)."""
MIN_PIDS = 16
MAX_PIDS = 2**22
"""The largest pids_limit: Linux's PID_MAX_LIMIT (the cgroup refuses more)."""
MAX_STANDBY = 8
RESERVED_ENV_PREFIX = "KERNEL_SANDBOX_"

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RUNTIME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_MAX_ID = 2**31 - 2


def _refuse(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: {why}")


def _unlimited(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() == UNLIMITED)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _refuse(name, value, "must be a non-empty string")
    return value.strip()


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refuse(name, value, "must be true or false")
    return value


def parse_size(name: str, value: Any) -> int:
    """Bytes from ``value``: an int, or a string such as ``512m``, ``1.5g``, ``2GiB`` (binary
    units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
        number = int(Fraction(match[1]) * _UNITS[match[2].lower()])
    else:
        raise _refuse(name, value, "must be a size such as 512m or 2g")
    if number <= 0:
        raise _refuse(name, value, f"must be more than 0; to lift the limit say {UNLIMITED!r}")
    if number > MAX_SIZE:
        raise _refuse(
            name, value, f"must be at most {MAX_SIZE // 2**40}t ({MAX_SIZE} bytes, 1 PiB)"
        )
    return number


def _memory(name: str, value: Any) -> int | None:
    if _unlimited(value):
        return None
    size = parse_size(name, value)
    if size < MIN_MEMORY:
        raise _refuse(name, value, f"must be at least {MIN_MEMORY // MiB}m, or {UNLIMITED!r}")
    return size


def _tmpfs(name: str, value: Any) -> int | None:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    if _unlimited(value):
        raise _refuse(name, value, "a writable tmpfs always has a size; say 'auto' for the default")
    return parse_size(name, value)


def _cpus(name: str, value: Any) -> float | None:
    if _unlimited(value):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(name, value, "must be a number of cores such as 1 or 0.5")
    cores = float(value)
    if not math.isfinite(cores) or cores < 0.01 or cores > 1024:
        raise _refuse(name, value, f"must be between 0.01 and 1024 cores, or {UNLIMITED!r}")
    return cores


def _pids(name: str, value: Any) -> int | None:
    if _unlimited(value):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(name, value, "must be a whole number of processes")
    if value < MIN_PIDS:
        raise _refuse(
            name, value, f"must be at least {MIN_PIDS} (the kernel needs threads), or {UNLIMITED!r}"
        )
    if value > MAX_PIDS:
        raise _refuse(
            name, value, f"must be at most {MAX_PIDS} (Linux's PID_MAX_LIMIT), or {UNLIMITED!r}"
        )
    return value


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _refuse(name, value, "must be a number of seconds")
    if not 0 < value <= 86400:
        raise _refuse(name, value, "must be more than 0 and at most 86400 seconds")
    return float(value)


def _orphan_seconds(name: str, value: Any) -> float | None:
    return None if _unlimited(value) else _seconds(name, value)


def _user(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _refuse(name, value, "must be a string 'UID:GID' or ''")
    if not value:
        return ""
    uid, sep, gid = value.partition(":")
    if not (uid.isdigit() and sep and gid.isdigit()) or max(int(uid), int(gid)) > _MAX_ID:
        raise _refuse(name, value, "must be a numeric UID:GID such as 1000:1000")
    if int(uid) == 0 or int(gid) == 0:
        raise _refuse(
            name, value, "the kernel never runs as root: choose a uid and gid other than 0"
        )
    return f"{int(uid)}:{int(gid)}"


def _id_range(name: str, value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = value
    elif isinstance(value, str) and re.fullmatch(r"\d+-\d+", value.strip()):
        low, high = (int(part) for part in value.strip().split("-"))
    else:
        raise _refuse(name, value, "must be a range such as '100000-999999'")
    if (
        isinstance(low, bool)
        or isinstance(high, bool)
        or not (isinstance(low, int) and isinstance(high, int))
    ):
        raise _refuse(name, value, "must be a range of whole numbers")
    if not 1000 <= low <= high <= _MAX_ID:
        raise _refuse(name, value, f"must lie within 1000-{_MAX_ID}, low end first")
    return low, high


def _choice(choices: tuple[str, ...]) -> Any:
    def parse(name: str, value: Any) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise _refuse(name, value, f"must be one of {', '.join(choices)}")
        return value.strip().lower()

    return parse


def _runtime(name: str, value: Any) -> str:
    if not isinstance(value, str) or (value and not _RUNTIME.fullmatch(value)):
        raise _refuse(
            name,
            value,
            "must be the name of an OCI runtime registered with Docker, e.g. 'runsc', or ''",
        )
    return value


def _env(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _refuse(name, value, "must be a mapping of variable names to strings")
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise _refuse(name, value, f"{key!r} is not a valid variable name")
        if key.upper().startswith(RESERVED_ENV_PREFIX):
            raise _refuse(
                name,
                value,
                f"{key!r}: names starting with {RESERVED_ENV_PREFIX} are kernel-sandbox's own",
            )
        if not isinstance(item, str) or "\0" in item:
            raise _refuse(name, value, f"the value of {key!r} must be a string without NUL")
    return dict(value)


def _standby(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(name, value, "must be a whole number of kernels; 0 turns standbys off")
    if not 0 <= value <= MAX_STANDBY:
        raise _refuse(name, value, f"must be between 0 (off) and {MAX_STANDBY}")
    return value


def _max_kernels(name: str, value: Any) -> int | None:
    if _unlimited(value):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise _refuse(name, value, f"must be a whole number of kernels from 1, or {UNLIMITED!r}")
    return value


def _max_memory(name: str, value: Any) -> int | None:
    return None if _unlimited(value) else parse_size(name, value)


def _output_policy(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _refuse(name, value, f"must be one of {', '.join(POLICY_MODES)}")
    try:
        return OutputPolicy.from_name(value).mode
    except ConfigError:
        raise _refuse(name, value, f"must be one of {', '.join(POLICY_MODES)}") from None


def _names(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise _refuse(name, value, "must be a list of names")
    if not all(isinstance(part, str) and part.strip() and len(part) <= 200 for part in value):
        raise _refuse(
            name, value, "every name must be a non-empty string of at most 200 characters"
        )
    return tuple(part.strip() for part in value)


def _argv(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise _refuse(name, value, "must be a non-empty list of strings")
    if not all(isinstance(part, str) and part and "\0" not in part for part in value):
        raise _refuse(name, value, "every part must be a non-empty string")
    return tuple(value)


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
            raise _refuse(name, spec, "a mount must look like HOST_PATH:CONTAINER_PATH[:ro|rw]")
        host, target, mode = parts[0], parts[1], parts[2] if len(parts) == 3 else "ro"
    else:
        raise _refuse(name, spec, "a mount must be 'HOST:CONTAINER[:ro|rw]' or a dict")
    if (
        not isinstance(host, str)
        or not host
        or not isinstance(target, str)
        or "\0" in host + target
    ):
        raise _refuse(name, spec, "a mount needs a host path")
    if mode not in ("ro", "rw"):
        raise _refuse(name, spec, f"mode must be 'ro' or 'rw', not {mode!r}")
    return Mount(host, target, mode)


def _mounts(name: str, value: Any) -> tuple[Mount, ...]:
    if isinstance(value, (str, Mapping)) or not isinstance(value, (list, tuple)):
        raise _refuse(name, value, "must be a list of mounts")
    return tuple(parse_mount(name, spec) for spec in value)


def _option(
    default: Any,
    parse: Callable[[str, Any], Any],
    help: str,
    choices: tuple[str, ...] | None = None,
) -> Any:
    factory = (lambda: dict(default)) if isinstance(default, dict) else None
    metadata = {"parse": parse, "help": help, "default": default}
    if choices is not None:
        metadata["choices"] = choices
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=parse("default", default), metadata=metadata)


_Settings = TypeVar("_Settings", bound="BackendSettings")


@dataclass(frozen=True)
class BackendSettings:
    """What the settings of every backend share: the launcher's options, and reading and writing
    config.

    A backend's model subclasses this (its own options follow these) and names itself in ``title``.
    """

    title: ClassVar[str]
    """The backend as error messages name it, e.g. ``the Docker backend``."""

    orphan_timeout: float | None = _option(
        30.0,
        _orphan_seconds,
        "Seconds the kernel outlives the process that started it (to re-attach), or 'unlimited'.",
    )
    output_policy: str = _option(
        "strict",
        _output_policy,
        "What the kernel's outputs may do in the browser: 'strict' (default) cleans HTML, "
        "Markdown and SVG, drops JavaScript and unknown MIME types and refuses widgets that carry "
        "code; 'trusted' passes everything, so the kernel's outputs can run any script in the "
        "user's browser.",
        choices=POLICY_MODES,
    )
    allow_mime_types: tuple[str, ...] = _option(
        (),
        _names,
        "MIME types the strict output policy passes unchanged besides its own list (renderers you "
        "trust).",
    )
    allow_widget_modules: tuple[str, ...] = _option(
        (),
        _names,
        "Widget modules the strict output policy allows besides @jupyter-widgets/* (extensions "
        "you trust).",
    )
    allow_help_links: tuple[str, ...] = _option(
        (),
        _names,
        "URLs a kernel may put in JupyterLab's Help menu (kernel_info help_links); any other is "
        "dropped, in both output policies.",
    )
    package_index: tuple[str, ...] = _option(
        PYPI,
        parse_package_index,
        "Where pip finds packages: install() opens it for the call alone; an index URL "
        "(https://mirror.example/simple) or destinations; default PyPI's two hosts.",
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
