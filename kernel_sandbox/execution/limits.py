"""The limits of a result decoded from a sandbox, and the pass that measures a document against
them before anything is built (:func:`measure`); the errors that refuse a result."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError, ResultLimitError, UnsafePayloadError

MiB = 1024 * 1024
WINDOW = 64 * 1024
"""Bytes of the document :func:`measure` looks at in one step: its extra memory is a few windows."""
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_DIGITS_ONLY = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))


@dataclasses.dataclass(frozen=True)
class DecodeLimits:
    """Bounds on decoding one result from a sandbox; over any of them the result is refused.

    ``max_bytes`` counts the encoded document and its buffers; ``max_depth`` the nesting of
    JSON arrays and objects (a tagged value adds one or two levels); ``max_items`` array items
    and object members plus containers; ``max_str_length`` characters of one string;
    ``max_bytes_length`` bytes of one bytes value; ``max_int_digits`` digits of one number;
    ``max_exponent`` the exponent of a Decimal.
    """

    max_bytes: int = 64 * MiB
    max_depth: int = 100
    max_items: int = 1_000_000
    max_str_length: int = 32 * MiB
    max_bytes_length: int = 32 * MiB
    max_int_digits: int = 4300
    max_exponent: int = 4300

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if type(value) is not int or value < 1:
                raise ConfigError(
                    f"DecodeLimits.{field.name} must be a positive int, not {value!r}"
                )


def limit_error(limits: DecodeLimits, name: str, what: str) -> ResultLimitError:
    """The refusal of a result whose ``what`` exceeds the limit ``name``."""
    value = getattr(limits, name)
    return ResultLimitError(
        f"Refused a result from the sandbox: {what} exceeds {name}={value} (DecodeLimits). "
        "Nothing was decoded.",
        limit=name,
        value=value,
    )


def malformed(what: str) -> UnsafePayloadError:
    """The refusal of a malformed result, saying ``what`` is wrong."""
    return UnsafePayloadError(
        f"Refused a malformed result from the sandbox: {what}. Nothing was run on the host."
    )


class _Scan:
    """What :func:`measure` carries from one window of the document to the next."""

    def __init__(self, limits: DecodeLimits, window: int) -> None:
        self.limits = limits
        self.items = 1
        self.opened = self.closed = 0
        self.brackets: list[bytes] = []
        self.in_string = False
        self.string = 0  # characters (at most) of the string still open at the window's end
        self.digits = 0  # digits of the number still running at the window's end
        # a run within one window is found by search; one across windows by the carried count
        self.too_many_digits = (
            b"0" * (limits.max_int_digits + 1) if limits.max_int_digits < window else None
        )

    def window(self, text: bytes) -> None:
        """Take the next window of the document; it never ends inside an escape."""
        # an escaped backslash or quote: one character
        text = text.replace(b"\\\\", b"_").replace(b'\\"', b"_")
        parts = text.split(b'"')  # now every quote opens or closes a string
        first = 0
        if self.in_string:
            self.string += self.chars(parts[0])
            self.check_string(self.string)
            if len(parts) == 1:
                return
            first = 1
        structure, strings = parts[first::2], parts[first + 1 :: 2]
        self.in_string = (len(parts) - first) % 2 == 0  # the last part is a string's text
        if self.in_string:
            self.string = self.chars(strings.pop())
            self.check_string(self.string)
        if strings and max(map(len, strings)) > self.limits.max_str_length:
            for string in strings:
                self.check_string(self.chars(string))
        self.structure(b'""'.join(structure))
        if self.in_string:
            self.digits = 0

    @staticmethod
    def chars(text: bytes) -> int:
        """The characters a string's text decodes to, at most (a surrogate pair counts as two)."""
        return len(text) - text.count(b"\\") - 4 * text.count(b"\\u")

    def check_string(self, chars: int) -> None:
        if chars > self.limits.max_str_length:
            raise limit_error(
                self.limits, "max_str_length", f"the length of a string (about {chars} characters)"
            )

    def structure(self, bare: bytes) -> None:
        """Count the items, brackets and digit runs of the window's structure (its strings
        emptied)."""
        limits = self.limits
        self.items += bare.count(b",") + bare.count(b"[") + bare.count(b"{")
        if self.items > limits.max_items:
            raise limit_error(limits, "max_items", f"its number of items (at least {self.items})")
        brackets = bare.translate(_TO_SQUARE, _NOT_BRACKETS)
        opening = brackets.count(b"[")
        self.opened += opening
        self.closed += len(brackets) - opening
        if self.closed > self.opened:
            raise malformed("unbalanced brackets")
        self.brackets.append(brackets)
        runs = bare.translate(_DIGITS_ONLY)
        lead = len(runs) - len(runs.lstrip(b"0"))
        if lead == len(runs):
            self.digits += lead
            longest = self.digits
        else:
            longest = self.digits + lead
            self.digits = len(runs) - len(runs.rstrip(b"0"))
        if (
            longest > limits.max_int_digits
            or self.too_many_digits is not None
            and self.too_many_digits in runs
        ):
            raise limit_error(limits, "max_int_digits", "the number of digits of a number")

    def depth(self) -> None:
        """Peel the brackets level by level (at most ``2 * max_items`` bytes: every opening one was
        counted)."""
        if self.opened != self.closed:
            raise malformed("unbalanced brackets")
        brackets = b"".join(self.brackets)
        for _ in range(self.limits.max_depth):
            if not brackets:
                return
            peeled = brackets.replace(b"[]", b"")
            if len(peeled) == len(brackets):
                raise malformed("unbalanced brackets")
            brackets = peeled
        if brackets:
            raise limit_error(self.limits, "max_depth", "its nesting depth")


def measure(doc: bytes, buffer_bytes: int, limits: DecodeLimits) -> None:
    """Check ``doc`` (and ``buffer_bytes`` beside it) against ``limits`` without building anything.

    One pass over the document, :data:`WINDOW` bytes at a time, each step a few linear
    operations in C (no regular expression, nothing that backtracks): escaped backslashes and
    quotes become one character, the quotes then split strings from structure, whose
    separators, brackets and digit runs are counted; brackets are peeled level by level at the
    end (at most ``max_depth`` passes over at most ``2 * max_items`` bytes). The extra memory
    is a few windows, whatever the document holds. Raises :class:`ResultLimitError` or
    :class:`UnsafePayloadError`.
    """
    if len(doc) + buffer_bytes > limits.max_bytes:
        raise limit_error(limits, "max_bytes", f"its size ({len(doc) + buffer_bytes} bytes)")
    if not doc.isascii():
        raise malformed("the document is not ASCII")
    scan = _Scan(limits, WINDOW)
    start = 0
    while start < len(doc):
        window = doc[start : start + WINDOW]
        start += len(window)
        if start < len(doc) and (len(window) - len(window.rstrip(b"\\"))) % 2:
            # an escape's backslash stays with what it escapes
            window, start = window[:-1], start - 1
        scan.window(window)
    scan.depth()
