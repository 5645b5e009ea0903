"""What a tool may break, saved when the kernel-side helper is installed and put back after every
request (kernel side, standard library only; installed beside :mod:`.toolhost`).

Everything a tool may have changed that the next call relies on is put back before an answer is
sent: ``sys.stdout``/``stderr``/``displayhook``/``excepthook``, IPython's display hook and
publisher, the comm manager and its handlers, the helper's channel, and the path an answer takes
to IOPub (the methods of the comm, comm manager, session and IOPub socket classes, methods set on
those objects, the session's key and packers). Output streams are also made to flush by size, so
no output message is much larger than :data:`OUTPUT_FLUSH_BYTES`.
"""

from __future__ import annotations

import sys

OUTPUT_FLUSH_BYTES = 1024 * 1024


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def capture():
    """The objects the channel and the next calls rely on, as they are now."""
    shell = _ipython()
    kernel = getattr(shell, "kernel", None)
    saved = {
        "sys": {
            name: getattr(sys, name) for name in ("stdout", "stderr", "displayhook", "excepthook")
        }
    }
    if shell is not None:
        saved["shell"] = (
            shell,
            {name: getattr(shell, name, None) for name in ("displayhook", "display_pub")},
        )
    if kernel is not None:
        handlers = {
            "shell_handlers": dict(kernel.shell_handlers),
            "control_handlers": dict(kernel.control_handlers),
        }
        saved["kernel"] = (kernel, getattr(kernel, "comm_manager", None), handlers)
    try:
        import comm

        saved["comm"] = (comm, comm.get_comm_manager, comm.create_comm)
    except ImportError:
        pass
    if kernel is not None:
        saved["send"] = _send_path(kernel)
    return saved


SESSION_FIELDS = (
    "key",
    "auth",
    "pack",
    "unpack",
    "digest_mod",
    "signature_scheme",
    "session",
    "bsession",
    "username",
)


def _send_path(kernel):
    """What an answer goes through (the session, the IOPub socket and their classes, the comm
    classes the requests arrive through), as it is now."""
    session, socket = kernel.session, kernel.iopub_socket
    objects = [
        kernel,
        session,
        socket,
        getattr(socket, "io_thread", None),
        getattr(kernel, "comm_manager", None),
    ]
    objects = [obj for obj in objects if obj is not None]
    classes = [type(obj) for obj in objects[1:]]
    try:
        from ipykernel.comm import Comm

        classes.append(Comm)
    except ImportError:
        pass
    methods = {}
    for cls in {klass for root in classes for klass in root.__mro__ if klass is not object}:
        methods[cls] = (
            set(vars(cls)),
            {name: value for name, value in vars(cls).items() if _is_code(value)},
        )
    return {
        "kernel": (kernel, session, socket),
        "session": {name: getattr(session, name, None) for name in SESSION_FIELDS},
        "objects": [(obj, set(vars(obj))) for obj in objects],
        "classes": methods,
    }


def _clean(obj, names):
    """Remove what was set on ``obj`` since it had the attributes ``names`` and shadows a method of
    its class."""
    current = vars(obj)
    for name in current.keys() - names:
        if callable(current[name]) and _is_code(getattr(type(obj), name, None)):
            delattr(obj, name)


def _is_code(value):
    return callable(value) or isinstance(value, (staticmethod, classmethod, property))


def _restore_send_path(saved):
    kernel, session, socket = saved["kernel"]
    for cls, (names, methods) in saved["classes"].items():
        current = vars(cls)
        for name in current.keys() - names:
            if _is_code(current[name]):
                delattr(cls, name)
        for name, value in methods.items():
            if current.get(name) is not value:
                setattr(cls, name, value)
    for obj, names in saved["objects"]:
        _clean(obj, names)
    if kernel.session is not session:
        kernel.session = session
    if kernel.iopub_socket is not socket:
        kernel.iopub_socket = socket
    for name, value in saved["session"].items():
        if getattr(session, name, None) is not value:
            setattr(session, name, value)


def restore(state, on_msg):  # noqa: C901
    """Put back what :func:`capture` saved at install into ``state.originals``, and re-attach
    the channel ``state.channel`` with its callback ``on_msg``."""
    saved = state.originals
    if not saved:
        return
    for name, value in saved["sys"].items():
        if getattr(sys, name) is not value:
            setattr(sys, name, value)
        if name in ("stdout", "stderr"):
            _unshadow(value)
    if "shell" in saved:
        shell, attributes = saved["shell"]
        for name, value in attributes.items():
            if value is not None and getattr(shell, name, None) is not value:
                setattr(shell, name, value)
    if "comm" in saved:
        module, get_manager, create = saved["comm"]
        module.get_comm_manager, module.create_comm = get_manager, create
    if "kernel" in saved:
        kernel, manager, handlers = saved["kernel"]
        if manager is not None:
            kernel.comm_manager = manager
        for table, entries in handlers.items():
            if not isinstance(getattr(kernel, table, None), dict):
                setattr(kernel, table, {})
            current = getattr(kernel, table)
            for name, handler in entries.items():
                if current.get(name) is not handler:
                    current[name] = handler
        if "send" in saved:
            _restore_send_path(saved["send"])
        if saved.get("channel") is not None:
            state.channel, _comm_id, _topic, names = saved["channel"]
            _clean(state.channel, names)
        channel = state.channel
        if channel is not None and manager is not None:
            manager.comms[channel.comm_id] = channel
            channel._closed = False
            channel._msg_callback = on_msg


def bounded_output():
    """Make ipykernel's output streams send what they hold once it passes OUTPUT_FLUSH_BYTES.

    Left alone, a stream gathers everything written within its flush interval into one
    message (100 MB printed in a tight loop becomes one 100 MB message); flushed by size,
    output leaves in messages of about a megabyte, and the writer waits for them to go out.
    The class's ``write`` is wrapped; :func:`_unshadow` removes the stale instance copies
    of the old one that IPython leaves behind after a cell.
    """
    try:
        from ipykernel.iostream import OutStream
    except ImportError:
        return
    original = OutStream.write
    if getattr(original, "kernel_sandbox", None) is not None:
        return

    def write(self, string):
        if isinstance(string, str) and len(string) > OUTPUT_FLUSH_BYTES:
            for start in range(0, len(string), OUTPUT_FLUSH_BYTES):
                write(self, string[start : start + OUTPUT_FLUSH_BYTES])
            return len(string)
        written = original(self, string)
        try:
            with self._buffer_lock:
                pending = sum(buffer.tell() for buffer in self._buffers.values())
        except Exception:
            return written
        if pending > OUTPUT_FLUSH_BYTES:
            self.flush()
        return written

    write.kernel_sandbox = original
    OutStream.write = write


def _unshadow(stream):
    """Drop an instance attribute ``write`` that is the old, unwrapped method (IPython's
    leftover)."""
    method = getattr(stream, "__dict__", {}).get("write")
    current = getattr(type(stream), "write", None)
    if getattr(method, "__func__", None) is getattr(current, "kernel_sandbox", object()):
        del stream.__dict__["write"]


def flush(state):
    """Flush the output streams saved in ``state.originals`` (else the current ones)."""
    for name in ("stdout", "stderr"):
        stream = state.originals["sys"][name] if state.originals else getattr(sys, name)
        try:
            stream.flush()
        except Exception:
            pass
