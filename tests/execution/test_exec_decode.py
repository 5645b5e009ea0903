"""The data-only result format: round trips, allowed classes, every limit, a hostile corpus, fuzzing.

No kernel is needed: the kernel-side encoder is an ordinary module here, and hostile documents
are written by hand, as a tool that controls the kernel could send them.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import json
import math
import pathlib
import pickle
import tracemalloc
import typing
import uuid
from typing import Any
from unittest import mock

import attrs
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.security_figures import examples

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import DecodeLimits, ResultLimitError, UnsafePayloadError
from kernel_sandbox.execution import limits as limits_module
from kernel_sandbox.execution.decode import MAX_SAME_HASH, decode
from kernel_sandbox.execution.limits import WINDOW, measure
from kernel_sandbox.kernelside.dataformat import EncodeError, encode


@dataclasses.dataclass
class Note:
    text: str
    tags: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int


@attrs.define
class Budget:
    limit: decimal.Decimal
    spent: decimal.Decimal = decimal.Decimal(0)


class Memory(pydantic.BaseModel):
    facts: list[str] = []
    when: datetime.datetime | None = None


class Agent(pydantic.BaseModel):
    name: str
    memory: Memory
    notes: list[Note] = []


class Plain:
    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[Plain] = []


class Slotted:
    __slots__ = ("a", "__hidden")

    def __init__(self) -> None:
        self.a = 1
        self.__hidden = 2


class WithState:
    def __init__(self) -> None:
        self.kept, self.cache = "kept", object()

    def __getstate__(self) -> dict[str, Any]:
        return {"kept": self.kept}


class AgentState:
    """The caller's own agent state, with a method an attacker would like to change."""

    def __init__(self) -> None:
        self.name = "ada"

    def is_admin(self) -> bool:
        return False


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Pair(typing.NamedTuple):
    left: int
    right: str


ALLOWED = [Note, Point, Budget, Memory, Agent, Plain, Slotted, WithState, AgentState, Color, Pair]
WATCHED = [*ALLOWED, fractions.Fraction, collections.Counter, collections.OrderedDict, decimal.Decimal,
           datetime.datetime, dict, list, set, tuple, object, type]


def round_trip(value: Any, **kwargs: Any) -> Any:
    doc, buffers = encode(value, **kwargs)
    return decode(doc, buffers, allowed=ALLOWED)


def class_state() -> dict[type, dict[str, Any]]:
    return {cls: dict(vars(cls)) for cls in WATCHED}


@pytest.fixture(autouse=True)
def classes_are_never_changed():
    """Whatever a test decodes, no allowed or standard class may change (compare vars())."""
    before = class_state()
    yield
    assert class_state() == before


PLAIN_VALUES = [
    None, True, 0, -(10**40), 1.5, "text", "", [1, [2, [3]]], {"a": {"b": None}},
    (1, "two", (3.0,)), {1, 2}, frozenset({"x"}), {(1, 2): "tuple key", 3: "int key", "$": "dollar"},
    b"\x00\xff" * 10, bytearray(b"ab"), "s" * 300_000, b"b" * 300_000, float("inf"), -float("inf"),
    2 + 3j, decimal.Decimal("-1.25E+3"), decimal.Decimal("NaN"), fractions.Fraction(-7, 3),
    datetime.datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
    datetime.date(2024, 1, 2), datetime.time(3, 4, 5), datetime.timedelta(days=-1, seconds=5, microseconds=7),
    uuid.UUID(int=12345), pathlib.PurePosixPath("/home/sandbox/work/a.txt"),
    collections.OrderedDict(b=1, a=2), collections.Counter("hello"), collections.deque([1, 2], maxlen=3),
    collections.defaultdict(list, {"k": [1]}), "\ud800 lone surrogate", "naïve ☃",
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=lambda value: type(value).__name__)
def test_plain_values_round_trip_with_their_types(value: Any) -> None:
    for out_of_band in (64 * 1024, None):
        decoded = round_trip(value, out_of_band=out_of_band)
        assert type(decoded) is type(value)
        if isinstance(value, decimal.Decimal) and value.is_nan():
            assert decoded.is_nan()
        elif isinstance(value, collections.deque):
            assert (decoded, decoded.maxlen) == (value, value.maxlen)
        elif isinstance(value, collections.defaultdict):
            assert (decoded, decoded.default_factory) == (value, value.default_factory)
        else:
            assert decoded == value


def test_nan_and_big_strings_travel_out_of_band() -> None:
    assert math.isnan(round_trip(float("nan")))
    doc, buffers = encode({"blob": "x" * 100_000, "raw": b"y" * 100_000})
    assert len(doc) < 200 and [len(buffer) for buffer in buffers] == [100_000, 100_000]


def test_instances_of_allowed_classes_are_rebuilt() -> None:
    agent = Agent(name="ada", memory=Memory(facts=["sky"], when=datetime.datetime(2024, 1, 1)),
                  notes=[Note("n", {"t"})])
    plain = Plain("root")
    plain.children.append(Plain("leaf"))
    values = [Note("hi", {"a"}), Point(1, 2), Budget(decimal.Decimal("10.5")), agent, Color.BLUE,
              Pair(1, "r")]
    for value in values:
        assert round_trip(value) == value
    rebuilt = round_trip(plain)
    assert (type(rebuilt), rebuilt.name, rebuilt.children[0].name) == (Plain, "root", "leaf")
    slotted = round_trip(Slotted())
    assert (slotted.a, slotted._Slotted__hidden) == (1, 2)
    assert vars(round_trip(WithState())) == {"kept": "kept"}


def test_instances_of_other_classes_are_refused() -> None:
    doc, buffers = encode(Note("x"))
    with pytest.raises(UnsafePayloadError, match=r"test_exec_decode.Note, which is not in allowed_classes"):
        decode(doc, buffers)


def test_values_the_format_cannot_carry_fail_in_the_kernel_with_the_reason() -> None:
    with pytest.raises(EncodeError, match="cannot send a builtin_function_or_method back"):
        encode({"f": len})
    with pytest.raises(EncodeError, match="cannot send a function back"):
        encode(lambda: None)
    with pytest.raises(EncodeError, match=r"cannot send a MyList \(a subclass of list\).*unsafe_pickle"):
        encode([type("MyList", (list,), {})()])
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(EncodeError, match="reference cycle"):
        encode(cycle)
    nested = Plain("outer")
    nested.children = [len]  # type: ignore[list-item]
    with pytest.raises(EncodeError, match="inside: Plain > list"):
        encode(nested)


def test_pickles_are_refused_unless_the_caller_opted_in() -> None:
    doc, buffers = encode({"f": len}, allow_pickle=True)
    with pytest.raises(UnsafePayloadError, match="unsafe_pickle=True"):
        decode(doc, buffers)
    doc, buffers = encode({"when": Color}, allow_pickle=True)
    with pytest.raises(UnsafePayloadError, match="allow-list"):
        decode(doc, buffers, allow_pickle=True)
    doc, buffers = encode({"p": Point(1, 2), "q": collections.ChainMap({"a": 1})}, allow_pickle=True)
    assert decode(doc, buffers, allowed=[Point, collections.ChainMap], allow_pickle=True)["q"]["a"] == 1


# -- limits ------------------------------------------------------------------------------------

LIMIT_CASES = [
    ("max_bytes", {"max_bytes": 100}, json.dumps("x" * 200)),
    ("max_depth", {"max_depth": 5}, "[" * 6 + "]" * 6),
    ("max_items", {"max_items": 10}, json.dumps(list(range(20)))),
    ("max_str_length", {"max_str_length": 10}, json.dumps(["a" * 11])),
    ("max_bytes_length", {"max_bytes_length": 10}, json.dumps({"$": "bytes", "v": "eHh4" * 10})),
    ("max_int_digits", {"max_int_digits": 50}, "1" * 51),
    ("max_int_digits", {"max_int_digits": 50}, json.dumps({"$": "decimal", "v": "1" * 51})),
    ("max_exponent", {"max_exponent": 100}, json.dumps({"$": "decimal", "v": "1E+101"})),
]


@pytest.mark.parametrize(("limit", "settings_", "doc"), LIMIT_CASES, ids=[case[0] for case in LIMIT_CASES])
def test_every_limit_refuses_with_an_error_naming_it(limit: str, settings_: dict[str, int], doc: str) -> None:
    limits = DecodeLimits(**settings_)
    with pytest.raises(ResultLimitError, match=f"{limit}={settings_[limit]}") as info:
        decode(doc.encode(), limits=limits)
    assert (info.value.limit, info.value.value) == (limit, settings_[limit])
    assert isinstance(info.value, UnsafePayloadError)
    decode(doc.encode(), limits=DecodeLimits())


def test_limits_have_documented_defaults_and_refuse_nonsense() -> None:
    assert DecodeLimits() == DecodeLimits(
        max_bytes=64 * 2**20, max_depth=100, max_items=1_000_000, max_str_length=32 * 2**20,
        max_bytes_length=32 * 2**20, max_int_digits=4300, max_exponent=4300,
    )
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ConfigError, match="max_depth"):
            DecodeLimits(max_depth=bad)  # type: ignore[arg-type]


def test_out_of_band_buffers_count_against_the_limits() -> None:
    doc, buffers = encode({"blob": "x" * 100_000})
    with pytest.raises(ResultLimitError, match="max_bytes"):
        decode(doc, buffers, limits=DecodeLimits(max_bytes=50_000))
    with pytest.raises(ResultLimitError, match="max_str_length"):
        decode(doc, buffers, limits=DecodeLimits(max_str_length=50_000))


# -- hostile corpus ----------------------------------------------------------------------------

def obj(cls: str, **fields: Any) -> dict[str, Any]:
    return {"$": "obj", "c": cls, "v": fields}


HERE = __name__
HOSTILE = {
    "method shadowed on an instance": obj(f"{HERE}:AgentState", name="x", is_admin=True),
    "class swapped through __class__": obj(f"{HERE}:AgentState", __class__="x"),
    "instance dict replaced": obj(f"{HERE}:AgentState", __dict__={"is_admin": True}),
    "class attribute through __init__": obj(f"{HERE}:Plain", __init__=1),
    "a Fraction's class changed": obj("fractions:Fraction", _numerator=2, __class__=1),
    "Counter.most_common replaced": obj("collections:Counter", most_common="str"),
    "a class that is not allowed": obj("os:_wrap_close", name="x"),
    "a module named as a class": obj("os", name="x"),
    "a builtin as a class": obj("builtins:eval", name="x"),
    "an enum member that does not exist": {"$": "enum", "c": f"{HERE}:Color", "v": "_value2member_map_"},
    "an enum lookup on a plain class": {"$": "enum", "c": f"{HERE}:Plain", "v": "__init__"},
    "a named tuple of the wrong size": {"$": "ntuple", "c": f"{HERE}:Pair", "v": [1]},
    "a named tuple on a plain class": {"$": "ntuple", "c": f"{HERE}:Plain", "v": []},
    "a slotted class given a __dict__": obj(f"{HERE}:Point", x=1, y=2, extra=3),
    "pydantic data that does not validate": obj(f"{HERE}:Memory", facts=5),
    "a defaultdict with a callable factory": {"$": "defaultdict", "f": "eval", "v": []},
    "an unknown tag": {"$": "reduce", "v": ["os:system", "id"]},
    "a tag with extra keys": {"$": "tuple", "v": [], "c": "os:system"},
    "a buffer that does not exist": {"$": "bytes", "b": 3},
    "an unhashable set item": {"$": "set", "v": [[1]]},
    "a Fraction with a zero denominator": {"$": "fraction", "v": [1, 0]},
    "a Fraction from text": {"$": "fraction", "v": "1e999999999"},
    "a Decimal with a huge exponent": {"$": "decimal", "v": "1E+999999999"},
    "a Decimal that is not a number": {"$": "decimal", "v": "1.2.3"},
    "a datetime that is not ISO": {"$": "datetime", "v": "yesterday"},
    "a timedelta out of range": {"$": "timedelta", "v": [10**11, 0, 0]},
    "a UUID in the wrong form": {"$": "uuid", "v": "not-a-uuid"},
    "a float tag with a number": {"$": "float", "v": "1e999"},
    "a complex number of strings": {"$": "complex", "v": ["1", "2"]},
    "a pickle without opting in": {"$": "pickle", "v": "gASVAAAAAAAAAAAu"},
    "hash collisions in a set": {"$": "set", "v": [k * (2**61 - 1) for k in range(1, 2 * MAX_SAME_HASH)]},
    "hash collisions in dict keys": {"$": "dict", "v": [[k * (2**61 - 1), k] for k in range(1, 2 * MAX_SAME_HASH)]},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_documents_are_refused_and_change_nothing(name: str) -> None:
    probe = AgentState()
    with pytest.raises(UnsafePayloadError):
        decode(json.dumps({"r": HOSTILE[name]}).encode(), allowed=[*ALLOWED, fractions.Fraction, collections.Counter])
    assert probe.is_admin() is False
    assert fractions.Fraction(1) != fractions.Fraction(2)
    assert collections.Counter("aab").most_common(1) == [("a", 2)]


def test_allowed_standard_classes_are_rebuilt_without_changing_them() -> None:
    doc = json.dumps(obj("fractions:Fraction", _numerator=2, _denominator=1)).encode()
    rebuilt = decode(doc, allowed=[fractions.Fraction])
    assert type(rebuilt) is fractions.Fraction and rebuilt == 2
    assert fractions.Fraction(1) != fractions.Fraction(2)


BOMBS = {
    "deep nesting": b"[" * 200_000 + b"]" * 200_000,
    "deep unclosed nesting": b"[" * 200_000,
    "deep objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "a huge integer": b"9" * 1_000_000,
    "many huge floats": b"[" + b",".join([b"1" * 4000 + b".5e1"] * 200) + b"]",
    "a million items": b"[" + b"0," * 1_000_000 + b"0]",
    "a Decimal with a huge exponent": json.dumps({"$": "decimal", "v": "9e9999999999"}).encode(),
    "a Fraction of huge integers": json.dumps({"$": "fraction", "v": [10**4000, 7]}).encode().replace(b"7]", b"7" * 5000 + b"]"),
    "unterminated strings": b'["' + b'\\"' * 500_000,
    "a string of escapes": b'"' + b"\\u0000" * 1_000_000 + b'"',
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_decode_bombs_are_refused_with_bounded_memory(name: str) -> None:
    doc = BOMBS[name]
    tracemalloc.start()
    try:
        try:
            decode(doc, limits=DecodeLimits(max_str_length=100_000))
        except UnsafePayloadError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 64 * len(doc) + 1_000_000, f"{name}: {peak} bytes allocated for {len(doc)} bytes of input"


def test_items_are_counted_before_anything_is_built() -> None:
    doc = b"[" + b"[]," * 400_000 + b"[]]"
    tracemalloc.start()
    try:
        with pytest.raises(ResultLimitError, match="max_items"):
            decode(doc, limits=DecodeLimits(max_items=1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(doc)


# -- fuzzing -----------------------------------------------------------------------------------

FUZZ = settings(max_examples=examples(300), deadline=5000, suppress_health_check=[HealthCheck.too_slow])
TAGS = ["tuple", "set", "frozenset", "dict", "odict", "counter", "defaultdict", "deque", "bytes", "bytearray",
        "str", "float", "complex", "decimal", "fraction", "datetime", "date", "time", "timedelta", "uuid", "path",
        "enum", "ntuple", "obj", "pickle", "nope"]
CLASS_NAMES = [f"{HERE}:{cls.__qualname__}" for cls in ALLOWED] + ["fractions:Fraction", "os:system", "x"]

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)


def tagged(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    field = st.sampled_from(["v", "b", "c", "f", "m", "$", "__dict__", "__class__", "is_admin", "name"])
    return st.builds(
        lambda tag, extra: {"$": tag, **extra},
        st.sampled_from(TAGS),
        st.dictionaries(field, children | st.sampled_from(CLASS_NAMES), max_size=3),
    )


json_trees = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5)
    | tagged(children),
    max_leaves=40,
)


@FUZZ
@given(st.binary(max_size=2000))
def test_fuzz_arbitrary_bytes_raise_only_documented_errors(data: bytes) -> None:
    try:
        decode(data, [b"x" * 10], allowed=ALLOWED)
    except UnsafePayloadError:
        pass


@FUZZ
@given(json_trees, st.lists(st.binary(max_size=50), max_size=3))
def test_fuzz_well_formed_hostile_documents_raise_only_documented_errors(tree: Any, buffers: list[bytes]) -> None:
    try:
        doc = json.dumps(tree).encode()
    except ValueError:
        return
    try:
        decode(doc, buffers, allowed=[*ALLOWED, fractions.Fraction])
    except UnsafePayloadError:
        pass


@FUZZ
@given(json_trees, st.integers(min_value=0, max_value=10_000), st.binary(min_size=1, max_size=3))
def test_fuzz_damaged_documents_raise_only_documented_errors(tree: Any, where: int, junk: bytes) -> None:
    doc, buffers = encode(tree, out_of_band=8)
    cut = where % (len(doc) + 1)
    for damaged in (doc[:cut], doc[:cut] + junk + doc[cut:], doc[:cut] + doc[cut + 1 :]):
        try:
            decode(damaged, buffers, allowed=ALLOWED)
        except UnsafePayloadError:
            pass


JSON_BITS = '[]{}",:\\0123456789eE.-+ tfnu$'
FRAGMENTS = ['"', "\\", '\\"', "[", "]", "{", "}", '{"a":', '{"$":"set","v":', ",", ":", "9" * 60, "1e", "."]
snippets = st.lists(st.sampled_from(FRAGMENTS) | st.text(JSON_BITS, max_size=3), min_size=1, max_size=4).map("".join)


@settings(max_examples=examples(150), deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(snippets.filter(bool), st.text(JSON_BITS, max_size=4))
def test_fuzz_long_repetitive_documents_decode_in_bounded_time(snippet: str, head: str) -> None:
    """Quadratic work shows on long inputs: 200 kB of a repeated snippet must not take long.

    The deadline (20 s, against a few milliseconds in practice) bounds the time per input;
    it is not a performance measure.
    """
    doc = (head + snippet * (200_000 // len(snippet))).encode()
    try:
        decode(doc)
    except UnsafePayloadError:
        pass


def outcome(doc: bytes, limits: DecodeLimits) -> str | None:
    """What :func:`measure` says of ``doc``: None, or the limit it names, or "malformed"."""
    try:
        measure(doc, 0, limits)
    except ResultLimitError as exc:
        return exc.limit
    except UnsafePayloadError:
        return "malformed"
    return None


@FUZZ
@given(snippets, st.integers(min_value=2, max_value=9), st.integers(min_value=1, max_value=12))
def test_fuzz_the_measure_does_not_depend_on_where_its_windows_fall(snippet: str, window: int, limit: int) -> None:
    """The document is measured a window at a time; an escape, string or number across a window's edge counts as one.

    (Which limit a document over several of them names first may depend on the windows.)
    """
    doc = (snippet * (40 // max(len(snippet), 1) + 1)).encode()
    limits = DecodeLimits(max_str_length=limit, max_int_digits=limit, max_depth=limit, max_items=8 * limit)
    whole = outcome(doc, limits)
    with mock.patch.object(limits_module, "WINDOW", window):
        assert (outcome(doc, limits) is None) == (whole is None)


text_with_escapes = st.text(st.sampled_from('ab"\\/\n\x00\u00e9\u2028'), max_size=12)
documents = st.recursive(
    st.integers(min_value=-(10**12), max_value=10**12) | text_with_escapes,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text_with_escapes, children, max_size=3),
    max_leaves=12,
)


def longest(tree: Any, kind: str, depth: int = 1) -> int:
    """The longest string, the most digits or the deepest nesting in ``tree``."""
    inner = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else ()
    here = {"str": len(tree) if isinstance(tree, str) else 0, "digits": len(str(abs(tree))) if isinstance(tree, int) else 0,
            "depth": depth if isinstance(tree, (list, dict)) else 0}[kind]
    keys = [len(key) for key in tree] if isinstance(tree, dict) and kind == "str" else []
    return max([here, *keys, *(longest(child, kind, depth + 1) for child in inner)])


@FUZZ
@given(documents, st.integers(min_value=2, max_value=7))
def test_fuzz_every_limit_is_measured_exactly_on_what_the_parser_builds(tree: Any, window: int) -> None:
    """At its true value a limit passes; one below, it refuses, naming itself (small windows, so values cross them)."""
    doc = json.dumps(tree).encode()
    with mock.patch.object(limits_module, "WINDOW", window):
        for name, kind in (("max_str_length", "str"), ("max_int_digits", "digits"), ("max_depth", "depth")):
            value = longest(tree, kind)
            if value:
                assert outcome(doc, DecodeLimits(**{name: value})) is None
            if value > 1:
                assert outcome(doc, DecodeLimits(**{name: value - 1})) == name


@settings(max_examples=examples(40), deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(snippets.filter(bool))
def test_fuzz_measuring_takes_a_few_windows_of_memory_whatever_the_input(snippet: str) -> None:
    """Memory, not only time: measuring 1 MiB of any repeated snippet allocates a bounded amount, not a share of the input.

    (A string of escapes once cost 70 times its size: the regular expression that blanked strings
    kept state for every escape.) Brackets are kept until the end, at most two per counted item.
    """
    doc = (snippet * (2**20 // len(snippet))).encode()
    limits = DecodeLimits(max_str_length=2**30, max_int_digits=2**30, max_depth=2**20, max_items=20_000)
    tracemalloc.start()
    try:
        outcome(doc, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 80 * WINDOW + 2 * limits.max_items, f"{peak} bytes to measure {len(doc)} bytes of {snippet!r}"


def test_a_string_of_escapes_is_measured_in_constant_memory() -> None:
    """The attack: a plain tool returns a dict whose key is 31 M escaped backslashes (62 MiB of JSON)."""
    doc = b'{"' + b"\\\\" * (31 * 2**20) + b'": 1}'
    tracemalloc.start()
    try:
        measure(doc, 0, DecodeLimits())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 80 * WINDOW, f"{peak} bytes to measure {len(doc)} bytes"
    with pytest.raises(ResultLimitError, match="max_str_length=1000"):
        measure(doc, 0, DecodeLimits(max_str_length=1000))


values = st.recursive(
    scalars | st.binary(max_size=20) | st.decimals(allow_nan=False) | st.fractions() | st.datetimes()
    | st.dates() | st.times() | st.timedeltas() | st.uuids() | st.complex_numbers(allow_nan=False)
    | st.sampled_from(list(Color)),
    lambda children: st.lists(children, max_size=4)
    | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=4)
    | st.frozensets(st.integers() | st.text(max_size=5), max_size=4)
    | st.builds(Note, st.text(max_size=5), st.sets(st.text(max_size=3), max_size=3))
    | st.builds(Pair, st.integers(), st.text(max_size=5)),
    max_leaves=30,
)


@FUZZ
@given(values, st.sampled_from([None, 4, 64 * 1024]))
def test_fuzz_values_round_trip(value: Any, out_of_band: int | None) -> None:
    assert round_trip(value, out_of_band=out_of_band) == value


def test_pickle_of_the_format_is_never_needed() -> None:
    """The decoder never imports pickle for data-only answers (a canary for accidental use)."""
    doc, buffers = encode({"a": [1, (2, 3)], "n": Note("x")})
    real_loads = pickle.loads
    try:
        pickle.loads = None  # type: ignore[assignment]
        assert decode(doc, buffers, allowed=ALLOWED)["n"] == Note("x")
    finally:
        pickle.loads = real_loads
