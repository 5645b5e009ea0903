"""Kernel provisioner that runs each kernel in a fresh OpenSandbox sandbox.

The sandbox is created, kept alive and deleted by the launcher (:mod:`kernel_sandbox.launch`), the
same one code path the Docker provisioner runs
(:class:`~kernel_sandbox.provisioners.launched.LaunchedProvisioner`), so the output policy, the
client-signature checks and re-signing apply here too. This class adds the OpenSandbox side: its
options (``api_base``/``api_key`` from ``OPEN_SANDBOX_API_BASE`` / ``OPEN_SANDBOX_API_KEY`` when
unset), and the deletion of a sandbox whose launcher was killed.
"""

from __future__ import annotations

from typing import Any

from ..errors import OpenSandboxError
from ..backends import OPENSANDBOX_PROVISIONER
from .lifecycle import OpenSandboxClient
from .settings import OpenSandboxSettings
from ..provisioners.launched import LaunchedProvisioner


class OpenSandboxProvisioner(LaunchedProvisioner):
    """Launch the kernel of a kernelspec in a new sandbox of an OpenSandbox deployment.

    Every option of :class:`~kernel_sandbox.opensandbox.settings.OpenSandboxSettings` is a
    traitlet here (``c.OpenSandboxProvisioner.image = ...``) and a key of the kernelspec's
    provisioner config; they are checked together before anything is created.
    """

    backend = OPENSANDBOX_PROVISIONER
    settings_model = OpenSandboxSettings
    # the trait made from the model's option (LaunchedProvisioner.__init_subclass__)
    ready_timeout: float

    @property
    def sandbox_id(self) -> str | None:
        """The id of the kernel's sandbox, once the launcher has created it."""
        return self.launcher_state.get("sandbox_id")

    async def remove_leftover(self, state: dict[str, Any]) -> None:
        """Delete the sandbox of a launcher that could not (it was killed); one already gone is
        fine."""
        if not state.get("sandbox_id"):
            return
        try:
            settings = self.settings()
            async with OpenSandboxClient(
                settings.api_base, settings.api_key, limits=settings.limits
            ) as client:
                await client.delete(state["sandbox_id"])
        except OpenSandboxError as exc:
            self.log.warning(
                "could not delete the kernel's sandbox %s: %s", state["sandbox_id"], exc
            )

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The launch already waits for the kernel; allow for the sandbox's creation."""
        return max(recommended, float(self.ready_timeout))
