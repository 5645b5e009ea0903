"""The extension manager of a locked-down lab: JupyterLab's read-only one, with every extension
and plugin locked.

JupyterLab's own managers let a page enable or disable any installed extension through
``/lab/api/extensions`` (they ignore ``lockedExtensions`` and ``LabApp.lock_all_plugins``, which
only the plugin manager's ``/lab/api/plugins`` reads), and the server writes that into
``page_config.json`` for every later page load: one script in the page could turn
kernel-sandbox-frame off for good. ``kernel-sandbox lab --locked-down`` registers this manager
as :data:`NAME` and selects it (``LabApp.extension_manager``).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

from jupyterlab.extensions import MANAGERS
from jupyterlab.extensions.readonly import ReadOnlyExtensionManager

NAME = "kernel-sandbox-locked"
"""The name ``LabApp.extension_manager`` selects this manager by."""


class LockedExtensionManager(ReadOnlyExtensionManager):
    """Installs nothing, and enables or disables nothing: every extension is locked."""

    def __init__(
        self, app_options: Any = None, ext_options: dict[str, Any] | None = None, parent: Any = None
    ) -> None:
        super().__init__(app_options, {**(ext_options or {}), "lock_all": True}, parent)


def register() -> None:
    """Make :data:`NAME` a manager JupyterLab's ``LabApp.extension_manager`` can name (in this
    process; an installed entry point is not needed)."""
    MANAGERS.setdefault(
        NAME,
        EntryPoint(NAME, f"{__name__}:LockedExtensionManager", "jupyterlab.extension_manager_v1"),
    )
