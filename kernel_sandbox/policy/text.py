"""URL and text rules: script links, auto-links and terminal escapes defused, streams composed
as the frontend shows them, and the attribute filter shared by the sanitizers."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

# A script URL scheme as a browser reads it: tab, CR and LF are dropped anywhere in a URL, case is
# ignored, and Markdown turns ``\:`` into ``:``. ``data:`` is allowed only for raster images.
_GAP = r"[\t\n\r]*"
SCRIPT_URL = re.compile(
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
ZWSP = "\u200b"


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


def defuse_autolinks(text: str) -> str:
    """Text in which no frontend makes a clickable script link: a zero-width space after each
    scheme, if it had one."""
    if not _has_script_link(text):
        return text
    return _SCHEME_COLON.sub(ZWSP + ":", text)


def compose(index: int, text: str, old: str) -> tuple[str, int]:
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
STREAMS_KEPT = 256  # output areas (parent requests) whose last stream line the policy remembers


@dataclass(slots=True)
class Stream:
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
            composed, cursor = compose(self.cursor, text, self.line)
            if not _has_script_link(composed):
                self._keep(composed, cursor)
                return text
        # Written on a line of its own, as plain lines, its own links broken: it composes with
        # nothing.
        text = defuse_autolinks(text.replace("\r", "\n").replace("\b", ""))
        if self.line or self.lost_head:
            text = "\n" + text
        self._keep(*compose(len(self.line), text, self.line))
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


def defuse_urls(text: str) -> str:
    """Break every script URL in Markdown or LaTeX source, entity-encoded ones included."""
    decoded = text
    for _ in range(3):  # some renderers decode a link's entities twice
        if SCRIPT_URL.search(decoded):
            break
        if decoded == (decoded := html.unescape(decoded)):
            return text
    else:
        return text
    # Entities could spell a scheme the literal text does not show: no "&" may start one.
    return SCRIPT_URL.sub(lambda m: m.group(0) + ZWSP, text.replace("&", "&" + ZWSP))


RASTER_DATA_URL = re.compile(r"data:image/(?:png|jpeg|gif|webp|bmp)[;,]", re.IGNORECASE)


def browser_url(value: str) -> str:
    """A URL as a browser parses it: tab, CR and LF removed, C0 controls and spaces stripped at the
    ends."""
    return re.sub(r"[\t\n\r]", "", value).strip("".join(map(chr, range(33))))


def _is_local(url: str) -> bool:
    """A relative URL of the page itself (no scheme, no host): loads nothing from elsewhere."""
    head = re.split(r"[/?#]", url, maxsplit=1)[0]
    return ":" not in head and not url.startswith(("//", "/\\", "\\"))


LOCAL_REFERENCE = re.compile(r"\s*url\(\s*['\"]?#[\w.:-]+['\"]?\s*\)\s*")
CSS_RISK = re.compile(
    r"expression|url\s*\(|@import|behavior|binding|javascript|\\|/\*", re.IGNORECASE
)


def attribute_filter(tag: str, attribute: str, value: str) -> str | None:
    """Links may go anywhere http(s)/mailto; what loads by itself must be a data image or local."""
    if attribute == "style":
        return None if CSS_RISK.search(value) else value
    if "url(" in value.lower() and not LOCAL_REFERENCE.fullmatch(value):
        return None  # SVG paint, clip-path, mask, filter: only references inside the document
    if attribute == "href" and tag in {"use", "image"} or attribute == "src":
        url = browser_url(value)
        if RASTER_DATA_URL.match(url) or (_is_local(url) if tag != "use" else url.startswith("#")):
            return value
        return None
    if attribute == "href" and browser_url(value).lower().startswith("data:"):
        return None
    return value
