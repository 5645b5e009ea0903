"""Jupyter messages on the wire: the channels' names, taking a signed message apart, strict JSON
parts, and a message's parts as an output policy lets them through (:func:`filter_parts`); the
delimiter, signatures, headers and :func:`~.wire.dumps` are :mod:`.wire`'s."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from ..canonical import BUFFER_TYPES
from .journal import note
from .wire import DELIM, Frames, Signer, dumps

if TYPE_CHECKING:
    from ..policy.output import OutputPolicy

log = logging.getLogger("kernel_sandbox.launch")

REQUEST_CHANNELS = ("shell", "control", "stdin")
CHANNELS = (*REQUEST_CHANNELS, "iopub", "hb")


def unpack(frames: Frames, signer: Signer, sender: str) -> tuple[list[bytes], list[bytes]] | None:
    """Routing identities and parts of a message signed by ``signer``; None (logged) for anything
    else."""
    message = split(frames)
    if message is None:
        return None
    idents, signature, parts = message
    if not signer.verify(signature, parts):
        note(log, logging.WARNING, "dropped a message with a bad signature from the %s", sender)
        return None
    return idents, parts


def split(frames: Frames) -> tuple[list[bytes], bytes, list[bytes]] | None:
    """Routing identities, signature and the parts after it; None when there is no delimiter."""
    for index, frame in enumerate(frames):
        if frame == DELIM:
            if len(frames) < index + 6:
                return None
            return list(frames[:index]), frames[index + 1], list(frames[index + 2 :])
    return None


def launcher_note(text: str) -> dict[str, str]:
    """The content of a stderr stream message of the launcher's own saying ``text``, marked as
    the launcher's."""
    return {"name": "stderr", "text": f"[kernel-sandbox] {text}\n"}


def parse_part(raw: bytes) -> Any:
    """A message part parsed as clients parse it, but strictly: UTF-8 only; None when it is not
    JSON."""
    try:
        return json.loads(raw.decode())
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past Python's stack
        return None


def msg_type_of(header: bytes) -> str | None:
    """The ``msg_type`` a header part names; None when it names none."""
    value = parse_part(header)
    msg_type = value.get("msg_type") if isinstance(value, dict) else None
    return msg_type if isinstance(msg_type, str) else None


def filter_parts(
    policy: OutputPolicy, channel: str, msg_type: str, parts: list[bytes]
) -> list[bytes] | None:
    """A message's parts as ``policy`` lets them through: each part the kernel's own bytes when
    untouched, or None (drop).

    Content that is not UTF-8 JSON is dropped: what the policy cannot read, no client may see.
    A parent header or metadata that is not a JSON object becomes ``{}``.
    """
    header, parent, metadata, content = map(parse_part, parts[:4])
    if content is None:
        log.warning("dropped a %s from the kernel: its content is not UTF-8 JSON", msg_type)
        return None
    try:
        filtered = policy.filter_message(channel, header, parent, metadata, content)
    except Exception:  # whatever the kernel sent: what the policy could not check is not shown
        log.exception("dropped a %s from the kernel: the output policy failed on it", msg_type)
        return None
    if filtered is None:
        return None
    try:
        out = [
            raw if new is old else dumps(new)
            for raw, old, new in zip(parts, (header, parent, metadata, content), filtered)
        ]
    except (ValueError, RecursionError):
        log.warning(
            "dropped a %s from the kernel: its content cannot be written as JSON (NaN, or nested "
            "too deep)",
            msg_type,
        )
        return None
    return out + (parts[4:] if filtered[0].get("msg_type") in BUFFER_TYPES else [])
