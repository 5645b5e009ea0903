"""Bypasses of the strict output policy tried in real JupyterLab (headless Chromium).

Each cell, if its payload runs, marks the page (``data-pwned-NAME`` on <body>) and writes
``pwned-NAME.txt`` on the host through the contents API with the page's ``_xsrf`` cookie.
Nothing but the launcher's relay, which applies the policy, stands between kernel and page.
"""

from __future__ import annotations

import contextlib
import time
from urllib.parse import quote

import httpx
import pytest

from support.lab import ARTIFACTS, frame_with, in_frames, recording_page, wait_for_kernel
from test_policy_jupyterlab import HOSTILE_CELLS, _attack, put_notebook, run_all_cells, script_traces, shown

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

_HTML_STATE = (
    "dict(_model_module='@jupyter-widgets/controls', _model_module_version='2.0.0', _model_name='HTMLModel',"
    " _view_module='@jupyter-widgets/controls', _view_module_version='2.0.0', _view_name='HTMLView',"
    " description='', placeholder='', layout='IPY_MODEL_' + _h.layout.model_id,"
    " style='IPY_MODEL_' + _h.style.model_id, value=%r)"
)


def _img(name: str) -> str:
    return '<img src=x onerror="%s">' % _attack(name)


CELLS = {
    # A frontend link copies a Text widget's (unchecked) value into an HTML widget's value.
    "jsdlink": (
        "import ipywidgets as w\n"
        f"t = w.Text(value={_img('jsdlink')!r})\n"
        "h = w.HTML('<b>harmless</b>')\n"
        "w.jsdlink((t, 'value'), (h, 'value'))\n"
        "h"
    ),
    # A frontend link turns on description_allow_html after the description passed as text
    # (ipywidgets 8 cleans HTML descriptions with JupyterLab's sanitizer, so this one holds there).
    "allowhtml": (
        "import ipywidgets as w\n"
        f"s = w.IntSlider(description={_img('allowhtml')!r})\n"
        "c = w.Checkbox(value=True)\n"
        "w.jsdlink((c, 'value'), (s, 'description_allow_html'))\n"
        "s"
    ),
    # A widget opened with a comm id that is not a string (JupyterLab validates it; other frontends may not).
    "commid": (
        "import ipywidgets as w\n"
        "from IPython.display import display\n"
        "k = get_ipython().kernel\n"
        "_h = w.HTML()\n"
        f"state = {_HTML_STATE % _img('commid')}\n"
        "k.session.send(k.iopub_socket, 'comm_open', {'comm_id': 4242, 'target_name': 'jupyter.widget',"
        " 'data': {'state': state, 'buffer_paths': []}}, metadata={'version': '2.1.0'},"
        " parent=k.get_parent(), ident=k._topic('comm_open'))\n"
        "import time; time.sleep(2)\n"
        "display({'application/vnd.jupyter.widget-view+json': {'model_id': 4242, 'version_major': 2, 'version_minor': 1}}, raw=True)\n"
        "display({'application/vnd.jupyter.widget-view+json': {'model_id': '4242', 'version_major': 2, 'version_minor': 1}}, raw=True)"
    ),
}


def run_cells(browser, lab: dict, kernelspec: str, cells: dict[str, str], name: str) -> tuple[list[str], list[str]]:
    """Run ``cells`` in JupyterLab; return the page markers set and the pwned files written."""
    path = f"{name}.ipynb"
    put_notebook(lab, path, kernelspec, cells.values())
    with recording_page(browser, f"attack-{name}-failed.png", height=900, timeout_ms=120_000) as (page, _):
        panel = run_all_cells(page, lab, name, path)
        panel.locator(".jp-Cell").last.locator(".jp-InputArea-prompt", has_text="[").first.wait_for()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]"
            ".every(p => /\\[\\d+\\]/.test(p.textContent))")
        markers, written = script_traces(page, lab, 8)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"attack-{name}.png"), full_page=True)
        return markers, written


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("trick", list(CELLS))
def test_widget_tricks_run_no_script_in_jupyterlab(browser, lab, trick) -> None:
    """Widget tricks past the strict policy in JupyterLab: a frontend link, a late allow_html, a non-string comm id."""
    markers, written = run_cells(browser, lab, "sandboxed-python", {trick: CELLS[trick]}, f"widget-{trick}")
    assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written on the host {written}"


@pytest.mark.security("attack", "policy")
def test_hostile_outputs_through_the_launcher_run_no_script(browser, lab) -> None:
    """The hostile cells of issue 16 (and the widget tricks) with nothing but the launcher between kernel and page."""
    markers, written = run_cells(browser, lab, "sandboxed-python", {**HOSTILE_CELLS, **CELLS}, "hostile-relay")
    assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written on the host {written}"


# ---- issue 23: the shapes of messages (a list where a string is usual, Vega options, stream rewrites) -----

_VEGA = "application/vnd.vegalite.v5+json"
_CHART = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "mark": "bar",
          "encoding": {"x": {"field": "a", "type": "nominal"}, "y": {"field": "b", "type": "quantitative"}}}
_STYLE_MARK = "kspwnedstyle"
_OVERLAY = ("@import url(/files/vega-style-probe.css); ." + _STYLE_MARK + "{} body::after{content:'';position:fixed;"
            "top:0;left:0;right:0;bottom:0;z-index:99999;background:rgba(255,0,0,.5)}")
_FORGE = (
    "k = get_ipython().kernel\n"
    "def forge(msg_type, content):\n"
    "    k.session.send(k.iopub_socket, k.session.msg(msg_type, content, parent=k.get_parent()), ident=k._topic(msg_type))\n"
)


def _vega(spec: dict, options: dict | None = None) -> str:
    metadata = {_VEGA: {"embed_options": options}} if options is not None else {}
    return f"display({{{_VEGA!r}: {spec!r}, 'text/plain': 'chart'}}, metadata={metadata!r}, raw=True)"


SHAPE_CELLS = {
    # (1) ipywidgets writes String(value) as HTML: a list's string is its items joined by commas.
    "widgetlist": (
        "import ipywidgets as w\nh = w.HTML('<b>harmless</b>')\ndisplay(h)\nimport time; time.sleep(1)\n"
        "h.comm.send({'method': 'update', 'state': {'value': %r}, 'buffer_paths': []})"
        % ['<img src=x onerror="0', _attack("widgetlist") + '">']
    ),
    # (2) a Vega data URL to a file the server serves (read with the user's cookie).
    "vegaurl": _vega({**_CHART, "data": {"url": "vega-secret.csv"}, "usermeta": {"embedOptions": {"defaultStyle": _OVERLAY}}}),
    # (3) the chart's actions ("View Source" writes the spec into a page of the server's origin) and (4) defaultStyle.
    "vegastyle": _vega({**_CHART, "data": {"values": [{"a": "x", "b": 1}]}}, {"defaultStyle": _OVERLAY, "actions": True, "theme": "dark"}),
    # (6) a javascript: link in a stream's text list, and one composed by \r over two messages.
    "listlink": _FORGE + (
        "forge('stream', {'name': 'stdout', 'text': ['java', 'script:', '//%%0a%s']})\n"
        "forge('stream', {'name': 'stdout', 'text': '\\nXXXXXcript://%%0a%s\\r'})\n"
        "forge('stream', {'name': 'stdout', 'text': 'javas'})\n"
    ) % (quote(_attack("listlink"), safe=""), quote(_attack("rewrite"), safe="")),
}


@pytest.mark.security("attack", "policy")
def test_message_shapes_run_no_script_load_no_file_and_cover_nothing(browser, lab) -> None:
    """Findings 1-4 and 6 of issue 23 in JupyterLab, with nothing but the launcher's relay between kernel and page."""
    for name in ("vega-secret.csv", "vega-style-probe.css"):
        put = httpx.put(f"{lab['url']}/api/contents/{name}", headers=lab["headers"],
                        json={"type": "file", "format": "text", "content": "a,b\nsecret,1\n"})
        assert put.status_code in (200, 201), put.text
    put_notebook(lab, "shapes.ipynb", "sandboxed-python", SHAPE_CELLS.values())
    with recording_page(browser, "attack-shapes-failed.png", height=900, timeout_ms=120_000) as (page, requests):
        panel = run_all_cells(page, lab, "shapes", "shapes.ipynb")
        panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]"
            ".every(p => /\\[\\d+\\]/.test(p.textContent))")
        frame_with(page, ".widget-html-content", seconds=90)  # everything shows in kernel-sandbox-frame's frames
        charts = ".vega-embed svg, .vega-embed canvas"  # in the page, or in kernel-sandbox-frame's frames
        deadline = time.monotonic() + 120
        while panel.locator(charts).count() + in_frames(page, charts) < 2 and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert panel.locator(charts).count() + in_frames(page, charts) >= 2, "both charts drew"
        panel.locator(".jp-Cell").last.scroll_into_view_if_needed()  # (JupyterLab renders the cells in view)
        frame_with(page, ".jp-OutputArea-output", "pwned-rewrite")  # the stream text is shown
        markers, written = script_traces(page, lab, 5)
        actions = panel.locator(".vega-embed .vega-actions, .vega-embed details").count()
        actions += in_frames(page, ".vega-embed .vega-actions, .vega-embed details")
        styles = page.evaluate(f"[...document.querySelectorAll('style')].filter(s => s.textContent.includes('{_STYLE_MARK}')).length")
        covered = page.evaluate("getComputedStyle(document.body, '::after').position === 'fixed'")
        links = [href for frame in page.frames
                 for href in frame.evaluate("[...document.querySelectorAll('.jp-OutputArea a, #outputs a')].map(a => a.getAttribute('href') || '')")]
        for frame in page.frames:
            for link in frame.locator("a", has_text="pwned").all():
                with contextlib.suppress(Exception):
                    link.click(timeout=3_000)
        markers += script_traces(page, lab, 2)[0]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "attack-shapes.png"), full_page=True)
    assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written on the host {written}"
    assert [u for u in requests if "vega-secret" in u or "vega-style-probe" in u] == [], "a chart loaded a served file"
    assert actions == 0, "the chart shows vega-embed's actions (View Source)"
    assert styles == 0 and not covered, "the chart's defaultStyle became a page-wide style"
    assert [h for h in links if h.strip().lower().startswith(("javascript", "vbscript", "data:"))] == [], links


# ---- issue 33: a comm id of another target, restored as a widget by a reloaded page ----------------

_REUSE = (
    "import comm, threading, time, ipywidgets as w\n"
    "from IPython.display import display\n"
    "c = comm.create_comm(target_name='not-a-widget')  # JupyterLab has no handler: it ignores the comm\n"
    "h = w.HTML('<b>harmless</b>', comm=c)  # but ipywidgets' full-state reply serves it as an HTML widget\n"
    "display({'application/vnd.jupyter.widget-view+json': {'model_id': c.comm_id, 'version_major': 2,"
    " 'version_minor': 0}, 'text/plain': 'view'}, raw=True)\n"
    "def later():\n"
    "    for _ in range(360):\n"
    "        c.send({'method': 'update', 'state': {'value': %r}, 'buffer_paths': []})\n"
    "        time.sleep(0.5)\n"
    "threading.Thread(target=later, daemon=True).start()\n"
    "try: w.Widget.get_manager_state()  # (makes h's lazy layout and style now: the reply then has them all)\n"
    "except RuntimeError: pass\n"
    "print('reuse-ready')"
) % ('<img src=x onerror="%s">' % _attack("reuse"))


@pytest.mark.security("attack", "policy")
def test_a_comm_id_of_another_target_runs_no_script_after_a_page_reload(browser, lab) -> None:
    """Issue 33: an id first opened for another target was remembered as "not a widget"; after a page reload
    JupyterLab's widget restore made it a widget with no comm_open the policy saw, and its updates passed
    unchecked. Now the restore gets a note for it and its updates are dropped."""
    put_notebook(lab, "reuse.ipynb", "sandboxed-python", [_REUSE])
    with recording_page(browser, "attack-reuse-failed.png", height=900, timeout_ms=120_000) as (page, _):
        panel = run_all_cells(page, lab, "reuse", "reuse.ipynb")
        assert shown(page, panel, ".jp-OutputArea-output", "reuse-ready", seconds=120) >= 1  # in the page or a frame
        page.keyboard.press("Control+s")  # the widget view is saved with the notebook, for the reloaded page
        page.locator(".jp-mod-dirty").first.wait_for(state="detached")
        page.goto(f"{lab['url']}/lab/workspaces/reuse/tree/reuse.ipynb?token={lab['token']}")  # the reload
        panel = page.locator(".jp-NotebookPanel:visible")
        wait_for_kernel(page, panel)
        assert shown(page, panel, ".widget-html-content", "refused", seconds=60) >= 1  # the restore got the note
        markers, written = script_traces(page, lab, 10)  # while the kernel sends its updates
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "attack-reuse.png"), full_page=True)
    assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written on the host {written}"
