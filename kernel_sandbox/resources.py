"""Locate the data files shipped with kernel-sandbox (kernelspecs, the image's build context)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_path(name: str) -> Path:
    """Return the directory ``name`` (``kernelspecs`` or ``docker``) from the wheel or the source
    tree."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"kernel-sandbox data directory {name!r} is missing; reinstall kernel-sandbox"
    )
