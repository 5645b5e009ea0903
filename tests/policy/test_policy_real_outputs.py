"""Real messages of a local ipykernel through the strict policy: the useful parts survive, the hostile ones do not."""

from __future__ import annotations

import copy

import pytest

from kernel_sandbox.policy.output import OutputPolicy

from support.policy_checks import html_problems, untouched

pytestmark = pytest.mark.timeout(180)


def through(policy: OutputPolicy, messages: list[dict]) -> list[tuple[str, dict | None]]:
    """Each message's (msg_type, content as the client sees it), None for dropped messages."""
    out = []
    for msg in messages:
        msg_type = msg["header"]["msg_type"]
        content = policy.filter(msg_type, msg["content"]) if policy.inspects(msg_type) else msg["content"]
        out.append((msg_type, content))
    return out


def test_pandas_table_keeps_its_markup(kernel) -> None:
    run = kernel.run("import pandas as pd\ndf = pd.DataFrame({'city': ['Paris', 'Zürich'], 'n': [1, 2]})\ndf")
    [(_, result)] = [m for m in through(OutputPolicy(), run.of("execute_result"))]
    table = result["data"]["text/html"]
    assert '<table border="1" class="dataframe">' in table
    assert "<th>city</th>" in table and "<td>Zürich</td>" in table and "<td>2</td>" in table
    assert html_problems(table) == []
    assert result["data"]["text/plain"] == run.of("execute_result")[0]["content"]["data"]["text/plain"]


def test_matplotlib_figure_passes_untouched(kernel) -> None:
    run = kernel.run("%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()")
    [figure] = run.of("display_data")
    assert OutputPolicy().filter("display_data", figure["content"])["data"] is figure["content"]["data"]
    assert figure["content"]["data"]["image/png"].startswith("iVBOR")


def test_markdown_latex_and_harmless_html_pass(kernel) -> None:
    run = kernel.run(
        "from IPython.display import display, HTML, Markdown, Math, Latex\n"
        "display(Markdown('# Title\\n**bold**, `a < b` and a [link](https://jupyter.org)'))\n"
        "display(Math(r'\\alpha^2 + \\beta'))\n"
        "display(Latex(r'$\\frac{1}{2}$'))\n"
        "display(HTML('<b>hi</b>'))\n"
    )
    shown = [content for _, content in through(OutputPolicy(), run.of("display_data"))]
    originals = [m["content"] for m in run.of("display_data")]
    assert all(untouched(a, b) for a, b in zip(shown[:3], originals[:3]))
    assert shown[3]["data"]["text/html"] == "<b>hi</b>"


def test_stream_and_errors_pass_untouched(kernel) -> None:
    run = kernel.run("print('see https://jupyter.org', flush=True)\n1/0")
    for msg_type, content in through(OutputPolicy(), run.of("stream", "error")):
        original = next(m["content"] for m in run.iopub if m["header"]["msg_type"] == msg_type)
        assert content is original
    assert run.of("error")[0]["content"]["ename"] == "ZeroDivisionError"


def test_ipywidgets_slider_works_under_strict(kernel) -> None:
    run = kernel.run("import ipywidgets as w\ns = w.IntSlider(value=3, description='n')\ndisplay(s)\ns.value = 5")
    policy = OutputPolicy()
    seen = through(policy, run.iopub)
    for (msg_type, content), original in zip(seen, run.iopub):
        assert untouched(content, original["content"]), msg_type  # nothing of a slider is touched
    [slider] = [c for t, c in seen if t == "comm_open" and c["data"]["state"]["_model_name"] == "IntSliderModel"]
    assert slider["data"]["state"]["value"] == 3
    [view] = [c for t, c in seen if t == "display_data"]
    assert view["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] == slider["comm_id"]
    assert {"method": "update", "state": {"value": 5}, "buffer_paths": []} in [c["data"] for t, c in seen if t == "comm_msg"]


def test_tqdm_notebook_progress_bar_keeps_its_widgets_and_text(kernel) -> None:
    run = kernel.run("from tqdm.notebook import tqdm\nfor i in tqdm(range(3), desc='work'): pass")
    seen = through(OutputPolicy(), run.iopub)
    assert all(untouched(content, original["content"]) for (_, content), original in zip(seen, run.iopub))
    models = {c["data"]["state"]["_model_name"] for t, c in seen if t == "comm_open"}
    assert {"HBoxModel", "FloatProgressModel", "HTMLModel"} <= models
    values = [c["data"]["state"].get("value") for t, c in seen if t == "comm_msg"]
    assert "work:\u2007100%" in values and any(isinstance(v, str) and "3/3" in v for v in values)


def test_widget_with_esm_is_refused_and_says_so(kernel) -> None:
    run = kernel.run(
        "import ipywidgets as w, traitlets as t\n"
        "class Evil(w.DOMWidget):\n"
        "    _model_name = t.Unicode('AnyModel').tag(sync=True)\n"
        "    _model_module = t.Unicode('anywidget').tag(sync=True)\n"
        "    _view_name = t.Unicode('AnyView').tag(sync=True)\n"
        "    _view_module = t.Unicode('anywidget').tag(sync=True)\n"
        "    _esm = t.Unicode(\"export default {render(){fetch('/api/contents/pwned.txt', {method: 'PUT'})}}\").tag(sync=True)\n"
        "    _css = t.Unicode('body{display:none}').tag(sync=True)\n"
        "class Sneaky(w.DOMWidget):\n"
        "    _model_name = t.Unicode('HTMLModel').tag(sync=True)\n"
        "    _model_module = t.Unicode('@jupyter-widgets/controls').tag(sync=True)\n"
        "    _esm = t.Unicode('alert(1)').tag(sync=True)\n"
        "e = Evil(); display(e); e._esm = 'alert(2)'\n"
        "s = Sneaky(); s._esm = 'alert(3)'\n"
    )
    seen = through(OutputPolicy(), run.iopub)
    opens = [c for t, c in seen if t == "comm_open"]
    refused = [c for c in opens if c["data"]["state"]["_model_name"] == "HTMLModel" and "refused" in c["data"]["state"]["value"]]
    assert len(refused) == 2
    assert "not one of the allowed widget modules" in refused[0]["data"]["state"]["value"]
    assert "carries code for the browser (_esm)" in refused[1]["data"]["state"]["value"]
    assert all("_esm" not in c["data"]["state"] and "_css" not in c["data"]["state"] for c in opens)
    ids = {c["comm_id"] for c in refused}
    assert [c for t, c in seen if t == "comm_msg" and c is not None and c["comm_id"] in ids] == []
    assert sum(1 for t, c in seen if t == "comm_msg" and c is None) == 2  # the two `_esm` updates
    # With anywidget's module allowed by the operator, the code still never reaches the browser.
    allowed = through(OutputPolicy(allow_widget_modules=["anywidget"]), run.iopub)
    assert all("_esm" not in c["data"]["state"] for t, c in allowed if t == "comm_open")


def test_html_widgets_and_html_descriptions_are_sanitized(kernel) -> None:
    run = kernel.run(
        "import ipywidgets as w\n"
        "h = w.HTML(value='<b>ok</b><img src=x onerror=alert(1)>')\n"
        "m = w.HTMLMath(value='$x$<svg onload=alert(2)>')\n"
        "c = w.Checkbox(description='<i>fine</i><img src=x onerror=alert(3)>', description_allow_html=True)\n"
        "t = w.Text(description='<img src=x onerror=alert(4)>', value='a < b')\n"
        "h.value = '<a href=\"javascript:alert(5)\">x</a><b>new</b>'\n"
        "t.description_allow_html = True\n"
        "t.value = '<b>typed</b>'\n"
    )
    seen = through(OutputPolicy(), run.iopub)
    states = [c["data"]["state"] for t, c in seen if t in {"comm_open", "comm_msg"} and c and "state" in c.get("data", {})]
    html_fields = [s[k] for s in states for k in ("value", "description") if isinstance(s.get(k), str)]
    as_text = [s for s in states if s.get("description") == "<img src=x onerror=alert(4)>"]
    assert len(as_text) == 1 and as_text[0]["description_allow_html"] is False  # shown as text, so kept as written
    assert all(html_problems(v) == [] for v in html_fields if v != as_text[0]["description"]), html_fields
    assert "<b>ok</b><img>" in html_fields  # a widget's HTML loads no URL: a path is the server's API and "<i>fine</i>" in "".join(html_fields) and "<b>new</b>" in "".join(html_fields)
    assert "a < b" in html_fields and "<b>typed</b>" in html_fields  # a Text widget's value is text, not HTML
    # turning HTML on for an old description sends it again, cleaned
    assert {"description_allow_html": True, "description": "<img>"} in states


def test_output_widget_outputs_go_through_the_mime_policy(kernel) -> None:
    run = kernel.run(
        "import ipywidgets as w\nfrom IPython.display import Javascript, HTML\n"
        "out = w.Output()\n"
        "out.append_display_data(Javascript('alert(1)'))\n"
        "out.append_display_data(HTML('<b>kept</b><img src=x onerror=alert(2)>'))\n"
        "out.append_stdout('plain text')\n"
    )
    seen = through(OutputPolicy(), run.iopub)
    updates = [c["data"]["state"]["outputs"] for t, c in seen if t == "comm_msg" and "outputs" in c["data"]["state"]]
    final = updates[-1]
    assert "application/javascript" not in final[0]["data"] and "removed by the strict output policy" in final[0]["data"]["text/plain"]
    assert final[1]["data"]["text/html"] == '<b>kept</b><img src="x">'
    assert final[2] == {"output_type": "stream", "name": "stdout", "text": "plain text"}


def test_non_widget_comms_pass_untouched_but_widget_messages_on_them_are_policed(kernel) -> None:
    """A frontend may hold any comm id as a widget (restored by id after a page reload): a message with a
    widget's method or state is policed as one, whatever target its comm was opened for."""
    run = kernel.run(
        "import comm\n"
        "c = comm.create_comm(target_name='kernel_sandbox', data={'state': {'_esm': 'x', 'value': '<img src=x onerror=1>'}})\n"
        "c.send({'marker': 'm', 'lengths': [16]}, buffers=[b'\\x00' * 16])\n"
        "c.send({'method': 'update', 'state': {'value': '<img src=x onerror=1>'}, 'buffer_paths': [['value']]}, buffers=[b'\\x00' * 16])\n"
        "c.send({'method': 'update', 'state': {'value': '<img src=x onerror=1>'}, 'buffer_paths': []})\n"
    )
    seen = through(OutputPolicy(), run.iopub)
    comm_messages = [(c, m["content"]) for (t, c), m in zip(seen, run.iopub) if t.startswith("comm_")]
    assert len(comm_messages) == 4
    (opened, opened_original), (answer, answer_original), (buffered, _), (update, _) = comm_messages
    assert opened is opened_original and answer is answer_original  # the tool-call channel's shapes
    assert buffered is None  # a buffer on a checked field
    assert update["data"]["state"] == {"value": "<img>"}


def test_control_comm_full_state_reply_is_checked() -> None:
    policy = OutputPolicy()
    states = {
        "a": {"model_name": "IntSliderModel", "model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0",
              "state": {"_model_name": "IntSliderModel", "_model_module": "@jupyter-widgets/controls", "_view_module": "@jupyter-widgets/controls", "value": 1}},
        "b": {"model_name": "AnyModel", "model_module": "anywidget", "model_module_version": "0.9",
              "state": {"_model_name": "AnyModel", "_model_module": "anywidget", "_esm": "alert(1)"}},
        "c": {"model_name": "HTMLModel", "model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0",
              "state": {"_model_name": "HTMLModel", "_model_module": "@jupyter-widgets/controls", "_view_name": "HTMLView",
                        "_view_module": "@jupyter-widgets/controls", "value": "<img src=x onerror=alert(1)>"}},
    }
    content = {"comm_id": "control", "data": {"method": "update_states", "states": copy.deepcopy(states), "buffer_paths": []}}
    out = policy.filter("comm_msg", content)["data"]["states"]
    assert out["a"] is content["data"]["states"]["a"]
    assert out["b"]["model_name"] == "HTMLModel" and "_esm" not in out["b"]["state"] and "refused" in out["b"]["state"]["value"]
    assert out["c"]["state"]["value"] == "<img>"
    assert policy.filter("comm_msg", {"comm_id": "b", "data": {"method": "update", "state": {"x": 1}}}) is None
    # a buffer meant for a refused widget would land on its note: the reply is dropped whole
    content["data"]["buffer_paths"] = [["b", "state", "blob"]]
    assert OutputPolicy().filter("comm_msg", content) is None


def test_unknown_comm_updates_are_policed_blind() -> None:
    out = OutputPolicy().filter("comm_msg", {"comm_id": "never-opened", "data": {
        "method": "update", "state": {"_esm": "alert(1)", "_view_name": "HTMLView", "value": "<img src=x onerror=alert(1)>"}, "buffer_paths": []}})
    assert out["data"]["state"] == {"value": "<img>"}
    out = OutputPolicy().filter("comm_msg", {"comm_id": "never-opened", "data": {
        "method": "update", "state": {"description": "<b onclick=alert(1)>d</b>"}, "buffer_paths": []}})
    assert out["data"]["state"] == {"description": "<b>d</b>"}


def test_buffers_on_checked_fields_drop_the_message() -> None:
    policy = OutputPolicy()
    opened = {"comm_id": "h", "target_name": "jupyter.widget", "data": {"state": {
        "_model_name": "HTMLModel", "_model_module": "@jupyter-widgets/controls", "_view_module": "@jupyter-widgets/controls",
        "_view_name": "HTMLView", "value": ""}, "buffer_paths": []}}
    assert policy.filter("comm_open", opened) is opened
    assert policy.filter("comm_msg", {"comm_id": "h", "data": {"method": "update", "state": {}, "buffer_paths": [["value"]]}}) is None
    assert policy.filter("comm_msg", {"comm_id": "h", "data": {"method": "update", "state": {}, "buffer_paths": [["_esm"]]}}) is None


def test_real_kernel_replies(kernel) -> None:
    policy = OutputPolicy()
    info = kernel.request("kernel_info")
    assert policy.filter("kernel_info_reply", info["content"]) == {**info["content"], "help_links": []}  # none allowed
    assert info["content"]["help_links"]  # ipykernel's links are all https
    allowed = OutputPolicy(allow_help_links=[link["url"] for link in info["content"]["help_links"]])
    assert allowed.filter("kernel_info_reply", info["content"]) == info["content"]  # its language_info passes
    inspect = kernel.request("inspect", "len", 3)
    assert policy.filter("inspect_reply", inspect["content"]) is inspect["content"]
    run = kernel.run("def f():\n    '''<img src=x onerror=alert(1)> javascript://%0aalert(1)'''\nf?")
    [page] = [p for p in run.reply["content"]["payload"] if p["source"] == "page"]
    shown = policy.filter("execute_reply", run.reply["content"])["payload"][0]
    assert "javascript\u200b://" in shown["data"]["text/plain"] and "<img" in page["data"]["text/plain"]


def test_trusted_passes_every_message_untouched(kernel) -> None:
    run = kernel.run("from IPython.display import Javascript, HTML\ndisplay(Javascript('alert(1)'), HTML('<img src=x onerror=alert(1)>'))")
    policy = OutputPolicy("trusted")
    assert all(untouched(policy.filter(m["header"]["msg_type"], m["content"]), m["content"]) for m in run.iopub)
    assert [policy.inspects(m["header"]["msg_type"]) for m in run.iopub] == [m["header"]["msg_type"] == "display_data" for m in run.iopub]


def test_matplotlib_svg_stays_a_well_formed_drawing(kernel) -> None:
    import xml.etree.ElementTree as ET

    run = kernel.run(
        "%matplotlib inline\n%config InlineBackend.figure_formats = ['svg']\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2], label='line'); plt.title('t'); plt.legend(); plt.show()\n"
        "%config InlineBackend.figure_formats = ['png']"
    )
    [figure] = run.of("display_data")
    original = figure["content"]["data"]["image/svg+xml"]
    cleaned = OutputPolicy().filter("display_data", figure["content"])["data"]["image/svg+xml"]
    root = ET.fromstring(cleaned)  # still XML, as JupyterLab's <img src="data:image/svg+xml,..."> needs
    paths = root.iter("{http://www.w3.org/2000/svg}path")
    assert sum(1 for _ in paths) >= original.count("<path") - 1 > 5
    assert html_problems(cleaned, svg_ids=True) == []


def _debug(kernel, command: str, arguments: dict | None = None) -> dict:
    """One DAP request on the control channel as JupyterLab's debugger sends it; the debug_reply."""
    client = kernel.client
    kernel.seq = getattr(kernel, "seq", 0) + 1
    msg = client.session.msg("debug_request", {"type": "request", "seq": kernel.seq, "command": command, "arguments": arguments or {}})
    client.control_channel.send(msg)
    while (reply := client.get_control_msg(timeout=60))["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
        pass
    return reply


def test_the_debugger_keeps_working_and_its_rich_variables_are_cleaned(kernel) -> None:
    """The JupyterLab debugger's requests through the strict policy: replies unchanged, rich variables cleaned."""
    policy = OutputPolicy()

    def through_policy(reply: dict) -> dict:
        out = policy.filter_message("control", reply["header"], reply["parent_header"], reply["metadata"], reply["content"])
        assert out is not None, reply
        return out[3]

    initialize = _debug(kernel, "initialize", {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path",
                                               "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True})
    assert initialize["content"]["success"], initialize["content"]
    try:
        for reply in (initialize, _debug(kernel, "attach"), _debug(kernel, "debugInfo")):
            assert through_policy(reply) is reply["content"]  # untouched: the debugger sees what the kernel sent
        kernel.run("from IPython.display import HTML\nh = HTML('<b>ok</b><img src=x onerror=alert(1)>')\nn = 42")
        variables = _debug(kernel, "inspectVariables")
        assert through_policy(variables) is variables["content"]
        assert "n" in [v["name"] for v in variables["content"]["body"]["variables"]]
        rich = through_policy(_debug(kernel, "richInspectVariables", {"variableName": "h"}))
        assert rich["success"] and rich["body"]["data"]["text/html"] == '<b>ok</b><img src="x">'
    finally:
        _debug(kernel, "disconnect", {"restart": False, "terminateDebuggee": True})
