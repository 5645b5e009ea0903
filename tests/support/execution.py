"""Helpers for the execution API tests: container look-ups."""

from __future__ import annotations

from kernel_sandbox.execution import Sandbox


def container_of(docker_engine, sandbox: Sandbox):
    """The Docker container running ``sandbox``'s kernel."""
    container_id = sandbox._async._km.provisioner.container_id
    return docker_engine.containers.get(container_id)
