"""Moving files between the host and a session's work directory, in chunks, within the host's
limits."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import IO, Any

from ..errors import ConfigError, PathError, SandboxFileError
from ..results import FileInfo
from .files import MAX_FILE_BYTES, MAX_STREAM_BYTES, NO_LIMIT, Content, Gathered, chunks, confine
from .session import SandboxSession


class FileTransfers(SandboxSession):
    """Upload, download and list the files of the work directory."""

    async def upload(
        self, files: Mapping[str, Content], *, timeout: float | None = None
    ) -> list[str]:
        """Write ``{path: content}`` under the work directory; returns the relative paths written.

        Content is ``bytes``/``str``, a host path (``pathlib.Path``) or a binary file object;
        it moves in chunks, so a file larger than memory is fine.
        """
        targets = []
        for path, content in files.items():
            rel = confine(path, self.work_dir)
            if rel == ".":
                raise PathError(f"{path!r} names the work directory itself, not a file")
            targets.append((rel, content))
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            for rel, content in targets:
                offset = 0
                for piece in chunks(content, self._chunk()):
                    request = {"op": "write", "path": rel, "offset": offset}
                    size = await self._op(request, [piece], seconds, deadline)
                    offset += len(piece)
                    if size != offset:
                        raise SandboxFileError(
                            f"{rel!r} changed in the sandbox while it was being written"
                        )
        return sorted(rel for rel, _ in targets)

    async def _read(
        self,
        path: str,
        sink: Callable[[bytes], Any],
        limit: int,
        limit_name: str,
        timeout: float | None,
        sized: Callable[[int], Any] | None = None,
    ) -> int:
        """Pass the file's chunks to ``sink``; refuse it, before ``sink`` sees a byte over it, past
        ``limit``. ``sized`` is told the size the kernel states (within ``limit``) before the first
        chunk.

        The limit is the host's: the size the kernel states is checked against it, and so is every
        byte that arrives (a kernel that patched its helper states what it likes).
        """
        rel = confine(path, self.work_dir)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        offset, total = 0, None
        async with self._lock:
            while total is None or offset < total:
                request = {"op": "read", "path": rel, "offset": offset, "size": self._chunk()}
                size, data = await self._op(request, (), seconds, deadline)
                if total is None:
                    total = size
                if type(size) is not int or size != total or not isinstance(data, bytes):
                    raise SandboxFileError(
                        f"{rel!r} changed in the sandbox while it was being read"
                    )
                if total > limit or offset + len(data) > limit:
                    raise SandboxFileError(
                        f"Refused {rel!r}: it is {max(total, offset + len(data))} bytes, over the "
                        f"limit of {limit} bytes ({limit_name}); nothing past the limit was kept."
                    )
                if len(data) != min(self._chunk(), total - offset):
                    raise SandboxFileError(
                        f"{rel!r} changed in the sandbox while it was being read"
                    )
                if offset == 0 and sized is not None:
                    sized(total)
                sink(data)
                offset += len(data)
        return offset

    async def download(self, path: str, *, timeout: float | None = None) -> bytes:
        """Read a file of the work directory into memory (up to 256 MiB; see
        :meth:`download_to`)."""
        return await self._download(
            path, MAX_FILE_BYTES, "download's ceiling; download_to streams larger files", timeout
        )

    async def _download(
        self, path: str, limit: int, limit_name: str, timeout: float | None
    ) -> bytes:
        gathered = Gathered()
        await self._read(path, gathered.write, limit, limit_name, timeout, gathered.reserve)
        return gathered.value()

    async def download_to(
        self,
        path: str,
        destination: str | os.PathLike[str] | IO[bytes],
        *,
        timeout: float | None = None,
        max_bytes: int | None = MAX_STREAM_BYTES,
    ) -> int:
        """Stream a file of the work directory to a host path or binary file; returns its size.

        A file over ``max_bytes`` (2 GiB by default; None for no limit) is refused before anything
        is written: the kernel decides how big its files claim to be (a sparse file costs it
        nothing). A destination path is removed again if the download fails.
        """
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
        ):
            raise ConfigError(f"max_bytes must be a number of bytes or None, not {max_bytes!r}")
        limit = NO_LIMIT if max_bytes is None else max_bytes
        if not isinstance(destination, (str, os.PathLike)):
            return await self._read(
                path, destination.write, limit, f"max_bytes={max_bytes}", timeout
            )
        try:
            with open(destination, "wb") as handle:
                return await self._read(
                    path, handle.write, limit, f"max_bytes={max_bytes}", timeout
                )
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(destination)
            raise

    async def list_files(self, path: str = ".", *, timeout: float | None = None) -> list[FileInfo]:
        """List a directory of the work directory (symlinks are listed, not followed)."""
        rel = confine(path, self.work_dir)
        seconds, deadline = self._deadline(timeout)
        assert self._lock is not None
        async with self._lock:
            entries = await self._op({"op": "list", "path": rel}, (), seconds, deadline)
        return [FileInfo(*entry) for entry in entries]
