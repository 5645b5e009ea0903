"""The debugger through the launcher (issue 25, item 2): what JupyterLab's debugger sends, on a Docker kernel.

JupyterLab speaks the Debug Adapter Protocol in ``debug_request``/``debug_reply`` on the control
channel and ``debug_event`` on IOPub. These tests send its sequence (initialize, attach,
debugInfo, dumpCell, setBreakpoints, configurationDone, then execute; stackTrace, scopes,
variables, richInspectVariables, next, continue) through the launcher and its output policy.
"""

from __future__ import annotations

import json

import pytest

from kernel_sandbox.kernelspecs import DOCKER_SPEC, OPENSANDBOX_SPEC, install, shipped_spec, started_client

from support.kernel import debug_a_cell

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


async def test_breakpoint_variables_and_step_through_the_launcher(docker_engine) -> None:
    async with started_client(DOCKER_SPEC, standby=0) as kc:
        await debug_a_cell(kc)


def test_kernelspecs_say_which_have_a_debugger(tmp_path) -> None:
    """JupyterLab greys the debugger toggle out unless the kernelspec's metadata says ``debugger``."""
    assert shipped_spec(DOCKER_SPEC).metadata["debugger"] is True
    assert shipped_spec(OPENSANDBOX_SPEC).metadata["debugger"] is True  # websocket (and auto): ipykernel in the sandbox
    execd = install(OPENSANDBOX_SPEC, prefix=str(tmp_path), install_as="execd-only", config={"mode": "execd"})
    assert json.loads((tmp_path / "share/jupyter/kernels/execd-only/kernel.json").read_text())["metadata"]["debugger"] is False
    docker = install(DOCKER_SPEC, prefix=str(tmp_path))
    assert json.loads((tmp_path / "share/jupyter/kernels" / DOCKER_SPEC / "kernel.json").read_text())["metadata"]["debugger"] is True
    assert execd and docker
