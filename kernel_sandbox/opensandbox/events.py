"""Parse the event stream that OpenSandbox's execd writes for ``POST /code``.

The real server writes each event as a bare JSON object followed by a blank line; proxies and
some clients use SSE ``data: {...}`` lines instead. Both are accepted; blank lines, SSE control
lines (``event:``, ``id:``, ``retry:``, comments, empty ``data:``) and anything that is not a JSON
object are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_CONTROL_PREFIXES = ("event:", "id:", "retry:", ":")


@dataclass(frozen=True)
class ExecdError:
    """An error raised by the code, as execd reports it."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Return the error as ``{"name", "value", "traceback"}``."""
        return {"name": self.name, "value": self.value, "traceback": list(self.traceback)}


@dataclass(frozen=True)
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
    error: ExecdError | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ExecdRun:
    """The collected outcome of one run: output text, result bundles, count and error."""

    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    execution_count: int | None = None
    error: ExecdError | None = None
    context_id: str | None = None

    def add(self, event: Event) -> None:
        """Fold one event into the execution (the first error wins)."""
        if event.type == "stdout":
            self.stdout += event.text or ""
        elif event.type == "stderr":
            self.stderr += event.text or ""
        elif event.type in ("result", "display_data") and event.data is not None:
            self.results.append(event.data)
        elif event.type == "execution_count" and event.execution_count is not None:
            self.execution_count = event.execution_count
        elif event.type == "error" and event.error is not None and self.error is None:
            self.error = event.error
        elif event.type == "init" and event.text:
            self.context_id = event.text


def parse_line(line: str | bytes) -> dict[str, Any] | None:
    """Return the JSON object carried by one stream line, or None for blank, control and junk lines."""
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
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def as_int(value: Any) -> int | None:
    """Return ``value`` as an int (also from a numeric string), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _mime_bundle(obj: dict[str, Any]) -> dict[str, Any]:
    bundle = obj.get("results")
    if not isinstance(bundle, dict):
        bundle = obj.get("data") if isinstance(obj.get("data"), dict) else None
    if bundle is None:
        bundle = {k: v for k, v in obj.items() if "/" in k}
    bundle = dict(bundle)
    if "text" in bundle and "text/plain" not in bundle:
        bundle["text/plain"] = bundle.pop("text")
    return bundle


def _pick(obj: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in obj and obj[key] is not None:
            return obj[key]
    return None


def _error(obj: dict[str, Any]) -> ExecdError:
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
    return ExecdError(
        name="Error" if name is None else str(name),
        value="" if value is None else str(value),
        traceback=[str(line) for line in traceback],
    )


def to_event(obj: dict[str, Any]) -> Event | None:
    """Normalise one decoded JSON object into an :class:`Event` (None when it carries nothing)."""
    kind = obj.get("type")
    if kind is None and "code" in obj and "message" in obj:
        return Event(type="error", error=_error(obj), raw=obj)
    if not isinstance(kind, str):
        return None
    if kind in ("stdout", "stderr", "init", "status"):
        text = obj.get("text")
        return Event(type=kind, text="" if text is None else str(text), raw=obj)
    if kind in ("result", "display_data", "execute_result"):
        return Event(type="display_data" if kind == "display_data" else "result", data=_mime_bundle(obj), raw=obj)
    if kind == "execution_count":
        count = as_int(obj.get("execution_count"))
        return Event(type=kind, execution_count=count, raw=obj) if count is not None else None
    if kind == "error":
        return Event(type=kind, error=_error(obj), raw=obj)
    return Event(type=kind, raw=obj)


def parse_event(line: str | bytes) -> Event | None:
    """Parse one stream line into an :class:`Event` (None for lines that carry no event)."""
    obj = parse_line(line)
    return None if obj is None else to_event(obj)


def parse_lines(lines: Iterable[str | bytes]) -> ExecdRun:
    """Collect a whole stream, given as lines, into an :class:`ExecdRun`."""
    execution = ExecdRun()
    for line in lines:
        event = parse_event(line)
        if event is not None:
            execution.add(event)
    return execution
