"""The Docker backend's settings and the container spec built from them: fast, no engine needed."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.security_figures import examples

from kernel_sandbox.docker.containers import container_spec, run_as, unused_id
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.kernelspecs import shipped_kernelspecs
from kernel_sandbox.docker.provisioner import DockerProvisioner
from kernel_sandbox.docker.settings import OPTIONS, DockerSettings
from kernel_sandbox.settings import HOME_DIR, PACKAGES_DIR, WORK_DIR
from kernel_sandbox.parsers import MiB

DOCS = Path(__file__).resolve().parents[2] / "docs"


def spec(**config: object) -> dict:
    return container_spec(
        DockerSettings.from_config(config),
        kernel_id="0123456789abcdef",
        kernel_key="kernel-key",
        user=(123456, 123456),
        env={"FROM_SPEC": "1"},
        mounts=[("/data", f"{WORK_DIR}/data", "ro")],
        labels={"kernel-sandbox": "true"},
    )


def test_defaults_make_a_locked_down_container() -> None:
    made = spec()
    assert made["read_only"] is True
    assert made["cap_drop"] == ["ALL"]
    assert made["security_opt"] == ["no-new-privileges"]
    assert made["network_mode"] == "none"
    assert made["ipc_mode"] == "private"
    assert made["mem_limit"] == made["memswap_limit"] == 1024 * MiB
    assert made["nano_cpus"] == 1_000_000_000 and made["pids_limit"] == 256
    assert made["user"] == "123456:123456" and made["init"] is True
    assert made["auto_remove"] is True and made["log_config"]["type"] == "none"
    assert made["volumes"] == {"/data": {"bind": f"{WORK_DIR}/data", "mode": "ro"}}
    assert "ports" not in made and "privileged" not in made


def test_tmpfs_sizes_fit_in_memory_and_belong_to_the_kernel_user() -> None:
    made = spec(memory="512m")
    tmpfs = made["tmpfs"]
    assert tmpfs["/tmp"] == f"rw,nosuid,nodev,size={32 * MiB},mode=1777"
    assert made["shm_size"] == 32 * MiB  # /dev/shm is in the budget too (Docker's default, 64 MiB, was not)
    assert tmpfs[HOME_DIR] == f"rw,nosuid,nodev,size={64 * MiB},uid=123456,gid=123456,mode=0755"
    assert tmpfs[WORK_DIR] == f"rw,nosuid,nodev,size={128 * MiB},uid=123456,gid=123456,mode=0755"
    # the one place mounted exec (compiled extensions load from it): where pip installs, nowhere else
    assert tmpfs[PACKAGES_DIR] == f"rw,exec,nosuid,nodev,size={128 * MiB},uid=123456,gid=123456,mode=0755"
    assert [path for path, options in tmpfs.items() if "exec" in options.split(",")] == [PACKAGES_DIR]
    assert sum(int(o.split("size=")[1].split(",")[0]) for o in tmpfs.values()) + made["shm_size"] == 384 * MiB


def test_environment_holds_only_what_is_given_and_the_kernel_key() -> None:
    env = spec(env={"GREETING": "hi"})["environment"]
    modules = json.loads(env.pop("KERNEL_SANDBOX_MODULES"))  # the magics' sources, for the boot
    assert list(modules) == [
        "_kernel_sandbox_workfiles", "_kernel_sandbox_checkpoint", "_kernel_sandbox_packages", "_kernel_sandbox_textframe", "_kernel_sandbox_magics",
        "_kernel_sandbox_trust",
    ]
    assert env == {
        "FROM_SPEC": "1",
        "GREETING": "hi",
        "HOME": HOME_DIR,
        "PYTHONUNBUFFERED": "1",
        "JPY_PARENT_PID": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "KERNEL_SANDBOX_KEY": "kernel-key",
        # pip installs into the packages' tmpfs, unpacks there and keeps no cache
        "PIP_TARGET": PACKAGES_DIR,
        "PYTHONPATH": PACKAGES_DIR,
        "PIP_NO_CACHE_DIR": "1",
    }


def test_the_command_boots_the_configured_kernel() -> None:
    command = spec(kernel_cmd=["python", "-m", "mykernel", "-f", "{connection_file}"])["command"]
    assert command[:2] == ["python", "-c"] and "def main(cmd)" in command[2]
    assert command[3:] == ["python", "-m", "mykernel", "-f", "{connection_file}"]


def test_network_runtime_and_unlimited_values() -> None:
    made = spec(network=True, runtime="runsc", memory="unlimited", cpus=None, pids_limit="unlimited")
    assert made["network_mode"] == "bridge" and made["runtime"] == "runsc"
    assert not {"mem_limit", "memswap_limit", "nano_cpus", "pids_limit"} & set(made)
    assert "size=134217728" in made["tmpfs"]["/tmp"]  # a tmpfs is never unlimited


def test_a_mounted_work_directory_has_no_tmpfs() -> None:
    assert WORK_DIR not in spec(mount_cwd="ro")["tmpfs"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"pid_limit": 16}, "no option 'pid_limit' (did you mean 'pids_limit'?)"),
        ({"bogus_option": 1}, "no option 'bogus_option'"),
        ({"pids_limit": 0}, "pids_limit=0"),
        ({"pids_limit": -1}, "pids_limit=-1"),
        ({"pids_limit": "16"}, "pids_limit='16'"),
        ({"memory": "0"}, "memory='0'"),
        ({"memory": ""}, "memory=''"),
        ({"memory": "lots"}, "memory='lots'"),
        ({"cpus": 0}, "cpus=0"),
        ({"cpus": True}, "cpus=True"),
        ({"tmp_size": "lots"}, "tmp_size='lots'"),
        ({"tmp_size": "unlimited"}, "tmp_size='unlimited'"),
        ({"memory": "512m", "work_size": "1g"}, "must fit in 3/4 of memory=512m"),
        ({"memory": "256m", "shm_size": "64m"}, "tmp_size 16m + shm_size 64m + home_size 32m + work_size 64m + packages_size 64m must fit in 3/4"),
        ({"shm_size": "unlimited"}, "shm_size='unlimited'"),
        ({"pids_limit": 2**40}, f"pids_limit={2**40}: must be at most 4194304 (Linux's PID_MAX_LIMIT)"),
        ({"pids_limit": 2**63}, f"pids_limit={2**63}: must be at most 4194304"),
        ({"memory": "99999999t"}, "memory='99999999t': must be at most 1024t"),
        ({"memory": 2**63}, "must be at most 1024t"),
        ({"memory": "9" * 400}, "must be at most 1024t"),
        ({"memory": "unlimited", "work_size": "2000t"}, "work_size='2000t': must be at most 1024t"),
        ({"cpus": 4096}, "cpus=4096: must be between 0.01 and 1024"),
        ({"launch_timeout": 10**9}, "at most 86400 seconds"),
        ({"standby": 100}, "standby=100: must be between 0 (off) and 8"),
        ({"user": "0:0"}, "never runs as root"),
        ({"user": "1000"}, "numeric UID:GID"),
        ({"mounts": "/a:/b"}, "must be a list"),
        ({"mounts": ["/a:b:rx"]}, "mode must be 'ro' or 'rw'"),
        ({"mount_cwd": "rw", "mounts": [f"/a:{WORK_DIR}"]}, "both mount the work directory"),
        ({"checkpoint_max_bytes": "3g"}, "checkpoint_max_bytes=3221225472 does not fit in max_checkpoint_bytes=2147483648"),
        ({"max_checkpoint_bytes": "lots"}, "max_checkpoint_bytes='lots'"),
        ({"env": {"KERNEL_SANDBOX_KEY": "x"}}, "kernel-sandbox's own"),
        ({"env": {"A B": "x"}}, "not a valid variable name"),
        ({"launch_timeout": 0}, "launch_timeout=0"),
        ({"orphan_timeout": -5}, "orphan_timeout=-5"),
        ({"kernel_cmd": []}, "kernel_cmd=[]"),
        ({"kernel_cmd": "python -m ipykernel"}, "kernel_cmd="),
        ({"uid_range": "10-20"}, "uid_range='10-20'"),
        ({"network": "yes"}, "network='yes'"),
        ({"runtime": "run sc"}, "runtime='run sc'"),
    ],
)
def test_bad_settings_are_refused_with_the_option_named(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        DockerSettings.from_config(config)


def test_limits_are_lifted_only_in_so_many_words() -> None:
    lifted = DockerSettings.from_config({"memory": "unlimited", "cpus": None, "pids_limit": "UNLIMITED"})
    assert lifted.memory is None and lifted.cpus is None and lifted.pids_limit is None
    assert DockerSettings.from_config({"orphan_timeout": None}).orphan_timeout is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=examples(400), deadline=None)
@given(st.dictionaries(st.sampled_from([*OPTIONS, "pid_limit", "bogus"]), JSON, max_size=4))
def test_any_config_is_accepted_whole_or_refused_with_a_config_error(config: dict) -> None:
    try:
        checked = DockerSettings.from_config(config)
    except ConfigError as exc:
        assert any(name in str(exc) for name in config) or "3/4 of memory" in str(exc)
        return
    assert DockerSettings.from_config(json.loads(json.dumps(checked.to_config()))) == checked
    if checked.memory is not None:
        assert sum(checked.tmpfs_sizes().values()) <= checked.memory * 3 / 4
    assert all(value is None or value > 0 for value in (checked.memory, checked.cpus, checked.pids_limit))


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 8192), st.sampled_from(["k", "m", "g"]))
def test_sizes_read_as_docker_reads_them(number: int, unit: str) -> None:
    from docker.utils import parse_bytes

    text = f"{number}{unit}"
    memory = DockerSettings.from_config({"memory": "unlimited", "tmp_size": text}).tmp_size
    assert memory == parse_bytes(text)


def test_every_option_is_a_provisioner_trait_and_on_the_options_page() -> None:
    traits = DockerProvisioner.class_traits(config=True)
    helps = {name: option.metadata["help"] for name, option in OPTIONS.items()}
    assert {name: traits[name].help for name in OPTIONS} == helps
    spec = importlib.util.spec_from_file_location("options_hook", DOCS / "options_hook.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.on_page_markdown((DOCS / "options.md").read_text(), None, None, None)
    missing = [name for name in OPTIONS if f"| `{name}` |" not in page]
    assert not missing, f"options missing from the generated table of docs/options.md: {missing}"


def test_the_provisioner_refuses_unknown_kernelspec_config() -> None:
    with pytest.raises(ConfigError, match="did you mean 'pids_limit'"):
        DockerProvisioner(kernel_id="k", kernel_spec=None, pid_limit=16)


def test_the_kernels_uid_is_unused_by_any_host_account(tmp_path: Path) -> None:
    (tmp_path / "passwd").write_text("root:x:0:0::/root:/bin/sh\nalice:x:100000:100001::/home/a:/bin/sh\n")
    (tmp_path / "group").write_text("root:x:0:\nstaff:x:100002:\n")
    (tmp_path / "subuid").write_text("alice:100003:5\n")
    (tmp_path / "subgid").write_text("")
    assert unused_id(100000, 100008, tmp_path) == 100008
    with pytest.raises(ConfigError, match="uid_range=100000-100002"):
        unused_id(100000, 100002, tmp_path)
    assert run_as(DockerSettings.from_config({"user": "4242:4343"})) == (4242, 4343)


def test_shipped_kernelspecs_cannot_start_anything_before_install() -> None:
    for path in shipped_kernelspecs().values():
        argv = json.loads((path / "kernel.json").read_text())["argv"]
        assert argv[0] == "{kernel_sandbox_python}" and argv[1:4] == ["-I", "-m", "kernel_sandbox.launch"]


def test_under_gvisor_the_tmpfs_and_pids_limits_hold_as_under_runc() -> None:
    """gVisor's tmpfs is in its runtime's memory, and its pids cgroup counts the runtime's threads (docs/docker.md)."""
    from kernel_sandbox.docker.containers import RUNSC_HOST_THREADS
    from kernel_sandbox.docker.settings import RUNSC_OVERHEAD

    runc = DockerSettings.from_config({"memory": "256m"}).tmpfs_sizes()
    runsc = DockerSettings.from_config({"memory": "256m", "runtime": "runsc"}).tmpfs_sizes()
    assert runc == {"tmp_size": 16 * MiB, "shm_size": 16 * MiB, "home_size": 32 * MiB, "work_size": 64 * MiB, "packages_size": 64 * MiB}
    assert runsc == {"tmp_size": 12 * MiB, "shm_size": 12 * MiB, "home_size": 24 * MiB, "work_size": 48 * MiB, "packages_size": 48 * MiB}
    assert sum(runsc.values()) <= (256 * MiB - RUNSC_OVERHEAD) * 3 / 4
    with pytest.raises(ConfigError, match=r"3/4 of memory=256m less gVisor's 64m"):
        DockerSettings.from_config({"memory": "256m", "runtime": "runsc", "work_size": "64m"})
    DockerSettings.from_config({"memory": "256m", "work_size": "64m"})  # fits under runc
    with pytest.raises(ConfigError, match=r"memory=96m is too little under runtime='runsc'.*at least 128m"):
        DockerSettings.from_config({"memory": "96m", "runtime": "runsc"})
    plain, gvisor = spec(pids_limit=64), spec(pids_limit=64, runtime="runsc")
    assert plain["pids_limit"] == 64 and "ulimits" not in plain
    assert gvisor["pids_limit"] == 2 * 64 + RUNSC_HOST_THREADS
    [nproc] = gvisor["ulimits"]
    assert (nproc["Name"], nproc["Soft"], nproc["Hard"]) == ("nproc", 64, 64)
    assert "ulimits" not in spec(pids_limit="unlimited", runtime="runsc")
