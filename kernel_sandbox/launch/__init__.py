"""The launcher, one process per kernel on the host (:mod:`.launcher`).

Light on purpose: a sleeping kernel's launcher (:mod:`.dormant`) imports its ZMTP framing from
here without the event loop, libzmq or a backend's SDK; the launcher's own names are imported on
first use.
"""

from __future__ import annotations

from typing import Any

_LAUNCHER = ("main", "serve", "make_link", "output_policy", "build_parser")


def __getattr__(name: str) -> Any:
    """The launcher's names (:mod:`.launcher`), imported on first use."""
    if name in _LAUNCHER:
        from . import launcher

        return getattr(launcher, name)
    raise AttributeError(f"module 'kernel_sandbox.launch' has no attribute {name!r}")
