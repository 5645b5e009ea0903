"""Sandbox backends as objects: everything in which ``docker``, ``opensandbox`` and ``local``
differ.

Each backend's wing holds one :class:`Backend` subclass (``local``'s is :mod:`.local`), found
by name (:func:`.adapters.adapter`, which asks the registry). The session
(:mod:`.sandbox`) asks its backend and never compares backend names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from ..errors import SandboxError
from ..kernelspecs import kernel_manager as spec_kernel_manager
from ..metrics import CgroupProbe, MetricsUnavailable
from ..privdir import remove_private

KERNEL_NAME = "kernel-sandbox-execution"
LauncherRequest = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""The session's egress request to its launcher (control channel, signed with the connection
key)."""
DEFAULT_BACKEND = "docker"


class Backend:
    """How one backend builds its kernel and where it differs from a sandbox's defaults."""

    name = ""
    sandboxed = True
    """False for a kernel that is not isolated at all (warned about; the output policy runs on the
    host)."""
    comms_known = True
    """False when only the running kernel can say whether it speaks comms (asked after start)."""
    package_window = False
    """True when the package index can be opened for one ``install()`` call (a network-off
    kernel)."""
    pool_defaults: dict[str, Any] = {}
    """Options a pool sets unless given, because the pool keeps its own ready kernels."""

    def speaks_comms(self, kernel_info: dict[str, Any]) -> bool:
        """Whether the running kernel, by the content of its ``kernel_info`` reply, speaks comms
        (asked when :attr:`comms_known` is False)."""
        return True

    def check(self, options: dict[str, Any]) -> None:
        """Refuse options that are unknown or out of range (ConfigError naming the option)."""

    def kernel_spec(self, options: dict[str, Any]) -> KernelSpec:
        """The in-memory kernelspec with the sandbox ``options`` mapped onto its provisioner."""
        raise NotImplementedError

    async def pause(self, provisioner: Any, paused: bool) -> None:
        """Pause (``paused``) or resume the kernel's sandbox; a backend that cannot says so."""
        raise SandboxError(
            f"the {self.name} backend cannot pause a kernel; pause() and resume() are for the "
            "opensandbox backend"
        )

    def index_window(
        self, provisioner: Any, request: LauncherRequest, seconds: float
    ) -> AbstractAsyncContextManager[None]:
        """Keep ``package_index`` reachable while the block (one ``install()``) runs, for at most
        ``seconds``, and close it after, also on error, timeout or cancel; here: nothing to open."""
        return contextlib.nullcontext()

    async def image(self, provisioner: Any) -> tuple[str, str]:
        """``(id, name)`` of the image the running kernel was started from (checkpoints restore into
        it only)."""
        settings = provisioner.settings()
        return settings.image, settings.image

    def probe(self, provisioner: Any) -> CgroupProbe:
        """The host's reader of the running kernel's usage (:class:`MetricsUnavailable` where there
        is none)."""
        raise MetricsUnavailable(
            f"the {self.name} backend offers no usage figures read by the host"
        )

    def kill_now(self, provisioner: Any) -> None:
        """Stop the kernel without an event loop (garbage collection, interpreter exit): kill its
        process and remove its private directory; a backend with more to remove adds that."""
        process = getattr(provisioner, "process", None)
        if process is not None and process.poll() is None:
            process.kill()
        private = getattr(provisioner, "private", None)
        if private is not None:
            remove_private(private.path)


def given(options: dict[str, Any]) -> dict[str, Any]:
    """The options that were given (not None)."""
    return {key: value for key, value in options.items() if value is not None}


def kernel_manager(spec: KernelSpec) -> AsyncKernelManager:
    """An AsyncKernelManager that launches ``spec``."""
    return spec_kernel_manager(KERNEL_NAME, spec=spec)
