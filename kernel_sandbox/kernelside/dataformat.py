"""The data-only format in which values leave a sandbox (kernel side: the encoder).

A value becomes one JSON document (ASCII) and a list of out-of-band buffers. JSON carries
``None``, ``bool``, ``int``, finite ``float``, ``str``, ``list`` and dicts with ``str`` keys
as themselves. Everything else is a *tagged value*: a JSON object with a ``"$"`` key naming
the tag, ``"v"`` holding its data, ``"c"`` the class for instances and enums, ``"b"`` the index
of an out-of-band buffer. A dict that has a ``"$"`` key or keys other than ``str`` is itself
tagged (``dict``), so every JSON object with a ``"$"`` key is a tag.

=============  ==========================================================================
tag            data
=============  ==========================================================================
tuple, list    ``v``: the items (``list`` is not used: JSON arrays are lists)
set, frozenset ``v``: the items
dict, odict    ``v``: ``[key, value]`` pairs (``odict`` is ``collections.OrderedDict``)
counter        ``v``: ``[key, count]`` pairs (``collections.Counter``)
defaultdict    ``v``: pairs; ``f``: the factory's name (list, dict, set, int, ...) or null
deque          ``v``: the items; ``m``: maxlen or null
bytes,         ``v``: base64 text, or ``b``: a buffer
bytearray
str            ``b``: a buffer holding UTF-8 (long strings travel out of band)
float          ``v``: ``"nan"``, ``"inf"`` or ``"-inf"``
complex        ``v``: ``[real, imag]``
decimal        ``v``: ``str(value)``
fraction       ``v``: ``[numerator, denominator]``
datetime,      ``v``: ISO 8601 text (aware values keep their UTC offset, not a zone name)
date, time
timedelta      ``v``: ``[days, seconds, microseconds]``
uuid           ``v``: 32 hex digits
path           ``v``: the path as text (a path inside the sandbox)
enum           ``c``: the enum class; ``v``: the member's name
ntuple         ``c``: the named tuple class; ``v``: the items
obj            ``c``: the class; ``v``: ``{field: value}`` (dataclasses, attrs classes,
               pydantic models, plain classes through ``__getstate__``/``__dict__``/slots)
pickle         ``v``/``b``: a pickle (only when the caller opted into pickled results)
=============  ==========================================================================

A class is named ``"module:qualname"``. The host rebuilds only classes its caller allowed,
as new instances (see ``kernel_sandbox.execution.decode``). Shared references are sent as
copies; a cycle is refused.
"""

from __future__ import annotations

import base64
import collections
import datetime
import decimal
import enum
import fractions
import json
import math
import pathlib
import pickle
import uuid

TAG = "$"
OUT_OF_BAND_BYTES = 64 * 1024
MAX_DEPTH = 500
FACTORIES = {
    "list": list,
    "dict": dict,
    "set": set,
    "int": int,
    "float": float,
    "str": str,
    "tuple": tuple,
    "frozenset": frozenset,
    "bytes": bytes,
    "bool": bool,
}
_FACTORY_NAMES = {factory: name for name, factory in FACTORIES.items()}
_SCALARS = frozenset({type(None), bool, int, str})


class EncodeError(TypeError):
    """A value cannot be sent back in the data-only format; ``inside`` lists the classes around
    it."""

    def __init__(self, message):
        super().__init__(message)
        self.message = message
        self.inside = []

    def __str__(self):
        if not self.inside:
            return self.message
        return f"{self.message} (inside: {' > '.join(reversed(self.inside))})"


def class_name(cls: type) -> str:
    """How the format names ``cls``: ``"module:qualname"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def encode(value, *, out_of_band=OUT_OF_BAND_BYTES, allow_pickle=False):
    """Encode ``value``; return the JSON document (ASCII bytes) and the out-of-band buffers.

    ``str``/``bytes`` values longer than ``out_of_band`` bytes travel as buffers (``None``: all
    inline, for transports without buffers). With ``allow_pickle``, a value the format cannot
    express is pickled instead of refused.
    """
    encoder = _Encoder(out_of_band, allow_pickle)
    tree = encoder.walk(value, 0)
    text = json.dumps(
        tree, ensure_ascii=True, allow_nan=False, check_circular=False, separators=(",", ":")
    )
    return text.encode("ascii"), encoder.buffers


class _Encoder:
    def __init__(self, out_of_band, allow_pickle):
        self.out_of_band = out_of_band
        self.allow_pickle = allow_pickle
        self.buffers = []
        self.path = set()

    def buffer(self, data):
        self.buffers.append(data)
        return len(self.buffers) - 1

    def binary(self, tag, data):
        if self.out_of_band is not None and len(data) > self.out_of_band:
            return {TAG: tag, "b": self.buffer(bytes(data))}
        return {TAG: tag, "v": base64.b64encode(data).decode("ascii")}

    def walk(self, value, depth):  # noqa: C901
        kind = type(value)
        if kind in _SCALARS:
            if kind is str and self.out_of_band is not None and len(value) > self.out_of_band // 4:
                data = value.encode("utf-8", "surrogatepass")
                if len(data) > self.out_of_band:
                    return {TAG: "str", "b": self.buffer(data)}
            return value
        if kind is float:
            return value if math.isfinite(value) else {TAG: "float", "v": repr(value)}
        if depth > MAX_DEPTH:
            raise EncodeError(f"the value is nested more than {MAX_DEPTH} levels deep")
        if kind in _CONTAINERS:
            return self.tracked(value, self.container, kind, depth + 1)
        if isinstance(value, enum.Enum):
            return {TAG: "enum", "c": class_name(kind), "v": value.name}
        atom = _ATOMS.get(kind)
        if atom is not None:
            return atom(self, value, depth + 1)
        if isinstance(value, tuple) and hasattr(kind, "_fields"):
            return self.tracked(value, self.named_tuple, kind, depth + 1)
        if isinstance(value, (datetime.date, datetime.time)):
            base = next(base for base in kind.__mro__ if base in _ATOMS)
            return _ATOMS[base](self, value, depth + 1)
        if isinstance(value, pathlib.PurePath):
            return {TAG: "path", "v": value.as_posix()}
        if isinstance(value, float):
            return self.walk(float(value), depth)
        if (
            kind.__module__ == "numpy"
            and getattr(value, "ndim", None) == 0
            and hasattr(value, "item")
        ):
            return self.walk(value.item(), depth)
        builtin = next((base for base in kind.__mro__[:-1] if base.__module__ == "builtins"), None)
        if builtin is not None:
            return self.fallback(
                value,
                f"a {kind.__qualname__}"
                + (f" (a subclass of {builtin.__name__})" if builtin is not kind else ""),
            )
        return self.tracked(value, self.instance, kind, depth + 1)

    def tracked(self, value, encode, kind, depth):
        key = id(value)
        if key in self.path:
            raise EncodeError(f"the value holds a reference cycle (through a {kind.__qualname__})")
        self.path.add(key)
        try:
            return encode(value, kind, depth)
        except EncodeError as exc:
            exc.inside.append(kind.__qualname__)
            raise
        finally:
            self.path.discard(key)

    def items(self, values, depth):
        return [self.walk(item, depth) for item in values]

    def pairs(self, mapping, depth):
        return [[self.walk(key, depth), self.walk(item, depth)] for key, item in mapping.items()]

    def container(self, value, kind, depth):
        if kind is list:
            return self.items(value, depth)
        if kind is dict:
            if TAG not in value and all(type(key) is str for key in value):
                return {key: self.walk(item, depth) for key, item in value.items()}
            return {TAG: "dict", "v": self.pairs(value, depth)}
        if kind is tuple or kind is set or kind is frozenset:
            return {TAG: kind.__name__, "v": self.items(value, depth)}
        if kind is collections.OrderedDict:
            return {TAG: "odict", "v": self.pairs(value, depth)}
        if kind is collections.Counter:
            return {TAG: "counter", "v": self.pairs(value, depth)}
        if kind is collections.defaultdict:
            factory = value.default_factory
            if factory is not None and factory not in _FACTORY_NAMES:
                return self.fallback(value, f"a defaultdict whose factory is {factory!r}")
            return {
                TAG: "defaultdict",
                "f": _FACTORY_NAMES.get(factory),
                "v": self.pairs(value, depth),
            }
        return {TAG: "deque", "v": self.items(value, depth), "m": value.maxlen}

    def named_tuple(self, value, kind, depth):
        return {TAG: "ntuple", "c": class_name(kind), "v": self.items(value, depth)}

    def instance(self, value, kind, depth):
        try:
            fields = instance_fields(value)
        except EncodeError as exc:
            return self.fallback(value, str(exc))
        return {
            TAG: "obj",
            "c": class_name(kind),
            "v": {name: self.walk(item, depth) for name, item in fields.items()},
        }

    def fallback(self, value, what):
        if not self.allow_pickle:
            raise EncodeError(
                f"cannot send {what} back from the sandbox: the data-only format carries JSON "
                "values, containers, dates, numbers, enums and instances of dataclasses, attrs "
                "classes, pydantic models and plain classes; convert it, or opt into pickled "
                "results (unsafe_pickle=True)"
            )
        return self.binary("pickle", pickle.dumps(value, protocol=4))


_CONTAINERS = frozenset(
    {
        list,
        dict,
        tuple,
        set,
        frozenset,
        collections.OrderedDict,
        collections.Counter,
        collections.defaultdict,
        collections.deque,
    }
)
_ATOMS = {
    bytes: lambda enc, value, depth: enc.binary("bytes", value),
    bytearray: lambda enc, value, depth: enc.binary("bytearray", value),
    memoryview: lambda enc, value, depth: enc.binary("bytes", value.tobytes()),
    complex: lambda enc, value, depth: {
        TAG: "complex",
        "v": [enc.walk(value.real, depth), enc.walk(value.imag, depth)],
    },
    decimal.Decimal: lambda enc, value, depth: {TAG: "decimal", "v": str(value)},
    fractions.Fraction: lambda enc, value, depth: {
        TAG: "fraction",
        "v": [value.numerator, value.denominator],
    },
    datetime.datetime: lambda enc, value, depth: {
        TAG: "datetime",
        "v": datetime.datetime.isoformat(value),
    },
    datetime.date: lambda enc, value, depth: {TAG: "date", "v": datetime.date.isoformat(value)},
    datetime.time: lambda enc, value, depth: {TAG: "time", "v": datetime.time.isoformat(value)},
    datetime.timedelta: lambda enc, value, depth: {
        TAG: "timedelta",
        "v": [value.days, value.seconds, value.microseconds],
    },
    uuid.UUID: lambda enc, value, depth: {TAG: "uuid", "v": value.hex},
}


def _slot_names(kind):
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            if name not in ("__dict__", "__weakref__"):
                yield name


def instance_fields(value):
    """The ``{name: value}`` state of an instance, as pickle would take it, for the ``obj`` tag."""
    kind = type(value)
    if hasattr(kind, "__pydantic_fields__"):
        fields = dict(value.__dict__)
        fields.update(getattr(value, "__pydantic_extra__", None) or {})
        return fields
    getstate = getattr(kind, "__getstate__", None)
    custom = (
        getstate is not None
        and getstate is not getattr(object, "__getstate__", None)
        and getattr(getstate, "__name__", "") != "_dataclass_getstate"
    )
    if custom:
        state = value.__getstate__()
        if (
            isinstance(state, tuple)
            and len(state) == 2
            and all(part is None or type(part) is dict for part in state)
        ):
            return {**(state[0] or {}), **(state[1] or {})}
        if type(state) is not dict:
            raise EncodeError(
                f"{kind.__qualname__}.__getstate__ returned a {type(state).__name__}, not a dict"
            )
        return dict(state)
    fields = dict(vars(value)) if hasattr(value, "__dict__") else None
    slots = list(_slot_names(kind))
    if fields is None and not slots:
        raise EncodeError(
            f"cannot send a {kind.__module__}.{kind.__qualname__} back from the sandbox: it has no "
            "fields"
        )
    fields = fields or {}
    for name in slots:
        try:
            fields[name] = getattr(value, name)
        except AttributeError:
            pass
    if any(type(name) is not str for name in fields):
        raise EncodeError(f"a {kind.__qualname__} has attribute names that are not strings")
    return fields
