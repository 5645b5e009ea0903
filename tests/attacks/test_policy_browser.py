"""Bypasses of the strict output policy tried in real JupyterLab (headless Chromium).

Each cell, if its payload runs, marks the page (``data-pwned-NAME`` on <body>) and writes
``pwned-NAME.txt`` on the host through the contents API with the page's ``_xsrf`` cookie.
Nothing but the launcher's relay, which applies the policy, stands between kernel and page.
"""

from __future__ import annotations

import pytest

from lab_kit import ARTIFACTS, recording_page
from test_policy_jupyterlab import HOSTILE_CELLS, _attack, put_notebook, run_all_cells, script_traces

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
