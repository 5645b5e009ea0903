"""The execd stream parser: wire formats, junk, and the mapping of every event type."""

from __future__ import annotations

import json

from kernel_sandbox.opensandbox import ExecdRun, ExecdError, parse_event, parse_line, parse_lines


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
        execution_count=7,
        error=ExecdError("ValueError", "bad", ["Traceback"]),
        context_id="ctx-1",
    )
    assert execution.error is not None
    assert execution.error.as_dict() == {"name": "ValueError", "value": "bad", "traceback": ["Traceback"]}


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
    assert parse_lines([sse({"code": "BadRequest", "message": "nope"})]).error == ExecdError(
        "BadRequest", "nope", []
    )
    assert parse_lines([sse({"type": "error", "name": "RuntimeError", "text": "boom"})]).error == ExecdError(
        "RuntimeError", "boom", []
    )


def test_error_empty_strings_are_kept_not_replaced() -> None:
    event = {
        "type": "error",
        "error": {"ename": "", "name": "Fallback", "evalue": "", "value": "fallback", "traceback": []},
    }
    assert parse_lines([sse(event)]).error == ExecdError("", "", [])


def test_first_error_wins() -> None:
    lines = [
        sse({"code": "BadRequest", "message": "nope"}),
        sse({"type": "error", "name": "RuntimeError", "text": "boom"}),
    ]
    assert parse_lines(lines).error == ExecdError("BadRequest", "nope", [])


def test_events_without_a_type_or_payload_are_ignored() -> None:
    assert parse_event(sse({"text": "no type"})) is None
    event = parse_event(sse({"type": "status", "text": "busy"}))
    assert event is not None and event.type == "status" and event.text == "busy"


def test_display_data_is_kept_apart_from_results() -> None:
    event = parse_event(sse({"type": "display_data", "data": {"image/png": "iVBOR", "text": "<Figure>"}}))
    assert event is not None and event.type == "display_data"
    assert event.data == {"image/png": "iVBOR", "text/plain": "<Figure>"}
