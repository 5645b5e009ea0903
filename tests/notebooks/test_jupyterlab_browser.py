"""JupyterLab in headless Chromium: pick "Sandboxed Python" in the launcher and run a cell in it.

Uses Debian's chromium (``apt-get install chromium``) through Playwright's ``executable_path``;
Playwright's own browser downloads are never used. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import httpx
import pytest

from kernel_sandbox.docker.containers import LABEL_KERNEL_ID, LABEL_OWNER_PID

from lab_kit import ARTIFACTS, chromium, recording_page, run_cell

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
        text = run_cell(page, panel, CODE, "interfaces:")
        panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
        page.screenshot(path=str(ARTIFACTS / "jupyterlab.png"))
        assert "hostname: sandbox" in text
        assert "interfaces: ['lo']" in text

        sessions = httpx.get(f"{lab_server.url}/api/sessions", headers=lab_server.headers).json()
        kernel_ids = [s["kernel"]["id"] for s in sessions if s["kernel"]["name"] == "sandboxed-python"]
        assert kernel_ids
        for kernel_id in kernel_ids:  # each notebook's kernel runs in a container owned by the server
            owned = {"label": [f"{LABEL_KERNEL_ID}={kernel_id}", f"{LABEL_OWNER_PID}={lab_server.process.pid}"]}
            assert len(docker_engine.containers.list(filters=owned, ignore_removed=True)) == 1, kernel_id
    outside = [url for url in requests if not url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))]
    assert outside == []  # the page loaded nothing from anywhere but the local server
