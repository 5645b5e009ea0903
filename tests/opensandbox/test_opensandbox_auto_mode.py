"""``mode: auto`` falls back to execd after ``jupyter_wait`` whatever the Jupyter port's endpoint lookup does.

A deployment that hands out no endpoint for port 44771 answers 404 (on Kubernetes
``KUBERNETES::POD_IP_NOT_AVAILABLE``, the server's body for an endpoint it cannot give), another 500
(``SANDBOX::INTERNAL_ERROR``), another hangs: the fakes answer so for that port only, execd's port
as the published server does. ``ready_timeout`` is far longer than the test may take, so only the
fallback after ``jupyter_wait`` lets the kernel start in time.
"""

from __future__ import annotations

from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager
from support.opensandbox_fakes import FakeOpenSandbox
from traitlets.config import Config

from kernel_sandbox.kernelspecs import started_client
from kernel_sandbox.opensandbox.relay import IMPLEMENTATION
from kernel_sandbox.opensandbox.settings import JUPYTER_PORT

NOT_AVAILABLE = (
    404,
    {"code": "KUBERNETES::POD_IP_NOT_AVAILABLE", "message": "Pod IP is not yet available. The Pod may still be starting."},
)
INTERNAL = (500, {"code": "SANDBOX::INTERNAL_ERROR", "message": "An unexpected error occurred."})
FALLBACK = "using execd's /code instead"


@pytest.mark.security("fault", "opensandbox")
@pytest.mark.parametrize("answer", [NOT_AVAILABLE, INTERNAL, 3600.0], ids=["404", "500", "hangs"])
async def test_auto_mode_falls_back_to_execd_whatever_the_endpoint_lookup_does(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox, capfd: pytest.CaptureFixture[str], answer: Any
) -> None:
    fake_opensandbox.lifecycle.endpoint_answers[JUPYTER_PORT] = answer
    options = {"mode": "auto", "jupyter_wait": 1.0, "ready_timeout": 3600.0, "poll_interval": 0.05}
    km = AsyncKernelManager(kernel_name=opensandbox_kernelspec, config=Config({"OpenSandboxProvisioner": options}))
    async with started_client(km, timeout=60) as kc:
        info = (await kc.kernel_info(reply=True, timeout=60))["content"]
        assert info["implementation"] == IMPLEMENTATION
        msg_id = kc.execute("6 * 7")
        reply = await kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
    lookups = [uri for method, uri in fake_opensandbox.lifecycle.requests if f"/endpoints/{JUPYTER_PORT}" in uri]
    assert lookups, "the launcher never asked for the Jupyter port"
    said = capfd.readouterr().err.count(FALLBACK)
    assert said == 1, f"the fallback should be said once, it was said {said} times"
