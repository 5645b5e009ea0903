"""The core of Jupyter's wire format: the delimiter, HMAC signatures, headers and JSON parts.

Light to import (the standard library and the protocol's version): a sleeping kernel's small
process (:mod:`.dormant`) signs with it; :mod:`.messages` adds the rest.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..canonical import PROTOCOL_VERSION
from ..errors import KernelLaunchError

DELIM = b"<IDS|MSG>"
Frames = Sequence[bytes]
"""A multipart message, one bytes object per frame."""


class Signer:
    """HMAC signatures of Jupyter messages with one key (an empty key signs nothing, as in
    Jupyter)."""

    def __init__(self, key: bytes, scheme: str = "hmac-sha256") -> None:
        algorithm = scheme.partition("hmac-")[2]
        if not scheme.startswith("hmac-") or algorithm not in hashlib.algorithms_available:
            raise KernelLaunchError(f"unsupported signature_scheme {scheme!r}; use hmac-sha256")
        self._hmac = hmac.new(key, digestmod=algorithm) if key else None

    def sign(self, parts: Frames) -> bytes:
        """The hex signature of a message's header, parent header, metadata and content."""
        if self._hmac is None:
            return b""
        digest = self._hmac.copy()
        for part in parts[:4]:
            digest.update(part)
        return digest.hexdigest().encode()

    def verify(self, signature: Any, parts: Frames) -> bool:
        """True when ``signature`` is this key's signature of ``parts`` (one of the wrong length
        costs no digest)."""
        if self._hmac is None:
            return True
        return len(signature) == self._hmac.digest_size * 2 and hmac.compare_digest(
            bytes(signature), self.sign(parts)
        )


def new_header(msg_type: str, session: str, username: str = "kernel") -> dict[str, Any]:
    """A fresh message header of ``session``, as a kernel (or ``username``) writes it."""
    return {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "username": username,
        "session": session,
        "date": datetime.now(timezone.utc).isoformat(),
        "version": PROTOCOL_VERSION,
    }


def dumps(value: Any) -> bytes:
    """``value`` as a message part: compact UTF-8 JSON (NaN refused)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
