"""Secrets that never enter the sandbox: values that live on the host, bound to destinations.

A kernel sees a placeholder in the environment variable of each secret's name; the launcher's egress
proxy puts the value in place of the placeholder in the headers of a request to a bound destination
(and, opted in, in its URL's query), and nowhere else (:mod:`kernel_sandbox.launch.intercept`).

The ``secrets`` option holds bindings only, never values: ``NAME[=PATH]@HOST[:PORT][,HOST...]``
with ``;query`` at the end to opt in to query parameters. At launch the launcher reads each value
from its own environment variable ``NAME`` (a Jupyter server's, or the one a program's
:class:`Secret` put there), or from the file ``PATH``; a missing one fails the launch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from .egress import Destination, parse_destination
from .errors import ConfigError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_SECRETS = 32
MAX_VALUE = 8192
RESERVED = frozenset(
    {
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "PIP_TARGET",
        "PYTHONPATH",
        "PIP_INDEX_URL",
        "PIP_TRUSTED_HOST",
        "PIP_RETRIES",
        "PIP_CERT",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "PIP_NO_CACHE_DIR",
        "PIP_LOG",
        "TMPDIR",
        "HOME",
        "PATH",
    }
)
"""Variables the sandbox sets itself: no secret may take their name."""
QUERY = ";query"


class Secret:
    """A value for the host only, and the destinations (``HOST[:PORT]``) that may receive it.

    ``query``: also put it in place of its placeholder in a URL query parameter (headers only by
    default). Its repr, str and pickle never show the value.
    """

    __slots__ = ("_value", "hosts", "query")

    def __init__(self, value: str, hosts: Sequence[str], *, query: bool = False) -> None:
        check_value("Secret", value)
        if isinstance(hosts, str) or not hosts:
            raise ConfigError("Secret: hosts must be a non-empty list such as ['api.openai.com']")
        self._value = value
        self.hosts = tuple(str(parse_binding_host("Secret", host)) for host in hosts)
        self.query = bool(query)

    def __repr__(self) -> str:
        return f"Secret(<hidden>, hosts={list(self.hosts)!r}, query={self.query})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is never pickled or copied: its value stays in this process")

    def binding(self, name: str) -> str:
        """The ``secrets`` option's entry for this secret under ``name`` (no value in it)."""
        return f"{name}@{','.join(self.hosts)}{QUERY if self.query else ''}"

    def reveal(self) -> str:
        """The value: for handing to the launcher only."""
        return self._value

    def for_call(self, name: str) -> dict[str, str]:
        """What the launcher binds for one tool call under ``name`` (the value with it: for the
        launcher's control request only)."""
        return {"binding": self.binding(name), "value": self._value}


def unsupported(title: str) -> ConfigError:
    """The refusal of ``secrets`` by a backend whose launcher does not run the egress proxy."""
    return ConfigError(
        f"secrets: {title} cannot keep secrets on the host (only the Docker backend's launcher "
        "runs the egress proxy that adds them to requests); use the Docker backend, or give the "
        "kernel the value itself in 'env'"
    )


def check_value(name: str, value: Any) -> None:
    """Refuse a value that cannot go in a header: not a string, empty, too long, or with controls
    (the message never shows the value)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}: the secret's value must be a non-empty string")
    if len(value) > MAX_VALUE:
        raise ConfigError(f"{name}: the secret's value is longer than {MAX_VALUE} characters")
    if any(not " " <= ch <= "~" for ch in value) or value != value.strip():
        raise ConfigError(
            f"{name}: the secret's value must be printable ASCII without line breaks or spaces at "
            "either end (it goes in HTTP headers)"
        )


def parse_binding_host(option: str, entry: Any) -> Destination:
    """One bound destination: a host name with an optional port (no wildcard, address or '@')."""
    if isinstance(entry, str) and "@" in entry:
        raise ConfigError(
            f"{option}: {entry!r}: a secret's host takes no '@ADDRESSES'; allow the address in "
            "the 'network' option instead"
        )
    destination = parse_destination(option, entry)
    if destination.wildcard or destination.address is not None:
        raise ConfigError(
            f"{option}: {entry!r}: a secret is bound to host names, not to a wildcard or an address"
        )
    return destination


@dataclass(frozen=True)
class Binding:
    """One entry of the ``secrets`` option: the variable's name, where it may go, where its value
    comes from."""

    name: str
    hosts: tuple[Destination, ...]
    path: str | None = None
    query: bool = False

    def __str__(self) -> str:
        source = f"={self.path}" if self.path else ""
        hosts = ",".join(map(str, self.hosts))
        return f"{self.name}{source}@{hosts}{QUERY if self.query else ''}"

    def value(self, environ: Mapping[str, str]) -> str:
        """The secret's value, from its file or from ``environ``; ConfigError (naming how to fix
        it) when there is none."""
        where = f"secrets: {self.name}"
        if self.path is not None:
            try:
                value = Path(self.path).read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(
                    f"{where}: cannot read its value from {self.path} ({exc.strerror}); fix the "
                    f"file or the option ({self.name}=PATH@HOST)"
                ) from None
        else:
            found = environ.get(self.name)
            if found is None:
                raise ConfigError(
                    f"{where}: the variable {self.name} is not set in the environment of the "
                    "process that launches the kernel (the Jupyter server's): set it there, or "
                    f"name a file holding the value ({self.name}=PATH@HOST)"
                )
            value = found
        check_value(where, value)
        return value


def parse_binding(option: str, entry: Any) -> Binding:
    """Check one entry ``NAME[=PATH]@HOST[:PORT][,HOST...][;query]``."""
    if not isinstance(entry, str) or "@" not in entry:
        raise ConfigError(
            f"{option}: {entry!r} must be NAME@HOST[,HOST...] (e.g. "
            "'OPENAI_API_KEY@api.openai.com'), or NAME=PATH@HOST to read the value from a file"
        )
    text, query = (entry[: -len(QUERY)], True) if entry.endswith(QUERY) else (entry, False)
    left, _, hosts = text.rpartition("@")
    name, eq, path = left.partition("=")
    if not NAME.fullmatch(name):
        raise ConfigError(f"{option}: {entry!r}: {name!r} is not an environment variable name")
    if name.upper() in RESERVED or name.upper().startswith("KERNEL_SANDBOX_"):
        raise ConfigError(
            f"{option}: {entry!r}: {name} is a variable the sandbox sets itself; choose another"
        )
    if eq and not path.startswith("/"):
        # not the entry: what follows '=' may be a value written there by mistake
        raise ConfigError(
            f"{option}: {name}=...: the file after '=' must be an absolute path (the value itself "
            "never goes in the option)"
        )
    bound = tuple(dict.fromkeys(parse_binding_host(option, h) for h in hosts.split(",")))
    return Binding(name, bound, path if eq else None, query)


def parse_bindings(option: str, value: Any) -> tuple[str, ...]:
    """The ``secrets`` option: the canonical spelling of each binding (one per name)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ConfigError(
            f"{option}={value!r}: must be a list such as ['OPENAI_API_KEY@api.openai.com']"
        )
    if len(value) > MAX_SECRETS:
        raise ConfigError(f"{option}: at most {MAX_SECRETS} secrets, not {len(value)}")
    bindings = [parse_binding(option, entry) for entry in value]
    names = [binding.name for binding in bindings]
    if len(set(names)) < len(names):
        raise ConfigError(f"{option}: each secret's name may appear once")
    return tuple(map(str, bindings))


def read_uses(directory: str | Path | None) -> tuple[tuple[str, int], ...]:
    """The secrets a kernel holds and how many requests used each, as its launcher keeps them in
    its private ``directory`` (names and counts, never values); () when there are none."""
    from .privdir import SECRETS

    if not directory:
        return ()
    try:
        data = json.loads((Path(directory) / SECRETS).read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(data, dict):
        return ()
    return tuple((str(name), count) for name, count in data.items() if isinstance(count, int))


def secret_values(secrets: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Check a program's ``secrets`` (name to :class:`Secret`) and return each value by name, for
    the launcher's environment only."""
    if not isinstance(secrets, Mapping):
        raise ConfigError("secrets must be a mapping of variable names to Secret(value, hosts=...)")
    values = {}
    for name, secret in secrets.items():
        if not isinstance(secret, Secret):
            raise ConfigError(
                f"secrets: {name!r} must be a Secret(value, hosts=[...]), not "
                f"{type(secret).__name__} (a bare value would enter the kernel)"
            )
        if name in env:
            raise ConfigError(f"secrets: {name!r} is in env too; the kernel gets a placeholder")
        parse_binding("secrets", secret.binding(name))
        values[name] = secret.reveal()
    return values
