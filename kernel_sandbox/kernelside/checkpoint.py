"""Checkpoints of a kernel's state (kernel side): the user's namespace and the work directory's
files.

:func:`save` writes one blob, a ZIP archive (stored, not compressed) holding ``namespace.pickle``
(the names the user defined, pickled together with cloudpickle, so shared objects stay shared and
functions keep seeing the namespace as their globals), ``sys_path.json`` (the import path, so that
a class from a package the user put on it, say ``sys.path.append('lib')``, loads again) and
``files/...`` (the regular files of the
work directory; other mounts under it are left out and said so), in a private directory of this
kernel (:func:`area`). The host moves the blob with the file operations of the helper
(:mod:`workfiles`, under that directory) and keeps it as opaque bytes: it never opens it.
:func:`load` is the other half, in a fresh kernel.

What cannot be pickled (an open socket, a thread, a generator, an open file...) is listed by name
with the reason, never dropped silently. Names IPython keeps for itself (``In``, ``Out``,
``_``, ``_i3``, ``get_ipython``...) are not the user's and are not saved.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import io
import json
import os
import pickle
import re
import shutil
import stat
import sys
import tempfile
import zipfile

try:  # inside the kernel, the host installed the sibling under this name
    import _kernel_sandbox_workfiles as files
except ImportError:  # on the host (tests run this module as code)
    from kernel_sandbox.kernelside import workfiles as files

BLOB = "checkpoint.zip"
NAMESPACE = "namespace.pickle"
SYS_PATH = "sys_path.json"
FILES = "files/"
_IPYTHON_NAMES = re.compile(r"_+|_i+|_i?\d+|_[dio]h|__\w+__")
_AREA = "_kernel_sandbox_checkpoint_area"


def area():
    """This kernel's directory for checkpoint blobs (made once, 0700), on the roomiest writable
    filesystem of home and the temporary directory: outside the work directory."""
    # the helper's state module, else this module (a kernel with the magics but no helper yet)
    holder = sys.modules.get("_kernel_sandbox_state") or sys.modules.get(__name__)
    path = getattr(holder, _AREA, None)
    if path and os.path.isdir(path):
        return path
    candidates = []
    for root in (os.path.expanduser("~"), tempfile.gettempdir()):
        if os.path.isdir(root) and os.access(root, os.W_OK):
            candidates.append((shutil.disk_usage(root).free, root))
    if not candidates:
        raise OSError(
            "no writable directory for a checkpoint (home and the temporary directory are "
            "read-only)"
        )
    path = tempfile.mkdtemp(prefix=".kernel-sandbox-checkpoint-", dir=max(candidates)[1])
    if holder is not None:
        setattr(holder, _AREA, path)
    return path


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def namespace():
    """``(user namespace, {name: value} of what IPython put there for itself})``."""
    shell = _shell()
    if shell is None:
        return sys.modules["__main__"].__dict__, {}
    ns, hidden = shell.user_ns, {}
    for name, value in shell.user_ns_hidden.items():
        current = ns.get(name)
        if current is value or type(current).__module__.split(".")[0] in ("IPython", "ipykernel"):
            hidden[name] = current
    return ns, hidden


def user_names(ns, hidden):
    """The names of ``ns`` the user defined, sorted."""
    return sorted(
        name
        for name, value in ns.items()
        if isinstance(name, str) and not _IPYTHON_NAMES.fullmatch(name) and name not in hidden
    )


def _pickler_class():
    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        """cloudpickle, with the namespace itself and IPython's own values by reference: functions
        defined here get the new kernel's namespace as their globals, and ``get_ipython`` its
        own."""

        def __init__(self, file, ns, hidden):
            super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
            self.ns, self.hidden = (
                ns,
                {id(value): name for name, value in hidden.items() if _by_reference(value)},
            )
            self.globals_ref[id(ns)] = ns  # what cloudpickle gives functions of ``ns`` as globals

        def persistent_id(self, obj):
            if obj is self.ns:
                return "namespace"
            name = self.hidden.get(id(obj))
            return None if name is None else ("hidden", name)

    return Pickler


def _by_reference(value):
    """True for IPython's objects and callables, never for values equal ones could share (``''``,
    ``0``)."""
    return callable(value) or type(value).__module__ != "builtins"


class _Discard(io.RawIOBase):
    def writable(self):
        return True

    def write(self, data):
        return memoryview(data).nbytes


def _reason(exc):
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:300] + "..."


def _picklable(pickler_class, ns, hidden, names):
    """``(names that pickle, {name: why not} for the others})``, each tried alone."""
    good, bad = [], {}
    for name in names:
        try:
            pickler_class(_Discard(), ns, hidden).dump({name: ns[name]})
        except BaseException as exc:  # an object's own reducer may raise anything
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            bad[name] = _reason(exc)
        else:
            good.append(name)
    return good, bad


def _work_files(work, skip):
    """``([(relative path, real path)], {relative path: why not saved})`` for the work directory."""
    root = os.path.realpath(work)
    device = os.stat(root).st_dev
    found, left = [], {}
    for folder, dirs, names in os.walk(root):
        for name in list(dirs):
            path = os.path.join(folder, name)
            info = os.lstat(path)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if path == skip or info.st_dev != device:
                dirs.remove(name)
                if path != skip:
                    left[relative + "/"] = "another filesystem mounted in the work directory"
            elif stat.S_ISLNK(info.st_mode):
                dirs.remove(name)
                left[relative] = "a symbolic link"
        for name in names:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                found.append((relative, path))
            else:
                left[relative] = (
                    "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                )
    return found, left


def digest(path):
    """The sha256 (hex) of the file at ``path``."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            sha.update(block)
    return sha.hexdigest()


def save(work):
    """Write the blob of this kernel's state; return its report.

    ``{"size", "sha256", "saved": [names], "not_saved": {name: why}, "files": count,
    "files_not_saved": {path: why}}``.
    """
    ns, hidden = namespace()
    pickler_class = _pickler_class()
    names = user_names(ns, hidden)
    target = os.path.join(area(), BLOB)
    found, files_left = _work_files(work, area())
    saved, not_saved = names, {}
    for attempt in range(2):
        try:
            with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                for relative, path in found:
                    archive.write(path, FILES + relative)
                archive.writestr(SYS_PATH, json.dumps([p for p in sys.path if isinstance(p, str)]))
                with archive.open(NAMESPACE, "w", force_zip64=True) as stream:
                    pickler_class(stream, ns, hidden).dump({name: ns[name] for name in saved})
            break
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit, OSError)) or attempt:
                drop()
                if getattr(exc, "errno", None) == errno.ENOSPC:
                    raise OSError(
                        errno.ENOSPC,
                        f"no room for the checkpoint in {area()} (on Docker: raise "
                        "home_size or memory)",
                    ) from None
                raise
            saved, not_saved = _picklable(pickler_class, ns, hidden, names)
    return {
        "size": os.path.getsize(target),
        "sha256": digest(target),
        "saved": saved,
        "not_saved": not_saved,
        "files": len(found),
        "files_not_saved": files_left,
    }


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, ns, hidden):
        super().__init__(file)
        self.ns, self.names = ns, hidden

    def persistent_load(self, pid):
        if pid == "namespace":
            return self.ns
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "hidden" and pid[1] in self.names:
            return self.names[pid[1]]
        raise pickle.UnpicklingError(f"unknown reference {pid!r} in the checkpoint")


def load(work, sha256):
    """Load the blob the host wrote into :func:`area`: the files into ``work``, the names into the
    namespace. Returns ``{"restored": [names], "files": count}``; the blob is removed."""
    target = os.path.join(area(), BLOB)
    try:
        if digest(target) != sha256:
            raise ValueError("the checkpoint did not arrive intact (its sha256 differs)")
        with zipfile.ZipFile(target) as archive:
            members = [
                info
                for info in archive.infolist()
                if info.filename.startswith(FILES) and not info.is_dir()
            ]
            for info in members:
                relative = info.filename[len(FILES) :]
                files.inside(work, relative)
                offset = 0
                with archive.open(info) as stream:
                    for block in iter(lambda: stream.read(4 * 1024 * 1024), b""):
                        files.write_chunk(work, relative, offset, block)
                        offset += len(block)
                    if offset == 0:
                        files.write_chunk(work, relative, 0, b"")
            if SYS_PATH in archive.namelist():
                saved = json.loads(archive.read(SYS_PATH))
                sys.path[:] = saved + [p for p in sys.path if p not in saved]
            importlib.invalidate_caches()  # the files just written, and the path, are to be seen
            ns, hidden = namespace()
            with archive.open(NAMESPACE) as stream:
                values = _Unpickler(stream, ns, hidden).load()
        ns.update(values)
        return {"restored": sorted(values), "files": len(members)}
    finally:
        drop()


def drop():
    """Remove the blob, if any."""
    try:
        os.unlink(os.path.join(area(), BLOB))
    except FileNotFoundError:
        pass
