"""No escape through the browser (issue 16): hostile outputs in JupyterLab run no script; benign ones render.

Real JupyterLab in headless Chromium, real Docker kernels, the policy applied by the launcher's
relay and nothing else. Each kernelspec of ``KERNEL_SANDBOX_POLICY_KERNELSPECS`` is tested
(default: ``sandboxed-python`` through its provisioner; ``sandboxed-python-argv``: the same
kernelspec's argv, which JupyterLab runs itself as a client that ignores provisioners does; and
``sandboxed-python-opensandbox`` in websocket mode on the published OpenSandbox server of the
harness in tests/opensandbox/server, whose code-interpreter stand-in has ipywidgets and tqdm)::

    KERNEL_SANDBOX_POLICY_KERNELSPECS=sandboxed-python,OTHER python -m pytest tests/policy/test_policy_jupyterlab.py

Each payload, if it runs, sets ``data-pwned-NAME`` on the page's <body> and PUTs
``pwned-NAME.txt`` through the Jupyter contents API with the page's ``_xsrf`` cookie, as the
attack in the issue did. Debian's chromium through Playwright's ``executable_path``; only 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import html
import os
import time
from typing import Any

import httpx
import pytest

from support.lab import ARTIFACTS, frame_with, in_frames, page_outputs, put_notebook, recording_page, run_all_cells

ARGV_SUFFIX = "-argv"
"""``NAME-argv``: the shipped kernelspec NAME's argv in a kernelspec without a provisioner."""
KERNELSPECS = [
    s for s in os.environ.get(
        "KERNEL_SANDBOX_POLICY_KERNELSPECS",
        f"sandboxed-python,sandboxed-python{ARGV_SUFFIX},sandboxed-python-opensandbox",
    ).split(",") if s
]

# its lab installs the OpenSandbox kernelspec on the published server (policy/conftest.py)
pytestmark = [pytest.mark.docker, pytest.mark.opensandbox_server, pytest.mark.timeout(600)]


def _attack(name: str) -> str:
    """JavaScript that marks the page and writes a file on the host through the contents API."""
    return (
        f"document.body.setAttribute('data-pwned-{name}','1');"
        "var x=(document.cookie.match(/_xsrf=([^;]+)/)||[])[1]||'';"
        f"fetch('/api/contents/pwned-{name}.txt',{{method:'PUT',credentials:'same-origin',"
        "headers:{'Content-Type':'application/json','X-XSRFToken':decodeURIComponent(x)},"
        "body:JSON.stringify({type:'file',format:'text',content:'escaped'})})"
    )


def _display(kind: str, payload: str) -> str:
    return f"from IPython.display import {kind}\n{kind}({payload!r})"


_SRCDOC = html.escape("<script>" + _attack("iframe").replace("document.", "parent.document.").replace("fetch(", "parent.fetch(") + "</script>")
HOSTILE_CELLS = {
    "js": _display("Javascript", _attack("js")),
    "html": _display("HTML", f'<img src=x onerror="{_attack("html")}">'),
    "svg": _display("SVG", f'<svg xmlns="http://www.w3.org/2000/svg" onload="{_attack("svg")}"><script>{_attack("svgscript")}</script></svg>'),
    "md": _display("Markdown", f'<script>{_attack("md")}</script>\n\n<img src=x onerror="{_attack("mdimg")}">\n\n'
                               f'[click-md-link](<javascript:{_attack("mdlink")}>)'),
    "iframe": _display("HTML", f'<iframe srcdoc="{_SRCDOC}"></iframe>'),
    "link": _display("HTML", f'<a href="javascript:{_attack("link")}">click-html-link</a>'),
    "widget": (
        "import ipywidgets as w, traitlets as t\n"
        "class Evil(w.DOMWidget):\n"
        "    _model_name = t.Unicode('AnyModel').tag(sync=True)\n"
        "    _model_module = t.Unicode('anywidget').tag(sync=True)\n"
        "    _view_name = t.Unicode('AnyView').tag(sync=True)\n"
        "    _view_module = t.Unicode('anywidget').tag(sync=True)\n"
        + "    _esm = t.Unicode(%r).tag(sync=True)\n" % ("export default {render() {" + _attack("esm") + "}}")
        + "Evil()"
    ),
    "swap": (
        "from IPython.display import HTML, display\n"
        "h = display(HTML('<b>harmless</b>'), display_id=True)\n"
        + "h.update(HTML(%r))" % ('<img src=x onerror="%s">' % _attack("swap"))
    ),
    "htmlwidget": "import ipywidgets as w\nw.HTML(%r)" % ('<img src=x onerror="%s">' % _attack("hw")),
}
BENIGN_CELLS = {
    "pandas": "import pandas as pd\npd.DataFrame({'city': ['Paris', 'Lyon'], 'n': [1, 2]})",
    "matplotlib": "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()",
    "svg": ("%config InlineBackend.figure_formats = ['svg']\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 3, 2]); plt.title('benign-svg'); plt.show()\n%config InlineBackend.figure_formats = ['png']"),
    "markdown": "from IPython.display import Markdown\nMarkdown('**benign-bold** and `a < b`')",
    "latex": "from IPython.display import Math\nMath(r'\\alpha^2 + \\beta')",
    "html": "from IPython.display import HTML\nHTML('<b>benign-html</b>')",
    "slider": "import ipywidgets as w\nw.IntSlider(value=7, description='benign-slider')",
    # the widgets issue 33's rules must leave working: interact, the Output widget, jslink, FileUpload
    "interact": "from ipywidgets import interact\n@interact(x=(0, 10))\ndef f(x=3):\n    print('benign-interact', x * 2)",
    "output": "import ipywidgets as w\no = w.Output()\nwith o:\n    print('benign-output')\no",
    "jslink": ("import ipywidgets as w\na = w.IntSlider(value=4, description='benign-a')\nb = w.IntText(value=0)\n"
               "w.jslink((a, 'value'), (b, 'value'))\nw.VBox([a, b])"),
    "upload": "import ipywidgets as w\nw.FileUpload(description='benign-upload')",
    "tqdm": "from tqdm.notebook import tqdm\nfor i in tqdm(range(3), desc='benign-tqdm'): pass",
}


def shown(page: Any, panel: Any, selector: str, text: str | None = None, seconds: float = 30) -> int:
    """How many ``selector`` elements (with ``text``) a notebook shows, in its page or in kernel-sandbox-frame's
    frames; waiting up to ``seconds`` for one."""
    deadline = time.monotonic() + seconds
    while True:
        found = panel.locator(selector, has_text=text).count() + in_frames(page, selector, text)
        if found or time.monotonic() >= deadline:
            return found
        page.wait_for_timeout(250)


def script_traces(page: Any, lab: dict, seconds: float) -> tuple[list[str], list[str]]:
    """What a payload that ran left, looked for during ``seconds``: the page's pwned markers and the pwned files written."""
    deadline = time.monotonic() + seconds
    while True:
        markers = page.evaluate("Object.keys(document.body.dataset).filter(k => k.startsWith('pwned'))")
        listing = httpx.get(f"{lab['url']}/api/contents", headers=lab["headers"]).json()["content"]
        written = sorted(item["name"] for item in listing if item["name"].startswith("pwned"))
        if markers or written or time.monotonic() > deadline:
            return markers, written
        page.wait_for_timeout(250)


@pytest.mark.parametrize("kernelspec", KERNELSPECS)
def test_hostile_outputs_run_no_script_and_benign_ones_render(browser, lab, kernelspec: str) -> None:
    if kernelspec in lab["unavailable"]:
        pytest.skip(lab["unavailable"][kernelspec])  # a failure under CI (ci_strict), which prepares the harness
    check_notebook(browser, lab, kernelspec)


def check_notebook(browser, lab: dict, kernelspec: str) -> None:
    """Run the hostile and benign cells in JupyterLab on ``kernelspec``; fail on any sign of script."""
    name = f"policy-{kernelspec}.ipynb"
    put_notebook(lab, name, kernelspec, [*HOSTILE_CELLS.values(), *BENIGN_CELLS.values()])
    with recording_page(browser, f"policy-{kernelspec}-failure.png", height=900, timeout_ms=120_000) as (page, requests):
        panel = run_all_cells(page, lab, kernelspec, name)
        # The benign outputs render (the last cell's progress bar completes last).
        frame_with(page, ".widget-hprogress, .widget-progress", seconds=90)
        frame_with(page, ".widget-html-content", "3/3", seconds=90)
        panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
        # everything renders in kernel-sandbox-frame's frames (tests/attacks/test_frame_browser.py), none in the page
        assert page_outputs(page) == [] and panel.locator(".jupyter-widgets").count() == 0
        assert in_frames(page, "table.dataframe td", "Lyon", seconds=30) == 1
        assert in_frames(page, ".jp-RenderedImage img[src^='data:image/png']", seconds=30) >= 1
        assert in_frames(page, "svg path", seconds=30) >= 1  # the cleaned SVG still draws
        assert in_frames(page, "strong", "benign-bold", seconds=30) == 1
        assert in_frames(page, "b", "benign-html", seconds=30) == 1
        assert in_frames(page, ".jp-RenderedLatex mjx-container", seconds=30) >= 1
        assert in_frames(page, ".widget-slider, .widget-hslider", seconds=30) >= 1
        assert in_frames(page, ".widget-label", "benign-slider", seconds=30) == 1
        assert shown(page, panel, ".jp-OutputArea-output", "benign-interact 6") >= 1
        assert shown(page, panel, ".jp-OutputArea-output", "benign-output") >= 1
        linked = page.evaluate("[...document.querySelectorAll('.widget-text input')].map(i => i.value)")
        for frame in page.frames[1:]:
            linked += frame.evaluate("[...document.querySelectorAll('.widget-text input')].map(i => i.value)")
        assert "4" in linked, linked  # jslink copied the slider's value into the IntText in the browser
        assert shown(page, panel, ".jupyter-widget-file-upload, .widget-upload", "benign-upload") == 1
        # The links would run script when clicked.
        for text in ("click-html-link", "click-md-link"):
            for frame in page.frames:
                link = frame.locator("a", has_text=text)
                if link.count():
                    with contextlib.suppress(Exception):
                        link.first.click(timeout=5_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"policy-{kernelspec}.png"), full_page=True)
        panel.locator(".jp-Cell").last.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"policy-{kernelspec}-benign.png"), full_page=True)
        markers, written = script_traces(page, lab, 5)
        assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written on the host {written}"
    outside = [u for u in requests if not u.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "about:"))]
    assert outside == []
