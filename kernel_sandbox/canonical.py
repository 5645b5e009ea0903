"""The canonical form of a kernel→client message: what the output policy decides on.

A client reads a message in ways a policy that checks only the usual shape would miss:
jupyter_client's adapter turns a protocol 4 ``pyout`` into an ``execute_result`` (and a stream's
``data`` into its ``text``) when the header's ``version`` is missing or 4.x; JupyterLab joins a
list of strings where it expects a string. :func:`canonical_message` therefore translates the
message as the client would (with jupyter_client's own adapter), keeps only the message types of
:data:`CHANNEL_TYPES` on their channel, rewrites the header to :data:`PROTOCOL_VERSION` (so no
client adapts it again), and rebuilds the content of each type from its allowed keys, each of
its JSON type: lists of strings joined as the frontends join them, anything of an unexpected
type dropped. The policy then cleans the values of this canonical form.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any


__all__ = [
    "CHANNEL_TYPES",
    "PROTOCOL_VERSION",
    "canonical_content",
    "canonical_message",
    "canonical_output",
    "joined_text",
]

PROTOCOL_VERSION = "5.4"
"""The one protocol version the policy speaks: every message it passes says this in its header."""

IOPUB_TYPES = frozenset(
    {
        "stream",
        "display_data",
        "update_display_data",
        "execute_input",
        "execute_result",
        "error",
        "status",
        "clear_output",
        "debug_event",
        "comm_open",
        "comm_msg",
        "comm_close",
        # also broadcast on IOPub (the protocol's older word; the execd relay does)
        "shutdown_reply",
    }
)
REPLY_TYPES = frozenset(
    {
        "execute_reply",
        "inspect_reply",
        "complete_reply",
        "history_reply",
        "is_complete_reply",
        "comm_info_reply",
        "kernel_info_reply",
        "shutdown_reply",
        "interrupt_reply",
        "debug_reply",
        "usage_reply",
        "create_subshell_reply",
        "delete_subshell_reply",
        "list_subshell_reply",
    }
)
CHANNEL_TYPES: dict[str, frozenset[str]] = {
    "iopub": IOPUB_TYPES,
    "shell": REPLY_TYPES,
    "control": REPLY_TYPES,
    "stdin": frozenset({"input_request"}),
}
"""The message types a kernel may send on each channel (protocol 5.4, and ipykernel 7's
subshells)."""
BUFFER_TYPES = frozenset({"comm_open", "comm_msg"})
"""The only types whose binary buffers a frontend reads (widget state); others lose them."""

_HEADER_KEYS = ("msg_id", "msg_type", "username", "session", "date", "subshell_id")
_DROP = object()
Message = tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]


# ---- values -------------------------------------------------------------------------------------


def joined_text(value: Any) -> str | None:
    """A string, or a list of strings joined as nbformat's multi-line strings are; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "".join(value)
    return None


def _text(value: Any) -> Any:
    text = joined_text(value)
    return _DROP if text is None else text


def _str(value: Any) -> Any:
    return value if isinstance(value, str) else _DROP


def _int(value: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else _DROP


def _int_or_none(value: Any) -> Any:
    return value if value is None else _int(value)


def _number(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else _DROP


def _bool(value: Any) -> Any:
    return value if isinstance(value, bool) else _DROP


def _dict(value: Any) -> Any:
    return value if isinstance(value, dict) else _DROP


def _strings(value: Any) -> Any:
    """A list of strings: its other elements dropped."""
    if not isinstance(value, list):
        return _DROP
    return (
        value
        if all(isinstance(v, str) for v in value)
        else [v for v in value if isinstance(v, str)]
    )


def _one_of(*allowed: str) -> Callable[[Any], Any]:
    return lambda value: value if isinstance(value, str) and value in allowed else _DROP


def _list_of(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, list):
            return _DROP
        return [kept for kept in map(item, value) if kept is not _DROP]

    return check


def _mapping_of(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, dict):
            return _DROP
        return {key: kept for key, entry in value.items() if (kept := item(entry)) is not _DROP}

    return check


class _Record:
    """A dict rebuilt from ``fields`` only, each value checked; _DROP without one of
    ``required``."""

    __slots__ = ("fields", "required")

    def __init__(
        self, fields: Mapping[str, Callable[[Any], Any]], required: tuple[str, ...] = ()
    ) -> None:
        self.fields = fields
        self.required = required

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return _DROP
        out = {}
        for key, field in self.fields.items():
            if key in value and (kept := field(value[key])) is not _DROP:
                out[key] = kept
        return _DROP if any(key not in out for key in self.required) else out


_record = _Record


def _numbers(value: Any) -> Any:
    """A dict of numbers (resource usage figures)."""
    if not isinstance(value, dict):
        return _DROP
    return {key: item for key, item in value.items() if _number(item) is not _DROP}


# ---- contents -----------------------------------------------------------------------------------

_STATUS = {"status": _one_of("ok", "error", "aborted")}
_ERROR = {"ename": _str, "evalue": _str, "traceback": _strings}
_REPLY = {**_STATUS, **_ERROR}
_BUNDLE = {"data": _dict, "metadata": _dict}
_TRANSIENT = _record({"display_id": _str})
# a Debug Adapter Protocol message: its body is the debugger's JSON, cleaned by the policy
_DEBUG = {
    "seq": _int,
    "type": _one_of("request", "response", "event"),
    "request_seq": _int,
    "success": _bool,
    "command": _str,
    "event": _str,
    "message": _str,
    "body": _dict,
}
_HELP_LINK = _record({"text": _str, "url": _str}, ("url",))
_LANGUAGE_INFO = _record(
    {
        "name": _str,
        "version": _str,
        "mimetype": _str,
        "file_extension": _str,
        "pygments_lexer": _str,
        "codemirror_mode": lambda v: v if isinstance(v, (str, dict)) else _DROP,
        "nbconvert_exporter": _str,
    }
)


def _history_entry(value: Any) -> Any:
    """``[session, line, input]`` or ``[session, line, [input, output]]``."""
    if not (
        isinstance(value, list)
        and len(value) == 3
        and _int(value[0]) is not _DROP
        and _int(value[1]) is not _DROP
    ):
        return _DROP
    entry = value[2]
    if isinstance(entry, str):
        return value
    if (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and (entry[1] is None or isinstance(entry[1], str))
    ):
        return value
    return _DROP


_COMPLETION_TYPE = _record(
    {"start": _int, "end": _int, "text": _str, "type": _str, "signature": _str}, ("text",)
)
_PAGE_PAYLOAD = _record(
    {"source": _one_of("page"), "data": _dict, "start": _int}, ("source", "data")
)
_PAYLOADS = {
    "page": _PAGE_PAYLOAD,
    "set_next_input": _record({"source": _str, "text": _str, "replace": _bool}, ("source", "text")),
    "edit_magic": _record({"source": _str, "filename": _str, "line_number": _int}, ("source",)),
    "ask_exit": _record({"source": _str, "keepkernel": _bool}, ("source",)),
}


def _payload(value: Any) -> Any:
    source = value.get("source") if isinstance(value, dict) else None
    kind = _PAYLOADS.get(source) if isinstance(source, str) else None
    return _DROP if kind is None else kind(value)


_USER_EXPRESSION = _record({**_REPLY, **_BUNDLE})

CONTENTS: dict[str, Callable[[Any], Any]] = {
    "stream": _record({"name": _one_of("stdout", "stderr"), "text": _text}, ("name", "text")),
    "display_data": _record({**_BUNDLE, "transient": _TRANSIENT}, ("data",)),
    "update_display_data": _record({**_BUNDLE, "transient": _TRANSIENT}, ("data",)),
    "execute_result": _record(
        {**_BUNDLE, "transient": _TRANSIENT, "execution_count": _int_or_none}, ("data",)
    ),
    "execute_input": _record({"code": _text, "execution_count": _int_or_none}, ("code",)),
    "error": _record(_ERROR, ("ename", "evalue", "traceback")),
    "status": _record(
        {"execution_state": _one_of("busy", "idle", "starting")}, ("execution_state",)
    ),
    "clear_output": _record({"wait": _bool}),
    "debug_event": _record(_DEBUG),
    # target_module: only null (ipykernel's); a name would make a frontend with require.js load and
    # run it
    "comm_open": _record(
        {
            "comm_id": _str,
            "target_name": _str,
            "data": _dict,
            "metadata": _dict,
            "target_module": lambda v: v if v is None else _DROP,
        },
        ("comm_id", "target_name"),
    ),
    "comm_msg": _record({"comm_id": _str, "data": _dict, "metadata": _dict}, ("comm_id",)),
    "comm_close": _record({"comm_id": _str, "data": _dict, "metadata": _dict}, ("comm_id",)),
    "execute_reply": _record(
        {
            **_REPLY,
            "execution_count": _int_or_none,
            "payload": _list_of(_payload),
            "user_expressions": _mapping_of(_USER_EXPRESSION),
        },
        ("status",),
    ),
    "inspect_reply": _record({**_REPLY, "found": _bool, **_BUNDLE}, ("status",)),
    "complete_reply": _record(
        {
            **_REPLY,
            "matches": _strings,
            "cursor_start": _int,
            "cursor_end": _int_or_none,
            "metadata": _record({"_jupyter_types_experimental": _list_of(_COMPLETION_TYPE)}),
        },
        ("status",),
    ),
    "history_reply": _record({**_REPLY, "history": _list_of(_history_entry)}, ("status",)),
    "is_complete_reply": _record(
        {
            **_REPLY,
            "status": _one_of("complete", "incomplete", "invalid", "unknown"),
            "indent": _str,
        },
        ("status",),
    ),
    "comm_info_reply": _record(
        {
            **_REPLY,
            "comms": _mapping_of(_record({"target_name": _str})),
        },
        ("status",),
    ),
    "kernel_info_reply": _record(
        {
            **_REPLY,
            "protocol_version": _str,
            "implementation": _str,
            "implementation_version": _str,
            "language_info": _LANGUAGE_INFO,
            "banner": _text,
            "debugger": _bool,
            "help_links": _list_of(_HELP_LINK),
            "supported_features": _strings,
        },
        ("status",),
    ),
    "shutdown_reply": _record({**_REPLY, "restart": _bool}),
    "interrupt_reply": _record(_REPLY),
    "debug_reply": _record(_DEBUG),
    "usage_reply": _record(
        {
            "hostname": _str,
            "pid": _int,
            "cpu_count": _int,
            "kernel_cpu": _number,
            "kernel_memory": _number,
            "host_cpu_percent": _number,
            "host_virtual_memory": _numbers,
        }
    ),
    "create_subshell_reply": _record({**_REPLY, "subshell_id": _str}),
    "delete_subshell_reply": _record(_REPLY),
    "list_subshell_reply": _record({**_REPLY, "subshell_id": _strings}),
    "input_request": _record({"prompt": _text, "password": _bool}, ("prompt",)),
}
"""Each message type's content: its allowed keys, each of its JSON type (lists of strings joined).
A :class:`_Record`'s ``fields`` are the keys its content may have."""

_OUTPUTS: dict[str, Callable[[Any], Any]] = {
    "stream": CONTENTS["stream"],
    "display_data": _record(_BUNDLE, ("data",)),
    "execute_result": _record({**_BUNDLE, "execution_count": _int_or_none}, ("data",)),
    "error": CONTENTS["error"],
}


def canonical_content(msg_type: str, content: Any) -> dict[str, Any] | None:
    """The content of a ``msg_type`` message rebuilt from its allowed keys, or None (unknown type,
    or unusable)."""
    shape = CONTENTS.get(msg_type)
    if shape is None:
        return None
    out = shape(content)
    return None if out is _DROP else out


def canonical_output(output: Any) -> dict[str, Any] | None:
    """One nbformat output (an Output widget's ``outputs``) in its canonical form, or None."""
    kind = output.get("output_type") if isinstance(output, dict) else None
    shape = _OUTPUTS.get(kind) if isinstance(kind, str) else None
    if shape is None:
        return None
    out = shape(output)
    return None if out is _DROP else {"output_type": kind, **out}


# ---- messages -----------------------------------------------------------------------------------


def _major(version: Any) -> int | None:
    """A header's protocol major version as jupyter_client reads it (none: 4), None if it cannot."""
    if version is None:
        return 4
    if not isinstance(version, str):
        return None
    try:
        return int(version.split(".")[0])
    except ValueError:
        return None


@functools.cache
def _v4_adapter() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """jupyter_client's protocol 4 → 5 adapter, imported at the first such message: importing it
    loads all of jupyter_client (13 MiB), which the launcher would hold for its life otherwise."""
    from jupyter_client.adapter import V4toV5

    return V4toV5()


def _header(header: dict[str, Any]) -> dict[str, Any]:
    return {key: header[key] for key in _HEADER_KEYS if isinstance(header.get(key), str)}


def canonical_message(
    channel: str, header: Any, parent: Any, metadata: Any, content: Any
) -> Message | None:
    """``(header, parent_header, metadata, content)`` as the policy decides on them, or None (drop).

    A header without ``version`` or with a 4.x one is translated as jupyter_client's adapter
    translates it for every Python client (``pyout`` → ``execute_result``, stream ``data`` →
    ``text``...); any other version but 5.x is dropped, as are message types not allowed on the
    channel and contents missing a required field. The header says :data:`PROTOCOL_VERSION`.
    """
    if not isinstance(header, dict) or not isinstance(content, dict):
        return None
    parent = parent if isinstance(parent, dict) else {}
    metadata = metadata if isinstance(metadata, dict) else {}
    major = _major(header.get("version"))
    if major == 4:
        message = copy.deepcopy(
            {"header": header, "parent_header": parent, "metadata": metadata, "content": content}
        )
        try:
            message = _v4_adapter()(message)
        except Exception:  # what the client's adapter fails on, the client never shows
            return None
        header, parent, metadata, content = (
            message[k] for k in ("header", "parent_header", "metadata", "content")
        )
        if not all(isinstance(part, dict) for part in (header, parent, metadata, content)):
            return None
    elif major != 5:
        return None
    msg_type = header.get("msg_type")
    shape = (
        CONTENTS.get(msg_type)
        if isinstance(msg_type, str) and msg_type in CHANNEL_TYPES.get(channel, ())
        else None
    )
    if shape is None or not isinstance(header.get("msg_id"), str):
        return None
    rebuilt = shape(content)
    if rebuilt is _DROP:
        return None
    parent_header = _header(parent)
    if isinstance(parent.get("version"), str):
        parent_header["version"] = parent["version"]
    return {**_header(header), "version": PROTOCOL_VERSION}, parent_header, metadata, rebuilt
