"""Vega and Vega-Lite specs rebuilt to load nothing, and vega-embed options reduced to inert
values."""

from __future__ import annotations

import re
from typing import Any

from .text import LOCAL_REFERENCE, SCRIPT_URL, browser_url

#: The keys a Vega or Vega-Lite spec may have at its top: no ``usermeta`` (vega-embed reads its
#: ``embedOptions``, which may name a loader, CSS or a URL of more options), nothing unknown.
VEGA_TOP_KEYS = frozenset(
    {
        "$schema",
        "autosize",
        "background",
        "config",
        "data",
        "datasets",
        "description",
        "encoding",
        "height",
        "mark",
        "name",
        "padding",
        "params",
        "projection",
        "resolve",
        "selection",
        "spacing",
        "title",
        "transform",
        "view",
        "width",
        "layer",
        "facet",
        "spec",
        "repeat",
        "columns",
        "concat",
        "hconcat",
        "vconcat",
        "align",
        "bounds",
        "center",
        "axes",
        "encode",
        "layout",
        "legends",
        "marks",
        "projections",
        "scales",
        "signals",
    }
)
#: A data source may only name or hold its values (no ``url``: the loader would fetch it with the
#: user's cookie from the server, or from anywhere).
VEGA_DATA_KEYS = frozenset(
    {"name", "values", "format", "sequence", "sphere", "graticule", "source", "transform", "on"}
)
_VEGA_SOURCES = frozenset({"name", "values", "sequence", "sphere", "graticule", "source"})
VEGA_FORMAT_KEYS = frozenset(
    {"type", "parse", "property", "feature", "mesh", "delimiter", "header", "filter", "copy"}
)
#: Keys whose value the renderer loads or navigates to: image marks' ``url``, links' ``href``.
_VEGA_LOADING_KEYS = frozenset({"url", "href", "loader", "usermeta"})
#: Keys whose string Vega evaluates as an expression (signals' ``init``/``update``, event handlers,
#: transforms' ``calculate``/``filter``/``expr``, conditions' ``test``, selections'
#: ``toggle``/``clear``, event streams' filters, data triggers).
_VEGA_EXPRESSION_KEYS = frozenset(
    {
        "expr",
        "update",
        "init",
        "signal",
        "calculate",
        "filter",
        "test",
        "toggle",
        "clear",
        "on",
        "events",
        "trigger",
        "insert",
        "remove",
        "modify",
    }
)
#: What lets an expression reach the window, a URL or a loader: ``event`` (a DOM event:
#: ``event.view`` is the window), the page's globals, prototype tricks, loading and navigation
#: names, a URL, or a member access whose key is computed (``datum['con' + 'structor']``), or a
#: backslash (``\u0065vent`` is ``event``). An expression with one is dropped.
_VEGA_REACH = re.compile(
    r"\b(?:event|window|view|document|location|open|href|url|src|top|opener|frames|self|globalThis|constructor|prototype|__\w+__|fetch|eval|Function|import|load|loader|sanitize|postMessage|setTimeout|setInterval|XMLHttpRequest|navigator)\b|//|\\|[\w$)\]]\s*\[(?!\s*(?:\d+|'[^'\\]*'|\"[^\"\\]*\")\s*\])"
)
#: Event streams (``window:mouseup[!event.item]``): their sources are names, their filters
#: expressions.
_VEGA_EVENT_KEYS = frozenset({"on", "events"})
_EVENT_SOURCE = re.compile(r"\b(?:window|view|scope)\s*:")
_VEGA_SCHEMA = re.compile(r"https://vega\.github\.io/schema/vega(?:-lite)?/v[\d.]+(?:\.json)?")
#: vega-embed's options a kernel may set, each of an inert value; ``actions`` is always off (its
#: "View Source" and "Open in Vega Editor" write the kernel's text into a page of the server's
#: origin).
VEGA_THEMES = frozenset(
    {
        "excel",
        "ggplot2",
        "quartz",
        "vox",
        "dark",
        "fivethirtyeight",
        "latimes",
        "urbaninstitute",
        "googlecharts",
        "powerbi",
        "carbonwhite",
        "carbong10",
        "carbong90",
        "carbong100",
    }
)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def embed_options(options: Any) -> dict[str, Any]:
    """vega-embed options reduced to a fixed list of inert values, with ``actions`` off."""
    options = options if isinstance(options, dict) else {}
    kept: dict[str, Any] = {}
    if options.get("theme") in VEGA_THEMES:
        kept["theme"] = options["theme"]
    if options.get("renderer") in ("svg", "canvas"):
        kept["renderer"] = options["renderer"]
    for key in ("scaleFactor", "width", "height"):
        if is_number(options.get(key)):
            kept[key] = options[key]
    padding = options.get("padding")
    if is_number(padding):
        kept["padding"] = padding
    elif isinstance(padding, dict):
        kept["padding"] = {
            k: padding[k] for k in ("top", "bottom", "left", "right") if is_number(padding.get(k))
        }
    if isinstance(options.get("tooltip"), bool):
        kept["tooltip"] = options["tooltip"]
    kept["actions"] = False
    return kept


def _vega_string(value: str) -> bool:
    """A spec string that loads nothing: no CSS ``url(...)`` but a local reference, no script
    URL."""
    lowered = value.lower()
    if "url(" in lowered and not LOCAL_REFERENCE.fullmatch(value):
        return False
    return not SCRIPT_URL.match(browser_url(value))


_GONE = object()
# data rows: drawn as text; nothing loads them once no channel links or loads
_VEGA_ROWS = frozenset({"values", "datasets"})


def _vega_value(value: Any, key: str | None) -> Any:  # noqa: C901
    """A spec's value (under ``key``) with every loading key and unsafe string removed; _GONE to
    remove it."""
    if key in _VEGA_ROWS and not isinstance(value, str):
        # (a string of values is CSV text, or a data trigger's expression: checked as one)
        return value
    if isinstance(value, str):
        expression = _EVENT_SOURCE.sub("", value) if key in _VEGA_EVENT_KEYS else value
        if (key in _VEGA_EXPRESSION_KEYS or key in _VEGA_ROWS) and _VEGA_REACH.search(expression):
            return _GONE
        return value if _vega_string(value) else _GONE
    if isinstance(value, list):
        return [kept for item in value if (kept := _vega_value(item, key)) is not _GONE]
    if not isinstance(value, dict):
        return value
    out = {}
    dropped_expression = False
    for name, item in value.items():
        if name in _VEGA_LOADING_KEYS or (key == "data" and name not in VEGA_DATA_KEYS):
            continue
        if key == "data" and name == "format":
            item = (
                {k: v for k, v in item.items() if k in VEGA_FORMAT_KEYS}
                if isinstance(item, dict)
                else item
            )
        kept = _vega_value(item, name)
        if kept is not _GONE:
            out[name] = kept
        elif name in _VEGA_EXPRESSION_KEYS:
            dropped_expression = True
    if dropped_expression and "name" not in out:
        # a handler, transform, condition or {"signal": ...} without its expression: gone whole; a
        # signal stays
        return _GONE
    if key == "data" and not out.keys() & _VEGA_SOURCES:
        out["values"] = []  # its URL was removed: an empty data set, which Vega draws without error
    return out


def vega_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A Vega or Vega-Lite spec rebuilt from :data:`VEGA_TOP_KEYS`, its data inline only, loading
    nothing, without expressions that could reach the window or a URL."""
    out = {}
    for key, value in spec.items():
        if key == "$schema":
            if isinstance(value, str) and _VEGA_SCHEMA.fullmatch(value):
                out[key] = value
        elif key in VEGA_TOP_KEYS and (kept := _vega_value(value, key)) is not _GONE:
            out[key] = kept
    return out
