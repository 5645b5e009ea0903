"""The answer channel's checks and path confinement, without a kernel."""

from __future__ import annotations

import secrets

import pytest

from kernel_sandbox.execution import DecodeLimits, FramingError, PathError, ResultLimitError
from kernel_sandbox.execution.channel import CHUNK, Answer, parse_text_frame
from kernel_sandbox.execution.decode import decode
from kernel_sandbox.execution.files import chunks, confine
from kernel_sandbox.kernelside import textframe, toolhost

WORK = "/home/sandbox/work"


def test_text_frame_round_trip_and_tampering() -> None:
    marker = secrets.token_hex(16)
    meta, buffers = toolhost.answer(marker, {"ok": b"x" * 100_000})
    text = repr(textframe.frame(marker, meta, buffers))
    parsed_meta, parsed = parse_text_frame(text, marker)
    doc, parts = Answer.first(parsed_meta, parsed, DecodeLimits()).parts()
    assert decode(doc, parts) == {"ok": b"x" * 100_000}
    assert parse_text_frame(text, secrets.token_hex(16)) is None
    with pytest.raises(FramingError, match="digest"):
        parse_text_frame(text.replace('"lengths"', '"lengthz"'), marker)


def test_answer_parts_must_match_their_declared_lengths() -> None:
    marker = secrets.token_hex(16)
    meta, buffers = toolhost.answer(marker, {"r": "y" * 200_000})
    assert len(buffers) == 2
    with pytest.raises(FramingError, match="declared lengths"):
        Answer.first(meta, buffers[:1], DecodeLimits())
    with pytest.raises(FramingError, match="declared lengths"):
        Answer.first(meta, [buffers[0], buffers[1][:-1]], DecodeLimits())
    with pytest.raises(FramingError, match="describe"):
        Answer.first({"marker": marker, "lengths": "many"}, buffers, DecodeLimits())


def test_a_large_answer_is_pulled_in_chunks_and_checked() -> None:
    marker = secrets.token_hex(16)
    value = bytes(range(256)) * (3 * CHUNK // 256)
    meta, buffers = toolhost.answer(marker, {"r": value})
    assert meta["pull"] and [len(b) for b in buffers] == [CHUNK]
    answer = Answer.first(meta, buffers, DecodeLimits())
    while answer.missing:
        pulled_meta, pulled = toolhost.handle({"op": "pull", "marker": "m", "of": marker, "offset": answer.received}, [])
        assert pulled_meta["raw"]
        answer.add(pulled[0])
    doc, parts = answer.parts()
    assert decode(doc, parts) == {"r": value}
    with pytest.raises(FramingError, match="expected size"):
        Answer.first(meta, buffers, DecodeLimits()).add(b"short")


def test_an_answer_over_the_size_limit_is_refused_before_it_is_pulled() -> None:
    marker = secrets.token_hex(16)
    meta, buffers = toolhost.answer(marker, {"r": b"z" * (CHUNK + 1)})
    with pytest.raises(ResultLimitError, match="max_bytes=1048576") as info:
        Answer.first(meta, buffers, DecodeLimits(max_bytes=1024 * 1024))
    assert info.value.limit == "max_bytes"


def test_upload_content_is_cut_into_chunks(tmp_path) -> None:
    data = bytes(range(256)) * 1000
    assert b"".join(chunks(data, 4096)) == data and all(len(c) <= 4096 for c in chunks(data, 4096))
    assert [bytes(c) for c in chunks(b"", 10)] == [b""]
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert b"".join(chunks(path, 1000)) == data
    with open(path, "rb") as handle:
        assert b"".join(chunks(handle, 999)) == data
    assert b"".join(chunks("héllo", 2)) == "héllo".encode()
    with pytest.raises(TypeError, match="upload content"):
        list(chunks(42, 10))  # type: ignore[arg-type]


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
