"""The host side of a sleep through cells (:mod:`kernel_sandbox.launch.cellblobs`), against a kernel
that lies: every chunk it answers is checked against what it stated before a byte is kept; its frames are
found among whatever else it printed, and one that does not check is refused."""

from __future__ import annotations

import asyncio
import io
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from kernel_sandbox.errors import CheckpointError, OpenSandboxAPIError
from kernel_sandbox.kernelside import textframe
from kernel_sandbox.launch.cellblobs import CHUNK, MODULES, CellChannel, install_cell
from kernel_sandbox.opensandbox.link import _unsupported


def channel(answers: list[tuple[dict[str, Any], list[bytes]]], calls: list[tuple[Any, ...]]) -> CellChannel:
    made = CellChannel("image:1")

    async def call(function: str, *args: Any) -> tuple[dict[str, Any], list[bytes]]:
        calls.append((function, *args))
        return answers.pop(0)

    made.call = call
    return made


def pull(answers: list[tuple[dict[str, Any], list[bytes]]], max_bytes: int = 10 * CHUNK) -> bytes:
    got = bytearray()
    size = asyncio.run(channel(answers, []).pull("/ignored", max_bytes, got.extend))
    assert size == len(got)
    return bytes(got)


def test_a_blob_comes_in_chunks_as_stated() -> None:
    data = bytes(range(256)) * (CHUNK // 128)  # two chunks
    answers = [({"size": len(data)}, [data[:CHUNK]]), ({"size": len(data)}, [data[CHUNK:]])]
    assert pull(answers) == data
    assert pull([({"size": 0}, [b""])]) == b""


@pytest.mark.parametrize(
    ("answers", "why"),
    [
        ([({"size": 10}, [b"x" * (CHUNK + 1)])], "malformed"),  # a chunk over the chunk size
        ([({"size": 10}, [b"x" * 11])], "malformed"),  # more than it stated
        ([({"size": 20}, [b"x" * 10]), ({"size": 30}, [b"x" * 10])], "changed"),  # the size moves
        ([({"size": 20 * CHUNK}, [b"x"])], "over the"),  # over the cap
        ([({"size": 10}, [b""])], "malformed"),  # no progress: never loops
        ([({"size": "10"}, [b"x"])], "malformed"),
        ([({"size": -1}, [b"x"])], "malformed"),
        ([({"size": 10}, [b"x", b"y"])], "malformed"),
    ],
)
def test_a_kernel_that_lies_about_its_blob_is_refused(answers: list[Any], why: str) -> None:
    with pytest.raises(CheckpointError, match=why):
        pull(answers)


def test_a_blob_goes_back_in_chunks() -> None:
    calls: list[tuple[Any, ...]] = []
    data = b"y" * (CHUNK + 5)
    asyncio.run(channel([({}, [])] * 2, calls).push("/ignored", io.BytesIO(data), len(data)))
    assert [(call[0], call[1]) for call in calls] == [("sleep_write", 0), ("sleep_write", CHUNK)]
    calls.clear()
    asyncio.run(channel([({}, [])], calls).push("/ignored", io.BytesIO(b""), 0))
    assert calls == [("sleep_write", 0, "")], "an empty blob is written (made empty) once"
    with pytest.raises(CheckpointError, match="shorter"):
        asyncio.run(channel([({}, [])] * 2, []).push("/ignored", io.BytesIO(b"short"), 100))


def test_a_frame_is_found_among_other_output_and_checked() -> None:
    text = textframe.frame("m1", {"size": 3}, [b"abc"]).text
    assert textframe.parse(f"noise {text} more", "m1", anywhere=True) == ({"size": 3}, [b"abc"])
    assert textframe.parse(f"noise {text}", "other", anywhere=True) is None
    assert textframe.parse(text[:-5], "m1", anywhere=True) is None, "cut short (over the output cap)"
    forged = text.replace('"size": 3', '"size": 4')
    with pytest.raises(ValueError, match="length or digest"):
        textframe.parse(forged, "m1", anywhere=True)


def test_the_install_cell_installs_the_modules_and_leaves_no_name() -> None:
    names = [f"_kernel_sandbox_{module}" for module in MODULES]
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    namespace: dict[str, Any] = {}
    try:
        assert eval(install_cell(), namespace) is None
        assert [name for name in namespace if name != "__builtins__"] == []
        assert all(name in sys.modules for name in names)
        assert callable(sys.modules["_kernel_sandbox_magics"].sleep_save)
        planted = sys.modules["_kernel_sandbox_magics"]
        eval(install_cell(), namespace)
        assert sys.modules["_kernel_sandbox_magics"] is planted, "installed where missing only"
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


@pytest.mark.parametrize(
    ("status", "message", "unsupported"),
    [
        (400, "Pause is not supported for this sandbox type", True),
        (501, "Not Implemented", True),
        (400, "sandbox is not running", False),
        (409, "not supported", False),
    ],
)
def test_only_a_server_that_cannot_pause_turns_the_sleep_into_a_checkpoint(status: int, message: str, unsupported: bool) -> None:
    error = OpenSandboxAPIError(f"POST /sandboxes/s/pause answered {status} ({message})", response=SimpleNamespace(status_code=status))
    assert _unsupported(error) is unsupported
