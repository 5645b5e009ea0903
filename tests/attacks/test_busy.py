"""What tells a sleeping kernel's launcher that a cell runs (:class:`~kernel_sandbox.launch.asleep.Busy`): the
kernel's IOPub status messages, by parent, so that a control request answered during a cell (JupyterLab's
kernel_info, a debugger's request) does not make the cell look done, and a kernel that floods busy messages is
counted as busy in bounded memory."""

from __future__ import annotations

import json

from kernel_sandbox.launch.asleep import BUSY_LIMIT, Busy


def status(state: str, parent: str | None) -> list[bytes]:
    header = json.dumps({"msg_type": "status"}).encode()
    parent_header = json.dumps({"msg_id": parent} if parent else {}).encode()
    return [header, parent_header, b"{}", json.dumps({"execution_state": state}).encode()]


def test_a_control_request_answered_during_a_cell_leaves_the_cell_running() -> None:
    busy = Busy()
    busy.note(status("starting", None))
    assert not busy
    assert busy.note(status("busy", "cell")) == "cell"
    busy.note(status("busy", "kernel-info-on-control"))
    busy.note(status("idle", "kernel-info-on-control"))
    assert busy, "the cell still runs"
    busy.note(status("idle", "cell"))
    assert not busy


def test_a_kernel_that_floods_busy_messages_stays_busy_in_bounded_memory() -> None:
    busy = Busy()
    for n in range(10 * BUSY_LIMIT):
        busy.note(status("busy", f"forged-{n}"))
    assert busy and len(busy._parents) == BUSY_LIMIT
    busy.note(status("busy", None))  # a status without a parent counts too, until its idle
    busy.note(status("idle", "not-a-request-it-was-busy-with"))
    assert busy
