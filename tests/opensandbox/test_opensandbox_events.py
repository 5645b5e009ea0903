"""The execd stream parser: wire formats, junk, and the mapping of every event type."""

from __future__ import annotations

import json

from kernel_sandbox.opensandbox.events import ExecdRun, RunCollector, parse_event, parse_line, parse_lines
from kernel_sandbox.results import ExecutionError


def bare(event: object) -> list[str]:
    """An event as the real execd writes it: a JSON object, then a blank line."""
    return [json.dumps(event), ""]


def sse(event: object) -> str:
    return f"data: {json.dumps(event)}"


def test_bare_json_and_sse_lines_are_both_accepted() -> None:
    lines = [*bare({"type": "stdout", "text": "a\n"}), sse({"type": "stdout", "text": "b\n"})]
    assert parse_lines(lines).stdout == "a\nb\n"


def test_junk_and_control_lines_are_skipped() -> None:
    lines = [
        "event: message",
        "id: 7",
        "retry: 100",
        ": comment",
        "not-json",
        "",
        "data:",
        "data: ",
        sse(["a list"]),
        "42",
        sse({"type": "stdout", "text": "ok\n"}),
    ]
    execution = parse_lines(lines)
    assert execution.stdout == "ok\n"
    assert execution.error is None
    assert parse_line(b'{"type": "ping"}') == {"type": "ping"}


def test_output_results_count_and_error_are_mapped() -> None:
    lines = [
        *bare({"type": "init", "text": "ctx-1"}),
        *bare({"type": "ping", "text": "pong"}),
        *bare({"type": "stdout", "text": "hello\n"}),
        *bare({"type": "stderr", "text": "warn\n"}),
        *bare({"type": "execution_count", "execution_count": 7}),
        *bare({"type": "result", "results": {"text": "4", "text/html": "<b>4</b>"}}),
        *bare({"type": "error", "error": {"ename": "ValueError", "evalue": "bad", "traceback": ["Traceback"]}}),
        *bare({"type": "execution_complete", "execution_time": 3}),
    ]
    execution = parse_lines(lines)
    assert execution == ExecdRun(
        stdout="hello\n",
        stderr="warn\n",
        results=[{"text/plain": "4", "text/html": "<b>4</b>"}],
        main_result={"text/plain": "4", "text/html": "<b>4</b>"},
        execution_count=7,
        error=ExecutionError("ValueError", "bad", "Traceback"),
        context_id="ctx-1",
    )
    assert execution.error is not None and execution.text == "4"
    assert execution.complete and repr(execution).startswith("ExecdRun(stdout='hello\\n', stderr='warn\\n'")


def test_text_plain_is_kept_when_present_and_flat_bundles_are_read() -> None:
    assert parse_lines([sse({"type": "result", "results": {"text/plain": "4"}})]).results == [{"text/plain": "4"}]
    assert parse_lines([sse({"type": "result", "text/plain": "5", "timestamp": 1})]).results == [{"text/plain": "5"}]


def test_execution_count_as_string_and_bad_values() -> None:
    assert parse_lines([sse({"type": "execution_count", "execution_count": "8"})]).execution_count == 8
    for bad in ("nope", None, True, [1]):
        assert parse_event(sse({"type": "execution_count", "execution_count": bad})) is None
    execution = parse_lines(
        [
            sse({"type": "execution_count", "execution_count": 3}),
            sse({"type": "execution_count", "execution_count": "x"}),
        ]
    )
    assert execution.execution_count == 3


def test_error_fallback_shapes() -> None:
    assert parse_lines([sse({"code": "BadRequest", "message": "nope"})]).error == ExecutionError("BadRequest", "nope", "")
    assert parse_lines([sse({"type": "error", "name": "RuntimeError", "text": "boom"})]).error == ExecutionError(
        "RuntimeError", "boom", ""
    )


def test_error_empty_strings_are_kept_not_replaced() -> None:
    event = {
        "type": "error",
        "error": {"ename": "", "name": "Fallback", "evalue": "", "value": "fallback", "traceback": []},
    }
    assert parse_lines([sse(event)]).error == ExecutionError("", "", "")


def test_first_error_wins() -> None:
    lines = [
        sse({"code": "BadRequest", "message": "nope"}),
        sse({"type": "error", "name": "RuntimeError", "text": "boom"}),
    ]
    assert parse_lines(lines).error == ExecutionError("BadRequest", "nope", "")


def test_events_without_a_type_or_payload_are_ignored() -> None:
    assert parse_event(sse({"text": "no type"})) is None
    event = parse_event(sse({"type": "status", "text": "busy"}))
    assert event is not None and event.type == "status" and event.text == "busy"


def test_display_data_is_kept_apart_from_results() -> None:
    event = parse_event(sse({"type": "display_data", "data": {"image/png": "iVBOR", "text": "<Figure>"}}))
    assert event is not None and event.type == "display_data"
    assert event.data == {"image/png": "iVBOR", "text/plain": "<Figure>"}


# ---- hostile input: the parser never raises, hangs or lets unserialisable text through ---------

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from support.security_figures import examples  # noqa: E402

from kernel_sandbox.opensandbox.events import (  # noqa: E402
    MAX_TRACEBACK_CHARS,
    Event,
    LineSplitter,
    cap_traceback,
    clean_bundle,
    clean_text,
)


def serialisable(value: object) -> None:
    """What jupyter_client's session does with a message: JSON, then UTF-8."""
    json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def test_deep_nesting_is_junk_not_a_recursion_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert parse_line(deep) is None
    assert parse_event('{"type": "stdout", "text": ' + deep + "}") is None
    nested_dict = '{"a":' * 100_000 + "1" + "}" * 100_000
    assert parse_event(nested_dict) is None


def test_lone_surrogates_and_nuls_are_replaced_in_text_keys_and_errors() -> None:
    line = json.dumps({"type": "stdout", "text": "a\ud800b\x00c"})
    event = parse_event(line)
    assert event is not None and event.text == "a\ufffdb\ufffdc"
    result = parse_event(json.dumps({"type": "result", "results": {"text/\udc00x": "v\ud800", "text": "t\x00"}}))
    assert result is not None and result.data == {"text/\ufffdx": "v\ufffd", "text/plain": "t\ufffd"}
    error = parse_event(
        json.dumps({"type": "error", "error": {"ename": "E\ud800", "evalue": "\x00", "traceback": ["\udfff"]}})
    )
    assert error is not None and error.error == ExecutionError("E\ufffd", "\ufffd", "\ufffd")
    for item in (event.text, result.data, vars(error.error)):
        serialisable(item)


def test_non_string_mime_values_are_kept_only_for_json_types() -> None:
    bundle = clean_bundle(
        {
            "text/plain": 42,
            "image/png": {"not": "base64"},
            "application/json": {"a": [1, "x\ud800"]},
            "application/vnd.custom+json": [None, True],
            "application/vdom.v1+json": json.loads("[" * 40 + "]" * 40),
        }
    )
    assert bundle == {"application/json": {"a": [1, "x\ufffd"]}, "application/vnd.custom+json": [None, True]}


def test_tracebacks_are_capped_keeping_the_end() -> None:
    lines = [f"line {i} " + "x" * 1000 for i in range(1000)]
    event = parse_event(
        json.dumps({"type": "error", "error": {"ename": "E", "evalue": "v" * 100_000, "traceback": lines}})
    )
    assert event is not None and event.error is not None
    kept = event.error.traceback.split("\n")
    assert sum(map(len, kept)) <= MAX_TRACEBACK_CHARS
    assert kept[-1] == lines[-1] and "earlier traceback line(s) cut" in kept[0]
    assert len(event.error.value) < 9000 and event.error.value.endswith("characters cut]")


def test_the_traceback_cap_counts_lines_and_bytes_not_only_characters() -> None:
    """7.8 M empty lines are 0 characters and 31 MB of JSON; lines of 'é' are twice their characters in UTF-8."""
    for lines in ([""] * 7_800_000, ["\u00e9" * 1000] * 200):
        kept = cap_traceback(lines)
        assert len(json.dumps(kept, ensure_ascii=False).encode()) <= MAX_TRACEBACK_CHARS + 2
        assert kept[-1] == lines[-1] and "earlier traceback line(s) cut" in kept[0]
    assert cap_traceback(["a"] * 100) == ["a"] * 100


def test_events_after_the_terminal_one_change_nothing() -> None:
    lines = [
        sse({"type": "stdout", "text": "a"}),
        sse({"type": "execution_complete"}),
        sse({"type": "stdout", "text": "late"}),
        sse({"type": "error", "error": {"ename": "Late", "evalue": ""}}),
    ]
    execution = parse_lines(lines)
    assert execution.complete and execution.stdout == "a" and execution.error is None


def test_accumulation_is_linear() -> None:
    """80 000 one-character events used to take 40 s (string concatenation per event)."""
    collector = RunCollector()
    event = Event(type="stdout", text="x")
    for _ in range(200_000):
        collector.add(event)
    assert len(collector._fold._out) == 200_000, "every event must be kept as a chunk, not concatenated"
    assert collector.result().stdout == "x" * 200_000
    assert len(collector._fold._out) == 1, "the chunks are joined once, at the end"


def test_line_splitter_handles_any_chunking() -> None:
    data = b'{"type": "stdout", "text": "a"}\n\n{"type": "ping"}\nlast'
    for size in (1, 2, 3, 7, len(data)):
        splitter = LineSplitter()
        lines: list[bytes] = []
        for start in range(0, len(data), size):
            lines += splitter.feed(data[start : start + size])
        assert lines + [splitter.rest()] == data.split(b"\n")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
event_types = st.sampled_from(
    [
        "stdout",
        "stderr",
        "result",
        "display_data",
        "error",
        "execution_count",
        "init",
        "ping",
        "status",
        "execution_complete",
    ]
) | st.text(max_size=10)
events_st = st.fixed_dictionaries(
    {"type": event_types},
    optional={
        "text": json_values,
        "results": json_values | st.dictionaries(st.text(max_size=20), json_values, max_size=4),
        "error": json_values
        | st.fixed_dictionaries({}, optional={"ename": json_values, "evalue": json_values, "traceback": json_values}),
        "execution_count": json_values,
        "code": json_values,
        "message": json_values,
    },
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(events_st, max_size=8), st.lists(st.binary(max_size=40), max_size=4), st.integers(1, 64))
def test_fuzz_the_stream_parser(items: list[dict], junk: list[bytes], chunk: int) -> None:
    """Any mix of events and junk, cut anywhere: parsing never raises, output is serialisable."""
    raw = b"".join(json.dumps(item).encode() + b"\n\n" for item in items) + b"\n".join(junk)
    splitter = LineSplitter()
    collector = RunCollector()
    parsed: list[Event] = []
    for start in range(0, len(raw), chunk):
        for line in splitter.feed(raw[start : start + chunk]):
            event = parse_event(line)
            if event is not None:
                parsed.append(event)
                collector.add(event)
    tail = parse_event(splitter.rest())
    if tail is not None:
        collector.add(tail)
    run = collector.result()
    for event in parsed:
        serialisable(
            {
                "type": event.type,
                "text": event.text,
                "data": event.data,
                "count": event.execution_count,
                "error": vars(event.error) if event.error else None,
            }
        )
    serialisable({"out": run.stdout, "err": run.stderr, "results": run.results})


@settings(max_examples=examples(200), deadline=None)
@given(st.text())
def test_fuzz_clean_text(text: str) -> None:
    cleaned = clean_text(text)
    assert len(cleaned) == len(text) and "\x00" not in cleaned
    cleaned.encode("utf-8")


@pytest.mark.parametrize("line", [b"\xff\xfe{", b'data: {"type": "stdout", "text": "\\ud800"}', b"\x00" * 100])
def test_byte_garbage_is_skipped_or_cleaned(line: bytes) -> None:
    event = parse_event(line)
    if event is not None:
        serialisable(event.text)
