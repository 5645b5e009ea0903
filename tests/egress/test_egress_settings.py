"""The ``network`` option's three forms and ``package_index``, checked by the settings model, the CLI and Sandbox."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from kernel_sandbox.cli import build_parser
from kernel_sandbox.cli.arguments import install_config
from kernel_sandbox.egress import package_index, parse_network
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import AsyncSandbox, Sandbox
from kernel_sandbox.execution.adapters import kernel_spec
from kernel_sandbox.docker.settings import DockerSettings


def test_the_three_forms_normalise_and_round_trip() -> None:
    assert DockerSettings.from_config({}).network is False
    assert DockerSettings.from_config({"network": True}).network is True
    assert DockerSettings.from_config({"network": []}).network is False
    listed = DockerSettings.from_config(
        {"network": ["PyPI.org", "*.Example.com:443", "mirror.corp@10.1.2.3", "10.1.2.3:8080", "[fd00::1]:443", "pypi.org"]}
    )
    assert listed.network == ("pypi.org", "*.example.com:443", "mirror.corp@10.1.2.3/32", "10.1.2.3:8080", "[fd00::1]:443")
    assert DockerSettings.from_config(listed.to_config()) == listed
    assert json.loads(json.dumps(listed.to_config()))["network"] == list(listed.network)


@pytest.mark.parametrize(
    "value, message",
    [
        ("yes", "network='yes'"),
        ("pypi.org", "network='pypi.org'"),
        ({"pypi.org": True}, "network={'pypi.org': True}"),
        ([None], "network: None"),
        ([""], "network: ''"),
        (["https://pypi.org/simple"], "not a URL"),
        (["pypi.org/simple"], "not a URL"),
        (["pypi org"], "not a URL"),
        (["*"], "'*'"),
        (["*.org"], "too broad"),
        (["a.*.org"], "'a.*.org'"),
        (["pypi.org:"], "malformed port"),
        (["pypi.org:0"], "malformed port"),
        (["pypi.org:65536"], "malformed port"),
        (["pypi.org:+1"], "malformed port"),
        (["pypi.org:443:1"], "'pypi.org:443:1'"),
        (["-pypi.org"], "not a host name"),
        (["pypi..org"], "not a host name"),
        (["a" * 64 + ".org"], "not a host name"),
        (["pyp\u00ef.org"], "not a host name"),
        (["pypi.org\nevil.test"], "not a URL"),
        (["1.2.3"], "not a host name"),
        (["mirror@"], "names no address"),
        (["mirror@corp"], "'corp' after '@'"),
        (["[::1"], "malformed port"),
        (["x.org"] * 300, "at most 256"),
    ],
)
@pytest.mark.security("attack", "options")
def test_a_malformed_entry_is_a_config_error_naming_it(value, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        DockerSettings.from_config({"network": value})


@pytest.mark.security("fuzz", "options")
@given(st.lists(st.text(max_size=30), max_size=5))
def test_any_list_of_strings_is_either_refused_or_canonical(entries: list[str]) -> None:
    try:
        canonical = parse_network("network", entries)
    except ConfigError:
        return
    assert canonical is False or parse_network("network", list(canonical)) == canonical


def test_package_index_takes_a_mirror_url_or_destinations() -> None:
    default = package_index("package_index", DockerSettings.from_config({}).package_index)
    assert [str(d) for d in default.destinations] == ["pypi.org", "files.pythonhosted.org"] and default.url is None
    mirror = DockerSettings.from_config({"package_index": "https://pypi.corp.example:8443/simple"}).package_index
    index = package_index("package_index", mirror)
    assert index.url == "https://pypi.corp.example:8443/simple" and [str(d) for d in index.destinations] == ["pypi.corp.example:8443"]
    for bad in ([], "ftp://x/simple", "https://user@x/simple", ["https://a/simple", "https://b/simple"], ["bad host"]):
        with pytest.raises(ConfigError, match="package_index"):
            DockerSettings.from_config({"package_index": bad})


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["install", *argv])


def test_install_allow_writes_the_list() -> None:
    assert install_config(_args("--allow", "pypi.org", "--allow", "*.example.com:443"))["network"] == [
        "pypi.org", "*.example.com:443",
    ]
    assert install_config(_args("--allow-package-index"))["network"] == ["pypi.org", "files.pythonhosted.org"]
    mirror = install_config(_args("--allow-package-index", "--set", 'package_index="https://pypi.corp.example/simple"'))
    assert mirror["network"] == ["pypi.corp.example:443"]
    with pytest.raises(ConfigError, match="both set the network"):
        install_config(_args("--network", "--allow", "pypi.org"))


def test_install_refuses_a_malformed_allow_naming_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli", "install", "--prefix", str(tmp_path), "--allow", "https://pypi.org"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1 and "network: 'https://pypi.org'" in result.stderr
    assert not (tmp_path / "share").exists()


def test_sandbox_takes_a_list_and_checks_it_before_starting() -> None:
    assert AsyncSandbox(network=("pypi.org",)).network == ["pypi.org"]
    with pytest.raises(ConfigError, match="network: 'pypi.org:x'"):
        Sandbox(network=["pypi.org:x"])


def test_opensandbox_turns_the_list_into_default_deny_egress_rules() -> None:
    from kernel_sandbox.opensandbox.settings import OpenSandboxSettings

    listed = OpenSandboxSettings.from_config({"network": ["pypi.org", "*.pythonhosted.org"]})
    assert listed.egress == {"allow_internet": False, "network_policy": {"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "pypi.org"}, {"action": "allow", "target": "*.pythonhosted.org"}]}}
    assert OpenSandboxSettings.from_config({}).egress == {"allow_internet": False, "network_policy": None}
    assert OpenSandboxSettings.from_config({"network": True}).egress["allow_internet"] is True
    custom = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "example.com"}]}
    assert OpenSandboxSettings.from_config({"network_policy": custom}).egress["network_policy"] == custom
    for entry in ("pypi.org:443", "mirror.corp@10.1.2.3", "10.1.2.3"):
        with pytest.raises(ConfigError, match="names and '\\*.domain' only"):
            OpenSandboxSettings.from_config({"network": [entry]})
    with pytest.raises(ConfigError, match="both set the sandbox's egress"):
        OpenSandboxSettings.from_config({"network": ["pypi.org"], "network_policy": custom})
    with pytest.raises(ConfigError, match="both set the sandbox's egress"):
        OpenSandboxSettings.from_config({"network": ["pypi.org"], "allow_internet": True})
    config = kernel_spec("opensandbox", {"network": ["pypi.org"]}).metadata["kernel_provisioner"]["config"]
    assert config["network"] == ["pypi.org"]
