"""What server 1.1.1 answers at scale, read from its wheel (issue 28 item 1), as client rules.

The Docker runtime the harness runs cannot produce these answers, so they are sent here with the
server's exact bodies and headers (httpx.MockTransport, no network):

* pool capacity (``services/k8s/kubernetes_service.py``, ``_pool_capacity_exhausted_error``):
  **429** ``{"code": "KUBERNETES::POOL_CAPACITY_EXHAUSTED", "message": "No Pool capacity became
  available before the acquisition timeout."}`` with ``Retry-After: <ceil(acquisition timeout)>``;
  the fast-sandbox runtime answers 429 with ``Retry-After: 1``;
* quota (``services/k8s/error_helpers.py``, ``_build_quota_exceeded_error``): **403**
  ``{"code": "KUBERNETES::QUOTA_EXCEEDED", "message": "Namespace ResourceQuota exceeded: <the
  Kubernetes message>"}``;
* signed endpoints (``api/lifecycle.py``, ``services/docker/networking.py``): the Docker runtime
  answers ``?expires=`` with **400** ``SANDBOX::API_NOT_SUPPORTED`` "Signed routes (expires
  parameter) are not supported when runtime.type='docker'. ..."; the same fallback runs against
  the real server in test_opensandbox_scale_server.py.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.security_figures import examples

from kernel_sandbox.errors import (
    ConfigError,
    KernelSandboxError,
    OpenSandboxAPIError,
    SandboxCapacityError,
    SandboxError,
    SandboxQuotaExceeded,
    SandboxTimeoutError,
)
from kernel_sandbox.execution.adapters import adapter
from kernel_sandbox.opensandbox import client as client_module
from kernel_sandbox.opensandbox import execd as execd_module
from kernel_sandbox.opensandbox import http as http_module
from kernel_sandbox.opensandbox import lifecycle as lifecycle_module
from kernel_sandbox.opensandbox.http import CAPACITY_MAX_DELAY, retry_after
from kernel_sandbox.opensandbox.lifecycle import build_create_body
from kernel_sandbox.opensandbox.settings import OpenSandboxSettings

from test_opensandbox_client import ENDPOINT, Router, created_router, lifecycle, sandbox_json

POOL_EXHAUSTED = {
    "code": "KUBERNETES::POOL_CAPACITY_EXHAUSTED",
    "message": "No Pool capacity became available before the acquisition timeout.",
}
QUOTA = {
    "code": "KUBERNETES::QUOTA_EXCEEDED",
    "message": (
        "Namespace ResourceQuota exceeded: pods \"sbx-1\" is forbidden: exceeded quota: compute-resources, "
        "requested: limits.memory=2Gi, used: limits.memory=8Gi, limited: limits.memory=8Gi"
    ),
}
SIGNED_REFUSED = {
    "code": "SANDBOX::API_NOT_SUPPORTED",
    "message": (
        "Signed routes (expires parameter) are not supported when runtime.type='docker'. "
        "Use the Kubernetes runtime for signed routes."
    ),
}


def capacity(retry: str | None = "2", status: int = 429) -> httpx.Response:
    return httpx.Response(status, json=POOL_EXHAUSTED, headers={"Retry-After": retry} if retry else {})


class Clock:
    """A fake monotonic clock that ``asyncio.sleep`` advances (the client's module only)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000 + self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    for module in (client_module, execd_module, http_module, lifecycle_module):  # the client's modules read the clock
        monkeypatch.setattr(module, "time", fake)
    monkeypatch.setattr(client_module.asyncio, "sleep", fake.sleep)
    return fake


# ---- 429 / 503: no capacity now --------------------------------------------------------------


async def test_429_waits_retry_after_and_then_creates(clock: Clock) -> None:
    router = created_router()
    router.routes[("POST", "/v1/sandboxes")] = [capacity("3"), capacity("1"), sandbox_json("Running", status=202)]
    sandbox = await lifecycle(router, ready_timeout=60).create()
    assert sandbox.id == "osb_1"
    assert clock.sleeps[:2] == [3.0, 1.0]
    assert router.calls()[:3] == [("POST", "/v1/sandboxes")] * 3


async def test_503_with_retry_after_is_retried_too(clock: Clock) -> None:
    router = created_router()
    router.routes[("POST", "/v1/sandboxes")] = [capacity("4", status=503), sandbox_json("Running", status=202)]
    await lifecycle(router, ready_timeout=60).create()
    assert clock.sleeps[0] == 4.0


async def test_without_retry_after_the_waits_double(clock: Clock) -> None:
    router = created_router()
    router.routes[("POST", "/v1/sandboxes")] = [capacity(None)] * 4 + [sandbox_json("Running", status=202)]
    await lifecycle(router, ready_timeout=60).create()
    assert clock.sleeps[:4] == [1.0, 2.0, 4.0, 8.0]


@pytest.mark.security("fault", "opensandbox")
async def test_capacity_that_never_comes_fails_at_the_deadline_saying_so(clock: Clock) -> None:
    router = Router().add("POST", "/v1/sandboxes", capacity("5"))
    with pytest.raises(SandboxCapacityError) as info:
        await lifecycle(router, ready_timeout=12).create()
    error = info.value
    message = str(error)
    assert "429" in message and "KUBERNETES::POOL_CAPACITY_EXHAUSTED" in message
    assert "no capacity" in message and "ready_timeout 12 s" in message and "tried 4 times" in message
    assert error.status_code == 429 and error.code == "KUBERNETES::POOL_CAPACITY_EXHAUSTED"
    assert isinstance(error, OpenSandboxAPIError) and isinstance(error, KernelSandboxError)
    assert clock.sleeps == [5.0, 5.0, 2.0], "the last wait is cut short at the deadline, none goes past it"
    assert all(call == ("POST", "/v1/sandboxes") for call in router.calls()), "nothing was created: nothing to delete"


@pytest.mark.security("attack", "opensandbox")
async def test_a_hostile_retry_after_cannot_stall_the_launch(clock: Clock) -> None:
    router = created_router()
    router.routes[("POST", "/v1/sandboxes")] = [capacity("99999999999999"), sandbox_json("Running", status=202)]
    await lifecycle(router, ready_timeout=600).create()
    assert clock.sleeps[0] == CAPACITY_MAX_DELAY


def test_retry_after_reads_seconds_and_http_dates() -> None:
    soon = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=20), usegmt=True)
    assert 15 <= retry_after(httpx.Response(429, headers={"Retry-After": soon}), 1.0) <= 20
    past = format_datetime(datetime.now(timezone.utc) - timedelta(hours=1), usegmt=True)
    assert retry_after(httpx.Response(429, headers={"Retry-After": past}), 1.0) == 0.0
    assert retry_after(httpx.Response(429, headers={"Retry-After": "7"}), 1.0) == 7.0
    assert retry_after(httpx.Response(429), 1.5) == 1.5


@pytest.mark.security("fuzz", "opensandbox")
@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=80))
def test_any_retry_after_gives_a_bounded_wait(value: str) -> None:
    try:
        response = httpx.Response(429, headers={"Retry-After": value})
    except (ValueError, UnicodeEncodeError):
        return  # not a header value httpx can carry
    wait = retry_after(response, 1.0)
    assert 0.0 <= wait <= CAPACITY_MAX_DELAY


# ---- 403 quota -------------------------------------------------------------------------------


@pytest.mark.security("fault", "opensandbox")
async def test_quota_exceeded_is_a_typed_error_naming_the_quota(clock: Clock) -> None:
    router = Router().add("POST", "/v1/sandboxes", httpx.Response(403, json=QUOTA))
    with pytest.raises(SandboxQuotaExceeded) as info:
        await lifecycle(router, ready_timeout=60).create()
    assert info.value.quota == "compute-resources"
    assert "compute-resources" in str(info.value) and "quota for sandboxes is used up" in str(info.value)
    assert clock.sleeps == [] and len(router.requests) == 1, "a quota does not free itself: no retry"


async def test_other_403s_stay_plain_api_errors() -> None:
    router = Router().add("POST", "/v1/sandboxes", httpx.Response(403, json={"code": "FORBIDDEN", "message": "no"}))
    with pytest.raises(OpenSandboxAPIError) as info:
        await lifecycle(router).create()
    assert not isinstance(info.value, SandboxQuotaExceeded)


# ---- states the client does not know -----------------------------------------------------------


@pytest.mark.security("fault", "opensandbox")
async def test_unknown_states_are_waited_through_and_logged_once(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    router = created_router()
    router.routes[("POST", "/v1/sandboxes")] = [sandbox_json("Allocating", status=202)]
    router.add(
        "GET", "/v1/sandboxes/osb_1",
        sandbox_json("Allocating"), sandbox_json("Allocating"), httpx.Response(200, json={"id": "osb_1", "status": {}}),
        sandbox_json("Running"),
    )
    with caplog.at_level(logging.WARNING, logger="kernel_sandbox.opensandbox.client"):
        sandbox = await lifecycle(router, ready_timeout=60).create()
    assert sandbox.state == "Running"
    notes = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(notes) == 2 and "'Allocating'" in notes[0] and "None" in notes[1], notes


async def test_an_unknown_state_forever_is_a_timeout_naming_it(clock: Clock) -> None:
    router = (
        Router()
        .add("POST", "/v1/sandboxes", sandbox_json("Hibernating", status=202))
        .add("GET", "/v1/sandboxes/osb_1", sandbox_json("Hibernating"))
        .add("DELETE", "/v1/sandboxes/osb_1", httpx.Response(204))
    )
    with pytest.raises(SandboxTimeoutError, match="last state Hibernating"):
        await lifecycle(router, poll_interval=1, ready_timeout=5).create()
    assert router.calls()[-1] == ("DELETE", "/v1/sandboxes/osb_1")


# ---- pause / resume ----------------------------------------------------------------------------


async def test_pause_and_resume_wait_for_their_states(clock: Clock) -> None:
    router = (
        Router()
        .add("POST", "/v1/sandboxes/osb_1/pause", httpx.Response(202))
        .add("POST", "/v1/sandboxes/osb_1/resume", httpx.Response(202))
        .add("GET", "/v1/sandboxes/osb_1", sandbox_json("Pausing"), sandbox_json("Paused"), sandbox_json("Resuming"),
             sandbox_json("Running"))
    )
    client = lifecycle(router, poll_interval=0.5, ready_timeout=60)
    assert (await client.pause("osb_1"))["status"]["state"] == "Paused"
    assert (await client.resume("osb_1"))["status"]["state"] == "Running"
    assert [c for c in router.calls() if c[0] == "POST"] == [
        ("POST", "/v1/sandboxes/osb_1/pause"), ("POST", "/v1/sandboxes/osb_1/resume")
    ]


# ---- volumes and extensions ------------------------------------------------------------------


VOLUMES = [
    {"name": "data", "pvc": {"claimName": "team-data", "createIfNotExists": False}, "mountPath": "/data", "readOnly": True},
    {"name": "ref", "host": {"path": "/srv/reference"}, "mountPath": "/ref", "subPath": "v1"},
]


def test_volumes_and_extensions_go_into_the_create_body_as_given() -> None:
    settings = OpenSandboxSettings.from_config(
        {"volumes": VOLUMES, "extensions": {"poolRef": "python-pool", "access.renew.extend.seconds": "600"},
         "allow_internet": True}
    )
    body = build_create_body(volumes=list(settings.volumes), extensions=settings.extensions, allow_internet=True)
    assert body["volumes"] == VOLUMES
    assert body["extensions"] == {"poolRef": "python-pool", "access.renew.extend.seconds": "600"}
    body["volumes"][0]["pvc"]["claimName"] = "changed"
    assert settings.volumes[0]["pvc"]["claimName"] == "team-data", "the body is a copy"
    assert "volumes" not in build_create_body() and "extensions" not in build_create_body()
    assert OpenSandboxSettings.from_config(settings.to_config()) == settings


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"volumes": {"name": "data"}}, "volumes=.*must be a list"),
        ({"volumes": ["data:/data"]}, r"volumes\[0\].*must be a mapping"),
        ({"volumes": [{"name": "Data", "pvc": {"claimName": "d"}, "mountPath": "/d"}]}, "lowercase name"),
        ({"volumes": [{"name": "d", "mountPath": "/d"}]}, "exactly one of host, pvc, ossfs"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d"}, "host": {"path": "/x"}, "mountPath": "/d"}]},
         "exactly one"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d"}, "mountPath": "d"}]}, "mountPath must be an absolute"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d"}, "mountPath": "/d/../../etc"}]}, "without '..'"),
        ({"volumes": [{"name": "d", "host": {"path": "/srv/../etc"}, "mountPath": "/d"}]}, "host.path"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d"}, "mountPath": "/d", "subPath": "../up"}]}, "subPath"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d"}, "mountPath": "/d", "readonly": True}]},
         "no field 'readonly'"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d", "size": "1Gi"}, "mountPath": "/d"}]}, "pvc has no field"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d", "storage": "lots"}, "mountPath": "/d"}]}, "pvc.storage"),
        ({"volumes": [{"name": "d", "pvc": {}, "mountPath": "/d"}]}, "pvc.claimName is required"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d"}, "mountPath": "/d"}] * 2}, "used twice"),
        ({"volumes": [{"name": "d", "pvc": {"claimName": "d"}, "mountPath": "/d", "readOnly": "yes"}]}, "readOnly"),
        ({"extensions": ["poolRef"]}, "extensions=.*mapping"),
        ({"extensions": {"poolRef": 3}}, "keys and values must be non-empty strings"),
        ({"extensions": {"access.renew.extend.seconds": "60"}}, "from 300 to 86400"),
        ({"extensions": {"bootstrap.execd.isolation": "enable"}}, "CAP_SYS_ADMIN"),
        ({"extensions": {"poolRef": "pool"}}, "poolRef cannot be combined with a networkPolicy"),
        ({"extensions": {"poolRef": "pool"}, "allow_internet": True, "network_policy": {"defaultAction": "deny"}},
         "poolRef cannot be combined"),
        ({"signed_endpoints": -1}, "signed_endpoints"),
    ],
)
@pytest.mark.security("attack", "options")
def test_volumes_and_extensions_are_checked_naming_the_option(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OpenSandboxSettings.from_config(config)


@pytest.mark.security("attack", "options")
def test_ossfs_secrets_never_appear_in_errors_or_repr() -> None:
    secret = "s3cr3t-value"
    volume = {
        "name": "oss", "mountPath": "/oss",
        "ossfs": {"bucket": "bkt", "endpoint": "oss.example", "accessKeyId": "id", "accessKeySecret": secret},
    }
    settings = OpenSandboxSettings.from_config({"volumes": [volume]})
    assert secret not in repr(settings)
    with pytest.raises(ConfigError) as info:
        OpenSandboxSettings.from_config({"volumes": [{**volume, "mountPath": "relative"}]})
    assert secret not in str(info.value)
    with pytest.raises(ConfigError, match="accessKeySecret is required"):
        OpenSandboxSettings.from_config({"volumes": [{**volume, "ossfs": {"bucket": "bkt", "endpoint": "e", "accessKeyId": "i"}}]})


# ---- signed endpoints ----------------------------------------------------------------------------


async def test_signed_endpoints_are_asked_for_with_expires() -> None:
    signed = {"endpoint": "gateway.example/osb_1-44772-lz4k0g-5f0c9d2a", "headers": {}}
    router = Router().add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json=signed))
    client = lifecycle(router, signed_endpoints=600)
    endpoint = await client.endpoint("osb_1")
    assert endpoint.url == "http://gateway.example/osb_1-44772-lz4k0g-5f0c9d2a"
    expires = int(router.requests[0].url.params["expires"])
    assert 590 <= expires - datetime.now(timezone.utc).timestamp() <= 610


async def test_a_server_without_signed_endpoints_is_used_plainly_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    router = Router().add(
        "GET", "/v1/sandboxes/osb_1/endpoints/44772",
        httpx.Response(400, json=SIGNED_REFUSED), httpx.Response(200, json=ENDPOINT),
    )
    client = lifecycle(router, signed_endpoints=600)
    with caplog.at_level(logging.WARNING, logger="kernel_sandbox.opensandbox.client"):
        assert (await client.endpoint("osb_1")).url == "http://127.0.0.1:40123/proxy/44772"
        assert (await client.endpoint("osb_1")).url == "http://127.0.0.1:40123/proxy/44772"
    assert "expires" in router.requests[0].url.params
    assert all("expires" not in r.url.params for r in router.requests[1:])
    assert len([r for r in caplog.records if "no signed endpoints" in r.getMessage()]) == 1


async def test_signed_endpoints_are_never_asked_through_the_server_proxy() -> None:
    router = Router().add("GET", "/v1/sandboxes/osb_1/endpoints/44772", httpx.Response(200, json=ENDPOINT))
    await lifecycle(router, signed_endpoints=600, use_server_proxy=True).endpoint("osb_1")
    assert "expires" not in router.requests[0].url.params


async def test_backends_that_cannot_pause_say_so() -> None:
    for name in ("docker", "local"):
        with pytest.raises(SandboxError, match="cannot pause a kernel; pause\\(\\) and resume\\(\\) are for the opensandbox"):
            await adapter(name).pause(None, True)
