"""Widget comms as strict polices them: the standard modules' names, the state of each comm, and
what a widget's state may hold."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .sanitizers import defuse_tex, same_if_equal, sanitize_widget_html
from .text import CSS_RISK

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


def widget_view(value: Any) -> dict[str, Any] | None:
    """A widget view reference: a string model id and integer versions, nothing else."""
    if not isinstance(value, dict) or not isinstance(value.get("model_id"), str):
        return None
    view: dict[str, Any] = {"model_id": value["model_id"]}
    for key in ("version_major", "version_minor"):
        if isinstance(value.get(key), int) and not isinstance(value[key], bool):
            view[key] = value[key]
    return view


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


class Widgets:
    """The widget comms of one kernel connection, as strict polices them.

    ``modules``: the widget modules a kernel may instantiate; ``outputs``: the policy's cleaning of
    an Output widget's outputs.
    """

    def __init__(
        self, modules: frozenset[str], outputs: Callable[[list[Any]], list[dict[str, Any]]]
    ) -> None:
        self.modules = modules
        self._outputs = outputs
        self._comms: dict[str, _Comm] = {}

    # -- widgets ----------------------------------------------------------------------------------

    def message(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any] | None:
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

    def _refusal(self, state: dict[str, Any], buffer_paths: Any, record: _Comm) -> str | None:
        """Why a widget may not be created, or None; fills in what ``record`` must remember."""
        for kind in ("model", "view"):
            module, name = state.get(f"_{kind}_module"), state.get(f"_{kind}_name")
            if kind == "view" and name is None:
                continue  # a widget without a view (a layout, a link)
            if not isinstance(module, str) or module not in self.modules:
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
                or (record.css and isinstance(out[key], str) and CSS_RISK.search(out[key]))
            ):
                del out[key]
            elif isinstance(out[key], str) and key not in _NAME_KEYS:
                out[key] = same_if_equal(out[key], defuse_tex(out[key]))  # views typeset text
        if record.html_value and isinstance(out.get("value"), str):
            out["value"] = same_if_equal(out["value"], sanitize_widget_html(out["value"]))
        if "description_allow_html" in out:
            record.allow_html = out["description_allow_html"] is True
        if isinstance(out.get("description"), str):
            record.description = out["description"]
            if record.allow_html:
                out["description"] = same_if_equal(
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
