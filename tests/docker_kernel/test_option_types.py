"""Every option takes only its documented types (issue 34 item 3): a string where a flag or a list
belongs, a flag where a number belongs, and so on, is refused with an error naming the option, on
every path: the settings models (kernel.json and traitlets config), and the keywords of
``Sandbox``, ``AsyncSandbox`` and ``SandboxPool``. No engine needed: nothing is started."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_sandbox.docker.settings import DockerSettings
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import AsyncSandbox, Sandbox, SandboxPool
from kernel_sandbox.opensandbox.settings import OpenSandboxSettings

pytestmark = pytest.mark.security("fault", "options")

# The Python types each option is documented to take (docs/options.md); a value of any other type
# must be refused. (A value of a listed type may still be refused for its content.)
NUMBER, SIZE = (int, float), (int, str)
SHARED = {
    "orphan_timeout": (*NUMBER, str, type(None)),  # seconds or 'unlimited'
    "output_policy": (str,),
    "allow_mime_types": (list, tuple),
    "allow_widget_modules": (list, tuple),
    "allow_help_links": (list, tuple),
    "package_index": (str, list, tuple),
    "suspend_lossy": (bool,),
    "max_suspended_bytes": (*SIZE, type(None)),
    "checkpoint_max_bytes": SIZE,
    "max_checkpoint_bytes": SIZE,
}
DOCKER = {
    **SHARED,
    "engine": (str,),
    "image": (str,),
    "network": (bool, list, tuple),
    "memory": (*SIZE, type(None)),
    "cpus": (*NUMBER, str, type(None)),
    "pids_limit": (int, str, type(None)),
    "user": (str,),
    "uid_range": (str, list, tuple),
    "read_only": (bool,),
    "tmp_size": SIZE,
    "shm_size": SIZE,
    "home_size": SIZE,
    "work_size": SIZE,
    "packages_size": SIZE,
    "mounts": (list, tuple),
    "mount_cwd": (str,),
    "env": (dict,),
    "runtime": (str,),
    "launch_timeout": NUMBER,
    "kernel_cmd": (list, tuple),
    "standby": (int,),
    "max_kernels": (int, str, type(None)),
    "max_memory": (*SIZE, type(None)),
    "checkpoint_on_oom": (bool,),
    "suspend_after": (*NUMBER, str, type(None)),  # seconds or 'unlimited'
    "secrets": (list, tuple),
}
OPENSANDBOX = {
    **SHARED,
    "api_base": (str,),
    "api_key": (str, type(None)),
    "image": (str,),
    "entrypoint": (list, tuple),
    "mode": (str,),
    "jupyter_port": (int,),
    "jupyter_wait": NUMBER,
    "kernel_name": (str,),
    "language": (str,),
    "timeout": (int,),
    "renew_interval": NUMBER,
    "resource_limits": (dict,),
    "resource_requests": (dict,),
    "env": (dict,),
    "metadata": (dict,),
    "network": (bool, list, tuple),
    "allow_internet": (bool,),
    "network_policy": (dict, type(None)),
    "secure_access": (bool,),
    "volumes": (list, tuple),
    "extensions": (dict,),
    "signed_endpoints": NUMBER,
    "use_server_proxy": (bool,),
    "ready_timeout": NUMBER,
    "poll_interval": NUMBER,
    "request_timeout": NUMBER,
    "max_output_bytes": (int,),
    "max_response_bytes": (int,),
    "interrupt_grace": NUMBER,
    "state_check_interval": NUMBER,
    "suspend_after": (*NUMBER, str, type(None)),  # seconds or 'unlimited'
    "suspend_by": (str,),
}
# The session's own keywords (the rest go to the backend's model, checked above).
SESSION = {
    "network": (bool, list, tuple),
    "env": (dict, type(None)),
    "mounts": (list, tuple, type(None)),
    "timeout": NUMBER,
    "start_timeout": NUMBER,
    "interrupt_grace": NUMBER,
    "max_output_bytes": (int,),
    "allowed_classes": (list, tuple, set, frozenset),
    "unsafe_pickle": (bool,),
    "output_policy": (str, type(None)),
    "secrets": (dict, type(None)),
}
POOL = {"size": (int,), "max_uses": (int,), "idle_timeout": (*NUMBER, type(None))}

WRONG_LOOKING = ["false", "true", "0", "1", "no", "", "1g", "pypi.org", "a:b", "unlimited"]
VALUES = st.one_of(
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WRONG_LOOKING),
    st.text(max_size=8),
    st.none(),
    st.lists(st.sampled_from(WRONG_LOOKING), max_size=3),
    st.lists(st.integers(0, 9), max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["A", "cpu", "memory"]), st.sampled_from(WRONG_LOOKING), max_size=2),
)


def _wrong_type(value: Any, accepted: tuple[type, ...]) -> bool:
    """True when ``value``'s type is none of ``accepted`` (a bool is no int, an int no float)."""
    if isinstance(value, bool):
        return bool not in accepted
    return type(value) not in accepted


def _named(exc: BaseException, name: str) -> bool:
    return re.search(rf"(^|\W){re.escape(name)}\b", str(exc)) is not None


def test_the_tables_cover_every_option() -> None:
    assert set(DOCKER) == set(DockerSettings.options())
    assert set(OPENSANDBOX) == set(OpenSandboxSettings.options())


@pytest.mark.parametrize(("model", "table"), [(DockerSettings, DOCKER), (OpenSandboxSettings, OPENSANDBOX)])
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_a_wrong_type_for_any_option_is_refused_naming_it(model: Any, table: dict, data: st.DataObject) -> None:
    """Any option of either model given a value of a type it does not document is refused, naming it."""
    name = data.draw(st.sampled_from(sorted(table)))
    value = data.draw(VALUES.filter(lambda value: _wrong_type(value, table[name])))
    with pytest.raises(ConfigError) as refused:
        model.from_config({name: value})
    assert _named(refused.value, name), str(refused.value)


@settings(max_examples=300)
@given(data=st.data())
def test_fuzz_a_wrong_type_for_any_session_keyword_is_refused_naming_it(data: st.DataObject) -> None:
    """Sandbox, AsyncSandbox and SandboxPool refuse a keyword of the wrong type before anything starts."""
    name = data.draw(st.sampled_from(sorted(SESSION) + sorted(POOL)))
    table = SESSION if name in SESSION else POOL
    value = data.draw(VALUES.filter(lambda value: _wrong_type(value, table[name])))
    make = data.draw(st.sampled_from([AsyncSandbox, Sandbox, SandboxPool] if name in SESSION else [SandboxPool]))
    with pytest.raises(ConfigError) as refused:
        make(**{name: value})
    assert _named(refused.value, name), str(refused.value)


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"network": "false"}, "network"),
        ({"network": "pypi.org"}, "network"),
        ({"unsafe_pickle": "false"}, "unsafe_pickle"),
        ({"unsafe_pickle": 0}, "unsafe_pickle"),
        ({"mounts": "/data:data"}, "mounts"),
        ({"env": "A=1"}, "env"),
        ({"env": [("A", "1")]}, "env"),
        ({"allowed_classes": "MyResult"}, "allowed_classes"),
        ({"max_output_bytes": "4m"}, "max_output_bytes"),
        ({"max_output_bytes": True}, "max_output_bytes"),
        ({"read_only": "false"}, "read_only"),
        ({"standby": True}, "standby"),
        ({"pids_limit": 64.0}, "pids_limit"),
    ],
)
@pytest.mark.parametrize("make", [AsyncSandbox, Sandbox, SandboxPool])
def test_the_attackers_spellings_are_refused_naming_the_option(keywords: dict, named: str, make: Any) -> None:
    """`Sandbox(network="false")` once started a kernel that could reach hosts f, a, l, s, e."""
    with pytest.raises(ConfigError, match=rf"^{named}\b|\b{named}="):
        make(**keywords)


def test_right_types_still_work() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sandbox = AsyncSandbox(network=["pypi.org"], env={"A": "1"}, mounts=("/tmp:data",), allowed_classes=[int],
                               unsafe_pickle=False, max_output_bytes=1024)
    assert sandbox.network == ["pypi.org"] and sandbox.unsafe_pickle is False
    assert AsyncSandbox(network=True).network is True
    assert SandboxPool(2, max_uses=3, idle_timeout=1.5)._async.size == 2


@pytest.mark.parametrize(("name", "value"), [("network", "false"), ("read_only", "false"), ("standby", True),
                                             ("memory", 1.5e9), ("mounts", "/data:data")])
def test_provisioner_traits_refuse_wrong_types_naming_the_option(name: str, value: Any) -> None:
    """c.DockerProvisioner.<option> (a traitlets config) is checked by the same model at launch."""
    from traitlets.config import Config

    from kernel_sandbox.docker.provisioner import DockerProvisioner

    provisioner = DockerProvisioner(kernel_id="types", kernel_spec=None, config=Config({"DockerProvisioner": {name: value}}))
    with pytest.raises(ConfigError, match=rf"{name}="):
        provisioner.settings()
