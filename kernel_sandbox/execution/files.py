"""Files in and out of the sandbox, through code run in the kernel (so every backend works).

Paths are checked twice: on the host (no ``..``, no absolute path outside the work directory)
and in the kernel, where the real path (symlinks resolved) must stay under the work directory.
"""

from __future__ import annotations

import posixpath

from .models import PathError

MAX_FILE_BYTES = 256 * 1024 * 1024

FILES_SRC = r'''
def _main_dict():
    import os
    work = os.path.realpath(_work)

    def inside(path):
        real = os.path.realpath(path)
        if real != work and not real.startswith(work + os.sep):
            raise PermissionError(f"{os.path.relpath(path, work)!r} resolves outside the work directory")
        return real

    def relative(path):
        return os.path.relpath(path, work).replace(os.sep, "/")

    try:
        if _op == "upload":
            for rel, encoded in _files.items():
                target = os.path.join(work, rel)
                inside(os.path.dirname(target))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                inside(target)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(base64.b64decode(encoded))
            return {"ok": sorted(_files)}
        real = inside(os.path.join(work, _path))
        if _op == "download":
            if not os.path.isfile(real):
                raise FileNotFoundError(f"{_path!r} is not a file in the work directory")
            size = os.path.getsize(real)
            if size > _limit:
                raise OSError(f"{_path!r} is {size} bytes, over the download limit of {_limit}")
            with open(real, "rb") as handle:
                return {"ok": base64.b64encode(handle.read()).decode("ascii")}
        if _op == "list":
            if not os.path.isdir(real):
                raise NotADirectoryError(f"{_path!r} is not a directory in the work directory")
            entries = []
            for entry in sorted(os.scandir(real), key=lambda e: e.name):
                info = entry.stat(follow_symlinks=False)
                is_dir = entry.is_dir(follow_symlinks=False)
                entries.append([entry.name, relative(entry.path), 0 if is_dir else info.st_size, is_dir])
            return {"ok": entries}
        if _op == "snapshot":
            found = {}
            for root, dirs, names in os.walk(real):
                for name in names:
                    path = os.path.join(root, name)
                    if os.path.isfile(path) and not os.path.islink(path):
                        info = os.stat(path)
                        found[relative(path)] = [info.st_size, info.st_mtime_ns]
            return {"ok": found}
        raise ValueError(f"unknown file operation {_op!r}")
    except PermissionError as exc:
        return {"refused": str(exc)}
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
'''


def confine(path: str, work_dir: str) -> str:
    """Return ``path`` relative to ``work_dir``, refusing ``..`` and absolute paths outside it."""
    if not isinstance(path, str) or "\x00" in path:
        raise PathError(f"Invalid path {path!r}")
    if posixpath.isabs(path):
        normal = posixpath.normpath(path)
        if normal != work_dir and not normal.startswith(work_dir.rstrip("/") + "/"):
            raise PathError(f"{path!r} is outside the sandbox's work directory {work_dir}")
        path = posixpath.relpath(normal, work_dir)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PathError(f"{path!r} leaves the work directory ('..' is not allowed)")
    return "/".join(parts) or "."
