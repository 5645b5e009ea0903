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

Arguments, agent state and the function travel in with cloudpickle (the caller's own modules by
value). Two transports carry a tool call, chosen per backend:

* The channel (kernels that speak comms: ``docker``, ``local``). A comm opened by the kernel
  (:data:`CHANNEL_SRC`) carries the pickle in as a binary message buffer (a small one rides in
  the cell, base64, which saves a message) and the values out as buffers (JSON text, or a pickle). Buffers skip JSON encoding and the message signature, so
  each one is named in the signed content with its length and sha256, and both ends check it:
  the kernel before it unpickles the arguments, the host before it decodes a value. The frame is
  the comm message whose signed content carries this call's marker; exactly one must arrive.
* Text frames (the OpenSandbox relay, which carries neither comms nor buffers): the pickle is
  a base64 literal in the cell and the result is the text frame described above.
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

_SCALARS = frozenset({str, int, float, bool, type(None)})

def _plain(value):
    """Whether JSON decodes ``value``'s encoding back to an equal value (str-keyed dicts, lists, scalars).

    A walk instead of decoding the JSON again and comparing: same answer, far less work on big strings.
    """
    if value is None or isinstance(value, (str, int, float)):
        return True
    if isinstance(value, list):
        return all(type(item) in _SCALARS or _plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and (type(item) in _SCALARS or _plain(item)) for key, item in value.items())
    return False

def _encode(value):
    """("json", JSON text) when JSON carries ``value`` faithfully, else ("pickle", its pickle)."""
    try:
        if _plain(value):
            return "json", json.dumps(value, ensure_ascii=True, allow_nan=False).encode("ascii")
    except Exception:
        pass
    try:
        return "pickle", pickle.dumps(value, protocol=4)
    except Exception:
        import io
        buf = io.BytesIO()
        _NamePickler(buf, protocol=4).dump(value)
        return "pickle", buf.getvalue()

def _error(exc):
    import traceback
    return {"name": type(exc).__name__, "value": str(exc), "traceback": traceback.format_exc()}

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
    return _frame(json.dumps(_main_dict(), ensure_ascii=True))
'''

TOOL_SRC = r'''
def _call_tool(raw):
    """Call the tool pickled in ``raw``; return {name: _encode(value)} for the values going back."""
    import inspect
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
    out = {"func_return": _encode(func(**kwargs))}
    if takes_state:
        out["agent_state"] = _encode(data["state"])
    return out
'''

TOOL_TEXT_MAIN = r'''
def _main():
    try:
        values = _call_tool(base64.b64decode(_payload))
    except Exception as exc:
        return _frame(json.dumps({"error": _error(exc)}, ensure_ascii=True))
    fragments = {
        name: '{"json": ' + data.decode("ascii") + "}" if kind == "json"
        else '{"pickle": "' + base64.b64encode(data).decode("ascii") + '"}'
        for name, (kind, data) in values.items()
    }
    return _frame("{" + ", ".join(f'"{name}": {text}' for name, text in fragments.items()) + "}")
'''

CHANNEL_LOST = "kernel-sandbox: the tool channel was closed in the kernel"

TOOL_CHANNEL_MAIN = r'''
def _main():
    import comm
    channel = comm.get_comm_manager().get_comm(_channel)
    if channel is None:
        raise LookupError(''' + repr(CHANNEL_LOST) + r''')
    try:
        values = _call_tool(_received(channel))
        meta = {"kinds": {name: kind for name, (kind, _) in values.items()}}
    except Exception as exc:
        values, meta = {}, {"error": _error(exc)}
    buffers = [data for _, data in values.values()]
    meta.update(marker=_marker, lengths=[len(data) for data in buffers],
                sha256=[hashlib.sha256(data).hexdigest() for data in buffers])
    channel.send(meta, buffers=buffers)

def _received(channel):
    """The call's pickle: inline in the cell, or the buffer that came ahead of it on the channel."""
    if _payload is not None:
        return base64.b64decode(_payload)
    inbox, channel.inbox = channel.inbox, {}
    payload = inbox.get("payload")
    if inbox.get("call") != _marker or hashlib.sha256(payload).hexdigest() != inbox.get("sha256"):
        raise ValueError("the tool call's payload did not arrive intact")
    return payload
'''

CHANNEL_SRC = r'''
def _main_dict():
    import comm
    channel = comm.create_comm(target_name="kernel_sandbox")
    channel.inbox = {}
    def receive(msg):
        channel.inbox = dict(msg["content"]["data"], payload=(msg["buffers"] or [b""])[0])
    channel.on_msg(receive)
    return {"channel": channel.comm_id}
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
    """Build a one-expression cell that runs ``main_src``'s ``_main()``, which sends the result.

    ``_main()`` publishes a text frame with ``_frame`` (append :data:`JSON_MAIN` to a source whose
    ``_main_dict()`` returns a dict), or sends a channel message (:data:`TOOL_CHANNEL_MAIN`).
    ``params`` become globals of a private namespace: the user's namespace sees nothing. A text
    frame is published as display_data, or with ``as_display=False`` (for relays that drop
    display_data) as the cell's execute_result, which IPython's ``_`` variables then hold. The
    compiled helper is cached in the kernel under :func:`helper_key`; with ``cached`` the cell
    only names it (a smaller cell is cheaper for IPython to process). Returns the cell and its
    marker.
    """
    marker = secrets.token_hex(16)
    namespace = {"__name__": "__kernel_sandbox__", "_marker": marker, "_as_display": as_display, **params}
    key = helper_key(main_src)
    cache = "__import__('sys').modules['_kernel_sandbox_cache'].__dict__"
    if cached:
        return f"(lambda ns: exec({cache}[{key!r}], ns) or ns['_result'])({namespace!r})", marker
    source = KERNEL_PRELUDE + main_src + "\n_result = _main()\n"
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


class ChannelFrames:
    """The tool channel's result frames for one call, checked as they arrive.

    :meth:`add` takes each comm message's (content data, buffers); those with the call's marker
    are frames. The first is checked and decoded at once, while the kernel is still finishing
    the cell: each buffer must match the length and sha256 that the signed content gives for it.
    :meth:`body` then returns it in a text frame body's shape, ``{"error": ...}`` or
    ``{name: {"json": value} | {"pickle": bytes}}``, or raises :class:`FramingError` when there
    was no frame, more than one, or a bad one.
    """

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.count = 0
        self._body: dict[str, Any] | FramingError = FramingError("The sandbox returned no result frame.")

    def add(self, meta: dict[str, Any], buffers: list[memoryview]) -> None:
        """Take one message received on the channel."""
        if meta.get("marker") != self.marker:
            return
        self.count += 1
        if self.count == 1:
            try:
                self._body = _read_channel_frame(meta, buffers)
            except FramingError as exc:
                self._body = exc

    def body(self) -> dict[str, Any]:
        """The decoded body of the single frame."""
        if self.count > 1:
            raise FramingError(
                "More than one result frame carried this call's marker: the tool tampered with the "
                "result channel; its output is not trusted."
            )
        if isinstance(self._body, FramingError):
            raise self._body
        return self._body


def _read_channel_frame(meta: dict[str, Any], buffers: list[memoryview]) -> dict[str, Any]:
    if "error" in meta:
        return {"error": meta["error"]}
    kinds, lengths, digests = meta.get("kinds"), meta.get("lengths"), meta.get("sha256")
    if not (isinstance(kinds, dict) and isinstance(lengths, list) and isinstance(digests, list)) or not (
        len(kinds) == len(lengths) == len(digests) == len(buffers)
    ):
        raise FramingError("The result frame does not describe its buffers.")
    body: dict[str, Any] = {}
    for (name, kind), buffer, length, digest in zip(kinds.items(), buffers, lengths, digests):
        if len(buffer) != length or hashlib.sha256(buffer).hexdigest() != digest:
            raise FramingError("The framed result failed its length or digest check.")
        if kind == "json":
            try:
                body[name] = {"json": json.loads(str(buffer, "ascii"))}
            except ValueError as exc:
                raise FramingError(f"The result frame does not hold JSON: {exc}") from exc
        else:
            body[name] = {kind: bytes(buffer)}
    return body


def decode_value(encoded: dict[str, Any], allowed: Iterable[type] = ()) -> Any:
    """Decode a value encoded by the kernel: JSON as JSON, pickles by the restricted unpickler.

    A pickle is base64 text from a text frame, or raw bytes from a channel frame.
    """
    if "json" in encoded:
        return encoded["json"]
    if "pickle" in encoded:
        data = encoded["pickle"]
        return restricted_loads(data if isinstance(data, bytes) else base64.b64decode(data), allowed)
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
    tool: Callable[..., Any] | str, args: dict[str, Any] | None, agent_state: Any, name: str | None
) -> tuple[dict[str, Any], bytes]:
    """The :data:`TOOL_SRC` parameters naming the tool, and the pickled call (function, args, state)."""
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
    return {"_source": source, "_name": name}, _dumps_by_value(payload, modules)


def tool_error(body: dict[str, Any]) -> ExecutionError | None:
    """The tool's exception recorded in a frame body, if it raised one."""
    error = body.get("error")
    if not error:
        return None
    return ExecutionError(str(error.get("name")), str(error.get("value")), str(error.get("traceback", "")))

