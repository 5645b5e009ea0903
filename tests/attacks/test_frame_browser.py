"""The outputs of sandboxed kernels in JupyterLab (headless Chromium), with kernel-sandbox-frame standing alone.

With ``output_policy: trusted`` nothing but the frame extension stands between the kernel's HTML,
SVG, Markdown, JavaScript and Vega and the page; with ``strict`` the policy comes first. Each
hostile payload, if it gets the page's origin, marks the top page (``data-pwned-NAME``), writes
``pwned-NAME.txt`` through the contents API, or requests a URL with ``probe`` in it (the page
records every request of every frame). The kernelspecs mount the notebook's folder ``rw``, so the
kernel also plants symlinks to a host file outside the served root, which the server must refuse.
A plain local kernel's outputs render as before, and the standard widgets keep working.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from ipykernel.kernelspec import get_kernel_dict
from nbformat.sign import NotebookNotary

from kernel_sandbox.kernelspecs import DOCKER_SPEC, install
from kernel_sandbox.lab import confinement_arguments

from support.lab import (ARTIFACTS, click_in_frame, frame_with, in_frames, jupyterlab, page_outputs, recording_page, remove_kernels_of, run_cell,
                     wait_for_kernel)
from test_policy_jupyterlab import HOSTILE_CELLS, put_notebook, run_all_cells, script_traces

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

POLICIES = ("trusted", "strict")
SECRET = "outside-the-root-secret"


@pytest.fixture(scope="module")
def frame_lab(docker_engine, widget_image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """JupyterLab as ``kernel-sandbox lab`` configures it, with a kernelspec per policy (``mount_cwd: rw``) and a plain one."""
    base = tmp_path_factory.mktemp("frame-lab")
    prefix = base / "prefix"
    for policy in POLICIES:
        install(DOCKER_SPEC, prefix=str(prefix), install_as=f"frame-{policy}", display_name=f"frame {policy}",
                config={"output_policy": policy, "mount_cwd": "rw"})
    plain = prefix / "share" / "jupyter" / "kernels" / "frame-plain"
    plain.mkdir(parents=True)
    (plain / "kernel.json").write_text(json.dumps({**get_kernel_dict(), "display_name": "frame plain"}))
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    with jupyterlab(base, prefix / "share" / "jupyter", "frame-jupyterlab.log", args=confinement_arguments([])) as server:
        server.root_dir.chmod(0o777)  # the kernel's user plants its symlinks there (mount_cwd: rw)
        yield {"url": server.url, "token": server.token, "headers": server.headers, "root": server.root_dir,
               "outside": outside, "log": server.log, "data": base / "data"}
    remove_kernels_of(docker_engine, server.process.pid)


def _frame_attack(name: str, url: str) -> str:
    """JavaScript that tries, from an output, to reach the top page, the server's API with the user's cookie, and the network."""
    body = json.dumps({"type": "file", "format": "text", "content": "escaped"})
    return (
        f"try{{window.top.document.body.setAttribute('data-pwned-{name}','1')}}catch(e){{}}"
        f"try{{parent.document.body.setAttribute('data-pwned-{name}-parent','1')}}catch(e){{}}"
        f"try{{fetch('{url}/api/contents?probe-read-{name}',{{credentials:'include'}})}}catch(e){{}}"
        f"try{{fetch('/api/contents/pwned-{name}.txt',{{method:'PUT',credentials:'include',"
        f"headers:{{'Content-Type':'application/json'}},body:{body!r}}})}}catch(e){{}}"
        f"try{{new Image().src='{url}/files/probe-img-{name}'}}catch(e){{}}"
        f"try{{top.location='{url}/lab?probe-nav-{name}'}}catch(e){{}}"
    )


def _display(kind: str, payload: str) -> str:
    return f"from IPython.display import {kind}, display\ndisplay({kind}({payload!r}))"


def _vega(url: str) -> str:
    """A Vega-Lite chart reading a served file and a path of the server, asking vega-embed for its actions."""
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"url": f"{url}/files/probe-vega-data.csv"},
        "mark": "bar", "encoding": {"x": {"field": "a", "type": "nominal"}, "y": {"field": "b", "type": "quantitative"}},
        "layer": [{"mark": "point", "data": {"url": "/api/contents?probe-vega-relative"}}],
        "usermeta": {"embedOptions": {"actions": True, "defaultStyle": f"@import url({url}/files/probe-vega-style.css);"}},
    }
    return ("from IPython.display import display\n"
            f"display({{'application/vnd.vegalite.v5+json': {spec!r}}}, raw=True)")


def hostile_cells(url: str) -> dict[str, str]:
    attack = lambda name: html.escape(_frame_attack(name, url))  # noqa: E731
    return {
        "html": _display("HTML", f'<img src=x onerror="{attack("html")}"><script>{_frame_attack("htmlscript", url)}</script>'),
        "svg": _display("SVG", f'<svg xmlns="http://www.w3.org/2000/svg" onload="{attack("svg")}">'
                               f'<script><![CDATA[{_frame_attack("svgscript", url)}]]></script></svg>'),
        "md": _display("Markdown", f'<script>{_frame_attack("md", url)}</script>\n\n<img src=x onerror="{attack("mdimg")}">'),
        "js": _display("Javascript", _frame_attack("js", url)),
        "overlay": _display("HTML", '<div style="position:fixed;inset:0;z-index:2147483647;background:red">overlay</div>'
                                    f'<style>@import url({url}/files/probe-css.css); body{{background:url({url}/files/probe-bg)}}</style>'),
        "vega": _vega(url),
        # widget views render in the output's frame, HTML widgets' iframes and images included: nothing of them loads
        "htmlwidget": ("import ipywidgets as w\n"
                       f"t = w.Text(value={'<img src=x onerror=' + chr(34) + attack('jsdlink') + chr(34) + '>'!r})\n"
                       "h = w.HTML('<b>widget-bold</b>')\nw.jsdlink((t, 'value'), (h, 'value'))\n"
                       f"display(w.HTML({'<img src=x onerror=' + chr(34) + attack('hw') + chr(34) + '><b>widget-bold</b>'!r}), h)"),
        "widgetframe": ("import ipywidgets as w\n"
                        f"w.HTML({'<iframe srcdoc=x onload=' + chr(34) + attack('wframe') + chr(34) + '></iframe>'!r}"
                        f" + '<img src=/api/contents/probe-widget-img><img src={url}/files/probe-widget-abs>')"),
        "height": _display("HTML", "<p>height-probe</p><script>setInterval(function () {"
                                   "parent.postMessage({type: 'kernel-sandbox-frame:height', height: 1e9}, '*');"
                                   "parent.postMessage({type: 'kernel-sandbox-frame:height', height: '9px;position:fixed'}, '*');"
                                   "}, 100)</script>"),
    }


BENIGN_CELLS = {
    "benign-html": _display("HTML", '<b>benign-html</b><div style="height:321px">tall</div>'),
    "pandas": "import pandas as pd\npd.DataFrame({'city': ['Paris', 'Lyon'], 'n': [1, 2]})",
    "chart": ("from IPython.display import display\n"
              "display({'application/vnd.vegalite.v5+json': {'data': {'values': [{'a': 'x', 'b': 2}, {'a': 'y', 'b': 5}]},"
              " 'mark': 'bar', 'encoding': {'x': {'field': 'a', 'type': 'nominal'}, 'y': {'field': 'b', 'type': 'quantitative'}}}},"
              " raw=True)"),
    "widgets": ("import ipywidgets as w\nfrom IPython.display import display, HTML\n"
                "out = w.Output()\nbutton = w.Button(description='benign-button')\n"
                "def clicked(_):\n    with out:\n        print('clicked-text')\n        display(HTML('<i>clicked-html</i>'))\n"
                "button.on_click(clicked)\n"
                "display(w.IntSlider(value=7, description='benign-slider'), button, out)"),
    "tqdm": "from tqdm.notebook import tqdm\nfor i in tqdm(range(3), desc='benign-tqdm'): pass",
}


def _plant(outside: Path, tag: str) -> str:
    """Kernel code planting links in its (rw-mounted) folder to a host file and folder outside the served root."""
    return (f"import os\nos.symlink({str(outside / 'secret.txt')!r}, 'leak-{tag}.txt')\n"
            f"os.symlink({str(outside)!r}, 'leakdir-{tag}')\nopen('inside-{tag}.txt', 'w').write('inside')\n"
            f"os.symlink('inside-{tag}.txt', 'fine-{tag}.txt')\nprint('planted')")


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("policy", POLICIES)
def test_outputs_of_a_sandboxed_kernel_cannot_act_with_the_servers_origin(browser, frame_lab, policy: str) -> None:
    """Hostile HTML, SVG, Markdown, JavaScript, an overlay and a Vega chart with data URLs and actions; then benign outputs and widgets."""
    lab = frame_lab
    name = f"frame-{policy}"
    cells = {**hostile_cells(lab["url"]), **BENIGN_CELLS, "plant": _plant(lab["outside"], policy)}
    put_notebook(lab, f"{name}.ipynb", name, cells.values())
    with recording_page(browser, f"{name}-failed.png", height=900, timeout_ms=120_000) as (page, _):
        # Chromium reports a request that its CSP then blocks: what counts is what got an answer, and the server's log
        answered: list[str] = []
        page.on("response", lambda response: answered.append(response.url))
        panel = run_all_cells(page, lab, name, f"{name}.ipynb")
        frame_with(page, ".widget-html-content", "3/3", seconds=90)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]"
            ".every(p => /\\[\\d+\\]/.test(p.textContent))")
        errors = [text for frame in page.frames[1:]
                  for text in frame.locator("[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()]
        assert in_frames(page, ".jp-OutputArea-output", "planted", seconds=30) == 1, errors
        markers, written = script_traces(page, lab, 5)
        assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written {written}"
        probes = [url for url in answered if "probe" in url]
        logged = [line for line in lab["log"].read_text().splitlines() if "probe" in line]
        assert probes == [] and logged == [], f"outputs reached the server: {probes} {logged}"
        assert page.url.startswith(f"{lab['url']}/lab/workspaces/{name}")
        assert len(page.context.pages) == 1
        # every output, text and widgets included, is in its area's opaque-origin frame that forbids network loads
        assert page_outputs(page) == []
        assert panel.locator(".jupyter-widgets").count() == 0
        areas = panel.locator(".jp-OutputArea:has(.jp-OutputArea-child)")
        assert areas.count() == len(cells) and panel.locator(".jp-OutputArea.kernel-sandbox-area").count() == len(cells)
        frames = panel.locator("iframe.kernel-sandbox-frame")
        assert frames.count() == len(cells)
        for index in range(frames.count()):
            assert frames.nth(index).get_attribute("sandbox") == "allow-scripts"
            assert "default-src 'none'" in frames.nth(index).get_attribute("srcdoc")
        # no overlay outside its frame: the top of the page is JupyterLab's own
        assert page.evaluate("document.elementFromPoint(640, 10).tagName") != "IFRAME"
        # a frame claiming any height gets a bounded one
        claimed = frame_with(page, "p", "height-probe").frame_element()
        if policy == "trusted":  # strict removes the script
            page.wait_for_function("f => f.getBoundingClientRect().height > 1000", arg=claimed)
        assert claimed.bounding_box()["height"] <= 20000 and "fixed" not in (claimed.get_attribute("style") or "")
        assert in_frames(page, ".widget-html-content b", "widget-bold", seconds=30) >= 1
        # the chart draws, with no vega-embed actions ("View Source")
        assert in_frames(page, ".vega-embed canvas, .vega-embed svg.marks", seconds=30) >= 1
        assert in_frames(page, ".vega-actions, .vega-embed details") == 0
        # benign outputs render, in frames sized to their content
        assert in_frames(page, "b", "benign-html", seconds=30) == 1
        tall = frame_with(page, "b", "benign-html").frame_element()
        page.wait_for_function("f => f.getBoundingClientRect().height >= 321", arg=tall)
        assert tall.bounding_box()["height"] < 400
        assert in_frames(page, "table.dataframe td", "Lyon", seconds=30) == 1
        # the standard widgets work: a slider, a button whose output widget prints and displays HTML, tqdm
        assert in_frames(page, ".widget-slider, .widget-hslider", seconds=30) >= 1
        click_in_frame(page, frame_with(page, "button", "benign-button").locator("button", has_text="benign-button"))
        frame_with(page, ".jp-RenderedText", "clicked-text")
        assert in_frames(page, "i", "clicked-html", seconds=30) == 1
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        assert script_traces(page, lab, 1) == ([], [])
    _assert_links_refused(lab, policy)


def _assert_links_refused(lab: dict, tag: str) -> None:
    """The kernel's links to outside the root are refused by every route; the link inside the root is served."""
    http = httpx.Client(base_url=lab["url"], headers=lab["headers"])
    for path in (f"/api/contents/leak-{tag}.txt", f"/api/contents/leakdir-{tag}", f"/api/contents/leakdir-{tag}/secret.txt",
                 f"/files/leak-{tag}.txt", f"/files/leakdir-{tag}/secret.txt", f"/files/leak-{tag}.txt?download=1",
                 f"/nbconvert/html/leak-{tag}.txt", f"/view/leak-{tag}.txt"):
        answer = http.get(path)
        assert answer.status_code in (403, 404) and SECRET not in answer.text, (path, answer.status_code, answer.text[:200])
    listing = http.get("/api/contents").json()["content"]
    assert {f"fine-{tag}.txt", f"inside-{tag}.txt"} <= {item["name"] for item in listing}
    assert http.get(f"/files/fine-{tag}.txt").text == "inside"
    put = http.put(f"/api/contents/leak-{tag}.txt", json={"type": "file", "format": "text", "content": "overwritten"})
    assert (lab["outside"] / "secret.txt").read_text() == SECRET, put.status_code
    for path, body in (("/api/contents", {"copy_from": f"leakdir-{tag}/secret.txt"}), (f"/api/contents/leak-{tag}.txt/checkpoints", None),
                       ("/api/contents", {"copy_from": f"leakdir-{tag}"})):
        answer = http.post(path, json=body)
        assert answer.status_code in (403, 404), (path, answer.status_code, answer.text[:200])
    copied = [p for p in lab["root"].rglob("*") if p.is_file() and not p.is_symlink() and SECRET in p.read_text(errors="replace")]
    assert copied == []


@pytest.mark.security("attack", "policy")
def test_a_plain_kernels_outputs_render_as_before(browser, frame_lab) -> None:
    """The extension leaves a kernel that is not sandboxed alone: its HTML renders in the page, not in a frame."""
    lab = frame_lab
    put_notebook(lab, "frame-plain.ipynb", "frame-plain", [_display("HTML", "<b>plain-html</b>")])
    with recording_page(browser, "frame-plain-failed.png") as (page, _):
        panel = run_all_cells(page, lab, "frame-plain", "frame-plain.ipynb")
        panel.locator("b", has_text="plain-html").wait_for()
        assert page.evaluate("document.body.dataset.kernelSandboxFrame") == "active"
        assert panel.locator("iframe.kernel-sandbox-frame").count() == 0


def _hostile_inspect(url: str) -> str:
    """Kernel code answering every inspect_request whose code names a bundle with that bundle (the tooltip's, the inspector's)."""
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "data": {"url": f"{url}/files/probe-tip-vega.csv"},
            "mark": "bar", "encoding": {"x": {"field": "a", "type": "nominal"}, "y": {"field": "b", "type": "quantitative"}},
            "usermeta": {"embedOptions": {"actions": True}}}
    bundles = {
        "tiphtml": {"text/html": f'<img src=x onerror="{html.escape(_frame_attack("tiphtml", url))}"><b>tip-html</b>'
                                 f'<script>{_frame_attack("tipscript", url)}</script>', "text/plain": "tip"},
        "tipvega": {"application/vnd.vegalite.v5+json": spec, "text/plain": "tip"},
        "tipjs": {"application/javascript": _frame_attack("tipjs", url), "text/plain": "tip"},
        "tipmd": {"text/markdown": f'<img src=x onerror="{html.escape(_frame_attack("tipmd", url))}">**tip-md**', "text/plain": "tip"},
        "tipplain": {"text/plain": "benign-tip-text"},
    }
    return (f"BUNDLES = {bundles!r}\n"
            "async def hostile_inspect(code, cursor_pos, detail_level=0, omit_sections=()):\n"
            "    name = next((n for n in BUNDLES if n in code), None)\n"
            "    return {'status': 'ok', 'found': name is not None, 'data': BUNDLES.get(name, {}), 'metadata': {}}\n"
            "get_ipython().kernel.do_inspect = hostile_inspect\nprint('inspect-' + 'ready')")


@pytest.mark.security("attack", "policy")
def test_tooltips_and_the_inspector_render_a_sandboxed_kernels_help_in_frames(browser, frame_lab) -> None:
    """A kernel answering inspect_request with HTML, Vega (data URL, actions), JavaScript and Markdown: the Shift+Tab
    tooltip and the Contextual Help panel draw it in frames (the policy is ``trusted``: the frame alone); plain text as before."""
    lab = frame_lab
    put_notebook(lab, "frame-inspect.ipynb", "frame-trusted", [""])
    with recording_page(browser, "frame-inspect-failed.png", height=900, timeout_ms=120_000) as (page, _):
        answered: list[str] = []
        page.on("response", lambda response: answered.append(response.url))
        panel = run_all_cells(page, lab, "frame-inspect", "frame-inspect.ipynb")
        run_cell(page, panel, _hostile_inspect(lab["url"]), "inspect-ready")
        tooltip = page.locator(".jp-Tooltip")
        for name in ("tiphtml", "tipvega", "tipjs", "tipmd", "tipplain"):
            panel.locator(".jp-Cell .cm-content").last.click()
            page.keyboard.press("ControlOrMeta+a")
            page.keyboard.insert_text(f"probe_{name}")
            page.keyboard.press("Shift+Tab")
            tooltip.wait_for()
            if name == "tipplain":
                tooltip.locator(".jp-RenderedText", has_text="benign-tip-text").wait_for()
                assert tooltip.locator("iframe").count() == 0
            else:
                frame = tooltip.locator("iframe.kernel-sandbox-frame")
                frame.wait_for()
                assert frame.get_attribute("sandbox") == "allow-scripts"
                assert "default-src 'none'" in frame.get_attribute("srcdoc")
                if name == "tiphtml":
                    assert in_frames(page, "b", "tip-html", seconds=15) >= 1
            page.keyboard.press("Escape")
            tooltip.wait_for(state="detached")
        # the inspector (Help > Show Contextual Help) follows the cursor
        page.locator(".lm-MenuBar-itemLabel", has_text="Help").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Show Contextual Help").first.click()
        inspector = page.locator(".jp-Inspector")
        for name in ("tipvega", "tiphtml"):
            panel.locator(".jp-Cell .cm-content").last.click()
            page.keyboard.press("ControlOrMeta+a")
            page.keyboard.insert_text(f"probe_{name}")
            inspector.locator("iframe.kernel-sandbox-frame").first.wait_for()
        assert in_frames(page, ".vega-embed canvas, .vega-embed svg.marks", seconds=30) >= 1
        assert in_frames(page, ".vega-actions, .vega-embed details") == 0
        markers, written = script_traces(page, lab, 5)
        assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written {written}"
        probes = [url for url in answered if "probe-" in url]
        logged = [line for line in lab["log"].read_text().splitlines() if "probe-" in line]
        assert probes == [] and logged == [], f"help reached the server: {probes} {logged}"
        # the user's own Markdown cell renders in the page, as before
        panel.locator(".jp-Cell .cm-content").last.click()
        page.keyboard.press("ControlOrMeta+a")
        page.keyboard.insert_text("**markdown-cell-bold**")
        page.keyboard.press("Escape")
        page.keyboard.press("m")
        page.keyboard.press("Shift+Enter")
        panel.locator(".jp-MarkdownOutput strong", has_text="markdown-cell-bold").wait_for()
        assert panel.locator(".jp-MarkdownOutput iframe").count() == 0
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "frame-inspect.png"), full_page=True)


def _widget_html(url: str) -> str:
    """Standard widgets whose descriptions, labels and values carry HTML: ipywidgets' inline_sanitize puts ``$...$`` back raw."""
    attack = lambda name: html.escape(_frame_attack(name, url))  # noqa: E731
    overlay = '<span style="position:fixed;inset:0;z-index:2147483647;background:red">desc-overlay</span>'
    return ("import ipywidgets as w\n"
            f"s = w.IntSlider(value=3, description={'$<img src=x onerror=' + chr(34) + attack('desc') + chr(34) + '>$' + overlay!r},"
            " description_allow_html=True)\n"
            f"c = w.Checkbox(value=True, description={'$<img src=x onerror=' + chr(34) + attack('check') + chr(34) + '>$'!r},"
            " description_allow_html=True)\n"
            f"b = w.Button(description={'<img src=x onerror=' + chr(34) + attack('button') + chr(34) + '>button-text'!r})\n"
            f"m = w.HTMLMath({'$x^2$ <img src=x onerror=' + chr(34) + attack('math') + chr(34) + '>math-text'!r})\n"
            f"l = w.Label({'$<img src=x onerror=' + chr(34) + attack('label') + chr(34) + '>$label-text'!r})\n"
            "display(s, c, b, m, l)\n"
            "o = w.Output()\ndisplay(w.IntSlider(value=4, description='benign-slider'), w.IntProgress(value=7, max=10), o)\n"
            "with o:\n    print('output-printed')")


def _vega_expressions(url: str) -> str:
    """Charts that draw (a Vega-Lite ``href`` encoding and a URL computed by a transform; a Vega rect that links and
    whose click handler navigates) and charts that load (a parameter reaching the window, image and data URLs as signals)."""
    schema = "https://vega.github.io/schema/vega"
    bars = {"mark": "bar", "encoding": {"x": {"field": "a", "type": "nominal"}, "y": {"field": "b", "type": "quantitative"},
                                        "href": {"field": "link"}}}
    lite = {"$schema": f"{schema}-lite/v5.json", "width": 300, "height": 150, **bars,
            "data": {"values": [{"a": "x", "b": 2, "link": f"{url}/files/probe-vl-href"}]},
            "transform": [{"calculate": f"'{url}/files/probe-vl-calc'", "as": "link2"}]}
    param = {"$schema": f"{schema}-lite/v5.json", **bars, "data": {"values": [{"a": "x", "b": 2}]},
             "params": [{"name": "p", "expr": f"event.view.fetch('{url}/files/probe-vl-param')"}]}
    rect = {"type": "rect", "from": {"data": "t"}, "encode": {"enter": {
        "x": {"value": 0}, "y": {"value": 0}, "width": {"value": 300}, "height": {"value": 150},
        "fill": {"value": "steelblue"}, "href": {"field": "link"}}}}
    linked = {"$schema": f"{schema}/v5.json", "width": 300, "height": 150,
              "signals": [{"name": "leak", "value": 0, "on": [{"events": "click",
                                                               "update": f"event.view.location.assign('{url}/files/probe-v-nav')"}]}],
              "data": [{"name": "t", "values": [{"link": f"{url}/files/probe-v-href"}]}], "marks": [rect]}
    loading = {"$schema": f"{schema}/v5.json", "width": 30, "height": 30,
               "signals": [{"name": "img", "update": f"'{url}/files/probe-v-image'"}],
               "data": [{"name": "remote", "url": {"signal": f"'{url}/files/probe-v-data'"}}],
               "marks": [{"type": "image", "encode": {"enter": {"url": {"signal": "img"}, "width": {"value": 9}}}}]}
    return ("from IPython.display import display\n"
            f"for mime, spec in [('vegalite', {lite!r}), ('vega', {linked!r}), ('vegalite', {param!r}), ('vega', {loading!r})]:\n"
            "    display({f'application/vnd.{mime}.v5+json': spec}, raw=True)")


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("policy", POLICIES)
def test_widget_descriptions_and_vega_expressions_stay_inert(browser, frame_lab, policy: str) -> None:
    """HTML in widget descriptions, labels and HTMLMath, and Vega expressions, links and URLs that reach the window or
    the server: no script in the page, no overlay, nothing requested, no navigation; a slider, a progress bar, an
    Output widget printing text and the charts still render."""
    lab = frame_lab
    name = f"frame-expr-{policy}"
    put_notebook(lab, f"{name}.ipynb", f"frame-{policy}", [_widget_html(lab["url"]), _vega_expressions(lab["url"])])
    with recording_page(browser, f"{name}-failed.png", height=900, timeout_ms=120_000) as (page, _):
        answered: list[str] = []
        page.on("response", lambda response: answered.append(response.url))
        panel = run_all_cells(page, lab, name, f"{name}.ipynb")
        frame_with(page, ".jp-RenderedText", "output-printed", seconds=90)
        charts = ".vega-embed canvas, .vega-embed svg.marks"
        deadline = time.monotonic() + 60
        while in_frames(page, charts) < 2 and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert in_frames(page, charts) >= 2, "the linked charts draw"
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]"
            ".every(p => /\\[\\d+\\]/.test(p.textContent))")
        for frame in panel.locator("iframe.kernel-sandbox-frame").all():  # click the charts' links and handlers
            box = frame.bounding_box()
            if box and box["height"] > 40:
                for dx, dy in ((0.1, 0.3), (0.3, 0.6), (0.5, 0.5)):
                    page.mouse.click(box["x"] + box["width"] * dx, box["y"] + box["height"] * dy)
        click_in_frame(page, frame_with(page, "button", "button-text").locator("button", has_text="button-text"))
        markers, written = script_traces(page, lab, 5)
        assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written {written}"
        probes = [url for url in answered if "probe-" in url]
        logged = [line for line in lab["log"].read_text().splitlines() if "probe-" in line]
        assert probes == [] and logged == [], f"a widget or chart reached the server: {probes} {logged}"
        assert page.url.startswith(f"{lab['url']}/lab/workspaces/{name}") and len(page.context.pages) == 1
        assert page.evaluate("document.elementFromPoint(640, 10).textContent.includes('desc-overlay')") is False
        assert panel.locator(".jupyter-widgets").count() == 0 and page_outputs(page) == []  # the page draws no widget
        # the standard widgets work in their frames: the slider, progress bar, HTMLMath and Output render
        assert in_frames(page, ".widget-label", "benign-slider", seconds=30) == 1
        assert in_frames(page, ".widget-slider, .widget-hslider") >= 2
        assert in_frames(page, ".widget-hprogress, .widget-progress", seconds=30) == 1
        assert in_frames(page, ".widget-htmlmath-content", "math-text", seconds=30) == 1
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


WIDGET_CELLS = [
    "from ipywidgets import interact\n@interact(x=5)\ndef f(x):\n    print('interact-x', x * 10)",
    ("import ipywidgets as w\nfrom IPython.display import display\nout = w.Output()\nbutton = w.Button(description='out-button')\n"
     "def clicked(_):\n    with out:\n        print('clicked-text')\nbutton.on_click(clicked)\n"
     "a = w.IntSlider(value=1, description='a-slider')\nb = w.IntSlider(value=2, description='b-slider')\n"
     "w.jslink((a, 'value'), (b, 'value'))\nup = w.FileUpload()\ndisplay(button, out, a, b, up)"),
    "",
]


def _readouts(frame: Any) -> list[str]:
    return [text.strip() for text in frame.locator(".widget-readout").all_inner_texts()]


def test_widgets_work_in_their_frame_and_come_back_from_the_kernel_after_a_reload(browser, frame_lab) -> None:
    """interact, an Output widget, jslink and FileUpload work inside the output frames (the page makes no widget),
    and after a reload of the page the widgets come back with the kernel's state."""
    lab = frame_lab
    put_notebook(lab, "frame-widgets.ipynb", "frame-strict", WIDGET_CELLS)
    with recording_page(browser, "frame-widgets-failed.png", height=900, timeout_ms=120_000) as (page, _):
        panel = run_all_cells(page, lab, "frame-widgets", "frame-widgets.ipynb")
        interact = frame_with(page, ".jp-RenderedText", "interact-x 50", seconds=90)
        click_in_frame(page, interact.locator(".noUi-handle").first)
        page.keyboard.press("ArrowRight")  # the slider moves: the kernel runs f(6) into the interact's Output widget
        frame_with(page, ".jp-RenderedText", "interact-x 60")
        widgets = frame_with(page, "button", "out-button")
        click_in_frame(page, widgets.locator("button", has_text="out-button"))
        frame_with(page, ".jp-RenderedText", "clicked-text")
        click_in_frame(page, widgets.locator(".noUi-handle").first)
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        deadline = time.monotonic() + 30
        while _readouts(widgets) != ["3", "3"] and time.monotonic() < deadline:  # jslink moves b with a
            page.wait_for_timeout(250)
        assert _readouts(widgets) == ["3", "3"]
        with page.expect_file_chooser() as chooser:
            click_in_frame(page, widgets.locator("button", has_text="Upload"))
        chooser.value.set_files(files=[{"name": "up.txt", "mimeType": "text/plain", "buffer": b"uploaded-bytes"}])
        widgets.locator("button", has_text="Upload (1)").wait_for()
        # the kernel gets the frames' updates as they settle (a link's echoes may still be on their way): ask until it agrees
        for attempt in range(6):
            shown = run_cell(page, panel, f"print('kernel-sees-{attempt}', a.value, b.value, bytes(up.value[0].content), len(out.outputs))",
                             f"kernel-sees-{attempt}")
            if shown.strip() == f"kernel-sees-{attempt} 3 3 b'uploaded-bytes' 1":
                break
            page.wait_for_timeout(1000)
        assert shown.strip() == f"kernel-sees-{attempt} 3 3 b'uploaded-bytes' 1"
        assert panel.locator(".jupyter-widgets").count() == 0 and page_outputs(page) == []
        page.keyboard.press("Escape")
        page.keyboard.press("ControlOrMeta+s")
        page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").wait_for(state="detached")
        # a new page: the widgets' states come from the kernel (request_states), the Output widget's outputs too
        page.reload()
        panel = page.locator(".jp-NotebookPanel:visible")
        wait_for_kernel(page, panel)
        frame_with(page, ".jp-RenderedText", "interact-x 60", seconds=90)
        widgets = frame_with(page, "button", "out-button")
        frame_with(page, ".jp-RenderedText", "clicked-text")
        deadline = time.monotonic() + 30
        while _readouts(widgets) != ["3", "3"] and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert _readouts(widgets) == ["3", "3"]
        assert panel.locator(".jupyter-widgets").count() == 0 and page_outputs(page) == []
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "frame-widgets.png"), full_page=True)


@pytest.mark.security("attack", "policy")
def test_a_widget_a_busy_kernel_shows_beside_a_refused_one_renders(browser, frame_lab) -> None:
    """Two frames ask a busy kernel for its widgets' states at once. ipywidgets answers on the control comm it opened
    last (the page opens each frame's with its request, so each frame gets its own answer), and late: the frame waits
    (ipywidgets' own manager gives up after 4 s and asks each comm, whose answers carry no model names past the
    policy and none for a refused widget). The slider shows, and the refused widget's frame the policy's note."""
    lab = frame_lab
    cells = [HOSTILE_CELLS["widget"],
             "import ipywidgets as w, time\ndisplay(w.IntSlider(value=5, description='busy-slider'))\ntime.sleep(8)\nprint('slept')"]
    put_notebook(lab, "frame-busy.ipynb", "frame-strict", cells)
    with recording_page(browser, "frame-busy-failed.png", height=900, timeout_ms=120_000) as (page, _):
        run_all_cells(page, lab, "frame-busy", "frame-busy.ipynb")
        frame_with(page, ".jp-RenderedText", "slept", seconds=90)
        assert in_frames(page, ".widget-label", "busy-slider", seconds=60) == 1
        assert in_frames(page, "em", "widget refused by the strict output policy", seconds=30) == 1
        assert script_traces(page, lab, 1) == ([], [])


def test_a_progress_bar_moves_while_its_cell_runs(browser, frame_lab) -> None:
    """tqdm's bar in a frame moves while the loop runs, as on a local kernel: the frame does not wait for the busy
    kernel to answer for its widgets' states."""
    lab = frame_lab
    cells = ["from tqdm.notebook import tqdm\nimport time\nfor i in tqdm(range(40), desc='slow-tqdm'):\n    time.sleep(0.5)\nprint('loop-done')"]
    put_notebook(lab, "frame-progress.ipynb", "frame-strict", cells)
    with recording_page(browser, "frame-progress-failed.png", height=900, timeout_ms=120_000) as (page, _):
        run_all_cells(page, lab, "frame-progress", "frame-progress.ipynb")
        bar = frame_with(page, ".widget-html-content", "/40", seconds=60)
        counts = []
        deadline = time.monotonic() + 90  # the loop takes 20 s
        while not in_frames(page, ".jp-RenderedText", "loop-done"):
            assert time.monotonic() < deadline, f"the cell never ended; the bar showed {counts}"
            shown = bar.locator(".widget-html-content", has_text="/40").first.inner_text()
            counts.append(int(shown.split("/")[0].split()[-1]))
            page.wait_for_timeout(500)
        assert len(set(counts)) >= 3 and min(counts) < 40, counts  # seen moving before the loop ended


@pytest.mark.security("attack", "policy")
def test_saved_outputs_of_a_sandboxed_kernel_stay_framed_on_a_local_kernel(browser, frame_lab) -> None:
    """A notebook saved with a sandboxed kernel's (marked) hostile outputs, opened on a plain local kernel and trusted:
    the marked outputs still render in a frame and run nothing in the page; the local kernel's own output renders as before."""
    lab = frame_lab
    hostile = f'<img src=x onerror="{html.escape(_frame_attack("marked", lab["url"]))}"><b>marked-html</b>'
    mark = {"kernel_sandbox": {"framed": True}}
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "frame-plain", "display_name": "frame plain", "language": "python"}})
    notebook.cells = [
        nbformat.v4.new_code_cell("x", execution_count=1, outputs=[
            nbformat.v4.new_output("display_data", data={"text/html": hostile, "text/plain": "x"}, metadata=mark),
            nbformat.v4.new_output("display_data", data={"application/javascript": _frame_attack("markedjs", lab["url"])}, metadata=mark),
        ]),
        nbformat.v4.new_code_cell("y", execution_count=2, outputs=[
            nbformat.v4.new_output("display_data", data={"text/html": "<b>unmarked-html</b>", "text/plain": "y"}),
        ]),
    ]
    notary = NotebookNotary(data_dir=str(lab["data"]))
    notary.sign(notebook)
    assert notary.check_signature(notebook)  # JupyterLab will trust it: its outputs would run in the page
    nbformat.write(notebook, str(lab["root"] / "frame-marked.ipynb"))
    with recording_page(browser, "frame-marked-failed.png", height=900) as (page, _):
        answered: list[str] = []
        page.on("response", lambda response: answered.append(response.url))
        page.goto(f"{lab['url']}/lab/workspaces/frame-marked/tree/frame-marked.ipynb?reset&token={lab['token']}")
        panel = page.locator(".jp-NotebookPanel:visible")
        wait_for_kernel(page, panel)
        marked = frame_with(page, "b", "marked-html")
        assert marked.frame_element().get_attribute("sandbox") == "allow-scripts"
        panel.locator("b", has_text="unmarked-html").wait_for()  # a local kernel's output, in the page as before
        assert panel.locator(".jp-OutputArea.kernel-sandbox-area").count() == 1
        markers, written = script_traces(page, lab, 5)
        assert markers == [] and written == [], f"script ran in the page: markers {markers}, files written {written}"
        probes = [url for url in answered if "probe" in url]
        assert probes == [] and [line for line in lab["log"].read_text().splitlines() if "probe-" in line and "marked" in line] == []


FOCUS_CELLS = [
    ("import ipywidgets as w, threading, time\nt = w.Text(description='focus-text')\ndisplay(t)\n"
     "def steal():\n    for _ in range(80):\n        t.focus()\n        time.sleep(0.25)\n"
     "threading.Thread(target=steal, daemon=True).start()"),
    "runs = globals().get('runs', 0) + 1\nprint('run-count', runs)",
    "",
]


@pytest.mark.security("attack", "policy")
def test_a_frame_takes_no_focus_and_shortcuts_work_after_a_click_in_it(browser, frame_lab) -> None:
    """A widget asking for focus again and again does not take the page's: what the user types into a cell stays in
    the cell and never reaches the kernel. After a click in a frame, Shift+Enter runs that frame's cell."""
    lab = frame_lab
    put_notebook(lab, "frame-focus.ipynb", "frame-strict", FOCUS_CELLS)
    with recording_page(browser, "frame-focus-failed.png", height=900, timeout_ms=120_000) as (page, _):
        panel = run_all_cells(page, lab, "frame-focus", "frame-focus.ipynb")
        frame_with(page, ".widget-text", "focus-text", seconds=90)
        counter = frame_with(page, ".jp-RenderedText", "run-count 1")
        editor = panel.locator(".jp-Cell .cm-content").last
        editor.click()
        page.keyboard.type("typed-in-the-cell", delay=150)  # about 2.5 s of typing while the widget calls focus()
        assert "typed-in-the-cell" in editor.inner_text()
        assert page.evaluate("document.activeElement.tagName") != "IFRAME"
        page.keyboard.press("ControlOrMeta+a")
        page.keyboard.insert_text("print('text-value', repr(t.value))")
        page.keyboard.press("Shift+Enter")
        assert "text-value ''" in frame_with(page, ".jp-RenderedText", "text-value").locator(".jp-RenderedText", has_text="text-value").inner_text()
        # a click in the counter's frame, then Shift+Enter: JupyterLab runs that cell again
        click_in_frame(page, counter.locator(".jp-RenderedText", has_text="run-count"))
        page.keyboard.press("Shift+Enter")
        frame_with(page, ".jp-RenderedText", "run-count 2")


FORGED_COMMS = [
    ("import ipywidgets as w\ngot = []\ns = w.IntSlider(value=1, description='forge-slider')\n"
     "s.observe(lambda change: got.append(('value', change['new'])), 'value')\n"
     "get_ipython().kernel.comm_manager.register_target('probe.target', lambda comm, msg: got.append(('open', 'probe.target')))\n"
     "s"),
    ("from IPython.display import HTML\n"
     "HTML('<b>forger-ready</b><script>var post = function (m) { parent.postMessage(m, \"*\"); };'"
     " + 'var id = ' + repr(s.model_id) + ';'"
     " + 'setInterval(function () {'"
     " + 'post({type: \"kernel-sandbox-frame:comm-send\", comm_id: id, id: \"f\", data: {method: \"update\", state: {value: 42}}, buffers: []});'"
     " + 'post({type: \"kernel-sandbox-frame:comm-open\", comm_id: \"forged-open\", target: \"probe.target\", data: {}});'"
     " + 'post({type: \"kernel-sandbox-frame:comm-open\", comm_id: id, target: \"jupyter.widget\", data: {}});'"
     " + '}, 100);</script>')"),
    "",
]


@pytest.mark.security("attack", "policy")
def test_a_frame_without_widgets_cannot_speak_to_the_kernels_comms(browser, frame_lab) -> None:
    """An output's script (``trusted``: nothing removes it) posts the bridge's comm messages from a frame that shows no
    widget: an update of another output's slider, a comm to another target, a widget comm of its choosing. The page
    relays none of them: the kernel sees no change and no comm."""
    lab = frame_lab
    put_notebook(lab, "frame-forge.ipynb", "frame-trusted", FORGED_COMMS)
    with recording_page(browser, "frame-forge-failed.png", height=900, timeout_ms=120_000) as (page, _):
        panel = run_all_cells(page, lab, "frame-forge", "frame-forge.ipynb")
        frame_with(page, ".widget-slider, .widget-hslider", seconds=90)
        frame_with(page, "b", "forger-ready")
        page.wait_for_timeout(3000)  # thirty rounds of forged messages
        shown = run_cell(page, panel, "print('kernel-got', got, s.value)", "kernel-got")
        assert shown.strip() == "kernel-got [] 1"
