"""execd events -> Jupyter messages (kernel_sandbox.opensandbox.translate), without any kernel."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.security_figures import examples

from kernel_sandbox.errors import OpenSandboxConnectionError, OpenSandboxError, OutputLimitExceeded
from kernel_sandbox.opensandbox.events import Event, parse_event
from kernel_sandbox.results import ExecutionError
from kernel_sandbox.opensandbox.translate import CellRelay, CellTranslator, relay_cell


class Published(list):
    def __call__(self, msg_type: str, content: dict[str, Any]) -> None:
        json.dumps(content).encode("utf-8")  # as the session would serialise it
        self.append((msg_type, content))

    def of(self, msg_type: str) -> list[dict[str, Any]]:
        return [content for kind, content in self if kind == msg_type]


def out(text: str, name: str = "stdout") -> Event:
    return Event(type=name, text=text)


COMPLETE = Event(type="execution_complete")


async def feed(*items: Event | BaseException) -> AsyncIterator[Event]:
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item


async def test_a_flood_of_tiny_events_becomes_few_messages_in_order() -> None:
    published = Published()
    translator = CellTranslator(published, execution_count=3, flush_bytes=4096)
    events = [out(str(i % 10)) for i in range(100_000)]
    reply = await relay_cell(feed(*events, COMPLETE), translator)
    streams = published.of("stream")
    assert "".join(s["text"] for s in streams) == "".join(e.text or "" for e in events)
    assert len(streams) <= 100_000 // 4096 + 50
    assert reply == {"status": "ok", "execution_count": 3, "payload": [], "user_expressions": {}}


async def test_held_text_is_published_while_the_cell_still_runs() -> None:
    """The source blocks until the test has seen the first output: only the time flush can deliver it."""
    published = Published()
    seen = asyncio.Event()

    def publish(msg_type: str, content: dict[str, Any]) -> None:
        published(msg_type, content)
        seen.set()

    async def source() -> AsyncIterator[Event]:
        yield out("first\n")
        await asyncio.wait_for(seen.wait(), 30)
        yield out("second\n")
        yield COMPLETE

    reply = await relay_cell(source(), CellTranslator(publish, execution_count=1, flush_interval=0.05))
    assert published.of("stream") == [{"name": "stdout", "text": "first\n"}, {"name": "stdout", "text": "second\n"}]
    assert reply["status"] == "ok"


async def test_kinds_keep_their_order() -> None:
    published = Published()
    result = Event(type="result", data={"text/plain": "42"})
    await relay_cell(
        feed(out("a"), out("b", "stderr"), out("c"), result, out("d"), COMPLETE),
        CellTranslator(published, execution_count=1),
    )
    assert [(k, c.get("name") or c.get("data")) for k, c in published] == [
        ("stream", "stdout"),
        ("stream", "stderr"),
        ("stream", "stdout"),
        ("execute_result", {"text/plain": "42"}),
        ("stream", "stdout"),
    ]


async def test_error_event_is_published_once_and_is_the_reply() -> None:
    published = Published()
    error = Event(type="error", error=ExecutionError("ZeroDivisionError", "division by zero", "tb1\ntb2"))
    reply = await relay_cell(
        feed(out("before"), error, out("late"), COMPLETE), CellTranslator(published, execution_count=2)
    )
    assert published.of("error") == [
        {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["tb1", "tb2"]}
    ]
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError" and reply["execution_count"] == 2
    assert [s["text"] for s in published.of("stream")] == ["before"]


@pytest.mark.parametrize(
    ("failure", "ename"),
    [
        (OpenSandboxConnectionError("POST x/code: the connection to execd dropped"), "OpenSandboxConnectionError"),
        (OutputLimitExceeded("execd output exceeded 10 bytes"), "OutputLimitExceeded"),
        (RecursionError("maximum recursion depth exceeded"), "SandboxError"),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), "SandboxError"),
        (TypeError("anything at all"), "SandboxError"),
    ],
)
async def test_every_failure_still_gives_exactly_one_reply(failure: BaseException, ename: str) -> None:
    published = Published()
    translator = CellTranslator(published, execution_count=1)
    reply = await relay_cell(feed(out("partial"), failure), translator)
    assert reply["status"] == "error" and reply["ename"] == ename and reply["evalue"]
    assert published.of("error") == [{k: reply[k] for k in ("ename", "evalue", "traceback")}]
    assert [s["text"] for s in published.of("stream")] == ["partial"]
    assert translator.reply() is reply


async def test_stdin_errors_say_input_is_unsupported() -> None:
    error = Event(type="error", error=ExecutionError("StdinNotImplementedError", "raw_input was called", ""))
    reply = await relay_cell(feed(error), CellTranslator(Published(), execution_count=1))
    assert reply["evalue"] == "input is not supported in this sandbox"


async def test_silent_cells_publish_nothing() -> None:
    published = Published()
    error = Event(type="error", error=ExecutionError("E", "v", ""))
    reply = await relay_cell(
        feed(out("x"), Event(type="result", data={"text/plain": "1"}), error),
        CellTranslator(published, execution_count=1, silent=True),
    )
    assert published == [] and reply["status"] == "error"


async def test_abort_from_another_thread_ends_a_cell_that_never_stops() -> None:
    published = Published()
    translator = CellTranslator(published, execution_count=1)
    relay = CellRelay(translator)
    started = asyncio.Event()

    async def endless() -> AsyncIterator[Event]:
        yield out("running")
        started.set()
        while True:
            await asyncio.sleep(3600)
            yield out("never")

    async def interrupter() -> None:
        await started.wait()
        thread = threading.Thread(target=relay.abort_later, args=(0.01, OpenSandboxError("execd did not end the cell")))
        thread.start()
        thread.join()

    reply, _ = await asyncio.wait_for(asyncio.gather(relay.run(endless()), interrupter()), 60)
    assert reply["status"] == "error" and reply["evalue"] == "execd did not end the cell"


@pytest.mark.security("attack", "opensandbox")
async def test_the_traceback_is_published_once_capped_and_the_reply_keeps_a_short_tail() -> None:
    lines = [f"frame {i} " + "x" * 1000 for i in range(10_000)]
    published = Published()
    reply = await relay_cell(feed(Event(type="error", error=ExecutionError("E", "v", "\n".join(lines)))), CellTranslator(published, execution_count=1))
    (error,) = published.of("error")
    assert 60 * 1024 < sum(map(len, error["traceback"])) <= 64 * 1024
    assert error["traceback"][-1] == lines[-1] and "cut" in error["traceback"][0]
    assert (reply["ename"], reply["evalue"]) == ("E", "v")
    assert sum(map(len, reply["traceback"])) <= 2 * 1024
    assert "cut" in reply["traceback"][0] and reply["traceback"][-1].endswith("x" * 500)


raw_events = st.lists(
    st.binary(max_size=60)
    | st.builds(
        lambda d: json.dumps(d).encode(),
        st.dictionaries(
            st.sampled_from(["type", "text", "results", "error", "execution_count"]),
            st.text(max_size=10) | st.integers() | st.lists(st.text(max_size=5), max_size=3),
            max_size=4,
        ),
    ),
    max_size=12,
)


@settings(max_examples=examples(200), deadline=None)
@given(raw_events, st.booleans())
def test_fuzz_one_reply_per_cell_whatever_execd_sends(lines: list[bytes], drop: bool) -> None:
    published = Published()

    async def main() -> dict[str, Any]:
        async def source() -> AsyncIterator[Event]:
            for line in lines:
                event = parse_event(line)
                if event is not None:
                    yield event
            if drop:
                raise OpenSandboxConnectionError("dropped")

        return await relay_cell(source(), CellTranslator(published, execution_count=1))

    reply = asyncio.run(main())
    assert reply["status"] in ("ok", "error")
    assert len(published.of("error")) == (1 if reply["status"] == "error" else 0)
    json.dumps(reply).encode("utf-8")
