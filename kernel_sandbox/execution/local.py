"""The ``local`` backend: an ordinary ipykernel on this machine, for development. NOT a sandbox."""

from __future__ import annotations

import sys
from typing import Any

from jupyter_client.kernelspec import KernelSpec

from .backend import Backend, given

IPYKERNEL_ARGV = ["-m", "ipykernel_launcher", "-f", "{connection_file}"]


class LocalBackend(Backend):
    """A local kernel: no isolation, no limits; the session applies the output policy itself."""

    name = "local"
    sandboxed = False

    def kernel_spec(self, options: dict[str, Any]) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, *IPYKERNEL_ARGV],
            display_name="Python (local, not sandboxed)",
            language="python",
            interrupt_mode="signal",
            env=dict(given(options).get("env") or {}),
        )
