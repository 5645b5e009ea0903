"""Kernel provisioner that runs each kernel in a fresh OpenSandbox sandbox.

The sandbox is created, kept alive and deleted by the launcher (:mod:`kernel_sandbox.launch`),
the same one code path the Docker provisioner runs (:class:`~.launched.LaunchedProvisioner`), so
the output policy, the client-signature checks and re-signing apply here too. This class adds
the OpenSandbox side: its options (``api_base``/``api_key`` from ``OPEN_SANDBOX_API_BASE`` /
``OPEN_SANDBOX_API_KEY`` when unset), and the deletion of a sandbox whose launcher was killed.
"""

from __future__ import annotations

from typing import Any

from ..errors import OpenSandboxError
from ..kernelspecs import OPENSANDBOX_PROVISIONER
from ..opensandbox.client import Limits, OpenSandboxClient
from ..opensandbox.settings import OPTIONS, OpenSandboxSettings
from ..policy import output_policy_trait
from .launched import LaunchedProvisioner, option_trait


class OpenSandboxProvisioner(LaunchedProvisioner):
    """Launch the kernel of a kernelspec in a new sandbox of an OpenSandbox deployment.

    Every option of :class:`~kernel_sandbox.opensandbox.settings.OpenSandboxSettings` is a
    traitlet here (``c.OpenSandboxProvisioner.image = ...``) and a key of the kernelspec's
    provisioner config; they are checked together before anything is created.
    """

    backend = OPENSANDBOX_PROVISIONER
    backend_title = "the OpenSandbox backend"
    options = OPTIONS

    api_base = option_trait(OPTIONS["api_base"])
    api_key = option_trait(OPTIONS["api_key"])
    image = option_trait(OPTIONS["image"])
    entrypoint = option_trait(OPTIONS["entrypoint"])
    mode = option_trait(OPTIONS["mode"])
    jupyter_port = option_trait(OPTIONS["jupyter_port"])
    jupyter_wait = option_trait(OPTIONS["jupyter_wait"])
    kernel_name = option_trait(OPTIONS["kernel_name"])
    language = option_trait(OPTIONS["language"])
    timeout = option_trait(OPTIONS["timeout"])
    renew_interval = option_trait(OPTIONS["renew_interval"])
    resource_limits = option_trait(OPTIONS["resource_limits"])
    resource_requests = option_trait(OPTIONS["resource_requests"])
    env = option_trait(OPTIONS["env"])
    metadata = option_trait(OPTIONS["metadata"])
    allow_internet = option_trait(OPTIONS["allow_internet"])
    network_policy = option_trait(OPTIONS["network_policy"])
    secure_access = option_trait(OPTIONS["secure_access"])
    use_server_proxy = option_trait(OPTIONS["use_server_proxy"])
    ready_timeout = option_trait(OPTIONS["ready_timeout"])
    poll_interval = option_trait(OPTIONS["poll_interval"])
    request_timeout = option_trait(OPTIONS["request_timeout"])
    max_output_bytes = option_trait(OPTIONS["max_output_bytes"])
    max_response_bytes = option_trait(OPTIONS["max_response_bytes"])
    interrupt_grace = option_trait(OPTIONS["interrupt_grace"])
    state_check_interval = option_trait(OPTIONS["state_check_interval"])
    orphan_timeout = option_trait(OPTIONS["orphan_timeout"])
    output_policy = output_policy_trait()
    allow_mime_types = option_trait(OPTIONS["allow_mime_types"])
    allow_widget_modules = option_trait(OPTIONS["allow_widget_modules"])

    def settings(self) -> OpenSandboxSettings:
        """The effective settings, checked, with the API base and key resolved (error: no API base)."""
        return OpenSandboxSettings.from_config({name: getattr(self, name) for name in OPTIONS}).resolved()

    @property
    def sandbox_id(self) -> str | None:
        """The id of the kernel's sandbox, once the launcher has created it."""
        return self.launcher_state.get("sandbox_id")

    async def remove_leftover(self, state: dict[str, Any]) -> None:
        """Delete the sandbox of a launcher that could not (it was killed); one already gone is fine."""
        if not state.get("sandbox_id"):
            return
        try:
            settings = self.settings()
            async with OpenSandboxClient(
                settings.api_base, settings.api_key, limits=Limits(request_timeout=settings.request_timeout)
            ) as client:
                await client.delete(state["sandbox_id"])
        except OpenSandboxError as exc:
            self.log.warning("could not delete the kernel's sandbox %s: %s", state["sandbox_id"], exc)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The launch already waits for the kernel; allow for the sandbox's creation."""
        return max(recommended, float(self.ready_timeout))
