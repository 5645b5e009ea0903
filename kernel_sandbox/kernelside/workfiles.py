"""File operations in the kernel's work directory (kernel side), one bounded chunk at a time.

Every path is resolved (symlinks followed) and must stay under the work directory. Files are
opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be regular files, so a FIFO, a device or a
symlink planted at the target is refused instead of blocking or leading elsewhere. Each call
opens, moves one chunk and closes: nothing stays open between calls, and no call holds more
than one chunk in memory.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat


class Refused(PermissionError):
    """A path that leaves the work directory, or a target that is not a regular file."""


def inside(work, relative):
    """The real path of ``relative`` under ``work``; :class:`Refused` if it resolves outside."""
    work = os.path.realpath(work)
    real = os.path.realpath(os.path.join(work, relative))
    if real != work and not real.startswith(work + os.sep):
        raise Refused(f"{relative!r} resolves outside the work directory")
    return real


def _open_regular(path, flags, mode=0o644):
    try:
        fd = os.open(
            path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode
        )
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader
            raise Refused(f"{os.path.basename(path)!r} is not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{os.path.basename(path)!r} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_chunk(work, relative, offset, data):
    """Write ``data`` at ``offset`` of ``relative`` (offset 0 creates or truncates it).

    Returns the file's size after the write.
    """
    target = os.path.join(os.path.realpath(work), relative)
    parent = os.path.dirname(target)
    inside(work, os.path.relpath(parent, os.path.realpath(work)))
    if offset == 0:
        os.makedirs(parent, exist_ok=True)
        inside(work, os.path.relpath(parent, os.path.realpath(work)))
    inside(work, relative)
    fd = _open_regular(target, os.O_WRONLY | (os.O_CREAT if offset == 0 else 0))
    try:
        if offset == 0:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        position = offset
        while view:
            written = os.pwrite(fd, view, position)
            view, position = view[written:], position + written
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_chunk(work, relative, offset, size):
    """Read up to ``size`` bytes at ``offset``; returns ``(file size, data)`` (the host applies its
    limits)."""
    real = inside(work, relative)
    try:
        fd = _open_regular(real, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"{relative!r} is not a file in the work directory") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR):
            raise FileNotFoundError(f"{relative!r} is not a file in the work directory") from None
        raise
    try:
        return os.fstat(fd).st_size, os.pread(fd, size, offset)
    finally:
        os.close(fd)


def listing(work, relative):
    """``[name, path, size, is_dir]`` for each entry of a directory (symlinks listed, not
    followed)."""
    real = inside(work, relative)
    if not os.path.isdir(real):
        raise NotADirectoryError(f"{relative!r} is not a directory in the work directory")
    root = os.path.realpath(work)
    entries = []
    for entry in sorted(os.scandir(real), key=lambda e: e.name):
        info = entry.stat(follow_symlinks=False)
        is_dir = entry.is_dir(follow_symlinks=False)
        path = os.path.relpath(entry.path, root).replace(os.sep, "/")
        entries.append([entry.name, path, 0 if is_dir else info.st_size, is_dir])
    return entries


def snapshot(work):
    """``{path: [size, mtime_ns]}`` of every regular file under the work directory."""
    root = os.path.realpath(work)
    found = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                found[os.path.relpath(path, root).replace(os.sep, "/")] = [
                    info.st_size,
                    info.st_mtime_ns,
                ]
    return found


def wipe(work):
    """Remove everything in the work directory (not the directory itself)."""
    for entry in os.scandir(os.path.realpath(work)):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)
