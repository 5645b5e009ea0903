"""The registry of backends: the one place that answers "which backend".

Each backend is a wing (:mod:`kernel_sandbox.docker`, :mod:`kernel_sandbox.opensandbox`) that
registers one :class:`BackendEntry` under the entry-point group :data:`GROUP`, as its
provisioner registers under ``jupyter_client.kernel_provisioners``. The core (the launcher, the
provisioners' base, the execution API) asks here by provisioner name, by settings, or by the
execution API's backend name, and imports no wing: an entry names its parts as
``module:attribute`` and each is imported on first use (each wing pulls in its own SDK).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import KernelLaunchError

if TYPE_CHECKING:
    from .settings import BackendSettings

GROUP = "kernel_sandbox.backends"
"""The entry-point group every backend's :class:`BackendEntry` is registered in."""
DOCKER_PROVISIONER = "kernel-sandbox-docker"
OPENSANDBOX_PROVISIONER = "kernel-sandbox-opensandbox"
"""The provisioners' entry-point names, which kernelspecs select (never renamed); here, not in
:mod:`kernel_sandbox.kernelspecs`, so that the launcher does not import jupyter_client."""


def load(reference: str) -> Any:
    """What a ``module:attribute`` reference of an entry names (its module imported now)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class BackendEntry:
    """What a wing tells the core about itself; its parts as ``module:attribute`` references."""

    name: str
    """The execution API's ``backend=`` name (``docker``)."""
    provisioner: str
    """The name of its provisioner's entry point, which kernelspecs select (never renamed)."""
    settings: str
    """Its settings model, a :class:`~kernel_sandbox.settings.BackendSettings` subclass."""
    link: str
    """The launcher's :class:`~kernel_sandbox.launch.front.KernelLink` that runs its kernels."""
    adapter: str
    """The execution API's :class:`~kernel_sandbox.execution.backend.Backend` for it."""
    magics: bool = False
    """Whether its kernels load ``%checkpoint`` and ``%restore`` at start (the lab extension offers
    "Restart Kernel, Keep Variables" for them)."""

    def identity(self) -> dict[str, Any]:
        """What an installed kernelspec's metadata says of its backend, under ``kernel_sandbox``
        (the lab extension reads it: which kernels' outputs it frames, which have the magics)."""
        return {"backend": self.name, "magics": self.magics}

    def settings_model(self) -> type[BackendSettings]:
        """The settings model (imported now)."""
        model: type[BackendSettings] = load(self.settings)
        return model


@functools.cache
def entries() -> dict[str, BackendEntry]:
    """Every registered backend, by its execution API name (KernelLaunchError when there is
    none)."""
    # here, not at the top: importlib.metadata is 2.4 MiB that the watchdog (which imports the
    # Docker wing's package, so this module) never needs
    from importlib.metadata import entry_points

    found = {}
    for point in entry_points(group=GROUP):
        entry = point.load()
        found[entry.name] = entry
    if not found:
        raise KernelLaunchError(
            f"no backend is registered under the entry-point group {GROUP}: the installed metadata "
            "is older than the code; reinstall kernel-sandbox (`pip install -e .` in a checkout)"
        )
    return found


def by_provisioner(provisioner_name: Any) -> BackendEntry | None:
    """The backend whose provisioner is ``provisioner_name`` (as a kernelspec names it), or None."""
    return next(
        (entry for entry in entries().values() if entry.provisioner == provisioner_name), None
    )


def provisioner_names() -> frozenset[str]:
    """The provisioners (entry points) that make a kernelspec sandboxed."""
    return frozenset(entry.provisioner for entry in entries().values())


def provisioner_settings(provisioner_name: Any, config: Any) -> BackendSettings:
    """The checked settings of a kernelspec's provisioner config (ConfigError naming a bad
    option)."""
    entry = by_provisioner(provisioner_name)
    if entry is None:
        known = " or ".join(sorted(provisioner_names()))
        raise KernelLaunchError(
            f"the kernelspec selects the provisioner {provisioner_name!r}, which kernel-sandbox "
            f"does not know; use {known}"
        )
    return entry.settings_model().from_config(config)


def for_settings(settings: BackendSettings) -> BackendEntry:
    """The backend whose settings model ``settings`` are (no other wing is imported to tell)."""
    model = type(settings)
    for entry in entries().values():
        if entry.settings == f"{model.__module__}:{model.__qualname__}":
            return entry
    raise KernelLaunchError(f"no backend is registered for {type(settings).__name__}")
