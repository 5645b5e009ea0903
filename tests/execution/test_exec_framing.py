"""Result framing and path confinement, without a kernel."""

from __future__ import annotations

import secrets

import pytest

from kernel_sandbox.execution import Execution, FramingError, PathError
from kernel_sandbox.execution.files import confine
from kernel_sandbox.execution.tools import extract_frame, frame, parse_frame

WORK = "/home/sandbox/work"


def test_frame_round_trip() -> None:
    marker = secrets.token_hex(16)
    body = '{"func_return": {"json": "1"}}'
    assert parse_frame(frame(body, marker), marker) == body


def test_frame_with_another_marker_is_not_a_frame() -> None:
    assert parse_frame(frame("{}", secrets.token_hex(16)), secrets.token_hex(16)) is None


def test_tampered_frame_fails_its_digest() -> None:
    marker = secrets.token_hex(16)
    text = frame('{"a": 1}', marker).replace('"a": 1', '"a": 2')
    with pytest.raises(FramingError, match="digest"):
        parse_frame(text, marker)


def test_printed_frames_are_ignored_and_two_frames_are_refused() -> None:
    marker = secrets.token_hex(16)
    real = frame('{"ok": 1}', marker)
    printed = Execution(stdout=real, results=[{"text/plain": real}])
    assert extract_frame(printed, marker) == {"ok": 1}
    forged = Execution(results=[{"text/plain": frame('{"ok": 2}', marker)}, {"text/plain": real}])
    with pytest.raises(FramingError, match="tampered"):
        extract_frame(forged, marker)
    with pytest.raises(FramingError, match="no result frame"):
        extract_frame(Execution(stdout=real), marker)


@pytest.mark.parametrize(
    ("path", "expected"),
    [("a.txt", "a.txt"), ("./d/a.txt", "d/a.txt"), (f"{WORK}/d/x", "d/x"), (WORK, "."), (".", ".")],
)
def test_confine_accepts_paths_inside(path: str, expected: str) -> None:
    assert confine(path, WORK) == expected


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "/home/sandbox/workx/a", "a\x00b"])
def test_confine_refuses_paths_outside(path: str) -> None:
    with pytest.raises(PathError):
        confine(path, WORK)
