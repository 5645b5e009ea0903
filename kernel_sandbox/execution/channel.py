"""The host side of the kernel-side helper (:mod:`kernel_sandbox.kernelside.toolhost`).

How an answer travels, and why a tool cannot pass a fake one off as the real one:

* Every request carries a marker made fresh for it (``secrets.token_hex``). The kernel answers
  with exactly one message carrying that marker: a comm message on the channel (``docker``,
  ``local``, ``opensandbox`` in websocket mode), or, where the kernel has no comms (the
  ``opensandbox`` launcher's execd relay), the value of the request's cell, a text frame
  ``BEGIN-marker length sha256 body END-marker``.
* The host takes an answer only from where an answer goes (the channel's comm id, or the
  cell's own ``execute_result``); what the tool prints or displays is output and never parsed.
  A second message with the marker (a tool that found the marker by introspection and forged
  one) makes the call fail with :class:`FramingError`, as does an answer that does not match
  its declared lengths.
* Framing only decides which bytes are the answer; the bytes stay untrusted and are decoded by
  :func:`kernel_sandbox.execution.decode.decode`, data only and bounded.
* No message is larger than one chunk (:data:`CHUNK`): a bigger answer waits in the kernel
  and the host pulls it chunk by chunk, after checking its declared size against the limit.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import FramingError, ResultLimitError
from ..kernelside import sources, textframe
from ..kernelside.toolhost import CHUNK, TARGET, VERSION
from .limits import DecodeLimits

MODULES = (
    "dataformat",
    "workfiles",
    "checkpoint",
    "packages",
    "trust",
    "guard",
    "textframe",
    "toolhost",
)
MAX_PARTS = textframe.MAX_PARTS

__all__ = ["CHUNK", "TARGET", "VERSION", "Answer", "bootstrap_cell", "new_marker", "text_cell"]


def new_marker() -> str:
    """A fresh random marker for one request."""
    return secrets.token_hex(16)


BOOT = """
import sys, types
if install or getattr(sys.modules.get("_kernel_sandbox_toolhost"), "VERSION", None) != version:
    for name, text in sources.items():
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(text, "<" + name + ">", "exec"), module.__dict__)
info = sys.modules["_kernel_sandbox_toolhost"].install(marker, work, probe, channel)
result = None if channel else sys.modules["_kernel_sandbox_textframe"].frame(marker, info, [])
"""


def bootstrap_cell(
    marker: str, work: str | None, probe: str | None, channel: bool, install: bool
) -> str:
    """A one-expression cell that installs the kernel-side modules (if needed) and starts serving.

    On the channel, the answer is the comm's open message; otherwise the cell's value is a
    text frame. The names it uses stay in a private namespace.
    """
    namespace = {
        "marker": marker,
        "work": work,
        "probe": probe,
        "channel": channel,
        "version": VERSION,
        "install": install,
        "sources": sources(MODULES) if install else {},
    }
    return f"(lambda ns: exec({BOOT!r}, ns) or ns['result'])({namespace!r})"


def text_cell(request: dict[str, Any], buffers: Sequence[bytes] = ()) -> str:
    """A cell that hands ``request`` to the installed helper; its value is the answer's text
    frame."""
    encoded = [base64.b64encode(bytes(buffer)).decode("ascii") for buffer in buffers]
    helper = "__import__('sys').modules['_kernel_sandbox_toolhost']"
    return f"{helper}.text_request({json.dumps(request)!r}, {encoded!r})"


def parse_text_frame(text: str, marker: str) -> tuple[dict[str, Any], list[bytes]] | None:
    """The (meta, buffers) of a text frame made with ``marker``; None if ``text`` is not one."""
    try:
        return textframe.parse(text, marker)
    except ValueError as exc:
        raise FramingError(f"The answer's frame is invalid: {exc}.") from None


@dataclass
class Answer:
    """The answer to one request, checked against what its first message declares.

    ``lengths`` are the sizes of the encoded document and its buffers. When ``pull`` is set,
    the parts arrived concatenated and only the first chunk came with the message; :meth:`add`
    takes the following chunks as they are pulled.
    """

    lengths: list[int]
    pull: bool
    chunks: list[bytes | memoryview] = field(default_factory=list)
    received: int = 0

    @classmethod
    def first(
        cls, meta: dict[str, Any], buffers: Sequence[bytes | memoryview], limits: DecodeLimits
    ) -> Answer:
        """Check the first message of an answer; raise :class:`FramingError` if it does not add
        up."""
        lengths = meta.get("lengths")
        if (
            not isinstance(lengths, list)
            or not 1 <= len(lengths) <= MAX_PARTS
            or not all(type(n) is int and n >= 0 for n in lengths)
        ):
            raise FramingError("The answer does not describe its parts.")
        total = sum(lengths)
        if total > limits.max_bytes:
            raise ResultLimitError(
                f"Refused a result from the sandbox: its size ({total} bytes) exceeds "
                f"max_bytes={limits.max_bytes} (DecodeLimits). Nothing was decoded.",
                limit="max_bytes",
                value=limits.max_bytes,
            )
        answer = cls(lengths, bool(meta.get("pull")))
        if answer.pull:
            if total <= CHUNK or len(buffers) != 1 or len(buffers[0]) != CHUNK:
                raise FramingError("The answer's first chunk does not match its declared size.")
        elif len(buffers) != len(lengths) or any(len(b) != n for b, n in zip(buffers, lengths)):
            raise FramingError("The answer's parts do not match their declared lengths.")
        answer.add(buffers[0] if answer.pull else buffers)
        return answer

    @property
    def total(self) -> int:
        """Bytes of the whole answer."""
        return sum(self.lengths)

    @property
    def missing(self) -> int:
        """Bytes still to be pulled (0 when complete)."""
        return self.total - self.received

    def add(self, chunk: bytes | memoryview | Sequence[bytes | memoryview]) -> None:
        """Take the next chunk (or, for an answer that was not pulled, all its parts)."""
        if isinstance(chunk, (bytes, bytearray, memoryview)):
            expected = min(CHUNK, self.missing)
            if len(chunk) != expected:
                raise FramingError("A pulled chunk of the answer does not have the expected size.")
            self.chunks.append(chunk)
            self.received += len(chunk)
        else:
            self.chunks = list(chunk)
            self.received = self.total

    def parts(self) -> tuple[bytes, list[memoryview]]:
        """The document and the buffers, once complete."""
        if self.missing:
            raise FramingError("The answer is incomplete.")
        if not self.pull:
            doc, *rest = self.chunks
            return bytes(doc), [memoryview(part) for part in rest]
        blob = memoryview(b"".join(self.chunks))
        views, offset = [], 0
        for length in self.lengths:
            views.append(blob[offset : offset + length])
            offset += length
        return bytes(views[0]), views[1:]
