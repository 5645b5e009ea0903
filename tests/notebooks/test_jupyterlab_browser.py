"""JupyterLab in headless Chromium: pick "Sandboxed Python" in the launcher and run a cell in it.

Uses Debian's chromium (``apt-get install chromium``) through Playwright's ``executable_path``;
Playwright's own browser downloads are never used. Everything stays on 127.0.0.1.
"""

from __future__ import annotations


import pytest

from lab_kit import ARTIFACTS, chromium, recording_page

CODE = "import os, socket\nprint('hostname:', socket.gethostname())\nprint('interfaces:', sorted(os.listdir('/sys/class/net')))"


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


def test_launcher_sandboxed_python_runs_a_cell_in_the_container(browser, lab_server, docker_engine) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with recording_page(browser, "jupyterlab-failure.png") as (page, requests):
        page.goto(f"{lab_server.url}/lab?token={lab_server.token}")
        card = page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python"]')
        card.wait_for()
        assert page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python (small)"]').count() == 1
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-launcher.png"))
        card.click()

        panel = page.locator(".jp-NotebookPanel:visible")
        panel.locator(".jp-Toolbar-kernelName", has_text="Sandboxed Python").wait_for()
        panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
        editor = panel.locator(".jp-Cell .cm-content").first
        editor.click()
        page.keyboard.insert_text(CODE)
        page.keyboard.press("Shift+Enter")

        output = panel.locator(".jp-OutputArea-output").first
        output.filter(has_text="interfaces:").wait_for()
        text = output.inner_text()
        panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
        page.screenshot(path=str(ARTIFACTS / "jupyterlab.png"))
        assert "hostname: sandbox" in text
        assert "interfaces: ['lo']" in text

        owned = {"label": ["kernel-sandbox", f"kernel-sandbox.owner-pid={lab_server.process.pid}"]}
        kernels = docker_engine.containers.list(filters=owned, ignore_removed=True)
        assert len(kernels) == 1  # the notebook's kernel runs in a container owned by the server
    outside = [url for url in requests if not url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))]
    assert outside == []  # the page loaded nothing from anywhere but the local server
