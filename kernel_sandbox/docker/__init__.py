"""The Docker backend's wing: the launcher's link, the provisioner, the execution API's adapter,
the engine calls (connect, checks, containers, image, engine, watchdog), the egress proxy's wiring
(proxy) and the settings.

It stands on the core (:mod:`kernel_sandbox.launch`, :mod:`kernel_sandbox.provisioners`,
:mod:`kernel_sandbox.execution`), which finds it through :data:`BACKEND` in the registry
(:mod:`kernel_sandbox.backends`) and never imports it.
"""

from ..backends import DOCKER_PROVISIONER, BackendEntry

BACKEND = BackendEntry(
    name="docker",
    provisioner=DOCKER_PROVISIONER,
    settings="kernel_sandbox.docker.settings:DockerSettings",
    link="kernel_sandbox.docker.link:DockerLink",
    adapter="kernel_sandbox.docker.execution:DockerBackend",
    magics=True,
)
"""The Docker backend as the registry knows it (entry point ``docker`` of
:data:`~kernel_sandbox.backends.GROUP`)."""
