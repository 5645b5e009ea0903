"""The parsers of option values every backend's settings share, and the limits they enforce.

Each parser takes the option's name and the value as written and returns the value as the settings
hold it, or raises :class:`~kernel_sandbox.errors.ConfigError` naming the option (:func:`refuse`).
A limit is lifted only when asked for in so many words: ``None`` or ``"unlimited"``; ``0``,
negative and empty values are refused. :func:`option` makes a settings field of a parser; the docs
hook (``docs/options_hook.py``) reads how each option is written from its parser.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from fractions import Fraction
from typing import Any

from .errors import ConfigError

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


def refuse(name: str, value: Any, why: str) -> ConfigError:
    """The error for option ``name`` set to ``value``, saying ``why``."""
    return ConfigError(f"{name}={value!r}: {why}")


def _unlimited(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() == UNLIMITED)


def parse_text(name: str, value: Any) -> str:
    """A non-empty string, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise refuse(name, value, "must be a non-empty string")
    return value.strip()


def parse_flag(name: str, value: Any) -> bool:
    """A boolean: ``true`` or ``false``, nothing that merely converts to one."""
    if not isinstance(value, bool):
        raise refuse(name, value, "must be true or false")
    return value


def parse_size(name: str, value: Any) -> int:
    """Bytes from ``value``: an int, or a string such as ``512m``, ``1.5g``, ``2GiB`` (binary
    units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
        number = int(Fraction(match[1]) * _UNITS[match[2].lower()])
    else:
        raise refuse(name, value, "must be a size such as 512m or 2g")
    if number <= 0:
        raise refuse(name, value, f"must be more than 0; to lift the limit say {UNLIMITED!r}")
    if number > MAX_SIZE:
        raise refuse(name, value, f"must be at most {MAX_SIZE // 2**40}t ({MAX_SIZE} bytes, 1 PiB)")
    return number


def parse_memory(name: str, value: Any) -> int | None:
    """A memory limit in bytes (at least :data:`MIN_MEMORY`), or None for ``unlimited``."""
    if _unlimited(value):
        return None
    size = parse_size(name, value)
    if size < MIN_MEMORY:
        raise refuse(name, value, f"must be at least {MIN_MEMORY // MiB}m, or {UNLIMITED!r}")
    return size


def parse_tmpfs(name: str, value: Any) -> int | None:
    """A tmpfs size in bytes, or None for ``auto`` (the backend's default share)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    if _unlimited(value):
        raise refuse(name, value, "a writable tmpfs always has a size; say 'auto' for the default")
    return parse_size(name, value)


def parse_cpus(name: str, value: Any) -> float | None:
    """A CPU limit in cores (0.01 to 1024), or None for ``unlimited``."""
    if _unlimited(value):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refuse(name, value, "must be a number of cores such as 1 or 0.5")
    cores = float(value)
    if not math.isfinite(cores) or cores < 0.01 or cores > 1024:
        raise refuse(name, value, f"must be between 0.01 and 1024 cores, or {UNLIMITED!r}")
    return cores


def parse_pids(name: str, value: Any) -> int | None:
    """A process and thread limit (:data:`MIN_PIDS` to :data:`MAX_PIDS`), or None for
    ``unlimited``."""
    if _unlimited(value):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse(name, value, "must be a whole number of processes")
    if value < MIN_PIDS:
        raise refuse(
            name, value, f"must be at least {MIN_PIDS} (the kernel needs threads), or {UNLIMITED!r}"
        )
    if value > MAX_PIDS:
        raise refuse(
            name, value, f"must be at most {MAX_PIDS} (Linux's PID_MAX_LIMIT), or {UNLIMITED!r}"
        )
    return value


def parse_seconds(name: str, value: Any) -> float:
    """A duration: more than 0 and at most a day, in seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise refuse(name, value, "must be a number of seconds")
    if not 0 < value <= 86400:
        raise refuse(name, value, "must be more than 0 and at most 86400 seconds")
    return float(value)


def parse_orphan_seconds(name: str, value: Any) -> float | None:
    """A duration in seconds, or None for ``unlimited``."""
    return None if _unlimited(value) else parse_seconds(name, value)


def parse_user(name: str, value: Any) -> str:
    """A numeric ``UID:GID`` other than root's, or ``''``."""
    if not isinstance(value, str):
        raise refuse(name, value, "must be a string 'UID:GID' or ''")
    if not value:
        return ""
    uid, sep, gid = value.partition(":")
    if not (uid.isdigit() and sep and gid.isdigit()) or max(int(uid), int(gid)) > _MAX_ID:
        raise refuse(name, value, "must be a numeric UID:GID such as 1000:1000")
    if int(uid) == 0 or int(gid) == 0:
        raise refuse(
            name, value, "the kernel never runs as root: choose a uid and gid other than 0"
        )
    return f"{int(uid)}:{int(gid)}"


def parse_id_range(name: str, value: Any) -> tuple[int, int]:
    """A range of ids ``(low, high)`` within 1000 and the largest id: ``LOW-HIGH`` or a pair."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = value
    elif isinstance(value, str) and re.fullmatch(r"\d+-\d+", value.strip()):
        low, high = (int(part) for part in value.strip().split("-"))
    else:
        raise refuse(name, value, "must be a range such as '100000-999999'")
    if (
        isinstance(low, bool)
        or isinstance(high, bool)
        or not (isinstance(low, int) and isinstance(high, int))
    ):
        raise refuse(name, value, "must be a range of whole numbers")
    if not 1000 <= low <= high <= _MAX_ID:
        raise refuse(name, value, f"must lie within 1000-{_MAX_ID}, low end first")
    return low, high


def parse_choice(choices: tuple[str, ...]) -> Any:
    """The parser of a value that must be one of ``choices`` (case ignored)."""

    def parse(name: str, value: Any) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise refuse(name, value, f"must be one of {', '.join(choices)}")
        return value.strip().lower()

    return parse


def parse_runtime(name: str, value: Any) -> str:
    """The name of an OCI runtime registered with Docker, or ``''``."""
    if not isinstance(value, str) or (value and not _RUNTIME.fullmatch(value)):
        raise refuse(
            name,
            value,
            "must be the name of an OCI runtime registered with Docker, e.g. 'runsc', or ''",
        )
    return value


def parse_env(name: str, value: Any) -> dict[str, str]:
    """Environment variables: valid names, none of kernel-sandbox's own, string values."""
    if not isinstance(value, Mapping):
        raise refuse(name, value, "must be a mapping of variable names to strings")
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise refuse(name, value, f"{key!r} is not a valid variable name")
        if key.upper().startswith(RESERVED_ENV_PREFIX):
            raise refuse(
                name,
                value,
                f"{key!r}: names starting with {RESERVED_ENV_PREFIX} are kernel-sandbox's own",
            )
        if not isinstance(item, str) or "\0" in item:
            raise refuse(name, value, f"the value of {key!r} must be a string without NUL")
    return dict(value)


def parse_standby(name: str, value: Any) -> int:
    """A number of warm standby kernels, from 0 (off) to :data:`MAX_STANDBY`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse(name, value, "must be a whole number of kernels; 0 turns standbys off")
    if not 0 <= value <= MAX_STANDBY:
        raise refuse(name, value, f"must be between 0 (off) and {MAX_STANDBY}")
    return value


def parse_max_kernels(name: str, value: Any) -> int | None:
    """A number of kernels from 1, or None for ``unlimited``."""
    if _unlimited(value):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise refuse(name, value, f"must be a whole number of kernels from 1, or {UNLIMITED!r}")
    return value


def parse_max_memory(name: str, value: Any) -> int | None:
    """A size in bytes, or None for ``unlimited``."""
    return None if _unlimited(value) else parse_size(name, value)


def parse_names(name: str, value: Any) -> tuple[str, ...]:
    """A list of non-empty names of at most 200 characters each."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise refuse(name, value, "must be a list of names")
    if not all(isinstance(part, str) and part.strip() and len(part) <= 200 for part in value):
        raise refuse(name, value, "every name must be a non-empty string of at most 200 characters")
    return tuple(part.strip() for part in value)


def parse_argv(name: str, value: Any) -> tuple[str, ...]:
    """A command: a non-empty list of non-empty strings."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise refuse(name, value, "must be a non-empty list of strings")
    if not all(isinstance(part, str) and part and "\0" not in part for part in value):
        raise refuse(name, value, "every part must be a non-empty string")
    return tuple(value)


def option(
    default: Any,
    parse: Callable[[str, Any], Any],
    help: str,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A settings field: its ``default`` (parsed now), its ``parse``r, its ``help`` and enum
    ``choices``, in the metadata the settings models and the docs read."""
    factory = (lambda: dict(default)) if isinstance(default, dict) else None
    metadata = {"parse": parse, "help": help, "default": default}
    if choices is not None:
        metadata["choices"] = choices
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=parse("default", default), metadata=metadata)
