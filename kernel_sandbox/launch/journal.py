"""The launcher's log on its stderr: one line per kind of event per interval, a byte budget,
escaped.

What a kernel does can make the launcher log: wrongly signed messages, output the policy cannot
read, knocks on the TCP gate, the container's own stdout and stderr. A kernel that repeats such a
thing must not fill the host's disk or terminal, nor cost the host's CPU per message. So:

* **one line per kind per interval**: a kind is a logging call's message template (its logger
  and level too). The first event of a kind is written at once; the ones after it within
  :data:`INTERVAL` seconds are only counted (:func:`note` counts them before a log record is even
  made), and one line at the interval's end says how many there were;
* **a byte budget** (:data:`BUDGET`) for everything below ERROR, the container's output included:
  once it is spent, one line says so and only errors (rate-limited as above) are written;
* **escaped**: every control character from anywhere (ESC, ``\\r``, C1...) is written as a visible
  escape (:func:`kernel_sandbox.controls.escape_controls`), and each line is capped at
  :data:`LINE_CHARS` characters.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from ..controls import ByteEscaper, escape_controls

INTERVAL = 60.0
"""Seconds over which repeated events of one kind are counted into one line."""
TICK = 5.0
"""Seconds between two looks for intervals that ended (their counts are then written)."""
BUDGET = 2 * 2**20
"""Bytes of warnings and container output one launcher (one kernel) writes in its life."""
LINE_CHARS = 4000
"""Characters of one line (a traceback included) past which it is cut."""
FORMAT = "[kernel-sandbox %(levelname)s %(asctime)s] %(message)s"

_installed: Journal | None = None


@dataclass
class _Kind:
    """One kind of event: when its interval began, how many more came in it, and the latest record
    of it."""

    since: float
    record: logging.LogRecord = field(repr=False)
    more: int = 0


class Journal(logging.StreamHandler):
    """A log handler that writes repeated events once per interval, within a budget, escaped."""

    def __init__(self, stream: IO[str], interval: float = INTERVAL, budget: int = BUDGET) -> None:
        super().__init__(stream)
        self.setFormatter(logging.Formatter(FORMAT))
        self.interval = interval
        self.left = budget
        self.budget = budget
        self._kinds: dict[tuple[str, int, Any], _Kind] = {}
        self._spent_said = False
        self._output = ByteEscaper()

    @staticmethod
    def kind_of(name: str, level: int, msg: Any) -> tuple[str, int, Any]:
        """What makes two events the same kind: logger, level and message template."""
        return name, level, msg if isinstance(msg, str) else type(msg)

    def counted(self, key: tuple[str, int, Any]) -> bool:
        """Count one more event of ``key`` if its interval is running with one written already; True
        then."""
        with self.lock:  # type: ignore[union-attr]
            kind = self._kinds.get(key)
            if kind is None or time.monotonic() - kind.since >= self.interval:
                return False
            kind.more += 1
            return True

    def emit(self, record: logging.LogRecord) -> None:
        key = self.kind_of(record.name, record.levelno, record.msg)
        now = time.monotonic()
        with self.lock:  # type: ignore[union-attr]
            kind = self._kinds.get(key)
            if kind is not None and now - kind.since >= self.interval:
                self._close_interval(key, kind, now)
                kind = self._kinds.get(key)
            if kind is not None:
                kind.more += 1
                kind.record = record
                return
            self._kinds[key] = _Kind(now, record)
            self._write(record)

    def tick(self) -> None:
        """Write the counts of intervals that ended (and forget kinds that went quiet)."""
        now = time.monotonic()
        with self.lock:  # type: ignore[union-attr]
            for key, kind in list(self._kinds.items()):
                if now - kind.since >= self.interval:
                    self._close_interval(key, kind, now)

    def flush_counts(self) -> None:
        """Write every count not written yet (the launcher is ending)."""
        now = time.monotonic()
        with self.lock:  # type: ignore[union-attr]
            for key, kind in list(self._kinds.items()):
                if kind.more:
                    self._summary(kind, now)
            self._kinds.clear()

    def _close_interval(self, key: tuple[str, int, Any], kind: _Kind, now: float) -> None:
        if kind.more:
            self._summary(kind, now)
            # still busy: the next ones are counted into the next line
            self._kinds[key] = _Kind(now, kind.record)
        else:
            del self._kinds[key]

    def _summary(self, kind: _Kind, now: float) -> None:
        last = kind.record
        summary = logging.makeLogRecord(dict(vars(last)))
        summary.msg = "%s (%d more like it in the last %.0f s)"
        summary.args = (last.getMessage(), kind.more, now - kind.since)
        summary.exc_info = summary.exc_text = None
        self._write(summary)

    def _write(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        line = escape_controls(line)
        if len(line) > LINE_CHARS:
            line = f"{line[:LINE_CHARS]} [... {len(line) - LINE_CHARS} more characters]"
        line += self.terminator
        if record.levelno < logging.ERROR and not self._spend(len(line)):
            return
        self._put(line)

    def _spend(self, size: int) -> bool:
        """Take ``size`` bytes from the budget; False (said once) when it is spent."""
        if self.left >= size:
            self.left -= size
            return True
        self.left = 0
        if not self._spent_said:
            self._spent_said = True
            self._put(
                "[kernel-sandbox WARNING] the launcher's log budget for this kernel "
                f"({self.budget // 2**20} MiB) is spent: its further warnings and container output "
                "are dropped, errors are still written\n"
            )
        return False

    def _put(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing to be done about it
            pass

    def output(self, data: bytes) -> None:
        """Write a chunk of the container's own stdout or stderr, escaped, within the budget."""
        with self.lock:  # type: ignore[union-attr]
            text = self._output.feed(data)
            if text and self._spend(len(text)):
                self._put(text)


def install(level: str) -> Journal:
    """Make a :class:`Journal` on stderr the launcher's one log handler, at ``level``."""
    global _installed
    journal = _installed = Journal(sys.stderr)
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.addHandler(journal)
    root.setLevel(level)
    return journal


def installed() -> Journal:
    """The installed journal; a launcher run without :func:`install` (in-process) gets one on stderr
    that only :meth:`Journal.output` uses."""
    global _installed
    if _installed is None:
        _installed = Journal(sys.stderr)
    return _installed


def note(logger: logging.Logger, level: int, msg: str, *args: Any) -> None:
    """``logger.log(level, msg, *args)`` for an event a kernel can repeat at will: a repeat within
    its interval is counted without making a log record (no formatting, no time, no frame
    lookup)."""
    if not logger.isEnabledFor(level):
        return
    journal = _installed
    if journal is not None and journal.counted(Journal.kind_of(logger.name, level, msg)):
        return
    logger.log(level, msg, *args)


async def keep_time() -> None:
    """Write the counts of ended intervals every :data:`TICK` s (run while the launcher serves)."""
    while True:
        await asyncio.sleep(TICK)
        if _installed is not None:
            _installed.tick()
