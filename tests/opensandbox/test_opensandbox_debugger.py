"""The debugger on OpenSandbox (issue 25, item 2): JupyterLab's sequence in websocket mode; execd mode says it has none."""

from __future__ import annotations

from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC as KERNEL_NAME
from kernel_sandbox.kernelspecs import started_client

from support.kernel import Debugger, debug_a_cell, reply_to

pytestmark = pytest.mark.timeout(600)


async def test_breakpoint_variables_and_step_in_websocket_mode(deployment: Any, deployment_jupyter_path: Any) -> None:
    deployment.kernelspec(deployment_jupyter_path, "websocket")
    async with started_client(AsyncKernelManager(kernel_name=KERNEL_NAME), timeout=300) as kc:
        await debug_a_cell(kc)


async def test_execd_mode_answers_that_it_has_no_debugger(deployment: Any, deployment_jupyter_path: Any) -> None:
    deployment.kernelspec(deployment_jupyter_path, "execd")
    async with started_client(AsyncKernelManager(kernel_name=KERNEL_NAME), timeout=300) as kc:
        info = (await reply_to(kc.shell_channel, kc.kernel_info()))["content"]
        assert info["debugger"] is False and "debugger" not in info["supported_features"]
        answer = await Debugger(kc).request("initialize", clientID="jupyterlab", adapterID="python")
        assert answer["success"] is False and "mode to 'websocket'" in answer["message"]
        assert answer["command"] == "initialize" and answer["request_seq"] == 1
