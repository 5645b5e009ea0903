"""Decoding values that come out of a sandbox: data only, bounded, no code run on the host.

The kernel encodes a value with :mod:`kernel_sandbox.kernelside.dataformat` (JSON plus tagged
values, and out-of-band buffers for long strings and bytes). :func:`decode` turns it back:

* Before anything is allocated, the document is measured against :class:`DecodeLimits` in one
  pass, a window at a time, in linear time and a few windows of memory (:func:`measure`); over
  a limit the result is refused with :class:`ResultLimitError` naming it. Then the
  standard library's JSON parser builds the value, and a hook called once per JSON object
  turns tagged objects into their types, checking each one's shape and size.
* Instances are rebuilt only for classes in ``allowed`` (looked up by ``module:qualname``,
  never imported), as a *new* instance whose fields are set from the data: dataclasses, attrs
  and plain classes by writing the new instance's ``__dict__`` and slots (no ``__init__``, no
  ``__setstate__``, no property setter, nothing set on the class); pydantic models through the
  model's own ``model_validate``, so its validators check the data; enum members are looked
  up by name; named tuples are built with ``tuple.__new__``. Nothing else is callable from
  the data, and pickles are refused unless the caller opted into them.
* Sets and dicts with non-string keys refuse more than :data:`MAX_SAME_HASH` distinct keys
  sharing one hash, which would make building them quadratic.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import json
import pathlib
import re
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ConfigError, ResultLimitError, UnsafePayloadError
from ..kernelside.dataformat import FACTORIES, TAG, class_name

MiB = 1024 * 1024
MAX_SAME_HASH = 8

WINDOW = 64 * 1024
"""Bytes of the document :func:`measure` looks at in one step: its extra memory is a few windows."""
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_DIGITS_ONLY = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_DECIMAL = re.compile(r"[+-]?(?:(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d{1,12}))?|Infinity|s?NaN(\d*))")
_UUID = re.compile(r"[0-9a-f]{32}")
_ISO_MAX = 64
_ISO_TYPES: dict[str, type[datetime.date] | type[datetime.time]] = {
    "datetime": datetime.datetime,
    "date": datetime.date,
    "time": datetime.time,
}


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


def _limit(limits: DecodeLimits, name: str, what: str) -> ResultLimitError:
    value = getattr(limits, name)
    return ResultLimitError(
        f"Refused a result from the sandbox: {what} exceeds {name}={value} (DecodeLimits). "
        "Nothing was decoded.",
        limit=name,
        value=value,
    )


def _malformed(what: str) -> UnsafePayloadError:
    return UnsafePayloadError(
        f"Refused a malformed result from the sandbox: {what}. Nothing was run on the host."
    )


def allowed_map(classes: Iterable[type]) -> dict[str, type]:
    """``{"module:qualname": class}`` for the classes a caller allows.

    A class defined inside a function may reach the kernel without its qualified name (pickled
    by value, some metaclasses keep only ``__name__``), so ``module:name`` is accepted too, as
    long as no two allowed classes share it.
    """
    mapping: dict[str, type] = {}
    short: dict[str, set[type]] = {}
    for cls in classes:
        if not isinstance(cls, type):
            raise ConfigError(f"allowed_classes takes classes, not {cls!r}")
        mapping[class_name(cls)] = cls
        short.setdefault(f"{cls.__module__}:{cls.__name__}", set()).add(cls)
    for name, found in short.items():
        if len(found) == 1:
            mapping.setdefault(name, next(iter(found)))
    return mapping


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
            raise _limit(
                self.limits, "max_str_length", f"the length of a string (about {chars} characters)"
            )

    def structure(self, bare: bytes) -> None:
        """Count the items, brackets and digit runs of the window's structure (its strings
        emptied)."""
        limits = self.limits
        self.items += bare.count(b",") + bare.count(b"[") + bare.count(b"{")
        if self.items > limits.max_items:
            raise _limit(limits, "max_items", f"its number of items (at least {self.items})")
        brackets = bare.translate(_TO_SQUARE, _NOT_BRACKETS)
        opening = brackets.count(b"[")
        self.opened += opening
        self.closed += len(brackets) - opening
        if self.closed > self.opened:
            raise _malformed("unbalanced brackets")
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
            raise _limit(limits, "max_int_digits", "the number of digits of a number")

    def depth(self) -> None:
        """Peel the brackets level by level (at most ``2 * max_items`` bytes: every opening one was
        counted)."""
        if self.opened != self.closed:
            raise _malformed("unbalanced brackets")
        brackets = b"".join(self.brackets)
        for _ in range(self.limits.max_depth):
            if not brackets:
                return
            peeled = brackets.replace(b"[]", b"")
            if len(peeled) == len(brackets):
                raise _malformed("unbalanced brackets")
            brackets = peeled
        if brackets:
            raise _limit(self.limits, "max_depth", "its nesting depth")


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
        raise _limit(limits, "max_bytes", f"its size ({len(doc) + buffer_bytes} bytes)")
    if not doc.isascii():
        raise _malformed("the document is not ASCII")
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


def decode(
    doc: bytes,
    buffers: Sequence[bytes | memoryview] = (),
    *,
    allowed: Mapping[str, type] | Iterable[type] = (),
    limits: DecodeLimits | None = None,
    allow_pickle: bool = False,
) -> Any:
    """Decode a value encoded by the kernel's :func:`~kernel_sandbox.kernelside.dataformat.encode`.

    ``allowed`` names the classes whose instances may be rebuilt (a mapping from
    :func:`allowed_map`, or the classes). Raises :class:`ResultLimitError` over a limit and
    :class:`UnsafePayloadError` for anything malformed or not allowed; nothing else.
    """
    limits = limits or DecodeLimits()
    measure(doc, sum(len(buffer) for buffer in buffers), limits)
    classes = allowed if isinstance(allowed, Mapping) else allowed_map(allowed)
    hook = _Tags(buffers, classes, limits, allow_pickle)
    text = doc.decode("ascii")
    hooked = "$" in text or "\\u0024" in text
    try:
        return json.loads(text, object_hook=hook if hooked else None, parse_constant=_no_constant)
    except (UnsafePayloadError, ResultLimitError, MemoryError):
        raise
    # the parser's own errors, and those of allowed classes' __hash__/__eq__ on the data
    except Exception as exc:
        raise _malformed(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _no_constant(name: str) -> None:
    raise _malformed(f"{name} is not JSON")


def _keyed(pairs: Any) -> list[tuple[Any, Any]]:
    if type(pairs) is not list or not all(type(pair) is list and len(pair) == 2 for pair in pairs):
        raise _malformed("a mapping's items are not [key, value] pairs")
    return [(key, value) for key, value in pairs]


def _distinct_hashes(keys: Iterable[Any]) -> None:
    """Refuse keys that would make a set or dict quadratic to build (many keys, one hash)."""
    counts: dict[int, int] = {}
    for key in keys:
        try:
            digest = hash(key)
        except Exception:  # unhashable, or an allowed class's __hash__ failing on the data
            raise _malformed(
                f"an unhashable {type(key).__name__} is used as a key or set item"
            ) from None
        seen = counts.get(digest, 0) + 1
        if seen > MAX_SAME_HASH:
            raise _malformed(f"more than {MAX_SAME_HASH} keys or set items share one hash")
        counts[digest] = seen


def _number(value: Any) -> float | int:
    if type(value) not in (int, float):
        raise _malformed("a complex number's parts are not numbers")
    return value


_Decoder = TypeVar("_Decoder", bound=Callable[..., Any])
_DECODERS: dict[str, tuple[tuple[frozenset[str], ...], Callable[[_Tags, dict[str, Any]], Any]]] = {}
"""Each tag's decoder and the key sets its objects may have (the tag included), filled by
:func:`_decodes`."""


def _decodes(*tags: str, keys: tuple[str, ...] = ("v",)) -> Callable[[_Decoder], _Decoder]:
    """Make the decorated ``_Tags`` method the decoder of ``tags``.

    An object with one of these tags must have, besides the tag, exactly the keys of one entry
    of ``keys`` (names separated by spaces: ``"c v"``); any other object is refused.
    """
    shapes = tuple(frozenset({TAG, *names.split()}) for names in keys)

    def register(method: _Decoder) -> _Decoder:
        for tag in tags:
            _DECODERS[tag] = (shapes, method)
        return method

    return register


class _Tags:
    """The JSON object hook: plain objects pass through, tagged objects become their values."""

    def __init__(
        self,
        buffers: Sequence[bytes | memoryview],
        classes: Mapping[str, type],
        limits: DecodeLimits,
        allow_pickle: bool,
    ) -> None:
        self.buffers = buffers
        self.used: set[int] = set()
        self.classes = classes
        self.limits = limits
        self.allow_pickle = allow_pickle

    def __call__(self, obj: dict[str, Any]) -> Any:
        tag = obj.get(TAG)
        if tag is None:
            return obj
        decoder = _DECODERS.get(tag) if type(tag) is str else None
        if decoder is None:
            raise _malformed(f"unknown tag {str(tag)[:40]!r}")
        shapes, decode_one = decoder
        if not any(obj.keys() == keys for keys in shapes):
            raise _malformed(f"a {tag} has the keys {sorted(obj)[:8]}")
        return decode_one(self, obj)

    # -- helpers ------------------------------------------------------------------------------

    def text(self, value: Any, what: str, longest: int = _ISO_MAX) -> str:
        if type(value) is not str or len(value) > longest:
            raise _malformed(f"a {what} is not short text")
        return value

    def buffer(self, index: Any) -> bytes | memoryview:
        if type(index) is not int or not 0 <= index < len(self.buffers) or index in self.used:
            raise _malformed("a reference to a missing or already used buffer")
        self.used.add(index)
        return self.buffers[index]

    def binary(self, obj: dict[str, Any]) -> bytes:
        if "b" in obj:
            data = self.buffer(obj["b"])
            if len(data) > self.limits.max_bytes_length:
                raise _limit(
                    self.limits, "max_bytes_length", f"the length of a bytes value ({len(data)})"
                )
            return bytes(data)
        text = obj["v"]
        if type(text) is not str:
            raise _malformed("a bytes value is not base64 text")
        if len(text) // 4 * 3 > self.limits.max_bytes_length:
            raise _limit(
                self.limits,
                "max_bytes_length",
                f"the length of a bytes value (about {len(text) // 4 * 3})",
            )
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            raise _malformed("a bytes value is not valid base64") from None

    def cls(self, obj: dict[str, Any], kind: str) -> type:
        name = obj["c"]
        if type(name) is not str:
            raise _malformed(f"a {kind}'s class name is not text")
        found = self.classes.get(name)
        if found is None:
            shown = name[:200].replace(":", ".", 1)
            raise UnsafePayloadError(
                f"Refused a result from the sandbox that holds a {shown}, which is not in "
                "allowed_classes. If it is your own type, pass it in allowed_classes. Nothing was "
                "run on the host."
            )
        return found

    def items(self, obj: dict[str, Any]) -> list[Any]:
        values = obj["v"]
        if type(values) is not list:
            raise _malformed("a container's items are not a list")
        return values

    # -- tags: each decoder names its tags and their objects' keys -----------------------------

    @_decodes("tuple")
    def tuple_(self, obj: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(self.items(obj))

    @_decodes("set")
    def set_(self, obj: dict[str, Any]) -> set[Any]:
        values = self.items(obj)
        _distinct_hashes(values)
        return set(values)

    @_decodes("frozenset")
    def frozenset_(self, obj: dict[str, Any]) -> frozenset[Any]:
        values = self.items(obj)
        _distinct_hashes(values)
        return frozenset(values)

    def pairs(self, obj: dict[str, Any]) -> list[tuple[Any, Any]]:
        pairs = _keyed(obj["v"])
        _distinct_hashes(key for key, _ in pairs)
        return pairs

    @_decodes("dict")
    def dict_(self, obj: dict[str, Any]) -> dict[Any, Any]:
        return dict(self.pairs(obj))

    @_decodes("odict")
    def odict(self, obj: dict[str, Any]) -> collections.OrderedDict[Any, Any]:
        return collections.OrderedDict(self.pairs(obj))

    @_decodes("counter")
    def counter(self, obj: dict[str, Any]) -> collections.Counter[Any]:
        pairs = self.pairs(obj)
        if not all(type(count) in (int, float) for _, count in pairs):
            raise _malformed("a Counter's counts are not numbers")
        counter: collections.Counter[Any] = collections.Counter()
        dict.update(counter, pairs)
        return counter

    @_decodes("defaultdict", keys=("v f",))
    def defaultdict(self, obj: dict[str, Any]) -> collections.defaultdict[Any, Any]:
        name = obj["f"]
        if name is not None and (type(name) is not str or name not in FACTORIES):
            raise _malformed("a defaultdict's factory is not one of the plain types")
        return collections.defaultdict(None if name is None else FACTORIES[name], self.pairs(obj))

    @_decodes("deque", keys=("v m",))
    def deque(self, obj: dict[str, Any]) -> collections.deque[Any]:
        maxlen = obj["m"]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise _malformed("a deque's maxlen is not a count")
        return collections.deque(self.items(obj), maxlen)

    @_decodes("bytes", keys=("v", "b"))
    def bytes_(self, obj: dict[str, Any]) -> bytes:
        return self.binary(obj)

    @_decodes("bytearray", keys=("v", "b"))
    def bytearray_(self, obj: dict[str, Any]) -> bytearray:
        return bytearray(self.binary(obj))

    @_decodes("str", keys=("b",))
    def str_(self, obj: dict[str, Any]) -> str:
        data = self.buffer(obj["b"])
        if len(data) > 4 * self.limits.max_str_length:
            raise _limit(self.limits, "max_str_length", "the length of a string")
        try:
            text = str(data, "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise _malformed("a string buffer is not UTF-8") from None
        if len(text) > self.limits.max_str_length:
            raise _limit(
                self.limits, "max_str_length", f"the length of a string ({len(text)} characters)"
            )
        return text

    @_decodes("float")
    def float_(self, obj: dict[str, Any]) -> float:
        value = obj["v"]
        if value not in ("nan", "inf", "-inf"):
            raise _malformed("a float tag that is not nan, inf or -inf")
        return float(value)

    @_decodes("complex")
    def complex_(self, obj: dict[str, Any]) -> complex:
        parts = self.items(obj)
        if len(parts) != 2:
            raise _malformed("a complex number is not [real, imag]")
        return complex(_number(parts[0]), _number(parts[1]))

    @_decodes("decimal")
    def decimal(self, obj: dict[str, Any]) -> decimal.Decimal:
        text = self.text(obj["v"], "Decimal", self.limits.max_int_digits + 32)
        match = _DECIMAL.fullmatch(text)
        if match is None or text in ("", "+", "-", ".") or not re.search(r"\d|Infinity|NaN", text):
            raise _malformed("a Decimal that is not a decimal number")
        whole, fraction, exponent, payload = match.groups()
        if len(whole or "") + len(fraction or "") + len(payload or "") > self.limits.max_int_digits:
            raise _limit(self.limits, "max_int_digits", "the number of digits of a Decimal")
        if exponent is not None and abs(int(exponent)) > self.limits.max_exponent:
            raise _limit(self.limits, "max_exponent", "the exponent of a Decimal")
        return decimal.Decimal(text)

    @_decodes("fraction")
    def fraction(self, obj: dict[str, Any]) -> fractions.Fraction:
        parts = self.items(obj)
        if (
            len(parts) != 2
            or type(parts[0]) is not int
            or type(parts[1]) is not int
            or parts[1] == 0
        ):
            raise _malformed("a Fraction that is not [numerator, non-zero denominator]")
        return fractions.Fraction(parts[0], parts[1])

    @_decodes("datetime", "date", "time")
    def iso(self, obj: dict[str, Any]) -> datetime.date | datetime.time:
        kind = _ISO_TYPES[obj[TAG]]
        text = self.text(obj["v"], kind.__name__)
        try:
            return kind.fromisoformat(text)
        except ValueError:
            raise _malformed(f"a {kind.__name__} that is not ISO 8601 text") from None

    @_decodes("timedelta")
    def timedelta(self, obj: dict[str, Any]) -> datetime.timedelta:
        parts = self.items(obj)
        if len(parts) != 3 or not all(type(part) is int and abs(part) < 10**12 for part in parts):
            raise _malformed("a timedelta that is not [days, seconds, microseconds]")
        try:
            return datetime.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2])
        except OverflowError:
            raise _malformed("a timedelta out of range") from None

    @_decodes("uuid")
    def uuid_(self, obj: dict[str, Any]) -> uuid.UUID:
        text = self.text(obj["v"], "UUID")
        if not _UUID.fullmatch(text):
            raise _malformed("a UUID that is not 32 hex digits")
        return uuid.UUID(hex=text)

    @_decodes("path")
    def path(self, obj: dict[str, Any]) -> pathlib.PurePosixPath:
        value = obj["v"]
        if type(value) is not str:
            raise _malformed("a path that is not text")
        return pathlib.PurePosixPath(value)

    @_decodes("enum", keys=("c v",))
    def enum(self, obj: dict[str, Any]) -> Any:
        cls = self.cls(obj, "enum member")
        members = getattr(cls, "__members__", None) if _is_enum(cls) else None
        name = obj["v"]
        if members is None or type(name) is not str or name not in members:
            raise _malformed(f"{class_name(cls)} has no member named {str(name)[:80]!r}")
        return members[name]

    @_decodes("ntuple", keys=("c v",))
    def ntuple(self, obj: dict[str, Any]) -> tuple[Any, ...]:
        cls = self.cls(obj, "named tuple")
        values = self.items(obj)
        fields = cls.__dict__.get("_fields") if issubclass(cls, tuple) else None
        if type(fields) is not tuple or len(fields) != len(values):
            raise _malformed(f"{class_name(cls)} is not a named tuple of {len(values)} fields")
        built: tuple[Any, ...] = tuple.__new__(cls, values)
        return built

    @_decodes("obj", keys=("c v",))
    def obj(self, obj: dict[str, Any]) -> Any:
        cls = self.cls(obj, "instance")
        fields = obj["v"]
        if type(fields) is not dict or not all(type(name) is str for name in fields):
            raise _malformed(f"the fields of a {class_name(cls)} are not a mapping of names")
        return rebuild(cls, fields)

    @_decodes("pickle", keys=("v", "b"))
    def pickle(self, obj: dict[str, Any]) -> Any:
        if not self.allow_pickle:
            raise UnsafePayloadError(
                "Refused a pickled value from the sandbox: pickles are decoded only when you opt "
                "in with unsafe_pickle=True. Nothing was run on the host."
            )
        from .unpickler import restricted_loads

        return restricted_loads(self.binary(obj), self.classes.values())


def _is_enum(cls: type) -> bool:
    return isinstance(cls, enum.EnumMeta)


def _slot_descriptors(cls: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            descriptor = klass.__dict__.get(name)
            if isinstance(descriptor, types.MemberDescriptorType):
                found[name] = descriptor
    return found


_MISSING = object()


def _declared_fields(cls: type) -> dict[str, bool] | None:
    """``{field: has a class-level default}`` for a dataclass or attrs class; None for other
    classes.

    A field without a class-level default (none at all, or a ``default_factory``) must come with
    the data: an instance made without it would lack the attribute.
    """
    if dataclasses.is_dataclass(cls):
        return {
            f.name: _class_attribute(cls, f.name) is not _MISSING and not _is_slot(cls, f.name)
            for f in dataclasses.fields(cls)
        }
    attributes = cls.__dict__.get("__attrs_attrs__")
    if attributes is not None:
        return {a.name: False for a in attributes}
    return None


def _is_slot(cls: type, name: str) -> bool:
    return isinstance(_class_attribute(cls, name), types.MemberDescriptorType)


def _class_attribute(cls: type, name: str) -> Any:
    """``name`` as the class (or a base) defines it, read from the class dicts: nothing runs."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def _check_declared(cls: type, fields: dict[str, Any]) -> None:
    """Refuse, for a dataclass or attrs class, fields it does not declare and missing ones it
    needs."""
    declared = _declared_fields(cls)
    if declared is None:
        return
    unknown = sorted(set(fields) - set(declared))
    missing = sorted(
        name for name, has_default in declared.items() if name not in fields and not has_default
    )
    if unknown or missing:
        what = (
            f"fields it does not declare ({', '.join(n[:40] for n in unknown[:5])})"
            if unknown
            else f"no value for its fields {', '.join(missing[:5])}"
        )
        raise _malformed(f"a {class_name(cls)} with {what}")


def rebuild(cls: type, fields: dict[str, Any]) -> Any:
    """A new ``cls`` instance holding ``fields``, made without running the class's own code.

    Pydantic models are validated by ``model_validate``. Everything else is created with
    ``object.__new__`` and filled by writing slots and the instance's ``__dict__`` directly;
    a field may not be named like a special attribute, nor shadow a method or other
    descriptor of the class (``is_admin`` cannot replace ``is_admin()``).
    """
    validate = getattr(cls, "model_validate", None)
    if callable(validate) and hasattr(cls, "__pydantic_fields__"):
        try:
            return validate(fields)
        except (ValueError, TypeError) as exc:
            raise _malformed(f"{class_name(cls)} refused the data: {str(exc)[:500]}") from None
    if any(name.startswith("__") and name.endswith("__") for name in fields):
        raise _malformed(f"a {class_name(cls)} with a field named like a special attribute")
    if _is_enum(cls):
        raise _malformed(f"a {class_name(cls)} built field by field is not one of its members")
    _check_declared(cls, fields)
    try:
        instance: object = object.__new__(cls)
    except TypeError:
        raise UnsafePayloadError(
            f"Cannot rebuild a {class_name(cls)} from data: it is not a plain class "
            "(a dataclass, attrs class, pydantic model or class with __dict__/__slots__)."
        ) from None
    slots = _slot_descriptors(cls)
    state = None
    for name, value in fields.items():
        descriptor = slots.get(name)
        if descriptor is not None:
            descriptor.__set__(instance, value)
            continue
        attribute = _class_attribute(cls, name)
        if attribute is not _MISSING and (
            callable(attribute) or hasattr(type(attribute), "__get__")
        ):
            raise _malformed(
                f"a {class_name(cls)} field named {name[:80]!r} would shadow a method or descriptor"
            )
        if state is None:
            try:
                state = object.__getattribute__(instance, "__dict__")
            except AttributeError:
                raise _malformed(f"a {class_name(cls)} has no field named {name[:80]!r}") from None
        state[name] = value
    return instance
