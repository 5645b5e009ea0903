"""The kernel-side modules run as ordinary code: file chunks, requests, environments, restoring."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from kernel_sandbox.execution.channel import Answer, parse_text_frame
from kernel_sandbox.execution.decode import decode
from kernel_sandbox.execution.limits import DecodeLimits
from kernel_sandbox.kernelside import source, toolhost
from kernel_sandbox.kernelside import workfiles as files


@pytest.fixture(autouse=True)
def fresh_helper_state() -> Iterator[None]:
    """Each test starts with no helper state, and leaves none (nothing restores into pytest later)."""
    sys.modules.pop("_kernel_sandbox_state", None)
    toolhost._state = toolhost._holder()
    yield
    sys.modules.pop("_kernel_sandbox_state", None)
    toolhost._state = toolhost._holder()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    toolhost._state.work = str(path)
    return path


def ask(request: dict[str, Any], buffers: list[bytes] = ()) -> Any:  # type: ignore[assignment]
    meta, parts = toolhost.handle({"marker": "m", **request}, list(buffers))
    doc, rest = Answer.first(meta, parts, DecodeLimits()).parts()
    return decode(doc, rest)


def call(func: Any, *, args: dict[str, Any] | None = None, state: Any = None, env: dict[str, str] | None = None) -> Any:
    payload = cloudpickle.dumps({"func": func, "source": None, "name": None, "args": args or {}, "env": env or {}})
    pickled_state = cloudpickle.dumps(state)
    described = {"length": len(pickled_state), "digest": "d", "keep": False}
    return ask({"op": "call", "length": len(payload), "state": described}, [payload, pickled_state])


def test_the_modules_are_read_as_text_for_the_kernel() -> None:
    assert "def handle(request, buffers):" in source("toolhost")
    assert source("dataformat").startswith('"""The data-only format')


def test_files_move_in_chunks_and_stay_inside(work: Path) -> None:
    assert files.write_chunk(str(work), "d/a.bin", 0, b"abc") == 3
    assert files.write_chunk(str(work), "d/a.bin", 3, memoryview(b"def")) == 6
    assert files.read_chunk(str(work), "d/a.bin", 2, 3) == (6, b"cde")
    assert files.write_chunk(str(work), "d/a.bin", 0, b"x") == 1
    assert files.read_chunk(str(work), "d/a.bin", 0, 4) == (1, b"x")
    os.symlink("/etc", work / "out")
    os.symlink(work / "d" / "a.bin", work / "in")
    for path in ("out/passwd", "../x", "out/new"):
        with pytest.raises(files.Refused):
            files.read_chunk(str(work), path, 0, 1)
        with pytest.raises(files.Refused):
            files.write_chunk(str(work), path, 0, b"x")
    with pytest.raises(OSError):
        files.write_chunk(str(work), "in", 0, b"x")
    assert files.listing(str(work), "d") == [["a.bin", "d/a.bin", 1, False]]
    assert list(files.snapshot(str(work))) == ["d/a.bin"]
    files.wipe(str(work))
    assert os.listdir(work) == []


def test_a_fifo_at_the_target_is_refused_at_once(work: Path) -> None:
    os.mkfifo(work / "pipe")
    with pytest.raises(files.Refused, match="not a regular file"):
        files.write_chunk(str(work), "pipe", 0, b"x")
    with pytest.raises(files.Refused, match="not a regular file"):
        files.read_chunk(str(work), "pipe", 0, 1)
    reader = threading.Thread(target=lambda: open(work / "pipe", "rb").close(), daemon=True)
    reader.start()
    while reader.is_alive():  # until a write found the reader there (its open then returns)
        with pytest.raises(files.Refused, match="not a regular file"):
            files.write_chunk(str(work), "pipe", 0, b"x")
        reader.join(timeout=0.01)


def test_requests_answer_and_never_raise(work: Path) -> None:
    assert ask({"op": "write", "path": "a.txt", "offset": 0}, [b"hi"]) == {"ok": 2}
    assert ask({"op": "read", "path": "a.txt", "offset": 0, "size": 10, "limit": 10}) == {"ok": [2, b"hi"]}
    assert "refused" in ask({"op": "read", "path": "../x", "offset": 0, "size": 1, "limit": 1})
    assert ask({"op": "nope"})["error"]["name"] == "KeyError"
    assert ask({"op": "call", "length": 5}, [b"short"]) == {toolhost.STATE_NOT_KEPT: True}
    assert "did not arrive intact" in ask({"op": "call", "length": 6}, [b"short"])["error"]["value"]
    described = {"length": 5, "digest": "d", "keep": True}
    assert ask({"op": "call", "length": 5, "state": described}, [b"short", b"state"])["error"]["name"] == "UnpicklingError"
    assert ask({"op": "call", "length": 5, "state": described}, [b"short"])["error"]["name"] == "UnpicklingError"


def test_tool_calls_return_value_state_and_every_exception() -> None:
    def remember(fact: str, agent_state: dict[str, Any]) -> int:
        agent_state.setdefault("facts", []).append(fact)
        return len(agent_state["facts"])

    assert call(remember, args={"fact": "x"}, state={}) == {"r": 1, "s": {"facts": ["x"]}}
    for exc in (ValueError("bad"), SystemExit(3), KeyboardInterrupt()):

        def fail(exc: BaseException = exc) -> None:
            raise exc

        assert call(fail)["error"]["name"] == type(exc).__name__
    assert call(lambda: len)["error"]["name"] == "EncodeError"


def test_the_environment_is_set_for_one_call_only() -> None:
    os.environ.pop("KS_SECRET", None)
    os.environ["KS_KEPT"] = "before"
    seen = call(lambda: (os.environ.get("KS_SECRET"), os.environ.get("KS_KEPT")),
                env={"KS_SECRET": "s3cret", "KS_KEPT": "during"})
    assert seen == {"r": ("s3cret", "during")}
    assert "KS_SECRET" not in os.environ and os.environ["KS_KEPT"] == "before"
    assert call(lambda: 1 / 0, env={"KS_SECRET": "x"})["error"]["name"] == "ZeroDivisionError"
    assert "KS_SECRET" not in os.environ
    assert ask({"op": "env", "action": "set"}, [json.dumps({"KS_SECRET": "run"}).encode()]) == {"ok": None}
    assert os.environ["KS_SECRET"] == "run"
    toolhost.install("m2", None, channel=False)
    assert "KS_SECRET" not in os.environ
    del os.environ["KS_KEPT"]


def test_what_a_tool_breaks_is_put_back(capsys: pytest.CaptureFixture[str]) -> None:
    info = toolhost.install("m", None, probe="x", channel=False)
    assert info["seen"] is False and info["version"] == toolhost.VERSION
    stdout, displayhook = sys.stdout, sys.displayhook

    def vandal() -> str:
        sys.stdout = None  # type: ignore[assignment]
        sys.displayhook = print
        return "done"

    assert call(vandal) == {"r": "done"}
    assert (sys.stdout, sys.displayhook) == (stdout, displayhook)
    assert toolhost.install("m3", None, probe="m", channel=False)["seen"] is True


def test_text_requests_answer_with_a_frame(work: Path) -> None:
    frame = toolhost.text_request(json.dumps({"op": "list", "path": ".", "marker": "abc"}))
    meta, parts = parse_text_frame(repr(frame), "abc")
    doc, rest = Answer.first(meta, parts, DecodeLimits()).parts()
    assert decode(doc, rest) == {"ok": []}
