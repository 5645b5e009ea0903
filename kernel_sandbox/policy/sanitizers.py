"""The HTML, SVG, Markdown and widget-HTML sanitizers (nh3), their tag, attribute and CSS lists, and
the MathJax commands defused."""

from __future__ import annotations

import html
import re
from typing import Any

import nh3

from .text import ZWSP, RASTER_DATA_URL, attribute_filter, browser_url, defuse_urls

_SVG_TAGS = {
    "svg",
    "g",
    "defs",
    "symbol",
    "use",
    "title",
    "desc",
    "metadata",
    "path",
    "rect",
    "circle",
    "ellipse",
    "line",
    "polyline",
    "polygon",
    "text",
    "tspan",
    "textPath",
    "clipPath",
    "mask",
    "pattern",
    "marker",
    "linearGradient",
    "radialGradient",
    "stop",
    "image",
    "filter",
    "feGaussianBlur",
    "feOffset",
    "feBlend",
    "feFlood",
    "feComposite",
    "feMerge",
    "feMergeNode",
    "feColorMatrix",
}
_SVG_PAINT = {
    "fill",
    "fill-opacity",
    "fill-rule",
    "stroke",
    "stroke-width",
    "stroke-opacity",
    "stroke-linecap",
    "stroke-linejoin",
    "stroke-dasharray",
    "stroke-dashoffset",
    "stroke-miterlimit",
    "opacity",
}
"""SVG's paint properties: presentation attributes of its elements and CSS properties alike."""
_SVG_ATTRIBUTES = {
    "id",
    "x",
    "y",
    "x1",
    "y1",
    "x2",
    "y2",
    "cx",
    "cy",
    "r",
    "rx",
    "ry",
    "dx",
    "dy",
    "d",
    "points",
    "width",
    "height",
    "viewBox",
    "preserveAspectRatio",
    "transform",
    *_SVG_PAINT,
    "clip-path",
    "clip-rule",
    "clipPathUnits",
    "mask",
    "font-family",
    "font-size",
    "font-weight",
    "font-style",
    "text-anchor",
    "dominant-baseline",
    "alignment-baseline",
    "letter-spacing",
    "offset",
    "stop-color",
    "stop-opacity",
    "gradientUnits",
    "gradientTransform",
    "patternUnits",
    "patternTransform",
    "markerWidth",
    "markerHeight",
    "refX",
    "refY",
    "orient",
    "markerUnits",
    "href",
    "xlink:href",
    "version",
    "style",
    "stdDeviation",
    "in",
    "in2",
    "result",
    "mode",
    "operator",
    "values",
    "type",
    "flood-color",
    "flood-opacity",
    "filter",
    "vector-effect",
    "visibility",
    "display",
    "color",
    "lengthAdjust",
    "textLength",
    "startOffset",
}
# In HTML, no ids (they clobber `window.<id>`, as JupyterLab's own sanitizer knows) and no classes.
_INLINE_SVG_ATTRIBUTES = _SVG_ATTRIBUTES - {"id"}
# Inline CSS: colours, type, boxes and SVG paint; nothing that positions over the page.
_STYLE_PROPERTIES = {
    "color",
    "background-color",
    "text-align",
    "vertical-align",
    "font-family",
    "font-size",
    "font-weight",
    "font-style",
    "text-decoration",
    "white-space",
    "width",
    "height",
    "max-width",
    "min-width",
    "padding",
    "padding-left",
    "padding-right",
    "padding-top",
    "padding-bottom",
    "margin",
    "margin-left",
    "margin-right",
    "margin-top",
    "margin-bottom",
    "border",
    "border-collapse",
    "border-left",
    "border-right",
    "border-top",
    "border-bottom",
    "border-color",
    "border-width",
    "border-style",
    "line-height",
    "text-indent",
    *_SVG_PAINT,
    "text-anchor",
    "dominant-baseline",
}
_HTML_ATTRIBUTES = {tag: set(attrs) for tag, attrs in nh3.ALLOWED_ATTRIBUTES.items()}
_HTML_ATTRIBUTES["*"] = {"title", "lang", "dir", "align", "style"}
_HTML_ATTRIBUTES["img"] |= {"title"}
_HTML_ATTRIBUTES["table"] |= {"border"}  # pandas' tables
for _tag in _SVG_TAGS:
    _HTML_ATTRIBUTES.setdefault(_tag, set()).update(_INLINE_SVG_ATTRIBUTES)
# Classes: only pandas' own, never JupyterLab's (which could dress an output up as the app's UI).
_CLASSES = {tag: {"dataframe"} for tag in ("table",)}
_COMMON: dict[str, Any] = dict(
    clean_content_tags={"script", "style"},
    url_schemes={"http", "https", "mailto", "data"},
    attribute_filter=attribute_filter,
    filter_style_properties=_STYLE_PROPERTIES,
    strip_comments=True,
    link_rel="noopener noreferrer",
)
_HTML = nh3.Cleaner(
    tags=set(nh3.ALLOWED_TAGS) | _SVG_TAGS,
    attributes=_HTML_ATTRIBUTES,
    allowed_classes=_CLASSES,
    **_COMMON,
)
_SVG = nh3.Cleaner(
    tags=_SVG_TAGS,
    attributes={"*": _SVG_ATTRIBUTES},
    set_tag_attribute_values={
        "svg": {
            "xmlns": "http://www.w3.org/2000/svg",
            "xmlns:xlink": "http://www.w3.org/1999/xlink",
        }
    },
    **_COMMON,
)


def _markdown_attribute_filter(tag: str, attribute: str, value: str) -> str | None:
    # Markdown may split a tag at a blank line: a "<" inside an attribute could start a new tag.
    return (
        None
        if "<" in value or ">" in value or "\n" in value
        else attribute_filter(tag, attribute, value)
    )


_MARKDOWN_HTML = nh3.Cleaner(
    tags=set(nh3.ALLOWED_TAGS) | _SVG_TAGS,
    attributes=_HTML_ATTRIBUTES,
    allowed_classes=_CLASSES,
    **{**_COMMON, "attribute_filter": _markdown_attribute_filter},
)


def _widget_attribute_filter(tag: str, attribute: str, value: str) -> str | None:
    """As for outputs, but what loads by itself may only be a data image: a widget's HTML is
    written into the page of the server's origin, where a path is the server's API."""
    kept = attribute_filter(tag, attribute, value)
    if kept is not None and (attribute == "src" or (attribute == "href" and tag == "image")):
        return kept if RASTER_DATA_URL.match(browser_url(value)) else None
    return kept


_WIDGET_HTML = nh3.Cleaner(
    tags=set(nh3.ALLOWED_TAGS) | _SVG_TAGS,
    attributes=_HTML_ATTRIBUTES,
    allowed_classes=_CLASSES,
    **{**_COMMON, "attribute_filter": _widget_attribute_filter},
)

# MathJax commands that set CSS, classes, ids or data attributes, make links, load extensions or
# fonts (\style{cursor:url(...)} loads a URL; \class{...} dresses math up as the app's UI).
_TEX_COMMAND = re.compile(
    r"\\(?=(?:style|href|class|cssId|data|require|url|unicode|bbox|mmlToken|html)(?![A-Za-z]))"
)
_TEX_URL = re.compile(r"url(?=\s*\()", re.IGNORECASE)


def defuse_tex(text: str) -> str:
    """Text in which MathJax finds none of :data:`_TEX_COMMAND` (each loses its backslash) and no
    CSS ``url(``; entity-encoded ones included (Markdown and HTML decode them before MathJax
    reads the page: then no ``&`` may start an entity)."""
    if "\\" not in text and "&" not in text and "url" not in text.lower():
        return text
    decoded = text
    for _ in range(3 if "&" in text else 0):
        decoded = html.unescape(decoded)
        if decoded != text and (_TEX_COMMAND.search(decoded) or _TEX_URL.search(decoded)):
            text = text.replace("&", "&" + ZWSP)
            break
    while _TEX_COMMAND.search(text):
        text = _TEX_COMMAND.sub(" ", text)
    return _TEX_URL.sub("url" + ZWSP, text)


def sanitize_widget_html(source: str) -> str:
    """A widget's HTML (HTML and HTMLMath values, HTML descriptions): as :func:`sanitize_html`, with
    no URL loaded by itself and no MathJax command that styles, links or loads."""
    return defuse_tex(_WIDGET_HTML.clean(source))


def sanitize_html(source: str) -> str:
    """HTML with no script, event handler, frame, form, style element or script/remote-loading
    URL."""
    return _HTML.clean(source)


def sanitize_svg(source: str) -> str:
    """An SVG document with only drawing elements left (no script, foreignObject, handlers, links
    out)."""
    return _SVG.clean(source).replace("&nbsp;", "&#160;")  # the result is XML, which has no &nbsp;


def sanitize_markdown(source: str) -> str:
    """Markdown whose raw HTML is cleaned like :func:`sanitize_html` and whose links are not
    scripts.

    When cleaning removes nothing, the source is kept as written, so code spans keep their ``<``.
    """
    if "<" in source:
        clean = _MARKDOWN_HTML.clean(source)
        if html.unescape(clean) != html.unescape(source):
            source = clean
    return defuse_urls(source)


SANITIZERS = {
    "text/html": sanitize_html,
    "text/markdown": sanitize_markdown,
    "image/svg+xml": sanitize_svg,
}


def same_if_equal(original: str, cleaned: str) -> str:
    """The original object when cleaning changed nothing, so callers can tell "untouched" by
    identity."""
    return original if cleaned == original else cleaned
