"""Skills (LiteLLM's skills executor contract): running one, its answer's shape and files."""

from __future__ import annotations

import base64
import mimetypes
import mmap
import posixpath
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError, SandboxError
from ..results import Execution
from .files import MAX_FILE_BYTES, MAX_SKILL_FILES_BYTES
from .packages import PackageInstalls
from .transfer import FileTransfers

IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg"}


def largest_encodable(room: int) -> int:
    """The most bytes whose base64 text fits in ``room`` characters."""
    return 3 * (room // 4)


class Encoder:
    """A file's base64 text, encoded piece by piece as its bytes arrive into a temporary file
    (``TMPDIR``), then read back whole as one ``str``: the program holds the text once, never the
    bytes, their encoding and its decoding together."""

    def __init__(self) -> None:
        self._spool = tempfile.TemporaryFile()
        self._carry = b""

    def write(self, data: bytes | memoryview) -> None:
        """Encode the next piece (all but its last ``len % 3`` bytes, kept for the next)."""
        data = self._carry + bytes(data)
        cut = len(data) - len(data) % 3
        self._spool.write(base64.b64encode(data[:cut]))
        self._carry = data[cut:]

    def text(self) -> str:
        """The whole text; the encoder is spent."""
        with self._spool:
            self._spool.write(base64.b64encode(self._carry))
            self._spool.flush()
            size = self._spool.tell()
            if not size:
                return ""
            with mmap.mmap(self._spool.fileno(), size, access=mmap.ACCESS_READ) as view:
                return str(view, "ascii")

    def close(self) -> None:
        """Remove the temporary file (done by :meth:`text` too)."""
        self._spool.close()


def file_entry(path: str, content_base64: str) -> dict[str, str]:
    """One file of the answer: ``{"name", "path", "content_base64", "mime_type"}``."""
    name = posixpath.basename(path)
    return {
        "name": name,
        "path": path,
        "content_base64": content_base64,
        "mime_type": mimetypes.guess_type(name)[0] or "application/octet-stream",
    }


def figure_files(results: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The images among displayed results, as files ``figure_1.png``, ``figure_2.svg``..."""
    files: list[dict[str, str]] = []
    for bundle in results:
        for mime, ext in IMAGE_TYPES.items():
            if mime in bundle:
                data = bundle[mime]
                encoded = base64.b64encode(data.encode()).decode() if ext == "svg" else data.strip()
                name = f"figure_{len(files) + 1}.{ext}"
                files.append(
                    {"name": name, "path": name, "content_base64": encoded, "mime_type": mime}
                )
                break
    return files


def failed_skill(output: str, error: str) -> dict[str, Any]:
    """The answer of a skill that could not run."""
    return {"success": False, "output": output, "error": error, "files": []}


def skill_result(execution: Execution, files: list[dict[str, str]]) -> dict[str, Any]:
    """The answer of a skill that ran: its output, its error (stderr and traceback) and files."""
    error = execution.stderr
    if execution.error is not None:
        error += execution.error.traceback or str(execution.error)
    return {
        "success": execution.error is None,
        "output": execution.stdout,
        "error": error,
        "files": files,
    }


class SkillRuns(FileTransfers, PackageInstalls):
    """``run_skill``: skill code run next to its files, and what it made."""

    async def run_skill(
        self,
        code: str,
        skill_files: Mapping[str, bytes | str] | None = None,
        requirements: str | Iterable[str] | None = None,
        *,
        timeout: float | None = None,
        max_files_bytes: int = MAX_SKILL_FILES_BYTES,
    ) -> dict[str, Any]:
        """Run skill ``code`` next to ``skill_files`` (LiteLLM's skills executor contract).

        Returns ``{"success", "output", "error", "files"}``; ``files`` holds the files the code
        created or changed in the work directory (not the unchanged skill files) and the images it
        displayed (``figure_1.png``...), each ``{"name", "path", "content_base64", "mime_type"}``.
        The files together may hold ``max_files_bytes`` (256 MiB by default) of base64 text, what
        the answer holds (4/3 of their bytes), counted as they arrive; past it the run fails with an
        error naming the limit.
        """
        if (
            isinstance(max_files_bytes, bool)
            or not isinstance(max_files_bytes, int)
            or max_files_bytes < 0
        ):
            raise ConfigError(f"max_files_bytes must be a number of bytes, not {max_files_bytes!r}")
        try:
            if skill_files:
                await self.upload(skill_files, timeout=timeout)
            if requirements:
                installed = await self.install(requirements, timeout=timeout)
                if installed.error is not None:
                    return failed_skill(installed.stdout, installed.stderr)
            before = await self._simple("snapshot", timeout)
            await self._simple("prepare", timeout)
            execution = await self.run(code, timeout=timeout)
            after = await self._simple("snapshot", timeout)
            files, room = [], max_files_bytes
            for path in sorted(after):
                if before.get(path) != after[path]:
                    limit = min(largest_encodable(room), MAX_FILE_BYTES)
                    name = (
                        f"max_files_bytes={max_files_bytes} of base64, {room} left"
                        if limit < MAX_FILE_BYTES
                        else "download's ceiling"
                    )
                    encoder = Encoder()
                    try:
                        await self._read(path, encoder.write, limit, f"run_skill's {name}", timeout)
                        text = encoder.text()
                    finally:
                        encoder.close()
                    room -= len(text)
                    files.append(file_entry(path, text))
            files += figure_files(execution.results)
        except SandboxError as exc:
            return failed_skill("", str(exc))
        return skill_result(execution, files)
