"""What a sleeping kernel answers with no kernel running: the replies the Docker sleeper
(:mod:`.sleep`), a paused OpenSandbox sandbox's link and the dormant process (:mod:`.dormant`)
give without waking it, and the line that tells the first cell it woke up."""

from __future__ import annotations

import collections.abc
from typing import Any

from ..privdir import SUSPEND_REQUEST
from .front import Front
from .messages import launcher_note, msg_type_of, parse_part

WOKEN_ANSWERS: dict[str, tuple[str, dict[str, Any]]] = {
    "comm_info_request": ("comm_info_reply", {"status": "ok", "comms": {}}),
    "history_request": ("history_reply", {"status": "ok", "history": []}),
}
"""Requests a sleeping kernel answers as the kernel that wakes will: no comms (a sleep closes
them), no input history (its IPython is a new one, in a new container)."""
SHOWN = 8
"""Names a sleep's messages list at most (the others are counted)."""


def answer_idle(
    front: Front, channel: str, idents: list[Any], parts: list[Any], kernel_info: Any
) -> bool:
    """Answer, for a kernel that sleeps, a ``kernel_info_request`` (with the live kernel's last
    reply, ``kernel_info``) or an ``interrupt_request`` (nothing runs); False for any other."""
    parent = bytes(parts[0])
    kind = msg_type_of(parent)
    if kind == "kernel_info_request" and kernel_info is not None:
        front.publish(parent, "status", {"execution_state": "busy"})
        front.reply(channel, idents, parent, "kernel_info_reply", kernel_info)
        front.publish(parent, "status", {"execution_state": "idle"})
        return True
    if kind == "interrupt_request":
        front.reply(channel, idents, parent, "interrupt_reply", {"status": "ok"})
        return True
    return False


def answer_woken(
    front: Front, channel: str, idents: list[Any], parts: list[Any], debug_info: Any
) -> bool:
    """Answer what the kernel that wakes would answer (JupyterLab asks each when a page opens the
    notebook): comm_info and history (:data:`WOKEN_ANSWERS`), and the debugger's ``debugInfo``
    with ``debug_info``, the kernel's last answer while its debugger was off (None: not kept);
    False for any other request."""
    parent = bytes(parts[0])
    kind = msg_type_of(parent)
    if kind == "debug_request" and debug_info is not None:
        request = parse_part(bytes(parts[3]))
        if not isinstance(request, dict) or request.get("command") != "debugInfo":
            return False
        seq = request.get("seq")
        seq = seq if type(seq) is int else 0
        reply_type, content = "debug_reply", {**debug_info, "request_seq": seq, "seq": seq + 1}
    elif kind in WOKEN_ANSWERS:
        reply_type, content = WOKEN_ANSWERS[kind]
    else:
        return False
    front.publish(parent, "status", {"execution_state": "busy"})
    front.reply(channel, idents, parent, reply_type, content)
    front.publish(parent, "status", {"execution_state": "idle"})
    return True


def dormant_answers(
    kernel_info: Any, lost: dict[str, str]
) -> dict[str, tuple[list[str], str, dict[str, Any], bool]]:
    """What the dormant process answers by itself, by request type: the channels it comes on,
    the reply's type and content, and whether the status messages go around it."""
    either = ["shell", "control"]
    answers = {kind: (either, *answer, True) for kind, answer in WOKEN_ANSWERS.items()}
    if kernel_info is not None:
        answers["kernel_info_request"] = (either, "kernel_info_reply", kernel_info, True)
    answers["interrupt_request"] = (["control"], "interrupt_reply", {"status": "ok"}, False)
    answers[SUSPEND_REQUEST] = (
        ["control"],
        SUSPEND_REQUEST[: -len("_request")] + "_reply",
        {"status": "ok", "state": "suspended", "not_kept": lost},
        False,
    )
    return answers


def debug_command(parts: list[Any]) -> str | None:
    """The command of a client's ``debug_request`` (None: not one, or malformed)."""
    if msg_type_of(bytes(parts[0])) != "debug_request":
        return None
    content = parse_part(bytes(parts[3]))
    command = content.get("command") if isinstance(content, dict) else None
    return command if isinstance(command, str) else None


def tell_first_cell(
    front: Front, waiting: collections.abc.Iterable[tuple[str, Any, list[Any]]], text: str
) -> None:
    """Say ``text`` once, on stderr, in the first cell that ``waiting`` holds for a kernel that
    woke up, else in the next cell a client runs."""
    for channel, _, parts in waiting:
        if channel == "shell" and msg_type_of(bytes(parts[0])) == "execute_request":
            front.publish(bytes(parts[0]), "stream", launcher_note(text))
            return
    front.notice_next_cell(text)


def listed(reasons: dict[str, str]) -> str:
    """``name (why), ...`` for the first :data:`SHOWN` of ``reasons``, and how many more."""
    names = [f"{name} ({why})" for name, why in list(reasons.items())[:SHOWN]]
    more = len(reasons) - SHOWN
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")
