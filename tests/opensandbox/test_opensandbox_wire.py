"""The OpenSandbox backend's option model and the kernel websocket's wire formats (no server needed)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.security_figures import examples
from jupyter_server.services.kernels.connection import base as jupyter_wire

from kernel_sandbox.errors import ConfigError, OpenSandboxConfigError, OpenSandboxProtocolError
from kernel_sandbox.opensandbox.jupyter import decode_legacy, decode_v1, encode_legacy, encode_v1
from kernel_sandbox.opensandbox.settings import OPTIONS, OpenSandboxSettings

# ---- settings ---------------------------------------------------------------------------------------


def test_defaults_round_trip_and_the_key_is_never_shown() -> None:
    settings = OpenSandboxSettings.from_config({"api_key": "s3cret", "mode": "EXECD", "timeout": 90})
    assert settings.mode == "execd" and settings.timeout == 90 and settings.renew_every == 30
    assert OpenSandboxSettings.from_config(settings.to_config()) == settings
    assert "s3cret" not in repr(settings)
    json.dumps(settings.to_config())


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"moed": "execd"}, "'moed' (did you mean 'mode'?)"),
        ({"fresh_sandbox_on_restart": True}, "has no option 'fresh_sandbox_on_restart'"),
        ({"mode": "ws"}, "mode='ws': must be one of auto, websocket, execd"),
        ({"timeout": 30}, "timeout=30: must be a whole number from 60"),
        ({"timeout": "300"}, "timeout='300'"),
        ({"api_base": "localhost:8080"}, "api_base='localhost:8080': must be an http:// or https:// URL"),
        ({"entrypoint": "/start.sh"}, "entrypoint='/start.sh': must be a non-empty list"),
        ({"resource_limits": {"cpu": 1}}, "resource_limits="),
        ({"metadata": {"opensandbox.io/id": "x"}}, "opensandbox.io/ is reserved"),
        ({"metadata": {"team": "a b"}}, "must be a label value"),
        ({"env": {"KERNEL_SANDBOX_X": "1"}}, "kernel-sandbox's own"),
        ({"allow_internet": "yes"}, "allow_internet='yes': must be true or false"),
        ({"network_policy": ["deny"]}, "network_policy="),
        ({"jupyter_port": 0}, "jupyter_port=0"),
        ({"max_output_bytes": 10}, "max_output_bytes=10"),
        ({"output_policy": "lax"}, "output_policy='lax': must be one of strict, trusted"),
        ({"allow_mime_types": "text/x-mine"}, "allow_mime_types='text/x-mine': must be a list of names"),
        ({"allow_widget_modules": [""]}, "allow_widget_modules=['']: every name must be a non-empty string"),
        ({"ready_timeout": -1}, "ready_timeout=-1"),
        ({"api_key": 12}, "api_key='***'"),
    ],
)
@pytest.mark.security("fault", "options")
def test_a_bad_option_is_refused_naming_it(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        OpenSandboxSettings.from_config(config)
    assert named in str(info.value)


def test_the_output_policy_options_are_the_docker_backends_and_reach_the_launchers_policy() -> None:
    from kernel_sandbox.launch import output_policy
    from kernel_sandbox.docker.settings import OPTIONS as DOCKER_OPTIONS

    for name in ("output_policy", "allow_mime_types", "allow_widget_modules"):
        assert OPTIONS[name].metadata == DOCKER_OPTIONS[name].metadata, name
    config = {"output_policy": "Strict", "allow_mime_types": ["application/x-mine"], "allow_widget_modules": ["my-widgets"]}
    settings = OpenSandboxSettings.from_config(config)
    assert OpenSandboxSettings.from_config(settings.to_config()) == settings
    policy = output_policy(settings)
    assert policy.mode == "strict" and "application/x-mine" in policy.passed_mime_types
    assert "my-widgets" in policy.widget_modules
    assert output_policy(OpenSandboxSettings.from_config({"output_policy": "trusted"})).mode == "trusted"


def test_every_option_has_help_and_a_default_that_parses() -> None:
    for name, option in OPTIONS.items():
        assert option.metadata["help"], name
        OpenSandboxSettings.from_config({name: option.metadata["default"]})


def test_the_api_base_and_key_come_from_the_environment_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE", raising=False)
    with pytest.raises(OpenSandboxConfigError, match="OPEN_SANDBOX_API_BASE"):
        OpenSandboxSettings.from_config({}).resolved()
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "from-env")
    resolved = OpenSandboxSettings.from_config({}).resolved()
    assert (resolved.api_base, resolved.api_key) == ("http://127.0.0.1:9/v1", "from-env")
    own = OpenSandboxSettings.from_config({"api_base": "http://127.0.0.1:8/v1", "api_key": ""}).resolved()
    assert (own.api_base, own.api_key) == ("http://127.0.0.1:8/v1", "")


# ---- wire formats: the same bytes as jupyter_server's own functions ----------------------------------

PARTS = [
    json.dumps({"msg_id": "m1", "msg_type": "execute_request", "session": "s", "username": "u", "date": "", "version": "5.4"}).encode(),
    json.dumps({"msg_id": "p"}).encode(),
    b"{}",
    json.dumps({"code": "print('\u00e9')"}, ensure_ascii=False).encode(),
]


@pytest.mark.parametrize("buffers", [[], [b"\x00\x01", b""], [b"x" * 70_000]])
def test_v1_matches_jupyter_server(buffers: list[bytes]) -> None:
    parts = [*PARTS, *buffers]
    frame = encode_v1("shell", parts)
    assert frame == jupyter_wire.serialize_msg_to_ws_v1(parts, "shell")
    assert decode_v1(frame) == ("shell", parts)
    assert decode_v1(jupyter_wire.serialize_msg_to_ws_v1(parts, "iopub")) == ("iopub", parts)


@pytest.mark.parametrize("buffers", [[], [b"\x00\x01", b"abc"]])
def test_legacy_matches_jupyter_server(buffers: list[bytes]) -> None:
    parts = [*PARTS, *buffers]
    frame = encode_legacy("control", parts)
    message = jupyter_wire.deserialize_binary_message(frame) if buffers else json.loads(frame)
    assert message["channel"] == "control" and message["content"] == {"code": "print('\u00e9')"}
    assert message["header"]["msg_id"] == "m1" and message.get("buffers", []) == buffers
    server_side = {**message, "buffers": buffers}
    framed = jupyter_wire.serialize_binary_message(server_side) if buffers else json.dumps(server_side)
    channel, decoded = decode_legacy(framed)
    assert channel == "control" and decoded[4:] == buffers
    assert [json.loads(part) for part in decoded[:4]] == [json.loads(part) for part in parts[:4]]


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        struct.pack("<Q", 2**62),
        struct.pack("<Q", 7) + b"\x00" * 8,
        struct.pack("<7Q", 6, 56, 61, 61, 61, 61, 10**9),
        encode_v1("shell", PARTS)[:-1],
        encode_v1("shell", PARTS).replace(b"shell", b"hello"),
    ],
)
@pytest.mark.security("attack", "opensandbox")
def test_hostile_v1_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(OpenSandboxProtocolError):
        decode_v1(frame)


@pytest.mark.parametrize(
    "frame",
    [
        "[]",
        "{",
        "[" * 100_000,
        json.dumps({"channel": "shell", "header": {}, "parent_header": {}, "metadata": {}}),
        json.dumps({"channel": "elsewhere", "header": {}, "parent_header": {}, "metadata": {}, "content": {}}),
        b"\x00\x00\x00\x02\x00\x00\x00\x0c\x00\x00\x00\x04",
        struct.pack("!I", 2**31),
    ],
)
@pytest.mark.security("attack", "opensandbox")
def test_hostile_legacy_frames_are_refused(frame: str | bytes) -> None:
    with pytest.raises(OpenSandboxProtocolError):
        decode_legacy(frame)


@pytest.mark.security("fuzz", "opensandbox")
@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=400) | st.builds(lambda n, rest: struct.pack("<Q", n) + rest, st.integers(0, 2**64 - 1), st.binary(max_size=200)))
def test_any_bytes_decode_or_are_refused(frame: bytes) -> None:
    for decode in (decode_v1, decode_legacy):
        try:
            channel, parts = decode(frame)
        except OpenSandboxProtocolError:
            continue
        assert channel in ("shell", "control", "stdin", "iopub") and all(isinstance(p, bytes) for p in parts)
        assert sum(map(len, parts)) <= len(frame) * 2 + 64


@settings(max_examples=examples(100), deadline=None)
@given(
    st.sampled_from(["shell", "control", "stdin", "iopub"]),
    st.lists(st.binary(max_size=50), max_size=5),
)
def test_v1_round_trips_any_parts(channel: str, buffers: list[bytes]) -> None:
    parts = [*PARTS, *buffers]
    assert decode_v1(encode_v1(channel, parts)) == (channel, parts)
