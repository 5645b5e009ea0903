"""The container's own stdout and stderr: held during start-up, then passed on through the
journal, the tail kept for error messages."""

from __future__ import annotations

import asyncio
import collections

from ..launch import journal
from ..parsers import MiB
from .exec_stream import Demux

OUTPUT_CAP = 1 * MiB
"""Bytes of the container's own stdout/stderr held during start-up (passed on once it answers)."""
OUTPUT_TAIL_LINES = 40
TAIL_LINE_CHARS = 4096
"""Characters of each of those last lines kept for an error message."""


class OutputStream(asyncio.Protocol):
    """The container's attached stdout and stderr, demultiplexed into a :class:`KernelOutput`."""

    def __init__(self, output: KernelOutput) -> None:
        self._demux = Demux(
            lambda data: output.write(bytes(data)), lambda data: output.write(bytes(data))
        )

    def data_received(self, data: bytes) -> None:
        self._demux.feed(data)


class KernelOutput:
    """The container's own stdout and stderr, passed to our stderr through the journal (escaped,
    within the kernel's log budget: :mod:`.journal`), the tail kept for errors.

    Until :meth:`release` (the kernel answered) output is only kept, up to ``cap`` bytes: a launch
    that fails reports it once, inside its error message.
    """

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self._cap = cap
        self.tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self._partial = ""
        self._held: list[bytes] | None = []

    def release(self) -> None:
        """Pass on what was held during start-up, and everything from now on."""
        held, self._held = self._held or [], None
        for chunk in held:
            self._pass_on(chunk)

    def write(self, data: bytes) -> None:
        """Record and pass on one chunk of the container's output."""
        text = self._partial + data.decode(errors="replace")
        *lines, partial = text.split("\n")
        self._partial = partial[-TAIL_LINE_CHARS:]  # a line without end is not gathered without end
        self.tail.extend(line[-TAIL_LINE_CHARS:] for line in lines[-OUTPUT_TAIL_LINES:])
        if self._held is not None:
            if sum(map(len, self._held)) < self._cap:
                self._held.append(data)
            return
        self._pass_on(data)

    def _pass_on(self, data: bytes) -> None:
        journal.installed().output(data)

    def text(self) -> str:
        """The last lines the container wrote."""
        return "\n".join([*self.tail, self._partial]).strip()
