"""jupyter_kernel_test, the Jupyter project's conformance suite, on the OpenSandbox kernel in websocket mode.

The kernelspec is configured for the published server the harness runs (the code-interpreter stand-in,
whose Jupyter server the launcher reaches by websocket); the same suite runs on a local ``python3``
beside it in tests/docker_kernel/test_conformance.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from support import conformance
import pytest

from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC as KERNEL_NAME

pytestmark = [pytest.mark.opensandbox_server, pytest.mark.usefixtures("websocket_spec")]


@pytest.fixture(scope="module")
def websocket_spec(opensandbox_deployment: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The OpenSandbox kernelspec in websocket mode on the test deployment, alone on JUPYTER_PATH."""
    data_dir = tmp_path_factory.mktemp("opensandbox-conformance")
    opensandbox_deployment.kernelspec(data_dir, "websocket")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JUPYTER_PATH", str(data_dir))
        env.setenv("OPEN_SANDBOX_API_KEY", opensandbox_deployment.api_key)
        env.delenv("OPEN_SANDBOX_API_BASE", raising=False)
        yield
    left = opensandbox_deployment.live_sandboxes()
    assert not left, f"sandboxes left behind by the conformance suite: {[s.get('id') for s in left]}"


class TestOpenSandboxWebsocket(conformance.PythonKernelTests):
    """The OpenSandbox kernelspec, websocket mode, through its provisioner."""

    kernel_name = KERNEL_NAME
