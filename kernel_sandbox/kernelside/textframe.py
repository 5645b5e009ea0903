"""Answers as text, for relays without comms: the frame ``BEGIN-marker length sha256 body
END-marker``, whose body is JSON ``{"meta", "parts": [base64...]}``.

The kernel makes one (:func:`frame`: the execution API's helper as a cell's value, the launcher's
sleep as a line printed by its own cell) and the host takes the one with the marker it made fresh
for that request out of whatever else the cell wrote (:func:`parse`); its length and digest are
checked, its content stays untrusted.
"""

import base64
import binascii
import hashlib
import json
import re

MAX_PARTS = 10_000
_HEADER = re.compile(r"(\d{1,12}) ([0-9a-f]{64}) ")


class Frame:
    """A frame whose repr is its text (a cell's value is shown as its repr)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def frame(marker, meta, buffers):
    """The frame of ``meta`` (JSON) and ``buffers`` (bytes), made with ``marker``."""
    body = json.dumps(
        {"meta": meta, "parts": [base64.b64encode(part).decode("ascii") for part in buffers]}
    )
    digest = hashlib.sha256(body.encode("ascii")).hexdigest()
    return Frame(f"BEGIN-{marker} {len(body)} {digest} {body} END-{marker}")


def parse(text, marker, anywhere=False):
    """The ``(meta, buffers)`` of the frame made with ``marker`` that ``text`` is (or, with
    ``anywhere``, holds); None if there is none. Raises ValueError for one that does not check."""
    begin, end = f"BEGIN-{marker} ", f" END-{marker}"
    start = text.find(begin) if anywhere else (0 if text.startswith(begin) else -1)
    stop = text.find(end, start) if anywhere and start >= 0 else len(text) - len(end)
    if start < 0 or stop < 0 or not text.endswith(end, 0, stop + len(end)):
        return None
    match = _HEADER.match(text, start + len(begin))
    if match is None:
        raise ValueError("the frame has no valid length and digest")
    body = text[match.end() : stop]
    if len(body) != int(match.group(1)) or hashlib.sha256(
        body.encode("ascii", "replace")
    ).hexdigest() != match.group(2):
        raise ValueError("the frame failed its length or digest check")
    try:
        parsed = json.loads(body)
        meta, parts = parsed["meta"], parsed["parts"]
        if not isinstance(meta, dict) or not isinstance(parts, list) or len(parts) > MAX_PARTS:
            raise ValueError("unexpected shape")
        return meta, [base64.b64decode(part, validate=True) for part in parts]
    except (ValueError, KeyError, TypeError, RecursionError, binascii.Error) as exc:
        raise ValueError(f"the frame is malformed: {exc}") from None
