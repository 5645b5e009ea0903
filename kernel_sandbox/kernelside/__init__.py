"""Code that runs inside the kernel, kept as real modules.

The host reads a module's text with :func:`source` and sends it to the kernel, where it runs
with the kernel's own standard library only. The same modules import on the host, so their
unit tests run them as ordinary code.
"""

from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    """The text of the kernel-side module ``name`` (a module of this package)."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
