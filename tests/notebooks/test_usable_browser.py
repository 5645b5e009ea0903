"""A sandboxed kernel's framed outputs are as usable as a local kernel's (issue 33): side by side in one JupyterLab.

The same cells run on Local Python (outputs in the page) and Sandboxed Python (outputs in kernel-sandbox-frame's
opaque-origin frames): a DataFrame, a Styler and Markdown look alike (computed styles), in the light and the dark
theme; Ctrl+F finds a word inside a frame; a right-click in a frame opens JupyterLab's output menu; Shift+Enter
and Ctrl+S work after a click in a frame; a Plotly figure draws; charts are saved with a PNG, which nbconvert exports. A hostile frame posting forged text, keys and menus gets no more.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from support.lab import ARTIFACTS, LabServer, click_in_frame, frame_with, in_frames, put_notebook, recording_page, run_all_cells

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

SANDBOXED = "sandboxed-python-trusted"
"""Outputs whole, with their styles and script (the strict policy removes Styler colours): the frame alone is tested."""



def _styler_html() -> str:
    import pandas as pd

    frame = pd.DataFrame({"city": ["Paris", "Lyon"], "n": [1, 2]})
    return frame.style.set_properties(subset=["n"], **{"color": "rgb(200, 0, 0)", "background-color": "rgb(255, 230, 150)"})._repr_html_()


LOOKS = {
    "dataframe": "import pandas as pd\ndf = pd.DataFrame({'city': ['Paris', 'Lyon'], 'n': [1, 2]})\ndf",
    # the HTML a Styler displays, made here (an image built before jinja2 joined it has no DataFrame.style)
    "styler": f"from IPython.display import HTML\nHTML({_styler_html()!r})",
    "markdown": "from IPython.display import Markdown\nMarkdown('# usable-heading\\n\\nsome *usable-em* and `usable-code`')",
}
# what is compared, in the page (local kernel) and in the frame (sandboxed kernel)
ELEMENTS = {
    "td": "table.dataframe tbody td",
    "th": "table.dataframe thead th",
    "row": "table.dataframe tbody tr",
    "styled": "table[id^='T_'] td.col1",
    "h1": "h1",
    "em": "em",
    "code": "code",
}
STYLE = """selector => {
  const element = document.querySelector(selector);
  if (!element) { return null; }
  const s = getComputedStyle(element);
  return {fontFamily: s.fontFamily, fontSize: s.fontSize, fontWeight: s.fontWeight, color: s.color,
          background: s.backgroundColor, border: s.borderBottom, padding: s.padding, align: s.textAlign,
          lineHeight: s.lineHeight};
}"""
USE = {
    # a word only an output shows (the source splits it)
    "search": "from IPython.display import HTML\nHTML('<p>find the ' + 'usable' + '-needle here</p>')",
    "counter": "from IPython.display import HTML\nruns = globals().get('runs', 0) + 1\nHTML(f'<b>run-count-{runs}</b>')",
    "menu": "HTML('<p>menu-target</p>')",
    # a figure as plotly sends it (an image built before plotly joined it has none): drawn by plotly.js in its frame
    "plotly": ("from IPython.display import display\n"
               "display({'application/vnd.plotly.v1+json': {'data': [{'type': 'bar', 'x': ['a', 'b'], 'y': [2, 5]}],"
               " 'layout': {'title': {'text': 'usable-plot'}}}, 'text/plain': 'Figure({...})'}, raw=True)"),
    "vega": ("display({'application/vnd.vegalite.v5+json': {'data': {'values': [{'a': 'x', 'b': 2}]}, 'mark': 'bar',"
             " 'encoding': {'x': {'field': 'a', 'type': 'nominal'}, 'y': {'field': 'b', 'type': 'quantitative'}}}}, raw=True)"),
}
CHARTS = 2
"""The charts of USE, each saved with a PNG of itself."""
HUGE = 2_000_000
# a frame that, unasked, posts every kind of message with forged or hostile content; a click on its button
# (a real user activation with the focus in it) posts shortcuts that are not JupyterLab's (after such a click a
# frame may post one of JupyterLab's: the allowed thing, as its script could forward the user's keys)
FORGER = (
    "from IPython.display import HTML\nforged = globals().get('forged', 0) + 1\n"
    "HTML('<b>forged-count-%d</b>' % forged + '''<button id=\"forge\">forge</button><script>\n"
    "var post = function (m) { parent.postMessage(m, '*'); }, clicked = false;\n"
    "setInterval(function () {\n"
    "  if (!clicked) {\n"
    "    post({type: 'kernel-sandbox-frame:key', key: 'Enter', code: 'Enter', shiftKey: true});\n"
    "    post({type: 'kernel-sandbox-frame:contextmenu', x: 1e9, y: -5});\n"
    "  }\n"
    f"  post({{type: 'kernel-sandbox-frame:text', text: 'forged-text<img src=x onerror=alert(1)>' + 'x'.repeat({HUGE})}});\n"
    "  post({type: 'kernel-sandbox-frame:text', text: {toString: 1}});\n"
    "  post({type: 'kernel-sandbox-frame:png', png: document.createElement('canvas').toDataURL('image/png')});\n"
    "  post({type: 'kernel-sandbox-frame:png', png: 'data:image/png;base64,' + btoa('<svg onload=alert(1)>')});\n"
    "}, 200);\n"
    "document.getElementById('forge').addEventListener('click', function () {\n"
    "  clicked = true;\n"
    "  [{key: 'a'}, {key: 'b'}, {key: 'R', ctrlKey: true, shiftKey: true}, {key: '__proto__'}, {key: 'constructor'},\n"
    "   {key: 'Enter', shiftKey: 'yes'}, {key: {length: 1}}, {key: 'Enter ', shiftKey: true}].forEach(function (k) {\n"
    "    k.type = 'kernel-sandbox-frame:key'; post(k); });\n"
    "});\n"
    "</script>''')"
)


def _styles(page: Any, sandboxed: bool) -> dict[str, Any]:
    """The computed styles of ELEMENTS in the outputs: in the page's output nodes, or in the frames."""
    found: dict[str, Any] = {}
    for name, selector in ELEMENTS.items():
        if sandboxed:
            values = [frame.evaluate(STYLE, selector) for frame in page.frames if frame != page.main_frame]
            found[name] = next((value for value in values if value), None)
        else:
            found[name] = page.evaluate(STYLE, f".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output {selector}")
    return found


def _open_and_run(page: Any, lab: LabServer, name: str, kernelspec: str, cells: dict[str, str]) -> Any:
    served = {"url": lab.url, "token": lab.token, "headers": lab.headers}
    put_notebook(served, f"{name}.ipynb", kernelspec, cells.values())
    panel = run_all_cells(page, served, name, f"{name}.ipynb")
    page.wait_for_function(
        "n => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]"
        ".filter(p => /\\[\\d+\\]/.test(p.textContent)).length === n", arg=len(cells))
    return panel


def _set_theme(page: Any, theme: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Theme").first.hover()
    page.locator(".lm-Menu-itemLabel", has_text=theme).first.click()
    page.wait_for_function("t => document.body.dataset.jpThemeName === t", arg=theme)


def _wait_styles(page: Any, sandboxed: bool, until: Callable[[dict[str, Any]], bool] = lambda _: True) -> dict[str, Any]:
    """The outputs' styles once all ELEMENTS are drawn and ``until`` them (a theme's CSS reaches a frame by a
    message); else as they are after 30 s."""
    for _ in range(120):
        styles = _styles(page, sandboxed)
        if all(styles.values()) and until(styles):
            break
        page.wait_for_timeout(250)
    return styles


def _frame_luminance(page: Any, frame: Any) -> float:
    """The mean brightness (0-255) of a strip at the right edge of ``frame``'s box, where no output text is."""
    from PIL import Image

    box = frame.bounding_box()
    strip = {"x": box["x"] + box["width"] - 30, "y": box["y"] + 2, "width": 20, "height": max(4, box["height"] - 4)}
    image = Image.open(io.BytesIO(page.screenshot(clip=strip))).convert("L")
    pixels = image.tobytes()
    return sum(pixels) / len(pixels)


def test_dataframe_styler_and_markdown_look_as_for_a_local_kernel_in_both_themes(browser, lab_server) -> None:
    with recording_page(browser, "usable-looks-failed.png", height=900) as (page, _):
        _open_and_run(page, lab_server, "usable-local", "local-python", LOOKS)
        local = _wait_styles(page, sandboxed=False)
        assert all(local.values()), local
        _open_and_run(page, lab_server, "usable-sandboxed", SANDBOXED, LOOKS)
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) iframe.kernel-sandbox-frame").nth(len(LOOKS) - 1).wait_for()
        assert _wait_styles(page, True, lambda styles: styles == local) == local
        # the 'zebra' rows, the Styler's own colour, JupyterLab's fonts: what the users missed
        assert local["styled"]["color"] == "rgb(200, 0, 0)" and local["styled"]["background"] == "rgb(255, 230, 150)"
        light = local
        try:
            _set_theme(page, "JupyterLab Dark")
            # the open frames take the new theme (by a message: one style sheet swapped at once)
            dark = _wait_styles(page, True, lambda styles: styles["td"]["color"] != light["td"]["color"])
            frame = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) iframe.kernel-sandbox-frame").first
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "usable-dark.png"))
            assert _frame_luminance(page, frame) < 80, "a framed output is a light box in the dark theme"
            _open_and_run(page, lab_server, "usable-local", "local-python", LOOKS)
            local_dark = _wait_styles(page, sandboxed=False)
            assert local_dark["td"]["color"] != light["td"]["color"]  # the theme did change
            assert dark == local_dark
            # and new frames start in it
            _open_and_run(page, lab_server, "usable-sandboxed", SANDBOXED, LOOKS)
            assert _wait_styles(page, True, lambda styles: styles == local_dark) == local_dark
        finally:
            _set_theme(page, "JupyterLab Light")


def _click(page: Any, selector: str, text: str, button: str = "left") -> None:
    """Click, as a user, the element ``selector`` showing ``text`` in its output frame."""
    click_in_frame(page, frame_with(page, selector, text).locator(selector, has_text=text), button)


def _gone(page: Any, selector: str, text: str) -> None:
    deadline = time.monotonic() + 30
    while in_frames(page, selector, text) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert in_frames(page, selector, text) == 0


def _outputs(lab: LabServer, name: str) -> str:
    got = httpx.get(f"{lab.url}/api/contents/{name}.ipynb", headers=lab.headers)
    assert got.status_code == 200, got.text[:500]
    return str([cell["outputs"] for cell in got.json()["content"]["cells"]])


@pytest.mark.security("attack", "lab")
def test_search_menu_and_shortcuts_reach_into_frames_and_a_forging_frame_gets_no_more(browser, lab_server) -> None:
    name = "usable-use"
    with recording_page(browser, "usable-use-failed.png", height=900) as (page, requests):
        panel = _open_and_run(page, lab_server, name, SANDBOXED, {**USE, "forger": FORGER})
        cells = panel.locator(".jp-Cell").count()
        # plotly draws (its SVG), not "Figure({...})"
        assert in_frames(page, ".js-plotly-plot svg.main-svg", seconds=60) >= 1
        assert in_frames(page, "text", "usable-plot", seconds=60) >= 1
        # Ctrl+F: the word inside a frame is found, once (the source does not hold it)
        panel.locator(".jp-Cell .jp-InputPrompt").first.click()
        page.keyboard.press("Control+f")
        page.locator(".jp-DocumentSearch-filter-button").click()
        page.locator(".jp-DocumentSearch-search-filter", has_text="Search Cell Outputs").click()
        page.locator(".jp-DocumentSearch-input").fill("usable-needle")
        page.locator(".jp-DocumentSearch-index-counter", has_text=re.compile(r"^\s*1\s*/\s*1\s*$")).wait_for()
        page.keyboard.press("Escape")
        # Shift+Enter after a click in a frame runs its cell; Ctrl+S saves the notebook
        _click(page, "b", "run-count-1")
        page.keyboard.press("Shift+Enter")
        frame_with(page, "b", "run-count-2")
        assert in_frames(page, "b", "run-count-1") == 0
        _click(page, "b", "run-count-2")
        page.keyboard.press("Control+s")
        for _ in range(120):
            if "run-count-2" in _outputs(lab_server, name):
                break
            page.wait_for_timeout(250)
        assert "run-count-2" in _outputs(lab_server, name), "Ctrl+S in a frame did not save the notebook"
        # a right-click in a frame opens JupyterLab's output menu, whose Clear Outputs clears that cell
        _click(page, "p", "menu-target", button="right")
        menu = page.locator(".lm-Menu").last
        menu.locator(".lm-Menu-itemLabel", has_text="Enable Scrolling for Outputs").wait_for()
        menu.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Clear (Cell )?Outputs?$")).first.click()
        _gone(page, "p", "menu-target")

        # the forging frame: its text is kept as text, cut short; its keys and menus did nothing
        copy = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .kernel-sandbox-frame-text", has_text="forged-text")
        copy.wait_for(state="attached")
        assert copy.evaluate("node => [node.textContent.length, node.children.length]") == [100_000, 0]
        assert in_frames(page, "b", "forged-count-1") == 1 and in_frames(page, "b", "forged-count-2") == 0
        assert page.locator(".lm-Menu").count() == 0
        click_in_frame(page, frame_with(page, "#forge").locator("#forge"))
        page.wait_for_timeout(3000)
        assert in_frames(page, "b", "forged-count-1") == 1 and panel.locator(".jp-Cell").count() == cells
        assert page.evaluate("Object.keys(document.body.dataset).filter(k => k.startsWith('pwned'))") == []
        # each chart is saved with its PNG (the forger's HTML output with none): exports show the charts
        panel.locator(".jp-Cell .jp-InputPrompt").first.click()
        page.keyboard.press("Control+s")
        for _ in range(120):
            if _outputs(lab_server, name).count("'image/png'") >= CHARTS:
                break
            page.wait_for_timeout(250)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "usable-use.png"))
    saved = json.loads((lab_server.root_dir / f"{name}.ipynb").read_text())
    pngs = [output["data"]["image/png"] for cell in saved["cells"] for output in cell["outputs"] if "image/png" in output.get("data", {})]
    assert len(pngs) == CHARTS and all(base64.b64decode(png).startswith(b"\x89PNG\r\n\x1a\n") for png in pngs)
    exported = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--stdout", str(lab_server.root_dir / f"{name}.ipynb")],
                              capture_output=True, text=True, check=True).stdout
    assert exported.count("data:image/png;base64,") >= CHARTS
    outside = [url for url in requests if not url.startswith((lab_server.url, "ws://127.0.0.1", "data:", "blob:", "about:"))]
    assert outside == []  # plotly.js and the forger loaded nothing from anywhere else
