"""The policy's small surface: modes by name, the cheap predicate, configuration errors."""

from __future__ import annotations


import pytest

from kernel_sandbox.errors import ConfigError, KernelSandboxError
from kernel_sandbox.policy.output import MODES, OutputPolicy


def test_modes_by_name() -> None:
    assert MODES == ("strict", "trusted")
    assert OutputPolicy().mode == "strict"
    assert OutputPolicy.from_name(None).mode == "strict" and OutputPolicy.from_name("").mode == "strict"
    assert OutputPolicy.from_name(" Trusted ").mode == "trusted"
    assert repr(OutputPolicy.from_name("strict", allow_mime_types=["application/vnd.x+json"])) == "OutputPolicy('strict', extra=['application/vnd.x+json'])"


@pytest.mark.parametrize("bad", ["off", "none", "permissive", 1, True])
def test_unknown_mode_is_a_config_error_naming_the_option(bad) -> None:
    with pytest.raises(ConfigError, match="output_policy") as caught:
        OutputPolicy.from_name(bad)
    assert isinstance(caught.value, KernelSandboxError)


def test_strict_inspects_every_message_type() -> None:
    """Strict decides on the canonical form of every message (its header too): no type is skipped unparsed."""
    strict = OutputPolicy()
    for msg_type in ("status", "execute_input", "clear_output", "shutdown_reply", "stream", "display_data", "pyout", "x"):
        assert strict.inspects(msg_type)
    content = {"name": "stdout", "text": "plain output\n" * 100}
    assert strict.filter("stream", content) is content  # untouched: the kernel's own bytes go on


def test_trusted_inspects_only_outputs_to_mark_and_replies_that_act_on_the_server() -> None:
    trusted = OutputPolicy("trusted")
    assert not any(trusted.inspects(t) for t in ("comm_open", "comm_msg", "stream", "status", "error"))
    assert all(trusted.inspects(t) for t in ("display_data", "update_display_data", "execute_result", "kernel_info_reply", "execute_reply"))
    content = {"data": {"application/javascript": "alert(1)"}, "metadata": {"kernel_sandbox": {"framed": False}}}
    out = trusted.filter("display_data", content)
    assert out["data"] is content["data"] and out["metadata"] == {"kernel_sandbox": {"framed": True}}
    stream = {"name": "stdout", "text": "x"}
    assert trusted.filter("stream", stream) is stream


def test_allow_mime_types_extends_the_allow_list() -> None:
    content = {"data": {"application/vnd.my-chart+json": {"x": [1]}}, "metadata": {}}
    assert "application/vnd.my-chart+json" not in OutputPolicy().filter("display_data", content)["data"]
    assert OutputPolicy(allow_mime_types=["application/vnd.my-chart+json"]).filter("display_data", content)["data"] is content["data"]


def test_malformed_content_does_not_raise() -> None:
    policy = OutputPolicy()
    for msg_type, content in [
        ("display_data", {"data": "x"}), ("display_data", {"data": {"text/html": None}, "metadata": 3}),
        ("error", {"traceback": "x"}), ("comm_open", {"target_name": "jupyter.widget", "data": {"state": 1}}),
        ("comm_msg", {"comm_id": 1, "data": {"method": "update", "state": []}}), ("execute_reply", {"payload": [1, {"source": "page"}]}),
        ("kernel_info_reply", {"help_links": [1, None]}), ("debug_reply", {"body": []}), ("stream", {"text": 5}),
        ("comm_msg", {"comm_id": "c", "data": {"method": "update_states", "states": {"m": 1, "n": {"state": {}}}}}),
    ]:
        policy.filter(msg_type, content)


def test_traitlets_option() -> None:
    from traitlets import TraitError

    from kernel_sandbox.docker.provisioner import DockerProvisioner as Provisioner

    assert Provisioner().output_policy == "strict"
    assert Provisioner(output_policy="TRUSTED").output_policy == "trusted"
    assert OutputPolicy.from_name(Provisioner(output_policy="Trusted").output_policy).mode == "trusted"
    with pytest.raises(TraitError):
        Provisioner(output_policy="off")


def test_untouched_messages_are_the_same_objects() -> None:
    policy = OutputPolicy()
    for msg_type, content in [
        ("inspect_reply", {"status": "ok", "found": False, "data": {}, "metadata": {}}),
        ("error", {"ename": "E", "evalue": "v", "traceback": ["a", "b"]}),
        ("execute_reply", {"status": "ok", "payload": [{"source": "page", "data": {"text/plain": "doc"}, "start": 0}]}),
    ]:
        assert policy.filter(msg_type, content) is content, msg_type


def test_display_outputs_keep_their_values_and_gain_only_the_mark() -> None:
    policy = OutputPolicy()
    for msg_type, content in [
        ("display_data", {"data": {"text/plain": "x", "application/json": ["a", "b"]}, "metadata": {}}),
        ("execute_result", {"data": {"image/png": "iVBOR"}, "execution_count": 1}),  # no metadata at all
    ]:
        out = policy.filter(msg_type, content)
        assert out["data"] is content["data"] and out["metadata"] == {"kernel_sandbox": {"framed": True}}, msg_type
