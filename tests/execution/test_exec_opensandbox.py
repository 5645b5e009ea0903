"""How the execution API maps its options onto the opensandbox backend (no server needed).

Sessions, files and tool calls on that backend run against the published OpenSandbox server
in tests/opensandbox/test_opensandbox_server.py.
"""

from __future__ import annotations

import pytest

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution.adapters import kernel_spec


def test_limits_network_and_timeouts_map_onto_the_provisioner_config() -> None:
    spec = kernel_spec("opensandbox", {"memory": "1g", "cpus": 1, "pids_limit": 64, "network": False,
                                       "launch_timeout": 30, "mounts": None, "env": {}})
    config = spec.metadata["kernel_provisioner"]["config"]
    assert config["resource_limits"] == {"memory": "1Gi", "cpu": "1"}
    assert config["network"] is False and config["ready_timeout"] == 30
    assert "pids_limit" not in config


def test_mounts_are_refused() -> None:
    with pytest.raises(ConfigError, match="does not take mounts"):
        kernel_spec("opensandbox", {"mounts": ["/tmp:/data"]})
