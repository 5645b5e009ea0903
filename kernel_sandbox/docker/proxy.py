"""The Docker kernel's egress proxy, from its settings: the proxy variables of the kernel's
environment, and its :class:`~kernel_sandbox.launch.egress.Egress` (``network`` false or a
list, the package index, the secrets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..egress import package_index, parse_destinations
from ..launch.egress import PROXY_PORT, Egress
from .settings import DockerSettings

if TYPE_CHECKING:
    from ..launch.intercept import SecretTable

PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
NO_PROXY = "localhost,127.0.0.1,::1"


def kernel_env(settings: DockerSettings, port: int = PROXY_PORT) -> dict[str, str]:
    """The proxy variables for the kernel's environment (upper and lower case: tools read either);
    pip uses ``package_index``'s URL when it names one."""
    url = f"http://127.0.0.1:{port}"
    env = dict.fromkeys(PROXY_ENV, url)
    env.update(NO_PROXY=NO_PROXY, no_proxy=NO_PROXY)
    if settings.network is False:
        # every request is refused: pip says why once (its retry warning), not five times
        env["PIP_RETRIES"] = "1"
    index = package_index("package_index", settings.package_index)
    if index.url is not None:
        env["PIP_INDEX_URL"] = index.url
        if index.url.startswith("http://"):
            env["PIP_TRUSTED_HOST"] = index.destinations[0].host
    return env


def proxy_for(settings: DockerSettings, secrets: SecretTable | None = None) -> Egress:
    """The proxy of a kernel with these settings (``network`` false or a list) and
    ``secrets``."""
    allowed = (
        parse_destinations("network", settings.network)
        if isinstance(settings.network, tuple)
        else ()
    )
    return Egress(
        allowed,
        package_index=package_index("package_index", settings.package_index).destinations,
        secrets=secrets,
    )
