"""The canonical form the strict policy decides on: messages of every shape in, only canonical ones out.

A fuzzer builds kernel messages as a hostile kernel might: lists, dicts and numbers where strings
are usual, protocol 4 types and headers, unknown types, extra keys, script in every text field.
Whatever passes must be canonical: a type allowed on its channel, the policy's protocol version,
only allowed keys of the expected JSON types, and nothing a browser would run.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.security_figures import examples

from kernel_sandbox.canonical import CHANNEL_TYPES, CONTENTS, PROTOCOL_VERSION, _Record
from kernel_sandbox.policy.output import OutputPolicy
from kernel_sandbox.policy.text import compose

from support.policy_checks import bundle_problems, html_problems, text_problems, unmarked

HOSTILE_TEXT = [
    "javascript://%0aalert(document.cookie)", "java", "script://%0aalert(1)", "\r", "\b", "\x1b[0m", "\n",
    "data:text/html,<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "https://jupyter.org/x",
    "url(http://127.0.0.1:1/x)", "XXXXXXXXXXXXXXXXXXXX://%0aalert(1)", "JaVaScRiPt:", "//%0aalert(1)",
]
MIME_TYPES = [
    "text/plain", "text/html", "text/markdown", "image/svg+xml", "image/png", "text/latex", "application/json",
    "application/javascript", "text/javascript", "application/vnd.vegalite.v5+json", "application/vnd.vega.v5+json",
    "application/vnd.jupyter.widget-view+json", "application/x-unknown",
]
MSG_TYPES = [*CONTENTS, "pyout", "pyerr", "pyin", "object_info_reply", "apply_reply", "data_pub", "iopub_welcome", "x"]
KEYS = sorted({k for shape in CONTENTS.values() if isinstance(shape, _Record) for k in shape.fields} | {"data", "x", "source"})

texts = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=12), st.lists(st.sampled_from(HOSTILE_TEXT), max_size=5).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False), texts)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
stringy = st.one_of(texts, st.lists(texts, max_size=4), st.lists(st.lists(texts, max_size=2), max_size=2), st.integers(), json_values)
vega = st.fixed_dictionaries({}, optional={
    "data": st.sampled_from([{"url": "/files/secret.txt"}, {"values": [{"a": 1}]}, [{"name": "t", "url": "/api/contents"}]]),
    "usermeta": st.just({"embedOptions": {"defaultStyle": "body{display:none}", "loader": {"baseURL": "/files/"}}}),
    "mark": st.sampled_from(["bar", {"type": "image", "url": "/files/x.png"}]),
    "encoding": st.just({"href": {"field": "a"}, "url": {"value": "/api/contents/"}, "x": {"field": "a"}}),
    "config": st.just({"background": "url(/files/x)", "font": "serif"}),
    "$schema": st.sampled_from(["https://vega.github.io/schema/vega-lite/v5.json", "/files/x.json"]),
})
bundles = st.dictionaries(st.sampled_from(MIME_TYPES), st.one_of(stringy, vega, st.just({"model_id": ["x"], "x": 1})), max_size=5)
bundle_metadata = st.dictionaries(st.sampled_from(MIME_TYPES), st.one_of(json_values, st.just({"embed_options": {
    "actions": True, "defaultStyle": "*{position:fixed}", "theme": "<x>", "i18n": {"SOURCE_ACTION": "<img src=x onerror=1>"},
    "tooltip": {"sanitize": "x"}, "renderer": "svg"}})), max_size=3)
widget_state = st.fixed_dictionaries({
    "_model_module": st.sampled_from(["@jupyter-widgets/controls", "anywidget", ["@jupyter-widgets/controls"]]),
    "_model_name": st.sampled_from(["HTMLModel", "HTMLMathModel", "LabelModel", "IntSliderModel", "OutputModel"]),
}, optional={k: stringy for k in ("value", "description", "placeholder", "tooltip", "_options_labels", "description_allow_html", "outputs")})
comm_data = st.one_of(
    st.fixed_dictionaries({"state": widget_state}, optional={"buffer_paths": json_values, "method": st.sampled_from(["update", "echo_update"])}),
    json_values,
)
contents = st.dictionaries(st.sampled_from(KEYS), st.one_of(stringy, bundles, comm_data), max_size=6).flatmap(
    lambda base: st.fixed_dictionaries({}, optional={
        "data": st.one_of(bundles, comm_data, texts), "metadata": bundle_metadata, "text": stringy, "name": st.sampled_from(["stdout", "stderr", "stdout", 1]),
        "comm_id": st.sampled_from(["c1", "c2", 3]), "target_name": st.sampled_from(["jupyter.widget", "other"]),
        "traceback": stringy, "status": st.sampled_from(["ok", "error", 1]), "execution_state": st.sampled_from(["idle", 1]),
    }).map(lambda extra: {**base, **extra})
)


def _header_of(msg_type: str) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"msg_id": st.sampled_from(["m1", "m1", "m1", 7]), "msg_type": st.just(msg_type)}, optional={
        "version": st.sampled_from(["4.1", "5.3", "5.3", "5.4", "6.0", "x", 5]), "session": stringy, "x": json_values,
    })


def _channel_of(msg_type: str) -> st.SearchStrategy[str]:
    own = [c for c, types in CHANNEL_TYPES.items() if msg_type in types] or ["iopub"]
    return st.one_of(st.sampled_from(own), st.sampled_from(own), st.sampled_from(own), st.sampled_from(list(CHANNEL_TYPES)))


V4_NAMES = {"execute_result": "pyout", "error": "pyerr", "execute_input": "pyin"}
OUTPUT_TYPES = ["stream", "display_data", "execute_result", "update_display_data", "error", "comm_open", "comm_msg", "execute_reply"]
messages = st.one_of(st.sampled_from(OUTPUT_TYPES), st.sampled_from(MSG_TYPES)).flatmap(lambda msg_type: st.tuples(
    _channel_of(msg_type), _header_of(msg_type) | _header_of(V4_NAMES.get(msg_type, msg_type)),
    st.one_of(st.just({"msg_id": "p"}), json_values), st.one_of(st.just({}), json_values), contents,
))

SCRIPT_TYPES = ("javascript", "ecmascript")


def _walk(value: Any):
    yield value
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _bundle_is_canonical(data: dict, metadata: dict) -> None:
    assert not [m for m in data if any(s in m for s in SCRIPT_TYPES)]
    for mime, value in data.items():
        if mime.startswith(("text/", "image/")):
            assert isinstance(value, str), (mime, value)
        if ".vega" in mime:
            assert isinstance(value, dict)
            keys = {k for k in _walk(value) if isinstance(k, str)}
            assert not keys & {"url", "href", "usermeta", "loader"}, value
            assert metadata[mime] == {"embed_options": metadata[mime]["embed_options"]}
            options = metadata[mime]["embed_options"]
            assert options["actions"] is False and options.keys() <= {"actions", "theme", "renderer", "scaleFactor", "width", "height", "padding", "tooltip"}
            assert isinstance(options.get("tooltip", True), bool)
    assert bundle_problems({m: v for m, v in data.items() if isinstance(v, str)}) == []


def _is_canonical(channel: str, out: tuple) -> None:
    header, parent, metadata, content = out
    json.dumps(out, allow_nan=False)  # JSON all through
    msg_type = header["msg_type"]
    assert msg_type in CHANNEL_TYPES[channel] and header["version"] == PROTOCOL_VERSION
    assert all(isinstance(v, str) for v in header.values()) and isinstance(parent, dict) and isinstance(metadata, dict)
    shape = CONTENTS[msg_type]
    if isinstance(shape, _Record):
        assert content.keys() <= shape.fields.keys(), (msg_type, content.keys())
        assert all(key in content for key in shape.required)
    if msg_type == "stream":
        assert content["name"] in ("stdout", "stderr") and isinstance(content["text"], str)
        assert text_problems(compose(0, content["text"], "")[0]) == []
    if msg_type == "error":
        assert all(isinstance(line, str) for line in content["traceback"]) and text_problems("\n".join(content["traceback"])) == []
    if "data" in content and msg_type not in ("comm_open", "comm_msg", "comm_close"):
        _bundle_is_canonical(content["data"], content.get("metadata", {}))
    if msg_type in ("comm_open", "comm_msg") and isinstance(content.get("data"), dict):
        state = content["data"].get("state")
        if content.get("target_name", "jupyter.widget") == "jupyter.widget" and isinstance(state, dict):
            for key in ("description", "placeholder"):
                assert isinstance(state.get(key, ""), str), (key, state)
            assert state.get("tooltip") is None or isinstance(state["tooltip"], str)
            labels = state.get("_options_labels", [])
            assert isinstance(labels, list) and all(isinstance(label, str) for label in labels)
            if state.get("_model_name") in ("HTMLModel", "HTMLMathModel"):
                assert isinstance(state.get("value", ""), str) and html_problems(state.get("value", "")) == []
            for output in state.get("outputs", []):
                assert output["output_type"] in ("stream", "display_data", "execute_result", "error")


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages)
def test_whatever_the_kernel_sends_what_passes_is_canonical(message) -> None:
    channel, header, parent, metadata, content = message
    original = copy.deepcopy(message)
    out = OutputPolicy().filter_message(channel, header, parent, metadata, content)
    assert (channel, header, parent, metadata, content) == original  # the kernel's message is not changed in place
    if out is not None:
        _is_canonical(channel, out)
        if header["msg_type"] not in ("comm_open", "comm_msg", "comm_close"):  # widgets: decided with the comm's history
            again = OutputPolicy().filter_message(channel, *out)
            # canonical is a fixed point (but for what strict noted it removed: a kernel's note is not kept)
            assert again is not None and unmarked(again[3]) == unmarked(out[3])
            if header["msg_type"] in ("display_data", "update_display_data", "execute_result"):
                assert out[3]["metadata"]["kernel_sandbox"]["framed"] is True


# ---- one by one: what the fuzzer must keep finding ---------------------------------------------


def _header(msg_type: str, version: str | None = "5.3") -> dict:
    return {"msg_id": "m", "msg_type": msg_type, "session": "s", "username": "u", **({"version": version} if version else {})}


@pytest.mark.parametrize("version", [None, "4.1", "4"])
def test_protocol_4_types_are_translated_as_jupyter_client_would_then_cleaned(version) -> None:
    """pyout/pyerr/pyin become execute_result/error/execute_input (jupyter_client's V4toV5), then go through the policy."""
    bundle = {"application/javascript": "fetch('/api/contents/x', {method: 'PUT'})", "text/html": "<img src=x onerror=alert(1)>"}
    out = OutputPolicy().filter_message("iopub", _header("pyout", version), {}, {}, {"data": bundle, "execution_count": 1, "metadata": {}})
    header, _, _, content = out
    assert header["msg_type"] == "execute_result" and header["version"] == PROTOCOL_VERSION
    assert "application/javascript" not in content["data"] and html_problems(content["data"]["text/html"]) == []
    error = OutputPolicy().filter_message("iopub", _header("pyerr", version), {}, {}, {
        "ename": "E", "evalue": "v", "traceback": ["javascript://%0aalert(document.cookie)"]})
    assert error[0]["msg_type"] == "error" and text_problems(error[3]["traceback"][0]) == []
    pyin = OutputPolicy().filter_message("iopub", _header("pyin", version), {}, {}, {"code": "1", "execution_count": 1})
    assert pyin[0]["msg_type"] == "execute_input"
    # a protocol 4 stream's text is in "data": the adapter moves it to "text", so the policy reads it there
    stream = OutputPolicy().filter_message("iopub", _header("stream", version), {}, {}, {"name": "stdout", "data": "javascript://%0aalert(1)"})
    assert text_problems(stream[3]["text"]) == []


@pytest.mark.parametrize("msg_type", ["pyout", "pyerr", "pyin", "object_info_reply", "apply_reply", "x"])
def test_protocol_4_names_in_a_5_header_and_unknown_types_are_dropped(msg_type) -> None:
    assert OutputPolicy().filter_message("iopub", _header(msg_type), {}, {}, {"data": {"text/plain": "x"}}) is None


@pytest.mark.parametrize("version", ["6.0", "x", "", 5, ["5.3"]])
def test_other_protocol_versions_are_dropped(version) -> None:
    header = {**_header("stream"), "version": version}
    assert OutputPolicy().filter_message("iopub", header, {}, {}, {"name": "stdout", "text": "x"}) is None


def test_types_are_allowed_on_their_channel_only() -> None:
    policy = OutputPolicy()
    assert policy.filter_message("shell", _header("display_data"), {}, {}, {"data": {"text/plain": "x"}}) is None
    assert policy.filter_message("iopub", _header("execute_reply"), {}, {}, {"status": "ok"}) is None
    assert policy.filter_message("iopub", _header("input_request"), {}, {}, {"prompt": "x"}) is None
    assert policy.filter_message("stdin", _header("input_request"), {}, {}, {"prompt": "x", "password": False}) is not None


def test_the_header_says_the_policys_protocol_and_odd_parts_become_empty() -> None:
    header, parent, metadata, content = OutputPolicy().filter_message(
        "iopub", {**_header("status", "5.3"), "x": "<script>"}, "not a header", [1], {"execution_state": "idle", "x": 1})
    assert header == {"msg_id": "m", "msg_type": "status", "session": "s", "username": "u", "version": PROTOCOL_VERSION}
    assert parent == {} and metadata == {} and content == {"execution_state": "idle"}


def test_untouched_parts_are_the_same_objects() -> None:
    header = {**_header("status"), "version": PROTOCOL_VERSION}
    parts = (header, {"msg_id": "p"}, {"k": 1}, {"execution_state": "busy"})
    assert all(a is b for a, b in zip(OutputPolicy().filter_message("iopub", *parts), parts))


def test_stream_text_as_a_list_is_joined_then_cleaned() -> None:
    """Finding 6: a ``javascript:`` link split over a list of strings."""
    out = OutputPolicy().filter("stream", {"name": "stdout", "text": ["java", "script:", "//%0aalert(document.cookie)"]})
    assert isinstance(out["text"], str) and text_problems(out["text"]) == [] and out["text"].replace("\u200b", "") == (
        "javascript://%0aalert(document.cookie)")


@pytest.mark.parametrize("parts", [
    ["javas", "cript://%0aalert(document.cookie)"],  # JupyterLab merges consecutive stream messages
    ["XXXXXcript://%0aalert(document.cookie)\rjavas"],  # \r: later text overwrites the line
    ["XXXXXcript://%0aalert(document.cookie)\r", "javas"],  # ...in the next message
    ["javascriptX", "\b://%0aalert(document.cookie)"],  # \b steps back over the X
    ["A" * 70_000 + "cript://%0aalert(1)", "\rjavas"],  # a line longer than the policy keeps
])
def test_stream_text_composed_as_jupyterlab_composes_it_has_no_script_link(parts) -> None:
    policy = OutputPolicy()
    shown = [policy.filter_message("iopub", _header("stream"), {"msg_id": "cell"}, {}, {"name": "stdout", "text": p})[3]["text"] for p in parts]
    text, index = "", 0
    for part in shown:
        text, index = compose(index, part, text)
    assert text_problems(text) == [], shown
    plain = OutputPolicy()  # what is not hostile is not touched
    assert plain.filter("stream", {"name": "stdout", "text": "10%\r20%\rdone, see https://jupyter.org\n"})["text"] == (
        "10%\r20%\rdone, see https://jupyter.org\n")


@pytest.mark.parametrize("value", [
    ["<img src=x onerror=", "alert(document.cookie)>"],  # finding 1: the browser joins a list with commas
    [["<img src=x onerror=alert(1)>"]], {"a": "<img src=x onerror=alert(1)>"}, 5,
])
def test_widget_text_fields_of_another_json_type_are_dropped(value) -> None:
    state = {"_model_module": "@jupyter-widgets/controls", "_model_name": "HTMLModel", "_view_name": "HTMLView",
             "_view_module": "@jupyter-widgets/controls", "value": value, "description": value, "placeholder": value,
             "tooltip": value, "_options_labels": [value]}
    policy = OutputPolicy()
    opened = policy.filter("comm_open", {"comm_id": "c", "target_name": "jupyter.widget", "data": {"state": state, "buffer_paths": []}})
    kept = opened["data"]["state"]
    assert not {"value", "description", "placeholder", "tooltip", "_options_labels"} & kept.keys(), kept
    update = policy.filter("comm_msg", {"comm_id": "c", "data": {"method": "update", "state": {"value": value}, "buffer_paths": []}})
    assert "value" not in update["data"]["state"]
    blind = OutputPolicy().filter("comm_msg", {"comm_id": "d", "data": {"method": "update", "state": {"value": value}}})
    assert isinstance(blind["data"]["state"].get("value", ""), (str, int)) and "onerror" not in str(blind["data"]["state"].get("value", ""))


def test_widget_values_of_other_widgets_keep_their_types() -> None:
    policy = OutputPolicy()
    state = {"_model_module": "@jupyter-widgets/controls", "_model_name": "IntRangeSliderModel", "value": [1, 5], "description": "r"}
    content = {"comm_id": "c", "target_name": "jupyter.widget", "data": {"state": state, "buffer_paths": []}}
    assert policy.filter("comm_open", content) is content


VEGA = "application/vnd.vegalite.v5+json"


def test_vega_specs_load_nothing_and_embed_options_are_inert() -> None:
    """Findings 2-4: data URLs, usermeta's embed options, actions (View Source), defaultStyle."""
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"url": "/files/secret.txt", "format": {"type": "csv"}},
        "usermeta": {"embedOptions": {"defaultStyle": "*{display:none}", "actions": True}},
        "transform": [{"lookup": "a", "from": {"data": {"url": "/api/contents/"}, "key": "a"}}],
        "mark": {"type": "image", "url": "/files/x.png", "href": "javascript:alert(1)"},
        "encoding": {"x": {"field": "a"}, "href": {"field": "a"}, "url": {"field": "a"}},
        "config": {"background": "url(/files/x)", "font": "serif"},
        "loader": {"baseURL": "/files/"}, "layer": [{"data": {"url": "/files/y"}, "mark": "bar"}],
        "datasets": {"d": [{"url": "kept: rows are data"}]},
    }
    options = {"actions": True, "defaultStyle": "body{position:fixed}", "loader": {"baseURL": "/"}, "theme": "dark",
               "renderer": "svg", "i18n": {"SOURCE_ACTION": "<img src=x onerror=1>"}, "tooltip": {"theme": "custom"}, "sourceHeader": "<x>"}
    out = OutputPolicy().filter("display_data", {"data": {VEGA: spec}, "metadata": {VEGA: {"embed_options": options, "x": 1}}})
    kept = out["data"][VEGA]
    assert kept == {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json", "data": {"format": {"type": "csv"}, "values": []},
        "transform": [{"lookup": "a", "from": {"data": {"values": []}, "key": "a"}}], "mark": {"type": "image"},
        "encoding": {"x": {"field": "a"}}, "config": {"font": "serif"}, "layer": [{"data": {"values": []}, "mark": "bar"}],
        "datasets": {"d": [{"url": "kept: rows are data"}]},
    }
    assert out["metadata"][VEGA] == {"embed_options": {"theme": "dark", "renderer": "svg", "actions": False}}
    # no embed_options at all: JupyterLab's default would show the actions
    bare = OutputPolicy().filter("display_data", {"data": {VEGA: {"mark": "bar"}}, "metadata": {}})
    assert bare["metadata"][VEGA] == {"embed_options": {"actions": False}}


def test_vega_expressions_that_reach_the_window_or_a_url_are_dropped() -> None:
    """Signals, event handlers, transforms and tests whose expression names ``event`` (``event.view`` is the window),
    a global, a loading or navigation name, a URL or a computed member go (the handler, transform or condition
    whole, so the spec still parses; a signal keeps its name); ordinary expressions stay."""
    spec = {
        "signals": [
            {"name": "leak", "update": "event.view.fetch('/files/x')"},
            {"name": "nav", "value": 0, "on": [{"events": "click", "update": "window.open('/lab')"},
                                               {"events": "window:mouseup", "update": "datum.a + 1"},
                                               {"events": "mousedown[event.view.fetch('/x')]", "update": "1"}]},
            {"name": "proto", "init": "datum['con' + 'structor']"}, {"name": "ok", "update": "width / 2"},
        ],
        "transform": [{"calculate": "'http://127.0.0.1:1/files/x'", "as": "link"}, {"calculate": "datum['b'] * 2", "as": "c"},
                      {"filter": "datum.url"}, {"filter": "datum.a > 1"}, {"type": "formula", "expr": "__proto__", "as": "d"}],
        "encoding": {"color": {"condition": {"test": "item[k]", "value": "red"}, "value": "blue"},
                     "size": {"condition": {"test": "inrange(datum.x, [0, 10])", "value": 3}}},
        "title": "open the window view",  # text, not an expression
        "data": [{"name": "csv", "values": "a,b\n1,2", "format": {"type": "csv"}},
                 {"name": "t", "on": [{"trigger": "\\u0065vent.view.open('/lab')", "insert": "{}"}, {"trigger": "x", "remove": True}]}],
    }
    out = OutputPolicy().filter("display_data", {"data": {VEGA: spec}, "metadata": {}})["data"][VEGA]
    assert out == {
        "signals": [
            {"name": "leak"},
            {"name": "nav", "value": 0, "on": [{"events": "window:mouseup", "update": "datum.a + 1"}]},
            {"name": "proto"}, {"name": "ok", "update": "width / 2"},
        ],
        "transform": [{"calculate": "datum['b'] * 2", "as": "c"}, {"filter": "datum.a > 1"}],
        "encoding": {"color": {"value": "blue"},
                     "size": {"condition": {"test": "inrange(datum.x, [0, 10])", "value": 3}}},
        "title": "open the window view",
        "data": [{"name": "csv", "values": "a,b\n1,2", "format": {"type": "csv"}}, {"name": "t", "on": [{"trigger": "x", "remove": True}]}],
    }
