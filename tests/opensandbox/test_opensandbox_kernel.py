"""The OpenSandbox provisioner's error paths, on the in-process fakes (opensandbox_fakes.py).

Everything the published server can show runs against it in test_opensandbox_server.py; here
stay the cases it cannot produce on demand: a sandbox that fails or expires under a live kernel,
an execd that refuses the advertised token, and configuration errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager
from opensandbox_fakes import FakeOpenSandbox
from traitlets.config import Config

from kernel_sandbox.opensandbox.client import OpenSandboxAPIError, OpenSandboxConfigError
from kernel_sandbox.opensandbox.settings import RelaySettings
from kernel_sandbox.provisioners.opensandbox import OpenSandboxProvisioner

FAST = {"poll_interval": 0.05, "state_check_interval": 0.0}


def manager(kernel_name: str, **options: Any) -> AsyncKernelManager:
    return AsyncKernelManager(kernel_name=kernel_name, config=Config({"OpenSandboxProvisioner": {**FAST, **options}}))


@pytest.fixture
async def kernel(opensandbox_kernelspec: str) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    km = manager(opensandbox_kernelspec)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    yield km, kc
    kc.stop_channels()
    await km.shutdown_kernel(now=True)


async def test_kernel_info_subshells_and_is_complete(kernel: tuple[AsyncKernelManager, Any]) -> None:
    _, kc = kernel
    info = await kc.kernel_info(reply=True, timeout=60)
    assert info["content"]["implementation"] == "kernel-sandbox-opensandbox"
    assert info["content"]["supported_features"] == []
    kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
    refused = await kc.control_channel.get_msg(timeout=60)
    assert refused["msg_type"] == "create_subshell_reply" and refused["content"]["status"] == "error"
    is_complete = await kc.is_complete("for i in range(3):", reply=True, timeout=60)
    assert is_complete["content"]["status"] == "incomplete"


@pytest.mark.parametrize("how", ["Failed", "Terminated"])
async def test_poll_follows_the_sandbox(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox, how: str
) -> None:
    km, _ = kernel
    assert await km.is_alive()
    fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id].state = how
    assert not await km.is_alive()
    await asyncio.wait_for(km.provisioner.wait(), 30)


@pytest.mark.parametrize("state", ["Unknown"])
async def test_an_unknown_state_is_not_declared_dead(
    kernel: tuple[AsyncKernelManager, Any], fake_opensandbox: FakeOpenSandbox, state: str
) -> None:
    km, _ = kernel
    fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id].state = state
    assert await km.is_alive()
    fake_opensandbox.lifecycle.sandboxes[km.provisioner.sandbox_id].state = "Running"


async def test_failed_launch_deletes_the_sandbox(
    opensandbox_kernelspec: str, fake_opensandbox: FakeOpenSandbox
) -> None:
    """A wrong execd token makes readiness fail after the sandbox exists."""
    deleted_before = len(fake_opensandbox.lifecycle.deleted)
    fake_opensandbox.lifecycle.advertised_token = "wrong"
    with pytest.raises(OpenSandboxAPIError, match="401"):
        await manager(opensandbox_kernelspec).start_kernel()
    assert len(fake_opensandbox.lifecycle.deleted) == deleted_before + 1
    assert not fake_opensandbox.lifecycle.live()


async def test_missing_api_base_is_a_clear_error(opensandbox_kernelspec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE")
    with pytest.raises(OpenSandboxConfigError, match="OPEN_SANDBOX_API_BASE"):
        await manager(opensandbox_kernelspec).start_kernel()


def test_options_come_from_kernelspec_config_and_traitlets() -> None:
    from_config = OpenSandboxProvisioner(config=Config({"OpenSandboxProvisioner": {"image": "img:1", "timeout": 900}}))
    assert (from_config.image, from_config.timeout) == ("img:1", 900)
    from_kwargs = OpenSandboxProvisioner(image="img:2", allow_internet=True, resource_limits={"cpu": "2"})
    assert (from_kwargs.image, from_kwargs.allow_internet, from_kwargs.resource_limits) == ("img:2", True, {"cpu": "2"})
    first, second = OpenSandboxProvisioner(), OpenSandboxProvisioner()
    first.resource_limits["cpu"] = "64"
    assert second.resource_limits == {"cpu": "1", "memory": "2Gi"}


def test_relay_settings_travel_through_the_environment() -> None:
    settings = RelaySettings(
        execd_url="http://127.0.0.1:1",
        context_id="ctx",
        execd_headers={"X-EXECD-ACCESS-TOKEN": "t"},
        sandbox_id="sbx",
        api_base="http://127.0.0.1:2/v1",
        api_key="k",
        renew_seconds=300,
        renew_interval=1.5,
        max_output_bytes=10,
        request_timeout=3.0,
        max_response_bytes=20,
        interrupt_grace=2.5,
    )
    assert RelaySettings.from_env(settings.to_env()) == settings
