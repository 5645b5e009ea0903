"""The OpenSandbox backend's wing: the launcher's link and execd relay, the provisioner, the
execution API's adapter, and the async lifecycle and execd clients with what they return.

The errors are in :mod:`kernel_sandbox.errors`; the event parser, the execd-to-Jupyter
translation, the sandbox's Jupyter server client and the backend's settings are in their
submodules. The core finds the wing through :data:`BACKEND` in the registry
(:mod:`kernel_sandbox.backends`); the clients below are imported on first use, so that the
registry's look-up does not import httpx.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..backends import OPENSANDBOX_PROVISIONER, BackendEntry

BACKEND = BackendEntry(
    name="opensandbox",
    provisioner=OPENSANDBOX_PROVISIONER,
    settings="kernel_sandbox.opensandbox.settings:OpenSandboxSettings",
    link="kernel_sandbox.opensandbox.link:OpenSandboxLink",
    adapter="kernel_sandbox.opensandbox.execution:OpenSandboxBackend",
)
"""The OpenSandbox backend as the registry knows it (entry point ``opensandbox`` of
:data:`~kernel_sandbox.backends.GROUP`)."""

_CLIENT_API = {
    "Endpoint": "execd",
    "ExecdClient": "execd",
    "Limits": "http",
    "OpenSandboxClient": "lifecycle",
    "Sandbox": "lifecycle",
    "keep_alive": "client",
    "run_once": "client",
    "run_once_sync": "client",
    "Event": "events",
    "ExecdRun": "events",
}
__all__ = ["BACKEND", *sorted(_CLIENT_API)]


def __getattr__(name: str) -> Any:
    """Import the clients on first use."""
    if name in _CLIENT_API:
        return getattr(importlib.import_module(f"{__name__}.{_CLIENT_API[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
