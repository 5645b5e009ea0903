"""Code that runs in the kernel for tool calls and file operations, and how results come back.

How a result travels, and why a tool cannot pass a fake one off as the real one:

* The host makes a fresh random marker (``secrets.token_hex``) for every call. The generated
  cell is a single expression; the kernel-side code calls the tool, encodes what it returned and
  publishes the framed text (``BEGIN-marker length sha256 body END-marker``) as a rich result:
  display_data, or the cell's execute_result on relays that drop display_data. ``print`` and
  the tool's own output go to stdout and are never parsed: a marker the tool prints, or data it
  echoes, stays in stdout, and cannot replace the result.
* The host accepts exactly one rich result carrying this call's marker, with a length and
  digest that match. A tool that goes out of its way to forge one (it runs in the same process,
  so it could introspect the cell to learn the marker) makes two frames appear: the call fails
  with :class:`FramingError` instead of returning the forgery. The frame is exempt from the
  output cap; everything else the call prints or displays is capped as usual.
* Framing only decides which bytes are the result; the bytes themselves stay untrusted. JSON is
  decoded as JSON; anything else was pickled in the kernel and is decoded on the host only by
  :class:`RestrictedUnpickler`, so the worst a hostile tool can do is return a wrong value.
* One kernel is one trust domain: what a tool leaves behind (threads, monkeypatches, the cached
  helper) can influence later calls in the same kernel. Give untrusted tools a fresh kernel
  each (a pool with the default ``max_uses=1`` does exactly that).

Arguments, agent state and the function travel in (cloudpickle, the caller's own modules by
value) inside the cell, or, above a size where compiling the literal would dominate, as the
answer to the helper's ``input()`` request on the stdin channel.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import sys
import textwrap
import threading
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from .models import Execution, ExecutionError, FramingError
from .unpickler import restricted_loads

_HEADER_RE = re.compile(r"(\d{1,12}) ([0-9a-f]{64}) ")
_pickle_lock = threading.Lock()

KERNEL_PRELUDE = r'''
import base64, hashlib, json, pickle

class _NamePickler(pickle._Pickler):
    """Pickle classes by module and qualified name even when the kernel cannot import them."""

    def save_global(self, obj, name=None):
        try:
            return pickle._Pickler.save_global(self, obj, name)
        except pickle.PicklingError:
            self.save(obj.__module__)
            self.save(name or obj.__qualname__)
            self.write(pickle.STACK_GLOBAL)
            self.memoize(obj)

def _encode(value):
    """A JSON fragment: {"json": value} when JSON carries it faithfully, else {"pickle": b64}."""
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=False)
        if json.loads(text) == value:
            return '{"json": ' + text + '}'
    except Exception:
        pass
    try:
        data = pickle.dumps(value, protocol=4)
    except Exception:
        import io
        buf = io.BytesIO()
        _NamePickler(buf, protocol=4).dump(value)
        data = buf.getvalue()
    return '{"pickle": "' + base64.b64encode(data).decode("ascii") + '"}'

def _error(exc):
    import traceback
    error = {"name": type(exc).__name__, "value": str(exc), "traceback": traceback.format_exc()}
    return json.dumps(error, ensure_ascii=True)

class _Frame:
    def __init__(self, text):
        self.text = text
    def __repr__(self):
        return self.text

def _frame(body):
    digest = hashlib.sha256(body.encode("ascii")).hexdigest()
    text = f"BEGIN-{_marker} {len(body)} {digest} {body} END-{_marker}"
    if not _as_display:
        return _Frame(text)
    from IPython.display import publish_display_data
    publish_display_data({"text/plain": text})
'''

JSON_MAIN = r'''
def _main():
    return json.dumps(_main_dict(), ensure_ascii=True)
'''

TOOL_SRC = r'''
def _main():
    import inspect
    out = {}
    try:
        raw = input().encode("latin-1") if _payload is None else base64.b64decode(_payload)
        data = pickle.loads(raw)
        func = data["func"]
        if func is None:
            namespace = {"__name__": "__kernel_sandbox_tool__"}
            exec(compile(_source, "<tool>", "exec"), namespace)
            if _name not in namespace or not callable(namespace[_name]):
                raise NameError(f"the tool source defines no function named {_name!r}")
            func = namespace[_name]
        kwargs = dict(data["args"] or {})
        takes_state = "agent_state" in inspect.signature(func).parameters
        if takes_state:
            kwargs["agent_state"] = data["state"]
        out["func_return"] = _encode(func(**kwargs))
        if takes_state:
            out["agent_state"] = _encode(data["state"])
    except Exception as exc:
        out = {"error": _error(exc)}
    return "{" + ", ".join(f'"{key}": {value}' for key, value in out.items()) + "}"
'''


def frame(body: str, marker: str) -> str:
    """Frame ``body`` (ASCII) as ``BEGIN-marker length sha256 body END-marker``."""
    digest = hashlib.sha256(body.encode("ascii")).hexdigest()
    return f"BEGIN-{marker} {len(body)} {digest} {body} END-{marker}"


def parse_frame(text: str, marker: str) -> str | None:
    """Return the body of a frame made with ``marker``, None if ``text`` is not one.

    A frame with this marker whose length or digest does not match raises :class:`FramingError`.
    """
    begin, end = f"BEGIN-{marker} ", f" END-{marker}"
    if not (text.startswith(begin) and text.endswith(end)):
        return None
    match = _HEADER_RE.match(text, len(begin))
    if match is None:
        raise FramingError("The result frame has no valid length and digest.")
    length, digest = int(match.group(1)), match.group(2)
    body = text[match.end() : len(text) - len(end)]
    if len(body) != length or hashlib.sha256(body.encode("ascii", "replace")).hexdigest() != digest:
        raise FramingError("The framed result failed its length or digest check.")
    return body


def helper_key(main_src: str) -> str:
    """The key under which the kernel caches the compiled helper built from ``main_src``."""
    return hashlib.sha256(main_src.encode()).hexdigest()[:16]


def kernel_call(
    main_src: str, params: dict[str, Any], cached: bool = False, as_display: bool = True
) -> tuple[str, str]:
    """Build a one-expression cell that runs ``main_src``'s ``_main()`` and frames what it returns.

    ``_main()`` returns the body's JSON text (append :data:`JSON_MAIN` to a source whose
    ``_main_dict()`` returns a dict). ``params`` become globals of a private namespace: the user's
    namespace sees nothing. The frame is published as display_data, or with ``as_display=False``
    (for relays that drop display_data) as the cell's execute_result, which IPython's ``_``
    variables then hold. The compiled helper is cached in the kernel under :func:`helper_key`;
    with ``cached`` the cell only names it (a smaller cell is cheaper for IPython to process).
    Returns the cell and its marker.
    """
    marker = secrets.token_hex(16)
    namespace = {"__name__": "__kernel_sandbox__", "_marker": marker, "_as_display": as_display, **params}
    key = helper_key(main_src)
    cache = "__import__('sys').modules['_kernel_sandbox_cache'].__dict__"
    if cached:
        return f"(lambda ns: exec({cache}[{key!r}], ns) or ns['_result'])({namespace!r})", marker
    source = KERNEL_PRELUDE + main_src + "\n_result = _frame(_main())\n"
    cache = (
        "__import__('sys').modules.setdefault('_kernel_sandbox_cache', "
        "__import__('types').ModuleType('_kernel_sandbox_cache')).__dict__"
    )
    code = (
        f"(lambda ns, c={cache}: exec(c.get({key!r}) or c.setdefault({key!r}, "
        f"compile({source!r}, '<kernel-sandbox>', 'exec')), ns) or ns['_result'])({namespace!r})"
    )
    return code, marker


def extract_frame(execution: Execution, marker: str) -> dict[str, Any]:
    """Return the decoded body of the single frame with ``marker`` among ``execution``'s results."""
    bodies = []
    for bundle in execution.results:
        text = bundle.get("text/plain")
        if isinstance(text, str) and (body := parse_frame(text, marker)) is not None:
            bodies.append(body)
    if len(bodies) > 1:
        raise FramingError(
            "More than one result frame carried this call's marker: the tool tampered with the "
            "result channel; its output is not trusted."
        )
    if not bodies:
        detail = f" ({execution.error})" if execution.error else ""
        raise FramingError(f"The sandbox returned no result frame{detail}.")
    try:
        return json.loads(bodies[0])
    except ValueError as exc:
        raise FramingError(f"The result frame does not hold JSON: {exc}") from exc


def decode_value(encoded: dict[str, str], allowed: Iterable[type] = ()) -> Any:
    """Decode a value encoded by the kernel: JSON as JSON, pickles by the restricted unpickler."""
    if "json" in encoded:
        return encoded["json"]
    if "pickle" in encoded:
        return restricted_loads(base64.b64decode(encoded["pickle"]), allowed)
    raise FramingError(f"Unknown value encoding {sorted(encoded)!r}")


def _dumps_by_value(obj: Any, modules: Iterable[str]) -> bytes:
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
            return cloudpickle.dumps(obj, protocol=4)
        finally:
            for module in registered:
                cloudpickle.unregister_pickle_by_value(module)


def _local_modules(*objects: Any) -> set[str]:
    """Modules whose functions/classes must travel by value: the caller's own, not installed ones."""
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
    return module_name.split(".")[0] in sys.stdlib_module_names or "site-packages" in path or "dist-packages" in path


def tool_params(
    tool: Callable[..., Any] | str,
    args: dict[str, Any] | None,
    agent_state: Any,
    name: str | None,
    inline_limit: int | None = None,
) -> tuple[dict[str, Any], str | None]:
    """The :data:`TOOL_SRC` parameters for one tool call, and the stdin payload if any.

    A payload larger than ``inline_limit`` bytes (None: no limit) is not put in the cell
    (compiling a megabyte literal costs far more than the call): the kernel reads it with
    ``input()`` and the host answers that one request on the stdin channel, the pickle's bytes
    carried as latin-1 text (no base64 on either side).
    """
    if isinstance(tool, str):
        if not name:
            raise ValueError("run_tool(source, name=...): name the function the source defines")
        func, source = None, textwrap.dedent(tool)
    elif callable(tool):
        func, source = tool, None
        name = name or getattr(tool, "__name__", "tool")
    else:
        raise TypeError(f"tool must be a function or its source, not {type(tool).__name__}")
    payload = {"func": func, "args": dict(args or {}), "state": agent_state}
    modules = _local_modules(func, agent_state, *(args or {}).values())
    data = _dumps_by_value(payload, modules)
    via_stdin = inline_limit is not None and len(data) > inline_limit
    inline = None if via_stdin else base64.b64encode(data).decode("ascii")
    params = {"_payload": inline, "_source": source, "_name": name}
    return params, data.decode("latin-1") if via_stdin else None


def tool_error(body: dict[str, Any]) -> ExecutionError | None:
    """The tool's exception recorded in a frame body, if it raised one."""
    error = body.get("error")
    if not error:
        return None
    return ExecutionError(str(error.get("name")), str(error.get("value")), str(error.get("traceback", "")))

