"""The kernel side of the execution API: tool calls, per-call environments, files, packages.

The host installs this module (with ``dataformat``, ``workfiles``, ``checkpoint``, ``packages``,
``trust`` and ``guard``) once per kernel and calls :func:`install`. Requests then arrive as comm
messages on the channel :func:`install` opens (``docker``, ``local``), handled between cells
without IPython's per-execute work, or as :func:`text_request` cells on transports without comms
(the OpenSandbox relay).

A request is ``{"op", "marker", ...}`` plus binary buffers. Every answer is one message
carrying the request's marker: ``{"marker", "lengths"}`` plus the buffers of a value encoded
with ``dataformat`` (``{"ok": ...}``, ``{"error": {...}}``, ``{"refused": ...}``, or for a
tool call ``{"r": return value, "s": agent state}`` or ``{STATE_NOT_KEPT: True}``). An answer
over :data:`CHUNK` bytes is kept here and sent in chunks the host pulls (``"pull": true``), so
no message is larger.

Sending the answer is the handler's last act. Before it, everything a tool may have changed
that the next call relies on is put back (:mod:`.guard`), and the per-call environment is
restored in any case. The answer is sent by the session straight to the IOPub socket, with the
request as its parent, so a tool that sent a forged answer cannot also swallow the real one by
patching the comm: the host sees two answers and refuses both.
"""

from __future__ import annotations

import base64
import collections
import importlib
import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
import types

try:  # inside the kernel, the host installed the siblings under these names
    import _kernel_sandbox_checkpoint as checkpoint
    import _kernel_sandbox_dataformat as dataformat
    import _kernel_sandbox_guard as guard
    import _kernel_sandbox_packages as packages
    import _kernel_sandbox_textframe as textframe
    import _kernel_sandbox_trust as trust
    import _kernel_sandbox_workfiles as files
except ImportError:  # on the host (tests run this module as code)
    from kernel_sandbox.kernelside import checkpoint, dataformat, guard, packages, textframe, trust
    from kernel_sandbox.kernelside import workfiles as files

VERSION = 2
CHUNK = 4 * 1024 * 1024
TARGET = "kernel_sandbox"
TEXT_LIMIT = 64 * 1024
STATE_NOT_KEPT = "state_not_kept"
"""The answer's key when a call named its agent state by digest and this kernel no longer holds
it (the tool did not run): the host sends the state and calls again. Not an error name: a tool
could raise an exception of any name."""
PACKAGES = os.environ.get("PIP_TARGET") or os.path.join(
    os.path.expanduser("~"), ".local", "kernel-sandbox-packages"
)
"""Where ``install`` puts packages: the launcher's ``PIP_TARGET`` (Docker), else under the home."""


def _holder():
    """Where the state lives: a module of its own, so it outlives a re-install of this one."""
    holder = sys.modules.get("_kernel_sandbox_state")
    if not isinstance(holder, types.ModuleType):
        holder = types.ModuleType("_kernel_sandbox_state")
        holder.channel = holder.originals = holder.work = holder.env = holder.states = None
        holder.seen = collections.deque(maxlen=64)
        holder.pending = {}
        sys.modules["_kernel_sandbox_state"] = holder
    return holder


_state = _holder()


# -- answers -----------------------------------------------------------------------------------


def _error(exc):
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    value = str(exc) if not isinstance(exc, KeyboardInterrupt) else "interrupted"
    return {
        "error": {
            "name": type(exc).__name__,
            "value": value[:TEXT_LIMIT],
            "traceback": text[-TEXT_LIMIT:],
        }
    }


def answer(marker, body, allow_pickle=False):
    """Encode ``body``; return ``(meta, buffers)`` for the answer to request ``marker``."""
    try:
        doc, buffers = dataformat.encode(body, allow_pickle=allow_pickle)
    except Exception as exc:
        doc, buffers = dataformat.encode(_error(exc))
    parts = [doc, *buffers]
    lengths = [len(part) for part in parts]
    meta = {"marker": marker, "lengths": lengths}
    if sum(lengths) <= CHUNK:
        return meta, parts
    blob = b"".join(parts)
    _state.pending.clear()
    _state.pending[marker] = blob
    meta["pull"] = True
    return meta, [blob[:CHUNK]]


def _pull(request, buffers):
    blob = _state.pending.get(request.get("of"))
    if blob is None:
        raise LookupError("no answer is waiting to be pulled for that call")
    offset = int(request["offset"])
    chunk = blob[offset : offset + CHUNK]
    if offset + CHUNK >= len(blob):
        _state.pending.clear()
    return {"marker": request["marker"], "lengths": [len(chunk)], "raw": True}, [chunk]


# -- requests ----------------------------------------------------------------------------------


def _work():
    return _state.work or os.getcwd()


def _agent_state(request, buffers):
    """The call's pickled agent state: sent along, or kept from an earlier call (None: not kept)."""
    described = request.get("state") or {}
    if len(buffers) == 2:
        if len(buffers[1]) != described.get("length"):
            raise ValueError("the tool call's payload did not arrive intact")
        data = bytes(buffers[1])
        if described.get("keep"):
            _state.states = {described["digest"]: data}
        return data
    return (_state.states or {}).get(described.get("digest"))


def _call(request, buffers):
    if len(buffers) not in (1, 2) or len(buffers[0]) != request.get("length"):
        raise ValueError("the tool call's payload did not arrive intact")
    state_data = _agent_state(request, buffers)
    if state_data is None:
        return {STATE_NOT_KEPT: True}
    payload = pickle.loads(buffers[0])
    payload["state"] = pickle.loads(state_data)
    func = payload["func"]
    if func is None:
        namespace = {"__name__": "__kernel_sandbox_tool__"}
        exec(compile(payload["source"], "<tool>", "exec"), namespace)
        func = namespace.get(payload["name"])
        if not callable(func):
            raise NameError(f"the tool source defines no function named {payload['name']!r}")
    kwargs = dict(payload["args"] or {})
    takes_state = "agent_state" in inspect.signature(func).parameters
    if takes_state:
        kwargs["agent_state"] = payload["state"]
    with _environment(payload.get("env") or {}):
        value = func(**kwargs)
    return {"r": value, "s": payload["state"]} if takes_state else {"r": value}


class _environment:
    """Set variables for one call and put the previous values back afterwards (a call's secrets'
    CA in the trust for the call only: :func:`trust.call_env`)."""

    def __init__(self, values):
        self.values = values
        self.previous = {}

    def __enter__(self):
        _restore_env()
        self.values = trust.call_env(self.values)
        self.previous = {name: os.environ.get(name) for name in self.values}
        _state.env = self.previous
        os.environ.update(self.values)

    def __exit__(self, *exc):
        _restore_env()
        trust.drop_call_bundle(self.values)


def _restore_env():
    previous, _state.env = _state.env or {}, None
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _env(request, buffers):
    if request["action"] == "set":
        _environment(json.loads(bytes(buffers[0]))).__enter__()
    else:
        _restore_env()
    return {"ok": None}


def _install(request, buffers):
    os.makedirs(PACKAGES, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(request["requirements"])
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--target",
        PACKAGES,
        "-r",
        handle.name,
        *request["pip_args"],
    ]
    environ = packages.pip_environ(os.environ)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, cwd=_work(), env=environ)
    finally:
        os.unlink(handle.name)
        refused = packages.refusals(environ)
    if proc.returncode == 0:
        if PACKAGES not in sys.path:
            sys.path.insert(0, PACKAGES)
        importlib.invalidate_caches()
    tail = request["tail"]
    return {
        "ok": {
            "returncode": proc.returncode,
            "stdout": proc.stdout[-tail:],
            "stderr": proc.stderr[-tail:],
            "refused": refused,
        }
    }


def _prepare(request, buffers):
    os.chdir(_work())
    if _work() not in sys.path:
        sys.path.insert(0, _work())
    return {"ok": None}


def _file(request, buffers):
    op, path = request["op"], request.get("path", ".")
    if op == "write":
        return {"ok": files.write_chunk(_work(), path, request["offset"], buffers[0])}
    if op == "read":
        total, data = files.read_chunk(_work(), path, request["offset"], request["size"])
        return {"ok": [total, data]}
    if op == "list":
        return {"ok": files.listing(_work(), path)}
    if op == "snapshot":
        return {"ok": files.snapshot(_work())}
    files.wipe(_work())
    return {"ok": None}


def _checkpoint(request, buffers):
    """Checkpoints: ``save`` the state into a blob, move it (``read``/``write`` of a chunk, as the
    file operations do, in the checkpoint area), ``load`` it, ``drop`` it."""
    action = request["action"]
    if action == "save":
        return {"ok": checkpoint.save(_work())}
    if action == "read":
        total, data = files.read_chunk(
            checkpoint.area(), checkpoint.BLOB, request["offset"], request["size"]
        )
        return {"ok": [total, data]}
    if action == "write":
        return {
            "ok": files.write_chunk(
                checkpoint.area(), checkpoint.BLOB, request["offset"], buffers[0]
            )
        }
    if action == "load":
        return {"ok": checkpoint.load(_work(), request["sha256"])}
    checkpoint.drop()
    return {"ok": None}


def _ready(request, buffers):
    return {"ok": None}


OPS = {
    "ready": _ready,
    "call": _call,
    "env": _env,
    "install": _install,
    "prepare": _prepare,
    "write": _file,
    "read": _file,
    "list": _file,
    "snapshot": _file,
    "wipe": _file,
    "checkpoint": _checkpoint,
}


def handle(request, buffers):
    """Run one request; return ``(meta, buffers)`` of its answer. Never raises."""
    marker = request.get("marker")
    _state.seen.append(marker)
    if request.get("op") == "pull":
        try:
            return _pull(request, buffers)
        except Exception as exc:
            return answer(marker, _error(exc))
    allow_pickle = False
    try:
        if request.get("op") == "call":
            allow_pickle = bool(request.get("pickle"))
        body = OPS[request["op"]](request, buffers)
    except files.Refused as exc:
        body = {"refused": str(exc)}
    except BaseException as exc:
        body = _error(exc)
    finally:
        guard.restore(_state, _on_msg)
        guard.flush(_state)
    return answer(marker, body, allow_pickle)


# -- transports --------------------------------------------------------------------------------


def _on_msg(msg):
    data = msg["content"].get("data") or {}
    meta, buffers = handle(data, msg.get("buffers") or [])
    saved = _state.originals or {}
    if "send" not in saved or saved.get("channel") is None:
        _state.channel.send(meta, buffers=buffers)
        return
    _channel, comm_id, topic, _names = saved["channel"]
    _kernel, session, socket = saved["send"]["kernel"]
    session.send(
        socket,
        "comm_msg",
        {"data": meta, "comm_id": comm_id},
        parent=msg,
        ident=topic,
        buffers=buffers,
    )


def text_request(request_text, buffers_text=()):
    """Handle a request given as JSON text and base64 buffers; the cell's value is the frame."""
    request = json.loads(request_text)
    meta, buffers = handle(request, [base64.b64decode(part) for part in buffers_text])
    return textframe.frame(request["marker"], meta, buffers)


def install(marker, work, probe=None, channel=True):
    """Start serving: capture the originals, restore any leftover environment, open the channel.

    Returns (and, on the channel, also announces in the comm's open message)
    ``{"marker", "version", "work", "seen"}``, where ``seen`` says whether a request with
    the marker ``probe`` was received before.
    """
    global _state
    _state = _holder()
    if _state.originals is None:
        _state.originals = guard.capture()
        guard.bounded_output()
    guard.restore(_state, _on_msg)
    _restore_env()
    _state.work = os.path.realpath(work or os.getcwd())
    info = {"marker": marker, "version": VERSION, "work": _state.work, "seen": probe in _state.seen}
    if channel:
        old, _state.channel = _state.channel, None
        if old is not None:
            try:
                old.close()
            except Exception:
                pass
        import comm

        _state.channel = comm.create_comm(target_name=TARGET, data=info)
        _state.channel.on_msg(_on_msg)
        channel = _state.channel
        _state.originals["channel"] = (channel, channel.comm_id, channel.topic, set(vars(channel)))
        guard.restore(_state, _on_msg)
    return info
