"""The output policy: what a sandboxed kernel may make a Jupyter client show or run.

JupyterLab trusts every output produced in the live session: an ``application/javascript``
output, or an ``<img onerror=...>`` in HTML, runs in the user's page with the user's rights on the
Jupyter server (read the ``_xsrf`` cookie, write files, start a terminal). The launcher's relay
therefore passes every kernel→client message through :meth:`OutputPolicy.filter` before a client
sees it, and re-signs what it returns.

Two modes (:data:`MODES`):

* ``strict`` (the default) lets through only what renders without running code the kernel sent:
  an **allow-list** of MIME types (:data:`PASSED_MIME_TYPES`; unknown types are dropped, the list is
  extended with ``allow_mime_types``), HTML / Markdown / SVG cleaned by nh3 (Ammonia), text with
  ``javascript:`` links defused, and widgets of the standard ``@jupyter-widgets/*`` modules only
  (``allow_widget_modules`` adds others), never with ``_esm``/``_css`` code.
* ``trusted`` passes everything unchanged: the kernel's outputs can run any script in the user's
  browser, as with an ordinary local kernel.

One :class:`OutputPolicy` per kernel connection: it remembers the widget comms it has seen.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import nh3

from .canonical import (
    PROTOCOL_VERSION,
    Message,
    canonical_content,
    canonical_message,
    canonical_output,
    joined_text,
)
from .errors import ConfigError

__all__ = [
    "MODES",
    "PASSED_MIME_TYPES",
    "PROTOCOL_VERSION",
    "STANDARD_WIDGET_MODULES",
    "MARK_KEY",
    "OutputPolicy",
    "PolicyMode",
]

PolicyMode = Literal["strict", "trusted"]
MODES: tuple[PolicyMode, ...] = ("strict", "trusted")

#: MIME types strict passes unchanged: data its renderer draws without running kernel code.
PASSED_MIME_TYPES = frozenset(
    {
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/bmp",
        "application/json",
        "application/vnd.dataresource+json",  # pandas table schema
        "application/vnd.plotly.v1+json",
        "application/vnd.vega.v5+json",
        "application/vnd.vega.v4+json",
        "application/vnd.vegalite.v5+json",
        "application/vnd.vegalite.v4+json",
        "application/vnd.vegalite.v3+json",
        "application/vnd.jupyter.widget-view+json",
    }
)
#: Plain text; passed with ``javascript://`` links (which JupyterLab would auto-link) defused.
TEXT_MIME_TYPES = frozenset(
    {"text/plain", "text/latex", "application/vnd.jupyter.stdout", "application/vnd.jupyter.stderr"}
)
#: Widget modules strict lets a kernel instantiate: the ipywidgets controls, nothing else.
STANDARD_WIDGET_MODULES = frozenset(
    {"@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output"}
)

#: The model and view names each standard widget module exports (ipywidgets 8; 7's are a subset):
#: a kernel may name no other (a name the frontend cannot find is written into its error box).
WIDGET_NAMES: dict[str, frozenset[str]] = {
    "@jupyter-widgets/base": frozenset(
        {"DOMWidgetModel", "LayoutModel", "StyleModel", "WidgetModel", "LayoutView", "StyleView"}
    ),
    "@jupyter-widgets/output": frozenset({"OutputModel", "OutputView"}),
    "@jupyter-widgets/controls": frozenset(
        f"{name}Model"
        for name in (
            "Accordion Audio Bool BoundedFloatText BoundedIntText Box Button ButtonStyle Checkbox "
            "CheckboxStyle ColorPicker ColorsInput Combobox ControllerAxis ControllerButton "
            "Controller DOMWidget DatePicker Datetime Description DescriptionStyle DirectionalLink "
            "Dropdown FileUpload FloatLogSlider FloatProgress FloatRangeSlider FloatSlider "
            "FloatText FloatsInput GridBox HBox HTMLMath HTMLMathStyle HTML HTMLStyle Image "
            "IntProgress IntRangeSlider IntSlider IntText IntsInput Label LabelStyle Link "
            "NaiveDatetime NumbersInputBase Password Play ProgressStyle RadioButtons Select "
            "SelectMultiple SelectionRangeSlider SelectionSlider SliderStyle Stack String "
            "StringStyle Tab TagsInputBase TagsInput Text TextStyle Textarea Time ToggleButton "
            "ToggleButtonStyle ToggleButtons ToggleButtonsStyle VBox Valid Video Widget"
        ).split()
    )
    | frozenset(
        f"{name}View"
        for name in (
            "Accordion Audio Box Button Checkbox ColorPicker ColorsInput Combobox ControllerAxis "
            "ControllerButton Controller DatePicker Datetime Dropdown FileUpload FloatLogSlider "
            "FloatRangeSlider FloatSlider FloatText FloatsInput GridBox HBox HTMLMath HTML Image "
            "IntRangeSlider IntSlider IntText IntsInput Label Password Play Progress RadioButtons "
            "SelectMultiple Select SelectionRangeSlider SelectionSlider Stack Tab TagsInput Text "
            "Textarea Time ToggleButton ToggleButtons VBox Valid Video"
        ).split()
    ),
}
#: The fields of the standard widgets that hold bytes (binary buffers): a buffer may land nowhere
#: else on them (FileUpload's ``value`` is a list of files whose ``content`` is bytes).
BINARY_FIELDS: dict[str, frozenset[str]] = {
    "ImageModel": frozenset({"value"}),
    "VideoModel": frozenset({"value"}),
    "AudioModel": frozenset({"value"}),
    "FileUploadModel": frozenset({"value"}),
}
_MEDIA_MODELS = frozenset({"ImageModel", "VideoModel", "AudioModel"})
# A name of a widget class of a module an operator allowed: an identifier, nothing to lay out.
_CLASS_NAME = re.compile(r"[A-Za-z_$][\w$]{0,99}")
# Path parts that reach an object's prototype when the frontend walks a buffer path.
_PROTOTYPE_KEYS = frozenset({"__proto__", "constructor", "prototype"})

_VEGA_TYPES = frozenset(t for t in PASSED_MIME_TYPES if ".vega" in t)
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_JSON_TYPES = frozenset(
    {"application/json", "application/vnd.dataresource+json", "application/vnd.plotly.v1+json"}
)

_DISPLAY_TYPES = frozenset({"display_data", "update_display_data", "execute_result"})
#: The message types ``trusted`` inspects too: display outputs (marked) and the replies whose
#: fields act on the server or the user's notebook, not in the browser's page.
TRUSTED_TYPES = _DISPLAY_TYPES | {"kernel_info_reply", "execute_reply"}

_WIDGET_TARGETS = frozenset({"jupyter.widget", "jupyter.widget.control"})
_NAME_KEYS = frozenset(
    {
        "_model_module",
        "_model_module_version",
        "_model_name",
        "_view_module",
        "_view_module_version",
        "_view_name",
    }
)
_HTML_WIDGETS = frozenset({"HTMLModel", "HTMLMathModel", "HTMLView", "HTMLMathView"})
# Widgets whose value is text (a view may write it into the page); their value must be a string.
_STRING_VALUE_WIDGETS = _HTML_WIDGETS | {
    "LabelModel",
    "TextModel",
    "TextareaModel",
    "PasswordModel",
    "ComboboxModel",
    "LabelView",
    "TextView",
    "TextareaView",
    "PasswordView",
    "ComboboxView",
}
# Text fields of every widget, and lists of text: of any other JSON type they are dropped (a list
# in an HTML sink is joined by the browser with commas, past a check that cleans strings only).
_STRING_FIELDS = frozenset({"description", "placeholder", "tooltip", *_NAME_KEYS})
_STRING_LIST_FIELDS = frozenset({"_options_labels", "tooltips", "icons", "options"})
# Links copy a field of one widget into another in the browser (jslink/jsdlink), past the policy.
_LINKS = {"LinkModel": ("source", "target"), "DirectionalLinkModel": ("target",)}
_MODEL_REFERENCE = "IPY_MODEL_"
# A widget module version as widgets write it ("2.0.0", "^1.5.0", "~0.9.*", "" for any): never a
# path or URL.
_MODULE_VERSION = re.compile(r"(?:[\^~]?\d+(?:\.(?:\d+|\*|x)){0,2}(?:-[0-9A-Za-z.]+)?|\*)?")
_MAX_COMMS = 100_000  # comm ids remembered (closed ones too): past that, no comm opens


# ---- URL and text rules -------------------------------------------------------------------------

# A script URL scheme as a browser reads it: tab, CR and LF are dropped anywhere in a URL, case is
# ignored, and Markdown turns ``\:`` into ``:``. ``data:`` is allowed only for raster images.
_GAP = r"[\t\n\r]*"
_SCRIPT_URL = re.compile(
    "(?:"
    + "|".join(_GAP.join(word) for word in ("javascript", "vbscript", "livescript"))
    + r")"
    + _GAP
    + r"\\?(?=:)"
    + "|"
    + _GAP.join("data")
    + _GAP
    + r"\\?(?=:(?![\t\n\r ]*image/(?:png|jpeg|gif|webp|bmp)[;,]))",
    re.IGNORECASE,
)
# A link JupyterLab's auto-linker (rendermime's ``webLinkRegex``: ``scheme://...``, ``data:...``,
# ``www....``) would make that runs script or opens a document when clicked. Found anywhere (it also
# flags a scheme the auto-linker would read as a longer one): breaking a harmless one costs nothing.
_BAD_LINK = re.compile(
    r"(?:javascript|vbscript|livescript)://|data:(?!image/(?:png|jpeg|gif|webp|bmp)[;,])[^\s\x00-\x20\x7f-\x9f]",
    re.IGNORECASE,
)
# Terminal escape sequences, which JupyterLab turns into spans around the text.
_ANSI = re.compile(r"\x1b(?:\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?|[@-Z\\-_]?)")
_SCHEME_COLON = re.compile(r"(?<=[A-Za-z0-9+.-]):")
_ZWSP = "\u200b"


def _has_script_link(text: str) -> bool:
    """Whether JupyterLab's auto-linker could make a script (or document) link of ``text`` (escape
    codes removed)."""
    if ":" not in text:
        return False
    visible = _ANSI.sub("", text) if "\x1b" in text else text
    lowered = visible.lower()
    # what every such link has (a quick scan first)
    if "script://" not in lowered and "data:" not in lowered:
        return False
    return _BAD_LINK.search(visible) is not None


def _defuse_autolinks(text: str) -> str:
    """Text in which no frontend makes a clickable script link: a zero-width space after each
    scheme, if it had one."""
    if not _has_script_link(text):
        return text
    return _SCHEME_COLON.sub(_ZWSP + ":", text)


def _compose(index: int, text: str, old: str) -> tuple[str, int]:
    """JupyterLab's ``processText`` (outputarea's model): ``text`` written over ``old`` at
    ``index``, as a terminal.

    ``\\r`` returns to the start of the line and later text overwrites it; ``\\b`` steps back; so
    one stream message can rewrite what an earlier one wrote. Returns the new text and cursor.
    """
    start = old.rfind("\n", 0, index) + 1
    done, line, cursor = [old[: start - 1]] if start else [], old[start:], index - start
    for piece in _CONTROL_CHAR.split(text):
        if piece == "\n":
            done.append(line)
            line, cursor = "", 0
        elif piece == "\r":
            cursor = 0
        elif piece == "\b":
            if cursor > 0:
                line, cursor = line[: cursor - 1] + line[cursor + 1 :], cursor - 1
        elif piece:
            line, cursor = line[:cursor] + piece + line[cursor + len(piece) :], cursor + len(piece)
    head = "\n".join(done)
    return (head + "\n" + line if done else line), (len(head) + 1 if done else 0) + cursor


_CONTROL_CHAR = re.compile(r"([\n\b\r])")
# characters of a stream's last line the policy keeps to compose the next message on
_LINE_KEPT = 8 * 1024
_STREAMS_KEPT = 256  # output areas (parent requests) whose last stream line the policy remembers


@dataclass(slots=True)
class _Stream:
    """The last line of an output area's stream output, as JupyterLab holds it, and its cursor."""

    name: str
    line: str = ""
    cursor: int = 0
    # the line was longer than the policy keeps: its start is unknown (cursor -1: so is the cursor)
    lost_head: bool = False

    def write(self, text: str) -> str:
        """``text`` as it may be written here: with no script link in what the frontend composes of
        it."""
        rewrites = "\r" in text or "\b" in text
        # the common case: text written at the cursor, then new lines
        if self.cursor >= 0 and not rewrites:
            head, newline, tail = text.partition("\n")
            first = self.line[: self.cursor] + head + self.line[self.cursor + len(head) :]
            if not _has_script_link(first) and not (newline and _has_script_link(tail)):
                self._keep(
                    first + newline + tail[tail.rfind("\n") + 1 :],
                    self.cursor + len(head) if not newline else -2,
                )
                return text
        elif self.cursor >= 0 and not self.lost_head:
            composed, cursor = _compose(self.cursor, text, self.line)
            if not _has_script_link(composed):
                self._keep(composed, cursor)
                return text
        # Written on a line of its own, as plain lines, its own links broken: it composes with
        # nothing.
        text = _defuse_autolinks(text.replace("\r", "\n").replace("\b", ""))
        if self.line or self.lost_head:
            text = "\n" + text
        self._keep(*_compose(len(self.line), text, self.line))
        return text

    def _keep(self, composed: str, cursor: int) -> None:
        """Remember the last line of ``composed`` and the cursor (-2: at its end)."""
        start = composed.rfind("\n") + 1
        line, cursor = composed[start:], (cursor - start if cursor != -2 else len(composed) - start)
        if start:
            self.lost_head = False
        if len(line) > _LINE_KEPT:
            cut = len(line) - _LINE_KEPT
            # -1: unknown
            line, cursor, self.lost_head = line[cut:], (cursor - cut if cursor >= cut else -1), True
        self.line, self.cursor = line, cursor


def _defuse_urls(text: str) -> str:
    """Break every script URL in Markdown or LaTeX source, entity-encoded ones included."""
    decoded = text
    for _ in range(3):  # some renderers decode a link's entities twice
        if _SCRIPT_URL.search(decoded):
            break
        if decoded == (decoded := html.unescape(decoded)):
            return text
    else:
        return text
    # Entities could spell a scheme the literal text does not show: no "&" may start one.
    return _SCRIPT_URL.sub(lambda m: m.group(0) + _ZWSP, text.replace("&", "&" + _ZWSP))


_RASTER_DATA_URL = re.compile(r"data:image/(?:png|jpeg|gif|webp|bmp)[;,]", re.IGNORECASE)


def _browser_url(value: str) -> str:
    """A URL as a browser parses it: tab, CR and LF removed, C0 controls and spaces stripped at the
    ends."""
    return re.sub(r"[\t\n\r]", "", value).strip("".join(map(chr, range(33))))


def _is_local(url: str) -> bool:
    """A relative URL of the page itself (no scheme, no host): loads nothing from elsewhere."""
    head = re.split(r"[/?#]", url, maxsplit=1)[0]
    return ":" not in head and not url.startswith(("//", "/\\", "\\"))


_LOCAL_REFERENCE = re.compile(r"\s*url\(\s*['\"]?#[\w.:-]+['\"]?\s*\)\s*")
_CSS_RISK = re.compile(
    r"expression|url\s*\(|@import|behavior|binding|javascript|\\|/\*", re.IGNORECASE
)


def _attribute_filter(tag: str, attribute: str, value: str) -> str | None:
    """Links may go anywhere http(s)/mailto; what loads by itself must be a data image or local."""
    if attribute == "style":
        return None if _CSS_RISK.search(value) else value
    if "url(" in value.lower() and not _LOCAL_REFERENCE.fullmatch(value):
        return None  # SVG paint, clip-path, mask, filter: only references inside the document
    if attribute == "href" and tag in {"use", "image"} or attribute == "src":
        url = _browser_url(value)
        if _RASTER_DATA_URL.match(url) or (_is_local(url) if tag != "use" else url.startswith("#")):
            return value
        return None
    if attribute == "href" and _browser_url(value).lower().startswith("data:"):
        return None
    return value


# ---- sanitizers ---------------------------------------------------------------------------------

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
    attribute_filter=_attribute_filter,
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
        else _attribute_filter(tag, attribute, value)
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
    kept = _attribute_filter(tag, attribute, value)
    if kept is not None and (attribute == "src" or (attribute == "href" and tag == "image")):
        return kept if _RASTER_DATA_URL.match(_browser_url(value)) else None
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


def _defuse_tex(text: str) -> str:
    """Text in which MathJax finds none of :data:`_TEX_COMMAND` (each loses its backslash) and no
    CSS ``url(``; entity-encoded ones included (Markdown and HTML decode them before MathJax
    reads the page: then no ``&`` may start an entity)."""
    if "\\" not in text and "&" not in text and "url" not in text.lower():
        return text
    decoded = text
    for _ in range(3 if "&" in text else 0):
        decoded = html.unescape(decoded)
        if decoded != text and (_TEX_COMMAND.search(decoded) or _TEX_URL.search(decoded)):
            text = text.replace("&", "&" + _ZWSP)
            break
    while _TEX_COMMAND.search(text):
        text = _TEX_COMMAND.sub(" ", text)
    return _TEX_URL.sub("url" + _ZWSP, text)


def sanitize_widget_html(source: str) -> str:
    """A widget's HTML (HTML and HTMLMath values, HTML descriptions): as :func:`sanitize_html`, with
    no URL loaded by itself and no MathJax command that styles, links or loads."""
    return _defuse_tex(_WIDGET_HTML.clean(source))


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
    return _defuse_urls(source)


_SANITIZERS = {
    "text/html": sanitize_html,
    "text/markdown": sanitize_markdown,
    "image/svg+xml": sanitize_svg,
}


def _same_if_equal(original: str, cleaned: str) -> str:
    """The original object when cleaning changed nothing, so callers can tell "untouched" by
    identity."""
    return original if cleaned == original else cleaned


# ---- Vega and Vega-Lite ------------------------------------------------------------------------

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


def _number(value: Any) -> bool:
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
        if _number(options.get(key)):
            kept[key] = options[key]
    padding = options.get("padding")
    if _number(padding):
        kept["padding"] = padding
    elif isinstance(padding, dict):
        kept["padding"] = {
            k: padding[k] for k in ("top", "bottom", "left", "right") if _number(padding.get(k))
        }
    if isinstance(options.get("tooltip"), bool):
        kept["tooltip"] = options["tooltip"]
    kept["actions"] = False
    return kept


def _vega_string(value: str) -> bool:
    """A spec string that loads nothing: no CSS ``url(...)`` but a local reference, no script
    URL."""
    lowered = value.lower()
    if "url(" in lowered and not _LOCAL_REFERENCE.fullmatch(value):
        return False
    return not _SCRIPT_URL.match(_browser_url(value))


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


def _widget_view(value: Any) -> dict[str, Any] | None:
    """A widget view reference: a string model id and integer versions, nothing else."""
    if not isinstance(value, dict) or not isinstance(value.get("model_id"), str):
        return None
    view: dict[str, Any] = {"model_id": value["model_id"]}
    for key in ("version_major", "version_minor"):
        if isinstance(value.get(key), int) and not isinstance(value[key], bool):
            view[key] = value[key]
    return view


# ---- the policy ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Comm:
    """What the policy remembers about one comm id (opened for ``target``; ids are never
    reused)."""

    target: str = "jupyter.widget"
    refused: bool = False
    html_value: bool = False
    string_value: bool = False
    output: bool = False
    media: bool = False
    css: bool = False  # a style or layout model: its strings become CSS
    allow_html: bool = False
    description: str | None = None
    link_ends: tuple[str, ...] = ()  # for a link: the fields naming the ends it writes to
    # where binary buffers may land: these fields (None: any field the policy does not check)
    binary: frozenset[str] | None = frozenset()

    @property
    def widget(self) -> bool:
        """Whether the comm was opened as a widget (a model of the widget manager)."""
        return self.target == "jupyter.widget"

    def checked_fields(self) -> set[str]:
        """The fields of this widget the policy checks: nothing may write to them behind its
        back."""
        fields = {"description", "description_allow_html", *_NAME_KEYS}
        if self.html_value:
            fields.add("value")
        if self.output:
            fields.add("outputs")
        if self.media:
            fields.add("format")
        return fields


# A widget comm the policy never saw open (or opened for another target): policed blind, as any
# widget could be.
def _blind() -> _Comm:
    return _Comm(
        html_value=True, output=True, media=True, allow_html=True, link_ends=("source", "target")
    )


class OutputPolicy:
    """Filters the content of every kernel→client message; ``strict`` (default) or ``trusted``.

    ``allow_mime_types`` extends the allow-list of MIME types strict passes unchanged (for a
    renderer you installed that draws data without running the kernel's code);
    ``allow_widget_modules`` adds widget modules (installed JupyterLab extensions) to the
    standard ``@jupyter-widgets/*`` ones; neither has any effect in ``trusted`` mode.
    ``allow_help_links``: the URLs a ``kernel_info_reply`` may put in JupyterLab's Help menu (none
    by default).

    Both modes mark every display output (:data:`MARK_KEY`), rebuild ``language_info``, keep only
    the allowed help links and turn a ``set_next_input`` that would replace the user's cell into
    one that offers a new cell (:data:`TRUSTED_TYPES`).
    """

    def __init__(
        self,
        mode: PolicyMode = "strict",
        *,
        allow_mime_types: Iterable[str] = (),
        allow_widget_modules: Iterable[str] = (),
        allow_help_links: Iterable[str] = (),
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"output_policy must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode: PolicyMode = mode
        self.passed_mime_types = PASSED_MIME_TYPES | frozenset(allow_mime_types)
        self.widget_modules = STANDARD_WIDGET_MODULES | frozenset(allow_widget_modules)
        self.help_links = frozenset(allow_help_links)
        self._comms: dict[str, _Comm] = {}
        self._streams: dict[str | None, _Stream] = {}

    @classmethod
    def from_name(cls, name: str | None, **options: Any) -> OutputPolicy:
        """The policy for an ``output_policy`` option value; ``None`` or ``""`` means ``strict``."""
        if name is not None and not isinstance(name, str):
            raise ConfigError(
                f"output_policy must be a string ({' or '.join(MODES)}), not {type(name).__name__}"
            )
        return cls((name or "strict").strip().lower(), **options)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        extra = sorted(self.passed_mime_types - PASSED_MIME_TYPES) + sorted(
            self.widget_modules - STANDARD_WIDGET_MODULES
        )
        return f"OutputPolicy({self.mode!r}{', extra=' + repr(extra) if extra else ''})"

    def inspects(self, msg_type: str) -> bool:
        """Whether :meth:`filter_message` may change a message of this type: in ``strict``, every
        one.

        Strict decides on the canonical form of every message (its header too), so it skips none;
        ``trusted`` inspects only :data:`TRUSTED_TYPES`, and the relay passes the others' bytes
        unparsed.
        """
        return self.mode != "trusted" or msg_type in TRUSTED_TYPES

    def _trusted(self, msg_type: Any, content: Any) -> Any:
        """What ``trusted`` changes: the mark on display outputs, and the replies of
        :func:`_replies`."""
        if msg_type not in TRUSTED_TYPES or not isinstance(content, dict):
            return content
        if msg_type in _DISPLAY_TYPES:
            return marked(content, cleaned=False)
        return _replies(msg_type, content, self.help_links)

    def filter_message(
        self, channel: str, header: Any, parent: Any, metadata: Any, content: Any
    ) -> Message | None:
        """A kernel message on ``channel`` as a client may see it: ``(header, parent_header,
        metadata, content)`` or None.

        Strict first brings the message to its canonical form
        (:func:`~kernel_sandbox.canonical.canonical_message`: protocol 4 translated as
        jupyter_client would, unknown types dropped, the header at :data:`PROTOCOL_VERSION`, every
        field of the content of its type), then decides on that. Parts left as they were are the
        same objects; ``trusted`` returns them all unchanged.
        """
        if self.mode == "trusted":
            msg_type = header.get("msg_type") if isinstance(header, dict) else None
            return header, parent, metadata, self._trusted(msg_type, content)
        canonical = canonical_message(channel, header, parent, metadata, content)
        if canonical is None:
            return None
        new_header, new_parent, new_metadata, new_content = canonical
        decided = self._decide(new_header["msg_type"], new_content, new_parent.get("msg_id"))
        if decided is None:
            return None
        return (
            header if new_header == header else new_header,
            parent if new_parent == parent else new_parent,
            new_metadata,
            content if decided == content else decided,
        )

    def filter(self, msg_type: str, content: Any) -> dict[str, Any] | None:
        """The content a client may see: ``content`` itself when untouched, a cleaned canonical
        copy, or None.

        None means the message must be dropped: an unknown type, a content without a field its type
        requires, a later message of a refused widget. (:meth:`filter_message` also checks the
        header.)
        """
        if self.mode == "trusted":
            return self._trusted(msg_type, content)
        canonical = canonical_content(msg_type, content)
        decided = None if canonical is None else self._decide(msg_type, canonical)
        if decided is None:
            return None
        return content if decided == content else decided

    def _decide(
        self, msg_type: str, content: dict[str, Any], area: str | None = None
    ) -> dict[str, Any] | None:
        """Clean the values of a canonical content; ``area``: the request whose output area shows
        it."""
        if msg_type in {"display_data", "execute_result", "error", "clear_output"}:
            self._streams.pop(area, None)  # the frontend's next stream output starts afresh
        if msg_type in _DISPLAY_TYPES:
            return marked(self._bundle_message(content), cleaned=True)
        if msg_type == "stream":
            return {**content, "text": self._stream(area, content["name"]).write(content["text"])}
        if msg_type == "error":
            return self._error(content)
        if msg_type in {"comm_open", "comm_msg", "comm_close"}:
            return self._comm(msg_type, content)
        if msg_type == "execute_reply":
            return self._execute_reply(self._error(content))
        if msg_type == "inspect_reply":
            return self._bundle_message(self._error(content))
        if msg_type == "kernel_info_reply":
            return _replies(msg_type, self._error(content), self.help_links)
        if msg_type in {"debug_reply", "debug_event"}:
            return self._debug(content)
        if msg_type == "input_request":
            return {**content, "prompt": _defuse_autolinks(content["prompt"])}
        return self._error(content)

    # -- MIME bundles -----------------------------------------------------------------------------

    def filter_bundle(self, data: Any, metadata: Any = None) -> tuple[dict[str, Any], Any]:
        """A MIME bundle and its metadata as strict lets them through (the same objects when
        untouched)."""
        bundle = data if isinstance(data, dict) else {}
        out: dict[str, Any] = {}
        removed: list[str] = []
        for mime, value in bundle.items():
            kept = self._mime_value(mime, value)
            if kept is None:
                removed.append(str(mime))
            else:
                out[mime] = kept
        meta = self._metadata(out, metadata) if isinstance(metadata, dict) else metadata
        if isinstance(meta, dict) and MARK_KEY in meta:  # the policy's key: never the kernel's
            meta = {k: v for k, v in meta.items() if k != MARK_KEY}
        if removed:
            if set(out) <= {"text/plain"}:
                plain = out.get("text/plain")
                out["text/plain"] = _note(removed) + ("\n" + plain if plain else "")
            listed = [kind[:100] for kind in removed[:10]]
            meta = {
                **(meta if isinstance(meta, dict) else {}),
                MARK_KEY: {"removed": listed, "output_policy": self.mode},
            }
        changed = removed or bundle is not data or any(out[k] is not bundle[k] for k in out)
        return (out if changed else data), meta

    def _mime_value(self, mime: str, value: Any) -> Any:
        """A MIME value of its type's JSON shape, cleaned; None to remove it."""
        if mime in _VEGA_TYPES:
            return vega_spec(value) if isinstance(value, dict) else None
        if mime == _WIDGET_VIEW:
            return _widget_view(value)
        if mime in _JSON_TYPES:
            return value if isinstance(value, (dict, list)) else None
        if mime in self.passed_mime_types and mime not in PASSED_MIME_TYPES:
            return value  # an operator's allow_mime_types: passed as the kernel sent it
        value = joined_text(value)  # nbformat's multi-line strings, as JupyterLab joins them
        if value is None:
            return None
        if mime in self.passed_mime_types:
            return value  # images: base64 text
        if mime in TEXT_MIME_TYPES:
            if mime == "text/latex":
                return _same_if_equal(value, _defuse_tex(_defuse_urls(value)))
            return _defuse_autolinks(value)
        clean = _SANITIZERS.get(mime)
        if clean is None:
            return None
        cleaned = clean(value) if mime == "image/svg+xml" else _defuse_tex(clean(value))
        return _same_if_equal(value, cleaned)

    def _metadata(self, data: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
        """The bundle's metadata; a Vega output's own is its inert ``embed_options`` only (actions
        off)."""
        vega = _VEGA_TYPES.intersection(data)
        if not vega:
            return metadata
        changed = {}
        for mime in vega:
            own = metadata.get(mime)
            options = own.get("embed_options") if isinstance(own, dict) else None
            changed[mime] = {"embed_options": embed_options(options)}
        return {**metadata, **changed}

    def _bundle_message(self, content: dict[str, Any]) -> dict[str, Any]:
        """A canonical content's ``data`` and ``metadata`` (a dict, empty if it had none)
        cleaned."""
        if "data" not in content:
            return content
        data, metadata = self.filter_bundle(content["data"], content.get("metadata", {}))
        if metadata == {} and "metadata" not in content:
            return {**content, "data": data}
        return {**content, "data": data, "metadata": metadata}

    def _error(self, content: dict[str, Any]) -> dict[str, Any]:
        """Error fields (of a canonical content) with their script links defused."""
        fields: dict[str, Any] = {
            k: _defuse_autolinks(content[k]) for k in ("ename", "evalue") if k in content
        }
        if "traceback" in content:
            fields["traceback"] = [_defuse_autolinks(line) for line in content["traceback"]]
        return {**content, **fields} if fields else content

    def filter_output(self, output: Any) -> dict[str, Any] | None:
        """One nbformat output (as in an Output widget's ``outputs``) as strict lets it through, or
        None."""
        canonical = canonical_output(output)
        if canonical is None:
            return None
        kind = canonical["output_type"]
        if kind == "stream":
            return {**canonical, "text": _Stream(canonical["name"]).write(canonical["text"])}
        if kind == "error":
            return self._error(canonical)
        return marked(self._bundle_message(canonical), cleaned=True)

    def _outputs(self, outputs: list[Any]) -> list[dict[str, Any]]:
        """An Output widget's outputs; consecutive streams of one name composed as the frontend
        merges them."""
        kept: list[dict[str, Any]] = []
        stream: _Stream | None = None
        for output in map(canonical_output, outputs):
            if output is None:
                continue
            if output["output_type"] != "stream":
                stream = None
                kept.append(self.filter_output(output))  # type: ignore[arg-type]
                continue
            if stream is None or stream.name != output["name"]:
                stream = _Stream(output["name"])
            kept.append({**output, "text": stream.write(output["text"])})
        return kept

    # -- replies ----------------------------------------------------------------------------------

    def _execute_reply(self, content: dict[str, Any]) -> dict[str, Any]:
        """A "page" payload (`obj?`, `%pdoc`), shown by JupyterLab as a trusted output, and user
        expressions' bundles, cleaned; a next input never replaces the user's cell."""
        out = _replies("execute_reply", content, self.help_links)
        if "payload" in content:
            out["payload"] = [
                self._bundle_message(p) if p["source"] == "page" else p for p in out["payload"]
            ]
        if "user_expressions" in content:
            out["user_expressions"] = {
                k: self._bundle_message(e) for k, e in content["user_expressions"].items()
            }
        return out

    def _debug(self, content: dict[str, Any]) -> dict[str, Any]:
        """A debugger message; richInspectVariables' ``body.data``, which the debugger renders as a
        MIME bundle, cleaned."""
        body = content.get("body")
        if not isinstance(body, dict) or "data" not in body:
            return content
        data, metadata = self.filter_bundle(
            body["data"], body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        )
        return {**content, "body": {**body, "data": data, "metadata": metadata}}

    # -- widgets ----------------------------------------------------------------------------------

    def _comm(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any] | None:
        comm_id = content.get("comm_id")
        data = content.get("data")
        if not isinstance(comm_id, str):
            # the protocol's ids are strings; anything else would escape the records below
            return None
        record = self._comms.get(comm_id)
        if msg_type == "comm_close":
            # The id stays taken (a comm_open reusing it is dropped); a widget's later messages are
            # dropped, another target's pass as before its close (the tool-call channel answers on
            # its id when code in the kernel closed it), widget-shaped ones policed as widgets.
            if record is not None and record.target in _WIDGET_TARGETS:
                self._comms[comm_id] = _Comm(target=record.target, refused=True)
            return content
        # (The canonical form has no target_module: a frontend with require.js would load and run
        # it.)
        if msg_type == "comm_open":
            if record is not None or len(self._comms) >= _MAX_COMMS:
                # an id the frontend may already hold as a widget (restored after a page reload)
                return None
            target = content["target_name"]
            if target not in _WIDGET_TARGETS:
                # e.g. a tool-call channel: never touched
                self._comms[comm_id] = _Comm(target=target)
                return content
            content = {**content, "data": _widget_data(data)}
            if target != "jupyter.widget":
                self._comms[comm_id] = _Comm(target=target)
                return content
            return self._widget_open(comm_id, content, content["data"])
        return self._comm_msg(record, content, data)

    def _comm_msg(
        self, record: _Comm | None, content: dict[str, Any], data: Any
    ) -> dict[str, Any] | None:
        if record is not None and record.refused:
            return None
        if not isinstance(data, dict) or not data.keys() & {"method", "state", "states"}:
            # no widget message (the tool-call channel's): nothing a widget manager applies
            return content if record is None or not record.widget else None
        # Whatever the comm was opened for: a frontend may hold its id as a widget (a page
        # reloaded restores widgets by id), so a widget message is policed as one.
        data = _widget_data(data)
        content = {**content, "data": data}
        method = data.get("method")
        if method == "update_states" and isinstance(data.get("states"), dict):
            return self._update_states(content, data)
        if method not in {"update", "echo_update"} or not isinstance(data.get("state"), dict):
            # custom messages ({"do": "focus"} keeps a widget focused: a keylogger) and anything
            # else a widget manager would act on
            return None
        if record is None or not record.widget:
            record = _blind()
        if self._link_refusal(record.link_ends, data["state"]) is not None:
            return None  # a link pointed (anew) at a field the policy checks
        state = self._widget_state(record, data["state"], update=True)
        if state is None or _buffers_refusal(data.get("buffer_paths"), record) is not None:
            return None
        if state is data["state"]:
            return content
        return {**content, "data": {**data, "state": state}}

    def _widget_open(
        self, comm_id: str, content: dict[str, Any], data: dict[str, Any]
    ) -> dict[str, Any]:
        state = data.get("state")
        record = self._comms[comm_id] = _Comm()
        reason = (
            self._refusal(state, data.get("buffer_paths"), record)
            if isinstance(state, dict)
            else "it has no state"
        )
        if reason is not None:
            record.refused = True
            version = str((content.get("metadata") or {}).get("version", "2"))
            return {**content, "data": {"state": _note_widget(reason, version), "buffer_paths": []}}
        filtered = self._widget_state(record, state, update=False)  # type: ignore[arg-type]
        return content if filtered is state else {**content, "data": {**data, "state": filtered}}

    def _update_states(
        self, content: dict[str, Any], data: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The control comm's full-state reply (JupyterLab asks for it when a page opens), or None.

        A refused widget is replaced by a note; if a binary buffer was meant for one, the reply is
        dropped (its buffers cannot be taken out of the message without shifting the others').
        """
        states = data["states"]
        paths = data.get("buffer_paths") or []
        if not isinstance(paths, list) or not all(
            _buffer_path(p)
            and p[0] in states
            and p[1:2] == ["state"]
            and not any(part in _PROTOTYPE_KEYS for part in p)
            for p in paths
        ):
            return None  # a buffer on no widget's state (["__proto__", ...] on the states)
        out: dict[str, Any] = {}
        for model_id, entry in states.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("state"), dict):
                out[model_id] = entry
                continue
            record = self._comms.get(model_id)
            names = {
                "_model_name": entry.get("model_name"),
                "_model_module": entry.get("model_module"),
                "_model_module_version": entry.get("model_module_version"),
            }
            own = [p for p in paths if p[0] == model_id]
            if record is not None and (record.refused or not record.widget):
                reason: str | None = (
                    "it was refused when it opened"
                    if record.widget
                    else f"its id was opened for {record.target[:100]!r}, not as a widget"
                )
            elif record is None and len(self._comms) >= _MAX_COMMS:
                reason = f"more than {_MAX_COMMS} comms are open"
            else:
                if record is None:
                    record = self._comms[model_id] = _Comm()
                state = {**entry["state"], **names}
                reason = self._refusal(state, [p[2:] for p in own], record)
            if reason is not None:
                if own:
                    return None
                # (an id opened for another target stays that target's, refused as a widget)
                self._comms[model_id] = _Comm(
                    target=record.target if record else "jupyter.widget", refused=True
                )
                out[model_id] = {
                    "model_name": "HTMLModel",
                    "model_module": "@jupyter-widgets/controls",
                    "model_module_version": "2.0.0",
                    "state": _note_widget(reason, "2"),
                }
                continue
            assert record is not None
            filtered = self._widget_state(record, entry["state"], update=False)
            out[model_id] = entry if filtered is entry["state"] else {**entry, "state": filtered}
        if all(out[k] is states[k] for k in states):
            return content
        return {**content, "data": {**data, "states": out}}

    def _stream(self, area: str | None, name: str) -> _Stream:
        """The stream output a message of stream ``name`` in ``area`` adds to, as the frontend
        merges them."""
        stream = self._streams.get(area)
        if stream is None or stream.name != name:
            if area not in self._streams and len(self._streams) >= _STREAMS_KEPT:
                del self._streams[next(iter(self._streams))]
            stream = self._streams[area] = _Stream(name)
        return stream

    def _refusal(self, state: dict[str, Any], buffer_paths: Any, record: _Comm) -> str | None:
        """Why a widget may not be created, or None; fills in what ``record`` must remember."""
        for kind in ("model", "view"):
            module, name = state.get(f"_{kind}_module"), state.get(f"_{kind}_name")
            if kind == "view" and name is None:
                continue  # a widget without a view (a layout, a link)
            if not isinstance(module, str) or module not in self.widget_modules:
                return (
                    f"its {kind} module {str(module)[:100]!r} is not one of the allowed widget "
                    "modules"
                )
            known = WIDGET_NAMES.get(module)
            if not isinstance(name, str) or not (
                name in known if known is not None else _CLASS_NAME.fullmatch(name)
            ):
                return f"its {kind} name is not one that {module} exports"
        for key in ("_model_module_version", "_view_module_version"):
            version = state.get(key)
            if version is not None and not (
                isinstance(version, str) and _MODULE_VERSION.fullmatch(version)
            ):
                return f"its {key} is not a version"
        code = sorted(k for k in state if _is_code_key(k))
        if code:
            return f"it carries code for the browser ({', '.join(code)[:200]})"
        names = {state["_model_name"], state.get("_view_name")}
        record.html_value = bool(names & _HTML_WIDGETS)
        record.string_value = bool(names & _STRING_VALUE_WIDGETS)
        record.output = "OutputModel" in names
        model = state["_model_name"]
        record.media = model in _MEDIA_MODELS
        record.css = model.endswith(("StyleModel", "LayoutModel"))
        record.link_ends = _LINKS.get(model, ())
        record.binary = (
            BINARY_FIELDS.get(model, frozenset())
            if state["_model_module"] in STANDARD_WIDGET_MODULES
            else None
        )
        reason = _buffers_refusal(buffer_paths, record)
        return reason if reason is not None else self._link_refusal(record.link_ends, state)

    def _link_refusal(self, ends: tuple[str, ...], state: dict[str, Any]) -> str | None:
        """Why a link may not write where ``state`` points its ``ends``, or None.

        A link copies values between widgets in the browser, where the policy cannot see them:
        it may write only to widgets the policy has seen, and never to a field it checks.
        """
        for end in ends:
            if end not in state:
                continue
            target = state[end]
            if not (
                isinstance(target, list)
                and len(target) == 2
                and all(isinstance(part, str) for part in target)
            ):
                return f"its {end} is not [widget, field]"
            reference, name = target
            record = self._comms.get(
                reference[len(_MODEL_REFERENCE) :]
                if reference.startswith(_MODEL_REFERENCE)
                else reference
            )
            if record is None or not record.widget or record.refused:
                return f"its {end} is a widget the policy has not let through"
            if name in record.checked_fields() or _is_code_key(name) or record.css:
                return (
                    f"it would write the {name!r} of another widget in the browser, past the policy"
                )
        return None

    def _widget_state(
        self, record: _Comm, state: dict[str, Any], *, update: bool
    ) -> dict[str, Any] | None:
        """A widget state with code keys gone and its HTML, text and outputs cleaned (same object
        if untouched)."""
        out = dict(state)
        for key in list(out):
            if (
                _is_code_key(key)
                or (update and key in _NAME_KEYS)
                or not _field_shape(record, key, out[key])
                # Image/Video/Audio with format "url" load their value as a URL
                or (record.media and key == "format" and out[key] == "url")
                # a style or layout's strings are CSS: no url(), no escapes
                or (record.css and isinstance(out[key], str) and _CSS_RISK.search(out[key]))
            ):
                del out[key]
            elif isinstance(out[key], str) and key not in _NAME_KEYS:
                out[key] = _same_if_equal(out[key], _defuse_tex(out[key]))  # views typeset text
        if record.html_value and isinstance(out.get("value"), str):
            out["value"] = _same_if_equal(out["value"], sanitize_widget_html(out["value"]))
        if "description_allow_html" in out:
            record.allow_html = out["description_allow_html"] is True
        if isinstance(out.get("description"), str):
            record.description = out["description"]
            if record.allow_html:
                out["description"] = _same_if_equal(
                    out["description"], sanitize_widget_html(out["description"])
                )
        elif (
            record.allow_html and "description_allow_html" in out and record.description is not None
        ):
            # HTML turned on for the old text
            out["description"] = sanitize_widget_html(record.description)
        if record.output and isinstance(out.get("outputs"), list):
            out["outputs"] = self._outputs(out["outputs"])
        if out.keys() == state.keys() and all(out[k] is state[k] for k in out):
            return state
        return out


MARK_KEY = "kernel_sandbox"
"""The key of an output's metadata the policy owns: ``{"framed": true}`` on every display output of
a sandboxed kernel (kernel-sandbox-frame frames such outputs whatever kernel the notebook has when
it is opened again), and what strict removed. A kernel's own value for it is never kept."""


def marked(content: dict[str, Any], *, cleaned: bool) -> dict[str, Any]:
    """A display message's content (or a display output) with the policy's mark in its metadata.

    ``cleaned``: strict has removed the kernel's value of :data:`MARK_KEY` (and may have written
    what it removed there, which stays); else whatever the kernel put there is replaced.
    """
    metadata = content.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    own = metadata.get(MARK_KEY) if cleaned else None
    mark = {**(own if isinstance(own, dict) else {}), "framed": True}
    return {**content, "metadata": {**metadata, MARK_KEY: mark}}


#: ``language_info`` fields as the frontends and the server use them: each a short name of its
#: form (the server imports ``nbconvert_exporter`` as an exporter's name: only ``python``).
_LANGUAGE_FIELDS = {
    "name": re.compile(r"[A-Za-z0-9_.+#-]{1,64}"),
    "version": re.compile(r"[A-Za-z0-9_.+-]{0,64}"),
    "mimetype": re.compile(r"[a-z]+/[A-Za-z0-9_.+-]{1,64}"),
    "file_extension": re.compile(r"\.[A-Za-z0-9_+-]{1,16}"),
    "pygments_lexer": re.compile(r"[A-Za-z0-9_+-]{1,64}"),
    "nbconvert_exporter": re.compile(r"python"),
}
_CODEMIRROR_MODE = re.compile(r"[A-Za-z0-9_+-]{1,64}")


def _language_info(value: Any) -> dict[str, Any]:
    """``language_info`` rebuilt from :data:`_LANGUAGE_FIELDS` (a field of another form is
    dropped)."""
    value = value if isinstance(value, dict) else {}
    out: dict[str, Any] = {
        key: value[key]
        for key, form in _LANGUAGE_FIELDS.items()
        if isinstance(value.get(key), str) and form.fullmatch(value[key])
    }
    mode = value.get("codemirror_mode")
    if isinstance(mode, str) and _CODEMIRROR_MODE.fullmatch(mode):
        out["codemirror_mode"] = mode
    elif isinstance(mode, dict) and isinstance(mode.get("name"), str):
        if _CODEMIRROR_MODE.fullmatch(mode["name"]):
            out["codemirror_mode"] = {"name": mode["name"]}
            if _number(mode.get("version")):
                out["codemirror_mode"]["version"] = mode["version"]
    return out


def _replies(msg_type: str, content: dict[str, Any], help_links: frozenset[str]) -> dict[str, Any]:
    """What both modes change in a reply: ``kernel_info_reply``'s ``language_info`` rebuilt and
    help links only those the operator allowed; ``execute_reply``'s next input never replaces the
    user's cell (JupyterLab would rewrite it silently)."""
    if msg_type == "kernel_info_reply":
        links = content.get("help_links")
        kept = [
            link
            for link in (links if isinstance(links, list) else [])
            if isinstance(link, dict) and _is_web_url(link.get("url")) and link["url"] in help_links
        ]
        out = {**content, "help_links": kept}
        if "language_info" in content:
            out["language_info"] = _language_info(content["language_info"])
        return content if out == content else out
    payload = content.get("payload")
    if msg_type != "execute_reply" or not isinstance(payload, list):
        return dict(content)
    return {
        **content,
        "payload": [
            {**p, "replace": False}
            if isinstance(p, dict)
            and p.get("source") == "set_next_input"
            and p.get("replace") is not False
            else p
            for p in payload
        ],
    }


def _has_string(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, list):
        return any(map(_has_string, value))
    return isinstance(value, dict) and any(map(_has_string, value.values()))


def _field_shape(record: _Comm, key: str, value: Any) -> bool:
    """Whether a widget state field has the JSON type its views expect (text fields: strings
    only)."""
    if key in _STRING_FIELDS:
        return isinstance(value, str) or (
            value is None and key not in ("description", "placeholder")
        )
    if key in _STRING_LIST_FIELDS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if key == "value" and (record.string_value or record.html_value):
        # A widget seen opening as a text widget: a string; one never seen (policed blind): no text
        # but a string.
        return isinstance(value, str) or (not record.string_value and not _has_string(value))
    if key == "description_allow_html":
        return isinstance(value, bool)
    if key == "outputs":
        return isinstance(value, list)
    return True


def _buffer_path(path: Any) -> bool:
    return (
        isinstance(path, list)
        and bool(path)
        and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in path)
    )


def _widget_data(data: Any) -> dict[str, Any]:
    """The data of a widget comm message from its allowed keys: method, state(s), buffer paths."""
    data = data if isinstance(data, dict) else {}
    out: dict[str, Any] = {}
    if isinstance(data.get("method"), str):
        out["method"] = data["method"]
    for key in ("state", "states"):
        if isinstance(data.get(key), dict):
            out[key] = data[key]
    if "buffer_paths" in data:
        out["buffer_paths"] = data["buffer_paths"]  # checked whole: dropping one shifts the rest
    return out


def _is_code_key(key: str) -> bool:
    """anywidget's ``_esm``/``_css`` (and similar): source the frontend would load and run."""
    return key.startswith(("_esm", "_css", "_anywidget")) or key in {"_module_url", "_source"}


def _buffers_refusal(buffer_paths: Any, record: _Comm) -> str | None:
    """Why binary buffers may not land where ``buffer_paths`` put them on ``record``'s widget, or
    None.

    Only a widget's own bytes fields take buffers (any field an operator's widget module does
    not have checked), and no path walks into an object's prototype.
    """
    if buffer_paths is None:
        return None
    if not isinstance(buffer_paths, list) or not all(map(_buffer_path, buffer_paths)):
        return "its binary buffer paths are not lists of names and indexes"
    for path in buffer_paths:
        if any(part in _PROTOTYPE_KEYS for part in path):
            return "a binary buffer path reaches an object's prototype"
        field = path[0]
        if not (
            field in record.binary
            if record.binary is not None
            else field not in record.checked_fields() and not _is_code_key(str(field))
        ):
            return f"a binary buffer would replace its {str(field)[:60]!r}, which is not bytes"
    return None


def _is_web_url(url: Any) -> bool:
    """An absolute http(s) URL with no characters a browser would silently drop."""
    return (
        isinstance(url, str)
        and re.fullmatch(r"https?://[^\s\x00-\x1f\\]+", url, re.IGNORECASE) is not None
    )


def _note(removed: list[str]) -> str:
    kinds = _defuse_autolinks(
        ", ".join(kind[:100] for kind in removed[:10]) + (", ..." if len(removed) > 10 else "")
    )
    return (
        f"[kernel-sandbox: output of type {kinds} removed by the strict output policy: it could "
        "run code in your browser. Use output_policy 'trusted' only for code you trust.]"
    )


def _note_widget(reason: str, protocol_version: str) -> dict[str, Any]:
    """The state of an HTML widget that says why the kernel's widget was refused."""
    controls = "2.0.0" if not protocol_version.startswith(("1", "2.0")) else "1.5.0"
    text = html.escape(f"kernel-sandbox: widget refused by the strict output policy: {reason}.")
    return {
        "_model_module": "@jupyter-widgets/controls",
        "_model_module_version": controls,
        "_model_name": "HTMLModel",
        "_view_module": "@jupyter-widgets/controls",
        "_view_module_version": controls,
        "_view_name": "HTMLView",
        "value": f"<em>{text}</em>",
        "description": "",
        "placeholder": "",
    }
