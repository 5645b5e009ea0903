"""Skills (LiteLLM's skills executor contract): the shape of a skill run's answer and its files."""

from __future__ import annotations

import base64
import mimetypes
import mmap
import posixpath
import tempfile
from typing import Any

from ..results import Execution

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
