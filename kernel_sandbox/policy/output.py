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

import re
from collections.abc import Iterable
from typing import Any, Literal

from ..canonical import (
    Message,
    canonical_content,
    canonical_message,
    canonical_output,
    joined_text,
)
from ..errors import ConfigError
from .sanitizers import SANITIZERS, defuse_tex, same_if_equal
from .text import STREAMS_KEPT, Stream, defuse_autolinks, defuse_urls
from .vega import embed_options, is_number, vega_spec
from .widgets import STANDARD_WIDGET_MODULES, Widgets, widget_view


__all__ = [
    "MODES",
    "PASSED_MIME_TYPES",
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

_VEGA_TYPES = frozenset(t for t in PASSED_MIME_TYPES if ".vega" in t)
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_JSON_TYPES = frozenset(
    {"application/json", "application/vnd.dataresource+json", "application/vnd.plotly.v1+json"}
)

_DISPLAY_TYPES = frozenset({"display_data", "update_display_data", "execute_result"})
#: The message types ``trusted`` inspects too: display outputs (marked) and the replies whose
#: fields act on the server or the user's notebook, not in the browser's page.
TRUSTED_TYPES = _DISPLAY_TYPES | {"kernel_info_reply", "execute_reply"}


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
        self._widgets = Widgets(self.widget_modules, self._outputs)
        self._streams: dict[str | None, Stream] = {}

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
            return self._widgets.message(msg_type, content)
        if msg_type == "execute_reply":
            return self._execute_reply(self._error(content))
        if msg_type == "inspect_reply":
            return self._bundle_message(self._error(content))
        if msg_type == "kernel_info_reply":
            return _replies(msg_type, self._error(content), self.help_links)
        if msg_type in {"debug_reply", "debug_event"}:
            return self._debug(content)
        if msg_type == "input_request":
            return {**content, "prompt": defuse_autolinks(content["prompt"])}
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
            return widget_view(value)
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
                return same_if_equal(value, defuse_tex(defuse_urls(value)))
            return defuse_autolinks(value)
        clean = SANITIZERS.get(mime)
        if clean is None:
            return None
        cleaned = clean(value) if mime == "image/svg+xml" else defuse_tex(clean(value))
        return same_if_equal(value, cleaned)

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
            k: defuse_autolinks(content[k]) for k in ("ename", "evalue") if k in content
        }
        if "traceback" in content:
            fields["traceback"] = [defuse_autolinks(line) for line in content["traceback"]]
        return {**content, **fields} if fields else content

    def filter_output(self, output: Any) -> dict[str, Any] | None:
        """One nbformat output (as in an Output widget's ``outputs``) as strict lets it through, or
        None."""
        canonical = canonical_output(output)
        if canonical is None:
            return None
        kind = canonical["output_type"]
        if kind == "stream":
            return {**canonical, "text": Stream(canonical["name"]).write(canonical["text"])}
        if kind == "error":
            return self._error(canonical)
        return marked(self._bundle_message(canonical), cleaned=True)

    def _outputs(self, outputs: list[Any]) -> list[dict[str, Any]]:
        """An Output widget's outputs; consecutive streams of one name composed as the frontend
        merges them."""
        kept: list[dict[str, Any]] = []
        stream: Stream | None = None
        for output in map(canonical_output, outputs):
            if output is None:
                continue
            if output["output_type"] != "stream":
                stream = None
                kept.append(self.filter_output(output))  # type: ignore[arg-type]
                continue
            if stream is None or stream.name != output["name"]:
                stream = Stream(output["name"])
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

    def _stream(self, area: str | None, name: str) -> Stream:
        """The stream output a message of stream ``name`` in ``area`` adds to, as the frontend
        merges them."""
        stream = self._streams.get(area)
        if stream is None or stream.name != name:
            if area not in self._streams and len(self._streams) >= STREAMS_KEPT:
                del self._streams[next(iter(self._streams))]
            stream = self._streams[area] = Stream(name)
        return stream


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
            if is_number(mode.get("version")):
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


def _is_web_url(url: Any) -> bool:
    """An absolute http(s) URL with no characters a browser would silently drop."""
    return (
        isinstance(url, str)
        and re.fullmatch(r"https?://[^\s\x00-\x1f\\]+", url, re.IGNORECASE) is not None
    )


def _note(removed: list[str]) -> str:
    kinds = defuse_autolinks(
        ", ".join(kind[:100] for kind in removed[:10]) + (", ..." if len(removed) > 10 else "")
    )
    return (
        f"[kernel-sandbox: output of type {kinds} removed by the strict output policy: it could "
        "run code in your browser. Use output_policy 'trusted' only for code you trust.]"
    )
