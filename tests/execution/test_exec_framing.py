"""Result framing and path confinement, without a kernel."""

from __future__ import annotations

import hashlib
import secrets

import pytest

from kernel_sandbox.execution import Execution, FramingError, PathError
from kernel_sandbox.execution.files import confine
from kernel_sandbox.execution.tools import ChannelFrames, extract_frame, frame, parse_frame

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


def _channel_msg(marker: str, data: bytes) -> tuple[dict, list[bytes]]:
    meta = {"marker": marker, "kinds": {"func_return": "json"}, "lengths": [len(data)],
            "sha256": [hashlib.sha256(data).hexdigest()]}
    return meta, [data]


def _channel_body(marker: str, *messages: tuple[dict, list[bytes]]) -> dict:
    frames = ChannelFrames(marker)
    for meta, buffers in messages:
        frames.add(meta, [memoryview(buffer) for buffer in buffers])
    return frames.body()


def test_channel_frames_check_marker_count_length_and_digest() -> None:
    marker = secrets.token_hex(16)
    real = _channel_msg(marker, b'"ok"')
    assert _channel_body(marker, _channel_msg(secrets.token_hex(16), b"1"), real) == {"func_return": {"json": "ok"}}
    with pytest.raises(FramingError, match="tampered"):
        _channel_body(marker, real, _channel_msg(marker, b'"forged"'))
    with pytest.raises(FramingError, match="no result frame"):
        _channel_body(marker)
    with pytest.raises(FramingError, match="digest"):
        _channel_body(marker, (real[0], [b'"no"']))
    with pytest.raises(FramingError, match="describe"):
        _channel_body(marker, (real[0], []))


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
