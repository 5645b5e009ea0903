"""Kernel messages delivered to the clients in order, through the output policy, with bounded
holding.

Messages of a channel keep their order. While one of them waits (filtered in a thread, or for room
in a client's queue), the channel's later messages are held, up to :data:`HELD_BYTES`; past that
they are dropped. The link stops reading a waiting request channel from the kernel; IOPub is read
on (ipykernel queues output it cannot send in its own memory, without limit), so a client that
stops reading loses output past the held bytes, as a ZMQ subscriber past its high-water mark does.
Only output is dropped there: the messages a client waits on (``status``, a comm's answer) are
held for :data:`SIGNAL_BYTES` more, so a flood never costs a client the end of its request.
The clients are told: where the dropped messages were, a stderr note of the cell they belonged to
says how many and how many bytes (:func:`~kernel_sandbox.results.drop_note`; the execution API
counts them as truncated).
One IOPub client that takes nothing (a suspended ``jupyter console``, a program that never reads
its IOPub) holds the others back for :data:`STALL_SECONDS` at most: from then on, until every
client has room again, each IOPub message goes to the clients that have room and is dropped for
those that have none, as a ZMQ subscriber past its high-water mark loses messages (no note is
sent: the others got them).
A message the relay fails on is dropped and logged; the session goes on.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from ..policy.output import OutputPolicy
from ..results import drop_note
from .messages import DELIM, REQUEST_CHANNELS, Signer, dumps, filter_parts, msg_type_of
from .sockets import Reader

log = logging.getLogger("kernel_sandbox.launch")

COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})
INLINE_BYTES = 32 * 1024
"""Contents up to this size are filtered on the event loop (a few ms at most); larger ones in a
thread."""
HELD_BYTES = 64 * 2**20
"""Bytes of a channel's messages held while one ahead of them waits; past it, newer messages are
dropped (as a ZMQ queue at its high-water mark drops them), with a warning. Each message counts
:data:`HELD_OVERHEAD` bytes besides its parts, so a flood of tiny messages is bounded too."""
HELD_OVERHEAD = 1024
OUTPUT_TYPES = frozenset(
    {"stream", "display_data", "update_display_data", "execute_result", "error", "execute_input"}
)
"""The IOPub messages dropped first: output, which a drop note stands for."""
HEADER_BYTES = 4096
"""A header larger than this is not parsed on the event loop to learn its type: it counts as
output."""
SIGNAL_BYTES = 16 * 2**20
"""Bytes past :data:`HELD_BYTES` held for the other messages (``status``, comms, debug events),
which clients wait on and no note can stand for; past both, these are dropped too."""
STALL_SECONDS = 5.0
"""How long an IOPub message waits for a client's full queue before it is sent to the clients
that have room (and dropped for that one)."""
RETRY_SECONDS = 0.005
MAX_RETRY_SECONDS = 0.1
"""A message for a full client queue is offered again after these delays (doubling)."""
Held = tuple[list[bytes], list[bytes]]
"""A held message: its routing identities and its parts."""


def _is_output(parts: list[bytes]) -> bool:
    """Whether a message is output (:data:`OUTPUT_TYPES`), or has a header too large to be read
    on the event loop, which no client waits on either."""
    header = parts[0] if parts else b""
    return len(header) > HEADER_BYTES or msg_type_of(header) in OUTPUT_TYPES


class Delivery:
    """Deliver the kernel's messages to the clients' sockets ``readers`` (see the module
    docstring); ``pause(channel, paused)`` stops and resumes reading a request channel from the
    kernel."""

    def __init__(
        self,
        policy: OutputPolicy,
        signer: Signer,
        readers: dict[str, Reader],
        pause: Callable[[str, bool], None],
        header: Callable[[str], bytes],
    ) -> None:
        self.policy = policy
        self._signer = signer
        self._readers = readers
        self._pause = pause
        self._header = header
        self._dropped: tuple[int, int, list[bytes], bytes] | None = None
        """IOPub messages dropped since the last note: their count and bytes, and the last one's
        routing identities and parent header."""
        self._loop = asyncio.get_running_loop()
        self._waiting: set[str] = set()
        self._held: dict[str, collections.deque[Held]] = {
            channel: collections.deque() for channel in (*REQUEST_CHANNELS, "iopub")
        }
        self._held_bytes = dict.fromkeys(self._held, 0)
        self._dropping = dict.fromkeys(self._held, False)
        self._stalled = False
        """True while an IOPub client has had no room for :data:`STALL_SECONDS`: messages go to
        the others."""

    def deliver(self, channel: str, idents: list[bytes], parts: list[bytes]) -> None:
        """Relay one message now, or hold it behind the channel's waiting one (dropped past
        :data:`HELD_BYTES`)."""
        held = self._held.get(channel)
        if held is None:
            log.warning("dropped a kernel message on the unknown channel %r", channel)
        elif channel in self._waiting:
            size = sum(map(len, parts)) + HELD_OVERHEAD
            held_bytes = self._held_bytes[channel] + size
            if held_bytes > HELD_BYTES and (
                held_bytes > HELD_BYTES + SIGNAL_BYTES or _is_output(parts)
            ):
                if not self._dropping.get(channel):
                    log.warning(
                        "dropping %s messages: the kernel sends faster than its clients take them",
                        channel,
                    )
                self._dropping[channel] = True
                if channel == "iopub":
                    count, total, _, _ = self._dropped or (0, 0, [], b"")
                    parent = parts[1] if len(parts) > 1 else b"{}"
                    self._dropped = (count + 1, total + size - HELD_OVERHEAD, idents, parent)
                return
            self._hold(channel, self._note_of_drops(channel))
            self._hold(channel, (idents, parts))
        else:
            self._dropping[channel] = False
            note = self._note_of_drops(channel)
            if note is not None:
                self._relay(channel, *note)
            if channel in self._waiting:
                self._hold(channel, (idents, parts))
            else:
                self._relay(channel, idents, parts)

    def _hold(self, channel: str, message: Held | None) -> None:
        if message is not None:
            self._held[channel].append(message)
            self._held_bytes[channel] += sum(map(len, message[1])) + HELD_OVERHEAD

    def _note_of_drops(self, channel: str) -> Held | None:
        """The stderr note for the IOPub messages dropped since the last one, in the cell of the
        last of them (None: none dropped); it goes where they would have been."""
        if channel != "iopub" or self._dropped is None:
            return None
        (count, total, idents, parent), self._dropped = self._dropped, None
        content = dumps({"name": "stderr", "text": drop_note(count, total)})
        return idents, [self._header("stream"), parent, b"{}", content]

    def waiting(self, channel: str) -> bool:
        """True while one of ``channel``'s messages waits (the later ones are held)."""
        return channel in self._waiting

    def hold_back(self, channel: str, idents: list[bytes], parts: list[bytes]) -> None:
        """Hold a message, and the channel behind it, until :meth:`release_after`."""
        self._wait(channel)
        self._hold(channel, (idents, parts))

    def release_after(self, channel: str, first: list[Held]) -> None:
        """Relay ``first``, then what the channel held, as :meth:`hold_back` left it."""
        self._waiting.discard(channel)
        for idents, parts in reversed(first):
            self._held[channel].appendleft((idents, parts))
            self._held_bytes[channel] += sum(map(len, parts)) + HELD_OVERHEAD
        self._release(channel)

    def _relay(self, channel: str, idents: list[bytes], parts: list[bytes]) -> None:
        """Filter and send one message (the channel may be left waiting for it); never raises."""
        try:
            msg_type = msg_type_of(parts[0])
            if msg_type is None:
                log.warning(
                    "dropped a %s message from the kernel: its header has no msg_type", channel
                )
                return
            if channel == "iopub" and msg_type == "iopub_welcome":
                return  # the front welcomes its own subscribers
            if channel == "control" and msg_type == "usage_reply":
                log.debug(
                    "dropped a usage_reply from the kernel: the launcher answers usage requests"
                )
                return
            if channel != "iopub" and msg_type in COMM_TYPES:
                log.warning(
                    "dropped a %s on %s: kernels send comm messages on IOPub only",
                    msg_type,
                    channel,
                )
                return
            if not self.policy.inspects(msg_type):
                self._send(channel, idents, parts)
            elif sum(map(len, parts[:4])) <= INLINE_BYTES:
                self._send(channel, idents, filter_parts(self.policy, channel, msg_type, parts))
            else:
                self._wait(channel)
                work = self._loop.run_in_executor(
                    None, filter_parts, self.policy, channel, msg_type, parts
                )
                work.add_done_callback(lambda done: self._filtered(channel, idents, parts, done))
        except Exception:  # whatever the kernel sent: one message is lost, never the session
            log.exception("dropped a %s message from the kernel: relaying it failed", channel)

    def _filtered(
        self,
        channel: str,
        idents: list[bytes],
        parts: list[bytes],
        done: asyncio.Future[list[bytes] | None],
    ) -> None:
        """A thread has filtered a large message: send it, then what the channel held meanwhile."""
        self._waiting.discard(channel)
        try:
            filtered = None if done.cancelled() else done.result()
        except Exception:
            log.exception("dropped a %s message from the kernel: filtering it failed", channel)
            filtered = None
        self._send(channel, idents, filtered)
        self._release(channel)

    def _send(self, channel: str, idents: list[bytes], parts: list[bytes] | None) -> None:
        """Sign ``parts`` for the client and send them; None drops the message.

        When the client's queue is full the message waits, and the channel with it.
        """
        reader = self._readers.get(channel)
        if parts is None or reader is None:
            return
        frames = [*idents, DELIM, self._signer.sign(parts), *parts]
        if reader.send(frames):
            if channel == "iopub":
                self._stalled = False  # every client has room again
        elif channel == "iopub" and self._stalled:
            reader.send_lossy(frames)
        else:
            self._wait(channel)
            since = self._loop.time()
            self._loop.call_later(RETRY_SECONDS, self._retry, channel, frames, RETRY_SECONDS, since)

    def _retry(self, channel: str, frames: list[Any], delay: float, since: float) -> None:
        reader = self._readers.get(channel)
        if reader is None:
            return
        if not reader.send(frames):
            if channel != "iopub" or self._loop.time() - since < STALL_SECONDS:
                delay = min(delay * 2, MAX_RETRY_SECONDS)
                self._loop.call_later(delay, self._retry, channel, frames, delay, since)
                return
            log.warning(
                "an IOPub client has taken no message for %g s: IOPub messages now go to the "
                "clients that have room, and are dropped for those that have none",
                STALL_SECONDS,
            )
            self._stalled = True
            reader.send_lossy(frames)
        self._waiting.discard(channel)
        self._release(channel)

    def _wait(self, channel: str) -> None:
        """The channel's next message waits: hold the later ones (and stop reading a request
        channel)."""
        self._waiting.add(channel)
        if channel != "iopub":
            self._pause(channel, True)

    def _release(self, channel: str) -> None:
        """Relay what the channel held, until one of its messages has to wait again; then read
        on."""
        held = self._held[channel]
        while held and channel not in self._waiting:
            idents, parts = held.popleft()
            self._held_bytes[channel] -= sum(map(len, parts)) + HELD_OVERHEAD
            self._relay(channel, idents, parts)
        if channel not in self._waiting and channel != "iopub":
            self._pause(channel, False)
