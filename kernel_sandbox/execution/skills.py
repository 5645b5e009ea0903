"""Skills (LiteLLM's skills executor contract): the shape of a skill run's answer and its files."""

from __future__ import annotations

import base64
import mimetypes
import posixpath
from typing import Any

from ..results import Execution

IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg"}


def file_entry(path: str, content: bytes) -> dict[str, str]:
    """One file of the answer: ``{"name", "path", "content_base64", "mime_type"}``."""
    name = posixpath.basename(path)
    return {
        "name": name,
        "path": path,
        "content_base64": base64.b64encode(content).decode("ascii"),
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
