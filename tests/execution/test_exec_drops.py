"""Output the launcher drops for a slow client is said where it was, and counted as truncated.

The launcher holds a channel's messages while a client's queue is full, up to ``HELD_BYTES``, and
drops what comes past that (``kernel_sandbox.launch.delivery``). Its clients then get a stderr note
in the cell of the dropped messages, in their place, with how many and how many bytes; the
execution API's fold adds those bytes to ``truncated_bytes``. The kernel of the flood test
(``test_exec_hostile.py``) is real; here a client queue that is full until told otherwise.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kernel_sandbox.launch import delivery
from kernel_sandbox.launch.delivery import Delivery
from kernel_sandbox.launch.messages import Signer, dumps
from kernel_sandbox.launch.wire import new_header
from kernel_sandbox.policy.output import OutputPolicy
from kernel_sandbox.results import OutputFold, drop_note


class FullQueue:
    """A client socket whose queue is full until ``room`` is set; it keeps what it sent."""

    def __init__(self) -> None:
        self.room = False
        self.sent: list[list[Any]] = []

    def send(self, frames: list[Any]) -> bool:
        if self.room:
            self.sent.append(frames)
        return self.room


def stream(text: str, cell: str) -> list[bytes]:
    parent = json.dumps({"msg_id": cell}).encode()
    return [dumps(new_header("stream", "kernel")), parent, b"{}", json.dumps({"name": "stdout", "text": text}).encode()]


def texts(sent: list[list[Any]]) -> list[tuple[str, str, str]]:
    """(stream name, text, parent msg_id) of each sent message (frames: topic, DELIM, signature, parts)."""
    return [
        (json.loads(f[6])["name"], json.loads(f[6])["text"], json.loads(f[4])["msg_id"]) for f in sent
    ]


def delivery_to(queue: FullQueue) -> Delivery:
    """A strict-policy delivery whose IOPub clients are ``queue``."""
    return Delivery(
        OutputPolicy.from_name("strict"),
        Signer(b"key"),
        {"iopub": queue},  # type: ignore[dict-item]
        lambda channel, paused: None,
        lambda msg_type: dumps(new_header(msg_type, "launcher")),
    )


async def make_room(queue: FullQueue, relay: Delivery) -> None:
    """Let ``queue`` take messages again, and wait until ``relay`` has sent what it held."""
    queue.room = True
    for _ in range(200):
        if not relay.waiting("iopub"):
            break
        await asyncio.sleep(0.005)


async def test_dropped_iopub_is_said_in_its_cell_where_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delivery, "HELD_BYTES", 8 * 1024)
    monkeypatch.setattr(delivery, "RETRY_SECONDS", 0.001)
    queue = FullQueue()
    relay = delivery_to(queue)
    chunk = "x" * 1000
    relay.deliver("iopub", [b"topic"], stream("first " + chunk, "cell-1"))  # waits for the full queue
    flood = stream("flood " + chunk, "cell-1")
    for _ in range(40):  # past the held bytes: most are dropped
        relay.deliver("iopub", [b"topic"], flood)
    await make_room(queue, relay)
    relay.deliver("iopub", [b"topic"], stream("after", "cell-2"))

    sent = texts(queue.sent)
    notes = [i for i, (name, text, _) in enumerate(sent) if name == "stderr"]
    assert len(notes) == 1, sent
    (note,) = notes
    kept = len(sent) - 2  # the first message and what was held, less the note and "after"
    dropped = 41 - kept
    size = sum(map(len, flood))
    assert dropped > 30 and sent[note][1] == drop_note(dropped, dropped * size)
    assert sent[note][2] == "cell-1", "the note is in the cell its output was dropped from"
    assert sent[-2] == sent[note] and sent[-1][1] == "after", "the note stands where the dropped messages were"


def status(state: str, cell: str) -> list[bytes]:
    parent = json.dumps({"msg_id": cell}).encode()
    return [dumps(new_header("status", "kernel")), parent, b"{}", json.dumps({"execution_state": state}).encode()]


async def test_a_flood_never_costs_a_client_the_end_of_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the held bytes output is dropped, but ``status`` (and comms) are held on, to a second cap."""
    flood = stream("flood " + "x" * 1000, "cell-1")
    monkeypatch.setattr(delivery, "HELD_BYTES", 3 * (sum(map(len, flood)) + delivery.HELD_OVERHEAD))  # full: no room left
    monkeypatch.setattr(delivery, "SIGNAL_BYTES", 16 * 1024)
    monkeypatch.setattr(delivery, "RETRY_SECONDS", 0.001)
    queue = FullQueue()
    relay = delivery_to(queue)
    relay.deliver("iopub", [b"topic"], stream("first", "cell-1"))  # waits for the full queue
    for _ in range(40):
        relay.deliver("iopub", [b"topic"], flood)
    relay.deliver("iopub", [b"topic"], status("idle", "cell-1"))
    for _ in range(100):  # a kernel that floods status messages is bounded by the second cap
        relay.deliver("iopub", [b"topic"], status("busy", "cell-2"))
    await make_room(queue, relay)

    kinds = [(json.loads(f[3])["msg_type"], json.loads(f[4])["msg_id"]) for f in queue.sent]
    idle = kinds.index(("status", "cell-1"))
    assert kinds[idle - 1] == ("stream", "cell-1") and "were dropped" in json.loads(queue.sent[idle - 1][6])["text"]
    assert json.loads(queue.sent[idle][6]) == {"execution_state": "idle"}, "the end of the flooded request arrives"
    busy = kinds.count(("status", "cell-2"))
    assert 0 < busy < 100, f"{busy} of 100 forged status messages held: the second cap does not bound them"


async def test_a_status_with_a_header_too_large_to_read_is_dropped_as_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A header past ``HEADER_BYTES`` is never parsed to learn its type: past the held bytes it is dropped."""
    flood = stream("flood " + "x" * 1000, "cell-1")
    monkeypatch.setattr(delivery, "HELD_BYTES", 3 * (sum(map(len, flood)) + delivery.HELD_OVERHEAD))
    monkeypatch.setattr(delivery, "RETRY_SECONDS", 0.001)
    queue = FullQueue()
    relay = delivery_to(queue)
    relay.deliver("iopub", [b"topic"], stream("first", "cell-1"))
    for _ in range(4):
        relay.deliver("iopub", [b"topic"], flood)
    header = json.loads(dumps(new_header("status", "kernel")))
    header["padding"] = "p" * delivery.HEADER_BYTES
    big = status("idle", "cell-big")
    relay.deliver("iopub", [b"topic"], [json.dumps(header).encode(), *big[1:]])
    relay.deliver("iopub", [b"topic"], status("idle", "cell-1"))
    await make_room(queue, relay)

    kinds = [(json.loads(f[3])["msg_type"], json.loads(f[4])["msg_id"]) for f in queue.sent]
    assert ("status", "cell-big") not in kinds, "a header too large to read is held past the output's cap"
    assert ("stream", "cell-big") in kinds, "its drop note stands in its cell"
    assert ("status", "cell-1") in kinds


def test_the_fold_counts_what_a_drop_note_says_as_truncated() -> None:
    fold = OutputFold(cap=1000)
    assert fold.message("stream", {"name": "stderr", "text": drop_note(3, 3_000_000)}) is not None
    fold.message("stream", {"name": "stdout", "text": drop_note(5, 5_000_000)})  # not the launcher's stream
    fold.message("stream", {"name": "stderr", "text": "say " + drop_note(7, 7_000_000)})  # not at the start
    fold.finish()
    assert fold.execution.truncated_bytes == 3_000_000
    assert "[output truncated: 3000000 bytes" in fold.execution.stdout


def test_a_forged_note_with_a_number_past_ints_digit_limit_counts_nothing_and_never_raises() -> None:
    fold = OutputFold()
    huge = drop_note(1, 1).replace("(1 bytes)", "(" + "9" * 5000 + " bytes)")  # int() refuses past 4300 digits
    assert fold.message("stream", {"name": "stderr", "text": huge}) == ("stderr", huge)
    assert fold.execution.truncated_bytes == 0


class OneStalled(FullQueue):
    """IOPub clients one of which takes nothing until ``room``: a lossy send reaches the others."""

    def __init__(self) -> None:
        super().__init__()
        self.lossy: list[list[Any]] = []

    def send_lossy(self, frames: list[Any]) -> None:
        self.lossy.append(frames)


async def test_a_stalled_client_holds_iopub_back_for_stall_seconds_then_until_all_have_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delivery, "STALL_SECONDS", 0.05)
    monkeypatch.setattr(delivery, "RETRY_SECONDS", 0.001)
    queue = OneStalled()
    relay = delivery_to(queue)
    relay.deliver("iopub", [b"topic"], stream("first", "cell-1"))  # waits for the stalled client
    relay.deliver("iopub", [b"topic"], stream("second", "cell-1"))  # held behind it
    assert relay.waiting("iopub") and not queue.lossy
    for _ in range(200):
        if not relay.waiting("iopub"):
            break
        await asyncio.sleep(0.005)
    assert [text for _, text, _ in texts(queue.lossy)] == ["first", "second"], "past the stall, both go to the others"
    relay.deliver("iopub", [b"topic"], stream("third", "cell-1"))
    assert [text for _, text, _ in texts(queue.lossy)][-1] == "third", "still stalled: no new wait"
    queue.room = True  # every client has room again
    relay.deliver("iopub", [b"topic"], stream("fourth", "cell-2"))
    assert texts(queue.sent)[-1][1] == "fourth"
    queue.room = False
    relay.deliver("iopub", [b"topic"], stream("fifth", "cell-2"))
    assert relay.waiting("iopub") and texts(queue.lossy)[-1][1] == "third", "a new stall waits again first"
