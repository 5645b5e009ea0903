"""The checkpoint file's format, shared by the launcher's store (:mod:`.launch.checkpoints`) and
the execution API (:mod:`.execution.checkpoint`): :data:`MAGIC`, the header's length, the header as
JSON, then the blob; and the shape checks of what a kernel reports about a checkpoint."""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

from .errors import CheckpointError, FramingError

MAGIC = b"kernel-sandbox checkpoint 1\n"
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_NAMES = 1_000_000


def header_bytes(header: dict[str, Any]) -> bytes:
    """The start of a checkpoint file: :data:`MAGIC`, the header's length and the header as JSON
    (the blob follows)."""
    data = json.dumps(header).encode()
    return MAGIC + struct.pack(">Q", len(data)) + data


def read_header(handle: BinaryIO, name: str, max_bytes: int, option: str) -> dict[str, Any]:
    """The header of the checkpoint file open in ``handle`` (left at the blob's start), refused
    (:class:`CheckpointError`, naming ``option``) when its blob is over ``max_bytes``."""
    if handle.read(len(MAGIC)) != MAGIC:
        raise CheckpointError(f"{name!r} is not a kernel-sandbox checkpoint file")
    (length,) = struct.unpack(">Q", handle.read(8).rjust(8, b"\0"))
    if length > MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{name!r}: its header claims {length} bytes, over {MAX_HEADER_BYTES}"
        )
    try:
        header = json.loads(handle.read(length))
    except ValueError as exc:
        raise CheckpointError(f"{name!r}: its header is not valid JSON ({exc})") from None
    if not isinstance(header, dict) or type(header.get("size")) is not int:
        raise CheckpointError(f"{name!r}: its header has no size")
    if header["size"] > max_bytes:
        raise CheckpointError(
            f"Refused {name!r}: its checkpoint is {header['size']} bytes, over "
            f"max_bytes={max_bytes} ({option}); nothing was read."
        )
    return header


def strings(value: Any, what: str) -> tuple[str, ...]:
    """``value`` (from a sandbox) as a tuple of names, or :class:`FramingError` naming ``what``."""
    if (
        not isinstance(value, list)
        or len(value) > MAX_NAMES
        or not all(isinstance(v, str) for v in value)
    ):
        raise FramingError(f"The checkpoint's {what} are not a list of names.")
    return tuple(value)


def reasons(value: Any, what: str) -> dict[str, str]:
    """``value`` (from a sandbox) as names with reasons, or :class:`FramingError` naming
    ``what``."""
    if (
        not isinstance(value, dict)
        or len(value) > MAX_NAMES
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    ):
        raise FramingError(f"The checkpoint's {what} are not names with reasons.")
    return dict(value)
