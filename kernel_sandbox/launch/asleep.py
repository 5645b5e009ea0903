"""What a sleeping kernel answers with no kernel running: the replies the Docker sleeper
(:mod:`.sleep`), a paused OpenSandbox sandbox's link and the dormant process (:mod:`.dormant`)
give without waking it, and the line that tells the first cell it woke up; what the sleeper needs
of a link."""

from __future__ import annotations

import collections.abc
import asyncio
import contextlib
import ctypes
import gc
import logging
from typing import Any, Protocol

from ..errors import KernelSandboxError
from ..privdir import SUSPEND_REQUEST, PrivateDir
from .checkpoints import BlobChannel
from .front import Front, KernelLink
from .messages import launcher_note, msg_type_of, parse_part

WOKEN_ANSWERS: dict[str, tuple[str, dict[str, Any]]] = {
    "comm_info_request": ("comm_info_reply", {"status": "ok", "comms": {}}),
    "history_request": ("history_reply", {"status": "ok", "history": []}),
}
"""Requests a sleeping kernel answers as the kernel that wakes will: no comms (a sleep closes
them), no input history (its IPython is a new one, in a new container)."""
SHOWN = 8
"""Names a sleep's messages list at most (the others are counted)."""
WIDGET_TARGET = "jupyter.widget"
DEBUG_INFO_MAX = 64 * 1024
"""Bytes of a ``debugInfo`` answer the launcher reads to keep (a larger one is not kept)."""
BUSY_LIMIT = 256
"""Requests a kernel may say it is busy with that :class:`Busy` remembers (the oldest go first)."""


class Busy:
    """The requests a kernel is busy with, from its IOPub ``status`` messages, by parent: the
    busy/idle that ipykernel sends around a control request (a client's ``kernel_info``, say)
    while a cell runs leaves the cell running. True while any is."""

    def __init__(self) -> None:
        self._parents: dict[str, None] = {}

    def __bool__(self) -> bool:
        return bool(self._parents)

    def note(self, parts: list[Any]) -> str | None:
        """Take a ``status`` message's parts; return its parent's msg_id when it says busy."""
        content = bytes(parts[3][:200])
        parent = parse_part(bytes(parts[1]))
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        key = msg_id if isinstance(msg_id, str) else ""
        if b'"busy"' not in content:  # idle (or starting: no request of a client's)
            self._parents.pop(key, None)
            return None
        self._parents[key] = None
        while len(self._parents) > BUSY_LIMIT:
            del self._parents[next(iter(self._parents))]
        return key


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
    kernel_info: Any, lost: dict[str, str], new_kernel: bool = True
) -> dict[str, tuple[list[str], str, dict[str, Any], bool]]:
    """What the dormant process answers by itself, by request type: the channels it comes on,
    the reply's type and content, and whether the status messages go around it. ``new_kernel``:
    the kernel that wakes is a new one (:data:`WOKEN_ANSWERS`), not the same one resumed."""
    either = ["shell", "control"]
    woken = WOKEN_ANSWERS if new_kernel else {}
    answers = {kind: (either, *answer, True) for kind, answer in woken.items()}
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


def answer_shutdown(front: Front, channel: str, idents: list[Any], parts: list[Any]) -> None:
    """Answer a ``shutdown_request`` for a kernel that sleeps (it then ends, never woken)."""
    content = parse_part(bytes(parts[3]))
    restart = bool(content.get("restart")) if isinstance(content, dict) else False
    reply = {"status": "ok", "restart": restart}
    front.reply(channel, idents, bytes(parts[0]), "shutdown_reply", reply)


def kept_debug_info(reply: Any, kept: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``debugInfo`` answer to keep after the kernel's debug reply ``reply`` (``kept``: the
    one kept so far): one from a kernel whose debugger is off, to answer it asleep."""
    if not isinstance(reply, dict) or reply.get("command") != "debugInfo":
        return kept
    body = reply.get("body")
    if not isinstance(body, dict):
        return kept
    off = body.get("isStarted") is False and not body.get("breakpoints")
    return reply if off and not body.get("stoppedThreads") else None


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


class Widgets:
    """The widget comms a kernel has open (a sleep closes them), from the comm messages."""

    def __init__(self) -> None:
        self._open: set[str] = set()

    def __len__(self) -> int:
        return len(self._open)

    def note(self, parts: list[Any], from_client: bool) -> None:
        """Take a ``comm_open`` or ``comm_close`` message's parts (a client opens no widget)."""
        kind = msg_type_of(bytes(parts[0]))
        content = parse_part(bytes(parts[3]))
        comm_id = content.get("comm_id") if isinstance(content, dict) else None
        if not isinstance(comm_id, str):
            return
        if kind == "comm_open" and not from_client and content.get("target_name") == WIDGET_TARGET:
            self._open.add(comm_id)
        elif kind == "comm_close":
            self._open.discard(comm_id)


def cells(queue: collections.abc.Iterable[tuple[str, Any, list[Any]]]) -> set[str]:
    """The msg_ids of the ``execute_request`` messages in ``queue``."""
    found = set()
    for channel, _, parts in queue:
        if channel == "shell" and msg_type_of(bytes(parts[0])) == "execute_request":
            header = parse_part(bytes(parts[0]))
            msg_id = header.get("msg_id") if isinstance(header, dict) else None
            if isinstance(msg_id, str):
                found.add(msg_id)
    return found


def give_back_memory() -> None:
    """Return the heap the awake kernel's traffic left free to the system (glibc keeps it
    otherwise), so that a sleeping kernel's launcher holds what it uses; nothing elsewhere."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def failure(exc: Exception) -> str:
    """Why a sleep or a wake failed, in words (an error not of the launcher's own kind is
    logged with its traceback)."""
    if not isinstance(exc, (KernelSandboxError, OSError, asyncio.TimeoutError)):
        logging.getLogger("kernel_sandbox.launch").error("a sleep or wake failed", exc_info=exc)
        return f"{type(exc).__name__}: {exc}"
    return str(exc) or "no answer in time"


class SleepableLink(KernelLink, Protocol):
    """A link whose container can be checkpointed and replaced (the Docker and OpenSandbox
    links)."""

    keep_dir: PrivateDir | None

    def blob_channel(self) -> BlobChannel:
        """How blobs move into and out of the link's container (a :class:`CellChannel`: through
        the kernel's cells, whose kernel side the sleep installs first)."""

    def count_from(self, count: int | None) -> None:
        """The kernel's last cell was number ``count``, whatever the launcher's own cells did."""


class PausingLink(SleepableLink, Protocol):
    """A link that can also sleep on its own, keeping its sandbox (OpenSandbox's pause)."""

    asleep: bool

    async def suspend(self, why: str) -> dict[str, Any]:
        """Pause; the reply says whether it sleeps, or why not (``unsupported``: never will)."""

    async def wake(self) -> dict[str, Any]:
        """Resume, and pass on what waited."""

    def quiet(self) -> bool:
        """Paused, with nothing waiting: the launcher may rest."""

    def snapshot(self) -> dict[str, Any]:
        """What a launcher exec'd anew needs to go on with the paused link."""

    async def resume(self, front: Front, kept: dict[str, Any]) -> None:
        """Go on paused as the launcher before an exec left off."""
