"""Text from a kernel made safe for a host terminal or log: control characters shown, never obeyed.

A kernel's output may hold terminal control sequences: OSC 52 writes the user's clipboard, CSI
clears the screen or moves the cursor, ``\\r`` and backspace overwrite what was printed, C1
characters (U+0080–U+009F) are controls too. :func:`escape_controls` writes every control
character but ``\\n`` and ``\\t`` as a visible escape (``\\x1b``, ``\\r``, ``\\x9b``), so what
reaches a terminal or a log is exactly what the kernel sent, and none of it acts.
"""

from __future__ import annotations

import codecs
import re
from typing import IO

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_COLOUR = re.compile("\x1b\\[[0-9;]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NAMED = {"\r": "\\r", "\b": "\\b", "\f": "\\f", "\v": "\\v", "\a": "\\a"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if len(char) > 1:  # a colour (SGR) sequence, kept
        return char
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def escape_controls(text: str, keep_colour: bool = False) -> str:
    """``text`` with every control character but newline and tab escaped (``keep_colour``: SGR
    colour codes kept)."""
    return (_CONTROL_OR_COLOUR if keep_colour else _CONTROL).sub(_escaped, text)


class SafeWriter:
    """Write a kernel's text to ``stream``: escaped when it is a terminal (``always``: in any case).

    A file or pipe gets the text unchanged, so ``kernel-sandbox exec ... > out.txt`` keeps the
    kernel's bytes; a terminal gets what :func:`escape_controls` makes of them.
    """

    def __init__(self, stream: IO[str], always: bool = False, keep_colour: bool = False) -> None:
        self.stream = stream
        self.escape = always or _is_terminal(stream)
        self.keep_colour = keep_colour

    def write(self, text: str) -> None:
        """Write and flush ``text`` (escaped when this writer escapes)."""
        self.stream.write(escape_controls(text, self.keep_colour) if self.escape else text)
        self.stream.flush()


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class ByteEscaper:
    """Escape a stream of bytes (UTF-8, chunks split anywhere): invalid bytes become ``\\xNN``
    too."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def feed(self, data: bytes, final: bool = False) -> str:
        """The escaped text of ``data`` (a character split across chunks waits for its rest)."""
        return escape_controls(self._decoder.decode(data, final))
