"""Parse the event stream that OpenSandbox's execd writes for ``POST /code``, as untrusted input.

The real server writes each event as a bare JSON object followed by a blank line; proxies and
some clients use SSE ``data: {...}`` lines instead. Both are accepted; blank lines, SSE control
lines (``event:``, ``id:``, ``retry:``, comments, empty ``data:``) and anything that is not a JSON
object (including JSON nested too deeply to decode) are skipped.

Everything taken from an event is cleaned: lone surrogates and NULs in text and MIME keys become
U+FFFD, MIME values that are not text are kept only for JSON types (depth-limited) or dropped,
and tracebacks are capped (:data:`MAX_TRACEBACK_CHARS`). A run ends at the first terminal event:
``execution_complete`` (success) or ``error`` (upstream execd sends nothing after it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..results import Execution, ExecutionError, OutputFold

_CONTROL_PREFIXES = ("event:", "id:", "retry:", ":")
_UNSAFE = re.compile("[\x00\ud800-\udfff]")
TERMINAL_TYPES = frozenset({"execution_complete", "error"})
MAX_TRACEBACK_CHARS = 64 * 1024
"""Cap on one traceback, in bytes: its lines' UTF-8 and :data:`LINE_COST` per line; past it the
oldest lines are dropped."""
LINE_COST = 4
"""What a traceback line costs besides its bytes (its quotes and comma in JSON, its newline joined):
empty lines count too."""
REPLY_TRACEBACK_CHARS = 2 * 1024
"""Cap on the traceback an ``execute_reply`` repeats (its tail): the whole one is in the IOPub
``error``."""
_CUT_NOTE_CHARS = 120
MAX_ERROR_FIELD_CHARS = 8 * 1024
"""Cap on an error's name and value."""
MAX_JSON_DEPTH = 32
"""Deepest nesting kept in a JSON MIME value (``application/json``, ``*+json``)."""


def clean_text(text: str) -> str:
    """Return ``text`` with NULs and lone surrogates replaced by U+FFFD (linear time)."""
    if "\x00" not in text:
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    return _UNSAFE.sub("\ufffd", text)


def _clip(text: str, limit: int) -> str:
    return (
        text if len(text) <= limit else text[:limit] + f"[... {len(text) - limit} characters cut]"
    )


@dataclass(frozen=True, slots=True)
class Event:
    """One normalised execd event.

    ``type`` is execd's event type (``stdout``, ``stderr``, ``result``, ``execution_count``,
    ``error``, ``init``, ``ping``, ``status``, ``execution_complete`` ...); only the field that
    belongs to the type is set.
    """

    type: str
    text: str | None = None
    data: dict[str, Any] | None = None
    execution_count: int | None = None
    error: ExecutionError | None = None

    @property
    def terminal(self) -> bool:
        """True for the event that ends a run (``execution_complete`` or ``error``)."""
        return self.type in TERMINAL_TYPES


@dataclass(repr=False)
class ExecdRun(Execution):
    """An :class:`~kernel_sandbox.results.Execution` from execd, with the code context it ran in.

    ``complete`` is True when the run's terminal event arrived; ``cleanup_error`` is set by
    :func:`~kernel_sandbox.opensandbox.client.run_once` when deleting the sandbox failed.
    """

    context_id: str | None = None
    complete: bool = field(default=False, compare=False)
    cleanup_error: BaseException | None = field(default=None, compare=False)


class RunCollector:
    """Folds events into an :class:`ExecdRun` through :class:`~kernel_sandbox.results.OutputFold`.

    In linear time (output is joined once, at the end); after a terminal event nothing changes.
    """

    def __init__(self, context_id: str | None = None) -> None:
        self._run = ExecdRun(context_id=context_id)
        self._fold = OutputFold(self._run)

    @property
    def complete(self) -> bool:
        """True once a terminal event arrived."""
        return self._run.complete

    def add(self, event: Event) -> None:
        """Fold one event into the run."""
        run, fold = self._run, self._fold
        if run.complete:
            return
        if event.type in ("stdout", "stderr"):
            fold.stream(event.type, event.text or "")
        elif event.type in ("result", "display_data") and event.data is not None:
            fold.result(event.data, main=event.type == "result")
        elif event.type == "execution_count" and event.execution_count is not None:
            fold.count(event.execution_count)
        elif event.type == "error" and event.error is not None:
            fold.error(event.error)
        elif event.type == "init" and event.text:
            run.context_id = event.text
        run.complete = event.terminal

    def result(self) -> ExecdRun:
        """The run so far, its output joined."""
        self._fold.finish()
        return self._run


class LineSplitter:
    """Split a byte stream into lines, looking at each byte once (a long line costs linear time)."""

    def __init__(self) -> None:
        self._partial = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Return the lines that ``chunk`` completes (without their newline)."""
        if b"\n" not in chunk:
            self._partial += chunk
            return []
        first, *middle, rest = chunk.split(b"\n")
        self._partial += first
        lines = [bytes(self._partial), *middle]
        self._partial = bytearray(rest)
        return lines

    def rest(self) -> bytes:
        """Return what is left after the last newline (the stream's unterminated last line)."""
        rest, self._partial = bytes(self._partial), bytearray()
        return rest


def parse_line(line: str | bytes) -> dict[str, Any] | None:
    """Return the JSON object carried by one stream line, or None for blank, control and junk
    lines."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.strip()
    if not line or line.startswith(_CONTROL_PREFIXES):
        return None
    if line.startswith("data:"):
        line = line[len("data:") :].strip()
        if not line:
            return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def as_int(value: Any) -> int | None:
    """Return ``value`` as an int (also from a short numeric string), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and len(value) <= 20:
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _clean_json(value: Any, depth: int = 0) -> Any:
    """Return a cleaned copy of a JSON value; raise ValueError past :data:`MAX_JSON_DEPTH`."""
    if isinstance(value, str):
        return clean_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= MAX_JSON_DEPTH:
        raise ValueError("JSON value nested too deeply")
    if isinstance(value, list):
        return [_clean_json(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {clean_text(str(k)): _clean_json(v, depth + 1) for k, v in value.items()}
    raise ValueError(f"not a JSON value: {type(value).__name__}")


def _is_json_mime(key: str) -> bool:
    return key == "application/json" or key.endswith("+json")


def clean_bundle(bundle: dict[str, Any]) -> dict[str, Any]:
    """Clean a MIME bundle: text values cleaned, JSON types kept depth-limited, anything else
    dropped.

    execd renames ``text/plain`` to ``text``; it is renamed back.
    """
    cleaned: dict[str, Any] = {}
    for key, value in bundle.items():
        key = clean_text(str(key))
        if key == "text" and "text/plain" not in bundle:
            key = "text/plain"
        if isinstance(value, str):
            cleaned[key] = clean_text(value)
        elif _is_json_mime(key):
            try:
                cleaned[key] = _clean_json(value)
            except ValueError:
                continue
    return cleaned


def _mime_bundle(obj: dict[str, Any]) -> dict[str, Any]:
    bundle = obj.get("results")
    if not isinstance(bundle, dict):
        bundle = obj.get("data") if isinstance(obj.get("data"), dict) else None
    if bundle is None:
        bundle = {k: v for k, v in obj.items() if "/" in k}
    return clean_bundle(bundle)


def _pick(obj: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in obj and obj[key] is not None:
            return obj[key]
    return None


def _line_cost(line: str) -> int:
    return len(line.encode("utf-8", "surrogatepass")) + LINE_COST


def traceback_fits(lines: list[Any], limit: int = MAX_TRACEBACK_CHARS) -> bool:
    """Whether ``lines`` are within ``limit`` (bytes and lines, see :data:`MAX_TRACEBACK_CHARS`);
    cheap for a long list."""
    return len(lines) * LINE_COST <= limit and sum(_line_cost(str(line)) for line in lines) <= limit


def cap_traceback(lines: list[str], limit: int = MAX_TRACEBACK_CHARS) -> list[str]:
    """Keep the last lines of a traceback within ``limit`` (bytes and lines), with a note of what
    was cut.

    Only the kept lines (and one more) are looked at, however many the traceback has.
    """
    if traceback_fits(lines, limit):
        return list(lines)
    budget = max(limit - _CUT_NOTE_CHARS, 0)
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        cost = _line_cost(line)
        if size + cost > budget:
            if not kept:
                room = max(budget - LINE_COST, 0)
                tail = line.encode("utf-8", "surrogatepass")[
                    len(line.encode("utf-8", "surrogatepass")) - room :
                ]
                kept.append(tail.decode("utf-8", "ignore") if room else "")
            break
        kept.append(line)
        size += cost
    cut = len(lines) - len(kept)
    note = f"[... {cut} earlier traceback line(s) cut: the traceback exceeded {limit} bytes]"
    return [note[:limit], *kept[::-1]]


def capped_error(
    content: dict[str, Any], traceback_limit: int = MAX_TRACEBACK_CHARS
) -> dict[str, Any]:
    """An ``error`` / error ``execute_reply`` content within the caps: ``ename`` and ``evalue`` at
    :data:`MAX_ERROR_FIELD_CHARS`, the traceback's last lines within ``traceback_limit``.

    Returns ``content`` itself when it is within them already (then nothing needs re-serialising).
    """
    name, value, traceback = content.get("ename"), content.get("evalue"), content.get("traceback")
    fits = (
        (not isinstance(name, str) or len(name) <= MAX_ERROR_FIELD_CHARS)
        and (not isinstance(value, str) or len(value) <= MAX_ERROR_FIELD_CHARS)
        and (not isinstance(traceback, list) or traceback_fits(traceback, traceback_limit))
    )
    if fits:
        return content
    capped = dict(content)
    for key in ("ename", "evalue"):
        if isinstance(capped.get(key), str):
            capped[key] = _clip(capped[key], MAX_ERROR_FIELD_CHARS)
    if isinstance(traceback, list):
        capped["traceback"] = cap_traceback([str(line) for line in traceback], traceback_limit)
    return capped


def _error(obj: dict[str, Any]) -> ExecutionError:
    nested = obj.get("error")
    source = nested if isinstance(nested, dict) else obj
    name = _pick(source, "ename", "name", "code")
    value = _pick(source, "evalue", "value", "message", "text")
    if name is None and isinstance(nested, str):
        value = nested
    traceback = source.get("traceback")
    if isinstance(traceback, str):
        traceback = traceback.splitlines()
    elif not isinstance(traceback, list):
        traceback = []
    lines = [
        line if isinstance(line, str) else json.dumps(line)[:MAX_ERROR_FIELD_CHARS]
        for line in traceback
        if isinstance(line, (str, int, float))
    ]
    return ExecutionError(
        name=_clip(clean_text("Error" if name is None else str(name)), MAX_ERROR_FIELD_CHARS),
        value=_clip(clean_text("" if value is None else str(value)), MAX_ERROR_FIELD_CHARS),
        traceback="\n".join(clean_text(line) for line in cap_traceback(lines)),
    )


def to_event(obj: dict[str, Any]) -> Event | None:
    """Normalise one decoded JSON object into an :class:`Event` (None when it carries nothing)."""
    kind = obj.get("type")
    if kind is None and "code" in obj and "message" in obj:
        return Event(type="error", error=_error(obj))
    if not isinstance(kind, str):
        return None
    kind = clean_text(kind[:64])
    if kind in ("stdout", "stderr", "init", "status"):
        text = obj.get("text")
        return Event(type=kind, text="" if text is None else clean_text(str(text)))
    if kind in ("result", "display_data", "execute_result"):
        return Event(
            type="display_data" if kind == "display_data" else "result", data=_mime_bundle(obj)
        )
    if kind == "execution_count":
        count = as_int(obj.get("execution_count"))
        return Event(type=kind, execution_count=count) if count is not None else None
    if kind == "error":
        return Event(type=kind, error=_error(obj))
    return Event(type=kind)


def parse_event(line: str | bytes) -> Event | None:
    """Parse one stream line into an :class:`Event` (None for lines that carry no event)."""
    obj = parse_line(line)
    if obj is None:
        return None
    try:
        return to_event(obj)
    except RecursionError:
        return None


def parse_lines(lines: Iterable[str | bytes]) -> ExecdRun:
    """Collect a whole stream, given as lines, into an :class:`ExecdRun` (up to its terminal
    event)."""
    collector = RunCollector()
    for line in lines:
        event = parse_event(line)
        if event is not None:
            collector.add(event)
            if collector.complete:
                break
    return collector.result()
