"""The execution API's backends by name: each wing's, found through the registry
(:mod:`kernel_sandbox.backends`), and ``local`` (:mod:`.local`, no sandbox)."""

from __future__ import annotations

import functools
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from .. import backends
from ..errors import ConfigError
from .backend import Backend
from .local import LocalBackend

LOCAL = "local"
"""The execution API's one backend that is not a wing (an ordinary local ipykernel, no sandbox)."""


@functools.cache
def adapter(name: str) -> Backend:
    """The execution API's backend called ``name`` (ConfigError listing the known ones
    otherwise)."""
    if name == LOCAL:
        return LocalBackend()
    entry = backends.entries().get(name)
    if entry is None:
        known = ", ".join([*sorted(backends.entries()), LOCAL])
        raise ConfigError(f"Unknown backend {name!r}; choose one of {known}")
    made: Backend = backends.load(entry.adapter)()
    return made


def kernel_spec(name: str, options: dict[str, Any]) -> KernelSpec:
    """Build the kernelspec for backend ``name`` with the sandbox ``options`` mapped onto its
    provisioner."""
    return adapter(name).kernel_spec(options)
