"""Decoding values that come out of a sandbox: data only, bounded, no code run on the host.

The kernel encodes a value with :mod:`kernel_sandbox.kernelside.dataformat` (JSON plus tagged
values, and out-of-band buffers for long strings and bytes). :func:`decode` turns it back:

* Before anything is allocated, the document is measured against :class:`DecodeLimits` in one
  pass, a window at a time, in linear time and a few windows of memory
  (:func:`.limits.measure`); over a limit the result is refused with :class:`ResultLimitError`
  naming it. Then the standard library's JSON parser builds the value, and a hook called once
  per JSON object turns tagged objects into their types, checking each one's shape and size.
* Instances are rebuilt (:mod:`.instances`) only for classes in ``allowed`` (looked up by
  ``module:qualname``, never imported), as a *new* instance whose fields are set from the data:
  dataclasses, attrs and plain classes by writing the new instance's ``__dict__`` and slots (no
  ``__init__``, no ``__setstate__``, no property setter, nothing set on the class); pydantic
  models through the model's own ``model_validate``, so its validators check the data; enum
  members are looked up by name; named tuples are built with ``tuple.__new__``. Nothing else is
  callable from the data, and pickles are refused unless the caller opted into them.
* Sets and dicts with non-string keys refuse more than :data:`MAX_SAME_HASH` distinct keys
  sharing one hash, which would make building them quadratic.
"""

from __future__ import annotations

import base64
import collections
import datetime
import decimal
import fractions
import json
import pathlib
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ResultLimitError, UnsafePayloadError
from ..kernelside.dataformat import FACTORIES, TAG, class_name
from .instances import allowed_map, is_enum, rebuild
from .limits import DecodeLimits, limit_error, malformed, measure

MAX_SAME_HASH = 8
_DECIMAL = re.compile(r"[+-]?(?:(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d{1,12}))?|Infinity|s?NaN(\d*))")
_UUID = re.compile(r"[0-9a-f]{32}")
_ISO_MAX = 64
_ISO_TYPES: dict[str, type[datetime.date] | type[datetime.time]] = {
    "datetime": datetime.datetime,
    "date": datetime.date,
    "time": datetime.time,
}


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
        raise malformed(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _no_constant(name: str) -> None:
    raise malformed(f"{name} is not JSON")


def _keyed(pairs: Any) -> list[tuple[Any, Any]]:
    if type(pairs) is not list or not all(type(pair) is list and len(pair) == 2 for pair in pairs):
        raise malformed("a mapping's items are not [key, value] pairs")
    return [(key, value) for key, value in pairs]


def _distinct_hashes(keys: Iterable[Any]) -> None:
    """Refuse keys that would make a set or dict quadratic to build (many keys, one hash)."""
    counts: dict[int, int] = {}
    for key in keys:
        try:
            digest = hash(key)
        except Exception:  # unhashable, or an allowed class's __hash__ failing on the data
            raise malformed(
                f"an unhashable {type(key).__name__} is used as a key or set item"
            ) from None
        seen = counts.get(digest, 0) + 1
        if seen > MAX_SAME_HASH:
            raise malformed(f"more than {MAX_SAME_HASH} keys or set items share one hash")
        counts[digest] = seen


def _number(value: Any) -> float | int:
    if type(value) not in (int, float):
        raise malformed("a complex number's parts are not numbers")
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
            raise malformed(f"unknown tag {str(tag)[:40]!r}")
        shapes, decode_one = decoder
        if not any(obj.keys() == keys for keys in shapes):
            raise malformed(f"a {tag} has the keys {sorted(obj)[:8]}")
        return decode_one(self, obj)

    # -- helpers ------------------------------------------------------------------------------

    def text(self, value: Any, what: str, longest: int = _ISO_MAX) -> str:
        if type(value) is not str or len(value) > longest:
            raise malformed(f"a {what} is not short text")
        return value

    def buffer(self, index: Any) -> bytes | memoryview:
        if type(index) is not int or not 0 <= index < len(self.buffers) or index in self.used:
            raise malformed("a reference to a missing or already used buffer")
        self.used.add(index)
        return self.buffers[index]

    def binary(self, obj: dict[str, Any]) -> bytes:
        if "b" in obj:
            data = self.buffer(obj["b"])
            if len(data) > self.limits.max_bytes_length:
                raise limit_error(
                    self.limits, "max_bytes_length", f"the length of a bytes value ({len(data)})"
                )
            return bytes(data)
        text = obj["v"]
        if type(text) is not str:
            raise malformed("a bytes value is not base64 text")
        if len(text) // 4 * 3 > self.limits.max_bytes_length:
            raise limit_error(
                self.limits,
                "max_bytes_length",
                f"the length of a bytes value (about {len(text) // 4 * 3})",
            )
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            raise malformed("a bytes value is not valid base64") from None

    def cls(self, obj: dict[str, Any], kind: str) -> type:
        name = obj["c"]
        if type(name) is not str:
            raise malformed(f"a {kind}'s class name is not text")
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
            raise malformed("a container's items are not a list")
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
            raise malformed("a Counter's counts are not numbers")
        counter: collections.Counter[Any] = collections.Counter()
        dict.update(counter, pairs)
        return counter

    @_decodes("defaultdict", keys=("v f",))
    def defaultdict(self, obj: dict[str, Any]) -> collections.defaultdict[Any, Any]:
        name = obj["f"]
        if name is not None and (type(name) is not str or name not in FACTORIES):
            raise malformed("a defaultdict's factory is not one of the plain types")
        return collections.defaultdict(None if name is None else FACTORIES[name], self.pairs(obj))

    @_decodes("deque", keys=("v m",))
    def deque(self, obj: dict[str, Any]) -> collections.deque[Any]:
        maxlen = obj["m"]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise malformed("a deque's maxlen is not a count")
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
            raise limit_error(self.limits, "max_str_length", "the length of a string")
        try:
            text = str(data, "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise malformed("a string buffer is not UTF-8") from None
        if len(text) > self.limits.max_str_length:
            raise limit_error(
                self.limits, "max_str_length", f"the length of a string ({len(text)} characters)"
            )
        return text

    @_decodes("float")
    def float_(self, obj: dict[str, Any]) -> float:
        value = obj["v"]
        if value not in ("nan", "inf", "-inf"):
            raise malformed("a float tag that is not nan, inf or -inf")
        return float(value)

    @_decodes("complex")
    def complex_(self, obj: dict[str, Any]) -> complex:
        parts = self.items(obj)
        if len(parts) != 2:
            raise malformed("a complex number is not [real, imag]")
        return complex(_number(parts[0]), _number(parts[1]))

    @_decodes("decimal")
    def decimal(self, obj: dict[str, Any]) -> decimal.Decimal:
        text = self.text(obj["v"], "Decimal", self.limits.max_int_digits + 32)
        match = _DECIMAL.fullmatch(text)
        if match is None or text in ("", "+", "-", ".") or not re.search(r"\d|Infinity|NaN", text):
            raise malformed("a Decimal that is not a decimal number")
        whole, fraction, exponent, payload = match.groups()
        if len(whole or "") + len(fraction or "") + len(payload or "") > self.limits.max_int_digits:
            raise limit_error(self.limits, "max_int_digits", "the number of digits of a Decimal")
        if exponent is not None and abs(int(exponent)) > self.limits.max_exponent:
            raise limit_error(self.limits, "max_exponent", "the exponent of a Decimal")
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
            raise malformed("a Fraction that is not [numerator, non-zero denominator]")
        return fractions.Fraction(parts[0], parts[1])

    @_decodes("datetime", "date", "time")
    def iso(self, obj: dict[str, Any]) -> datetime.date | datetime.time:
        kind = _ISO_TYPES[obj[TAG]]
        text = self.text(obj["v"], kind.__name__)
        try:
            return kind.fromisoformat(text)
        except ValueError:
            raise malformed(f"a {kind.__name__} that is not ISO 8601 text") from None

    @_decodes("timedelta")
    def timedelta(self, obj: dict[str, Any]) -> datetime.timedelta:
        parts = self.items(obj)
        if len(parts) != 3 or not all(type(part) is int and abs(part) < 10**12 for part in parts):
            raise malformed("a timedelta that is not [days, seconds, microseconds]")
        try:
            return datetime.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2])
        except OverflowError:
            raise malformed("a timedelta out of range") from None

    @_decodes("uuid")
    def uuid_(self, obj: dict[str, Any]) -> uuid.UUID:
        text = self.text(obj["v"], "UUID")
        if not _UUID.fullmatch(text):
            raise malformed("a UUID that is not 32 hex digits")
        return uuid.UUID(hex=text)

    @_decodes("path")
    def path(self, obj: dict[str, Any]) -> pathlib.PurePosixPath:
        value = obj["v"]
        if type(value) is not str:
            raise malformed("a path that is not text")
        return pathlib.PurePosixPath(value)

    @_decodes("enum", keys=("c v",))
    def enum(self, obj: dict[str, Any]) -> Any:
        cls = self.cls(obj, "enum member")
        members = getattr(cls, "__members__", None) if is_enum(cls) else None
        name = obj["v"]
        if members is None or type(name) is not str or name not in members:
            raise malformed(f"{class_name(cls)} has no member named {str(name)[:80]!r}")
        return members[name]

    @_decodes("ntuple", keys=("c v",))
    def ntuple(self, obj: dict[str, Any]) -> tuple[Any, ...]:
        cls = self.cls(obj, "named tuple")
        values = self.items(obj)
        fields = cls.__dict__.get("_fields") if issubclass(cls, tuple) else None
        if type(fields) is not tuple or len(fields) != len(values):
            raise malformed(f"{class_name(cls)} is not a named tuple of {len(values)} fields")
        built: tuple[Any, ...] = tuple.__new__(cls, values)
        return built

    @_decodes("obj", keys=("c v",))
    def obj(self, obj: dict[str, Any]) -> Any:
        cls = self.cls(obj, "instance")
        fields = obj["v"]
        if type(fields) is not dict or not all(type(name) is str for name in fields):
            raise malformed(f"the fields of a {class_name(cls)} are not a mapping of names")
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
