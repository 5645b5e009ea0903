"""OpenSandbox backend: the async lifecycle and execd clients, and what they return.

The errors are in :mod:`kernel_sandbox.errors`; the event parser, the execd-to-Jupyter
translation, the sandbox's Jupyter server client and the backend's settings are in their
submodules. The kernel itself is run by the launcher (:mod:`kernel_sandbox.launch.opensandbox_link`).
"""

from .client import Endpoint, ExecdClient, Limits, OpenSandboxClient, Sandbox, keep_alive, run_once, run_once_sync
from .events import Event, ExecdRun

__all__ = [
    "Endpoint",
    "Event",
    "ExecdClient",
    "ExecdRun",
    "Limits",
    "OpenSandboxClient",
    "Sandbox",
    "keep_alive",
    "run_once",
    "run_once_sync",
]
