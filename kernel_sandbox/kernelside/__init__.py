"""Code that runs inside the sandbox, kept as real modules and sent to the kernel as source.

Each module here runs with the image's Python (3.8 or newer, standard library only), through
``python -c SOURCE ARGS...`` or installed into a running kernel by the execution API;
:func:`source` reads one for sending. The same modules import on the host, so their unit
tests run them as ordinary code.
"""

from __future__ import annotations

from importlib.resources import files


def source(module: str) -> str:
    """The source text of ``kernel_sandbox.kernelside.<module>``, to send to the kernel."""
    return files(__name__).joinpath(f"{module}.py").read_text(encoding="utf-8")


INSTALLED_PREFIX = "_kernel_sandbox_"
"""A module installed into a running kernel is named ``_kernel_sandbox_<module>`` there."""
MAGICS = ("workfiles", "checkpoint", "packages", "textframe", "magics", "trust")
"""The modules the kernel's boot installs, in order: those of ``%checkpoint``, ``%restore`` and the
``%pip`` wrapper, and the egress proxy's CA in the kernel's trust."""


def sources(modules: tuple[str, ...]) -> dict[str, str]:
    """``{installed name: source}`` of ``modules``, in order, for installing into a kernel."""
    return {INSTALLED_PREFIX + name: source(name) for name in modules}
