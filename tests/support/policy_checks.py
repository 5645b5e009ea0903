"""Structural checks: parse what the policy let through and look for anything that can run script."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import mistune

# Elements that run script, load documents or change the page (and their mXSS carriers).
FORBIDDEN_ELEMENTS = {
    "script", "iframe", "frame", "frameset", "object", "embed", "applet", "form", "input", "button",
    "base", "meta", "link", "style", "foreignobject", "animate", "set", "handler", "noscript", "template",
    "textarea", "select", "math", "body", "html", "head", "title", "xss", "isindex", "bgsound", "marquee",
    "video", "audio", "source", "feimage",
}
# Attributes that run script, hold a document, or fetch by themselves.
FORBIDDEN_ATTRIBUTES = {"srcdoc", "formaction", "action", "background", "dynsrc", "lowsrc", "srcset", "ping", "data", "id", "name", "class"}
# Attributes a browser treats as URLs.
URL_ATTRIBUTES = {"href", "src", "xlink:href", "action", "formaction", "cite", "poster", "data", "background"}
LOADING = {("img", "src"), ("image", "href"), ("image", "xlink:href"), ("use", "href"), ("use", "xlink:href")}
RASTER = re.compile(r"data:image/(png|jpeg|gif|webp|bmp)[;,]")
SCRIPT_SCHEME = re.compile(r"^(javascript|vbscript|livescript):")


def browser_url(value: str) -> str:
    """A URL as a browser resolves its scheme: C0/space stripped at the ends, tab/CR/LF removed, lowercased."""
    return re.sub(r"[\t\n\r]", "", value).strip("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f ").lower()


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        tag = tag.lower()
        if tag in FORBIDDEN_ELEMENTS:
            self.problems.append(f"element <{tag}>")
        for name, value in attrs:
            name = name.lower()
            value = value or ""
            if name.startswith("on"):
                self.problems.append(f"handler {name} on <{tag}>")
            if name in FORBIDDEN_ATTRIBUTES and not (name == "id" and self._svg_ids) and not self._renderer_class(tag, name, value):
                self.problems.append(f"attribute {name} on <{tag}>")
            if "url(" in value.lower() and not re.fullmatch(r"\s*url\(\s*['\"]?#[\w.:-]+['\"]?\s*\)\s*", value):
                self.problems.append(f"external url() in {name} on <{tag}>: {value!r}")
            if name == "style" and re.search(r"expr|url\s*\(|behavior|binding|@import|position|z-index|\\|/\*", value, re.I):
                self.problems.append(f"style {value!r} on <{tag}>")
            if name in URL_ATTRIBUTES:
                url = browser_url(value)
                if SCRIPT_SCHEME.match(url):
                    self.problems.append(f"script URL in {name} on <{tag}>: {value!r}")
                if url.startswith("data:") and not RASTER.match(url):
                    self.problems.append(f"data URL in {name} on <{tag}>: {value[:40]!r}")
                if self._remote and (tag, name) in LOADING and re.match(r"^([a-z][a-z0-9+.-]*:(?!image/)|//|/\\|\\)", url) and not RASTER.match(url):
                    self.problems.append(f"remote load {name} on <{tag}>: {value!r}")
                if tag == "use" and name.endswith("href") and not url.startswith("#"):
                    self.problems.append(f"<use> of {value!r}")

    handle_startendtag = handle_starttag
    _svg_ids = False
    _remote = True

    @staticmethod
    def _renderer_class(tag: str, name: str, value: str) -> bool:
        """Classes the policy keeps (pandas') or a Markdown renderer adds (code languages)."""
        return name == "class" and (tag, value) == ("table", "dataframe") or (tag == "code" and value.startswith("language-"))


def html_problems(markup: str, *, svg_ids: bool = False, remote: bool = True) -> list[str]:
    """Everything script-capable in ``markup`` (empty when it is safe); ``remote``: remote loads count too."""
    collector = _Collector()
    collector._svg_ids = svg_ids
    collector._remote = remote
    collector.feed(markup)
    collector.close()
    return collector.problems


_markdown = mistune.create_markdown(
    escape=False, renderer=mistune.HTMLRenderer(escape=False, allow_harmful_protocols=True), plugins=["url"],
)


def markdown_problems(source: str) -> list[str]:
    """Render Markdown as a permissive frontend would (raw HTML kept, any link scheme) and check it.

    Remote images written in Markdown syntax (``![](https://...)``) are not counted: strict does
    not block them (docs/security.md, "Output policy"); raw ``<img>`` tags in Markdown are checked as HTML.
    """
    return html_problems(_markdown(source), remote=False) + [
        p for p in html_problems(_raw_html(source)) if p.startswith("remote load")
    ]


def _raw_html(source: str) -> str:
    """The raw HTML of a Markdown source: its tags only, as they are written."""
    return "".join(re.findall(r"<[A-Za-z][^<>]*>", source))


# JupyterLab's web auto-linker (rendermime renderers.ts, ILinker.webLinkRegex).
_CONTROL = "\\u0000-\\u0020\\u007f-\\u009f"
WEB_LINK = re.compile(
    "(?:[a-zA-Z][a-zA-Z0-9+.-]{2,40}://|data:|www\\.)[^\\s" + _CONTROL + '"]{2,}[^\\s' + _CONTROL + "\"'(){}\\[\\],:;.!?]"
)


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def text_problems(text: str) -> list[str]:
    """Links JupyterLab's auto-linker would make from text output that run script when clicked."""
    text = ANSI.sub("", text)  # JupyterLab turns escape codes into spans, then links the text
    return [m.group(0) for m in WEB_LINK.finditer(text) if SCRIPT_SCHEME.match(browser_url(m.group(0)))]


def bundle_problems(data: dict) -> list[str]:
    """Everything script-capable in a MIME bundle: script types, HTML, Markdown, SVG and linked text."""
    problems = [f"script type {mime}" for mime in data if "javascript" in mime]
    problems += html_problems(data.get("text/html", ""))
    problems += markdown_problems(data.get("text/markdown", ""))
    problems += html_problems(data.get("image/svg+xml", ""), svg_ids=True)
    return problems + text_problems(data.get("text/plain", ""))


def unmarked(content: dict) -> dict:
    """A content without the metadata key the policy owns (``kernel_sandbox``: its mark, its notes)."""
    metadata = content.get("metadata")
    if not isinstance(metadata, dict) or "kernel_sandbox" not in metadata:
        return content
    return {**content, "metadata": {k: v for k, v in metadata.items() if k != "kernel_sandbox"}}


def untouched(content: dict | None, original: dict) -> bool:
    """Whether the policy passed ``original`` as it was: the same object, or (a display output) the
    same data with only the frame mark added to its metadata."""
    if content is original or content == original:
        return True
    return (
        content is not None
        and content.get("data") == original.get("data")
        and content["metadata"].get("kernel_sandbox") == {"framed": True}
        and unmarked(content) == {**original, "metadata": original.get("metadata", {})}
    )
