"""Old import paths of modules that moved into the backends' wings, importable for one release.

Each old path is the moved module itself (the same object, so its names, private ones included,
and patches of them keep working). Nothing is left at the old paths in the tree, so that git
follows each move as a rename. Removed in the release after 0.1.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED = {
    "kernel_sandbox.containers": "kernel_sandbox.docker.containers",
    "kernel_sandbox.engine": "kernel_sandbox.docker.engine",
    "kernel_sandbox.image": "kernel_sandbox.docker.image",
    "kernel_sandbox.watchdog": "kernel_sandbox.docker.watchdog",
    "kernel_sandbox.launch.docker_link": "kernel_sandbox.docker.link",
    "kernel_sandbox.provisioners.docker": "kernel_sandbox.docker.provisioner",
    "kernel_sandbox.execution.backends": "kernel_sandbox.execution.backend",
    "kernel_sandbox.execution.backends.docker": "kernel_sandbox.docker.execution",
    "kernel_sandbox.execution.backends.local": "kernel_sandbox.execution.local",
    "kernel_sandbox.execution.backends.opensandbox": "kernel_sandbox.opensandbox.execution",
    "kernel_sandbox.launch.execd_relay": "kernel_sandbox.opensandbox.relay",
    "kernel_sandbox.launch.opensandbox_link": "kernel_sandbox.opensandbox.link",
    "kernel_sandbox.provisioners.opensandbox": "kernel_sandbox.opensandbox.provisioner",
}
"""Old module path → where the module lives now."""


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module at its new path."""

    def find_spec(
        self, fullname: str, path: object, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path (its package is a package, for the old subpaths beneath it)."""
        if fullname not in MOVED:
            return None
        is_package = any(name.startswith(fullname + ".") for name in MOVED)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        """The default (a placeholder that :meth:`exec_module` replaces)."""
        return None

    def exec_module(self, module: ModuleType) -> None:
        """Import the module at its new path and stand it in for the old one (an old package,
        which must stay a package for its old subpaths, reads its names from the new module)."""
        moved = importlib.import_module(MOVED[module.__name__])
        if module.__spec__ is not None and module.__spec__.submodule_search_locations is not None:
            module.__getattr__ = lambda name: getattr(moved, name)  # type: ignore[method-assign]
        else:
            sys.modules[module.__name__] = moved


def install() -> None:
    """Let the old paths be imported (once per interpreter)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())
