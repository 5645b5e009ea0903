"""Files in and out of the sandbox, moved in chunks by the kernel-side helper (every backend).

Paths are checked twice: on the host (no ``..``, no absolute path outside the work directory)
and in the kernel (:mod:`kernel_sandbox.kernelside.workfiles`), where the real path (symlinks
resolved) must stay under the work directory and the target must be a regular file.
"""

from __future__ import annotations

import io
import os
import posixpath
from collections.abc import Iterator
from typing import IO, Union

from ..errors import PathError

MAX_FILE_BYTES = 256 * 1024 * 1024
"""The largest file ``download`` reads into memory."""
MAX_STREAM_BYTES = 2 * 1024 * 1024 * 1024
"""The largest file ``download_to`` writes by default (the kernel decides how big a file claims to
be)."""
MAX_SKILL_FILES_BYTES = 256 * 1024 * 1024
"""The default of ``run_skill``'s ``max_files_bytes``: the files of one skill run, all together,
as the base64 text its answer holds."""
NO_LIMIT = 2**62

Content = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", IO[bytes]]


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


def chunks(content: Content, size: int) -> Iterator[memoryview]:
    """``content`` in pieces of at most ``size`` bytes (at least one piece, maybe empty).

    ``bytes``/``str`` are sliced without copying; a host path (``os.PathLike``) or a binary
    file object is read one piece at a time, so a large file is never held whole.
    """
    if isinstance(content, str):
        content = content.encode()
    if isinstance(content, (bytes, bytearray, memoryview)):
        view = memoryview(content).cast("B")
        yield view[:size]
        for start in range(size, len(view), size):
            yield view[start : start + size]
        return
    if isinstance(content, os.PathLike):
        with open(content, "rb") as handle:
            yield from chunks(handle, size)
        return
    if not callable(getattr(content, "read", None)):
        raise TypeError(
            "upload content must be bytes, str, a path or a binary file, not "
            f"{type(content).__name__}"
        )
    piece = content.read(size)
    yield memoryview(piece)
    while True:
        piece = content.read(size)
        if not piece:
            return
        yield memoryview(piece)


class Gathered:
    """Bytes of a size stated before the first arrives, gathered piece by piece into one buffer
    that becomes the result without a copy: the peak is the size once, not the pieces and their
    join."""

    def __init__(self) -> None:
        self._buffer = io.BytesIO()

    def reserve(self, size: int) -> None:
        """Make the buffer ``size`` bytes now, so that no write grows (and copies) it."""
        if size:
            self._buffer.seek(size - 1)
            self._buffer.write(b"\0")
            self._buffer.seek(0)

    def write(self, data: bytes | memoryview) -> None:
        """Add the next piece."""
        self._buffer.write(data)

    def value(self) -> bytes:
        """The bytes gathered: the buffer itself (CPython's ``BytesIO.getvalue`` hands over a buffer
        only it holds); the object is spent."""
        value, self._buffer = self._buffer.getvalue(), io.BytesIO()
        return value
