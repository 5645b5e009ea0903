"""What a tool call sends into the kernel, and how its answer becomes a :class:`ToolResult`.

The function (or its source), the arguments, the agent state and the call's environment
travel in with cloudpickle (the caller's own modules by value): the sandbox may run anything.
What comes back is data only (see :mod:`.decode`); the transport is described in
:mod:`.channel`.
"""

from __future__ import annotations

import sys
import textwrap
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import cloudpickle

from ..errors import ConfigError
from ..results import ExecutionError

_pickle_lock = threading.Lock()


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A per-call environment as a plain dict; the values (secrets) never appear in an error."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigError(f"env must be a mapping of names to strings, not a {type(env).__name__}")
    checked = {}
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
            raise ConfigError(f"env: {str(name)[:100]!r} is not a valid environment variable name")
        if not isinstance(value, str) or "\x00" in value:
            raise ConfigError(
                f"env[{name!r}] must be a string without NUL characters (value not shown)"
            )
        checked[name] = value
    return checked


def _dumps_by_value(objects: Iterable[Any], modules: Iterable[str]) -> list[bytes]:
    registered = []
    with _pickle_lock:
        try:
            for name in modules:
                module = sys.modules.get(name)
                if module is not None and name != "__main__":
                    try:
                        cloudpickle.register_pickle_by_value(module)
                    except ValueError:
                        continue
                    registered.append(module)
            return [cloudpickle.dumps(obj, protocol=4) for obj in objects]
        finally:
            for module in registered:
                cloudpickle.unregister_pickle_by_value(module)


def _local_modules(*objects: Any) -> set[str]:
    """Modules whose functions/classes must travel by value: the caller's own, not installed
    ones."""
    names = set()
    for obj in objects:
        for candidate in (obj, type(obj)):
            module = getattr(candidate, "__module__", None)
            if module and module in sys.modules and not _is_installed(module):
                names.add(module)
    return names


def _is_installed(module_name: str) -> bool:
    module = sys.modules[module_name]
    path = getattr(module, "__file__", None) or ""
    return (
        module_name.split(".")[0] in sys.stdlib_module_names
        or "site-packages" in path
        or "dist-packages" in path
    )


def tool_payload(
    tool: Callable[..., Any] | str,
    args: Mapping[str, Any] | None,
    agent_state: Any,
    name: str | None,
    env: dict[str, str],
) -> tuple[bytes, bytes]:
    """The pickled call (function or source and name, arguments, environment) and the pickled state.

    The state is pickled apart so that a large one the kernel already holds need not travel again.
    """
    if isinstance(tool, str):
        if not name:
            raise ConfigError("run_tool(source, name=...): name the function the source defines")
        func, source = None, textwrap.dedent(tool)
    elif callable(tool):
        func, source = tool, None
        name = name or getattr(tool, "__name__", "tool")
    else:
        raise TypeError(f"tool must be a function or its source, not {type(tool).__name__}")
    call = {"func": func, "source": source, "name": name, "args": dict(args or {}), "env": env}
    modules = _local_modules(func, agent_state, *(args or {}).values())
    call_bytes, state_bytes = _dumps_by_value([call, agent_state], modules)
    return call_bytes, state_bytes


def body_error(body: Any) -> ExecutionError | None:
    """The exception recorded in an answer's body, if it holds one."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    return ExecutionError(
        str(error.get("name")), str(error.get("value")), str(error.get("traceback", ""))
    )
