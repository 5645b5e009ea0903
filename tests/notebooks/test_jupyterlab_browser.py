"""JupyterLab in headless Chromium: pick "Sandboxed Python" in the launcher and run a cell in it.

Uses Debian's chromium (``apt-get install chromium``) through Playwright's ``executable_path``;
Playwright's own browser downloads are never used. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import httpx

from support.lab import ARTIFACTS, LabServer, kernel_containers, recording_page, run_cell

CODE = "import os, socket\nprint('hostname:', socket.gethostname())\nprint('interfaces:', sorted(os.listdir('/sys/class/net')))"


def _sessions(lab: LabServer) -> list[dict]:
    return httpx.get(f"{lab.url}/api/sessions", headers=lab.headers).json()


def test_launcher_sandboxed_python_runs_a_cell_in_the_container(browser, lab_server, docker_engine) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with recording_page(browser, "jupyterlab-failure.png") as (page, requests):
        page.goto(f"{lab_server.url}/lab?token={lab_server.token}")
        card = page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python"]')
        card.wait_for()
        assert page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python (small)"]').count() == 1
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-launcher.png"))
        before = {s["id"] for s in _sessions(lab_server)}
        card.click()

        panel = page.locator(".jp-NotebookPanel:visible")
        panel.locator(".jp-Toolbar-kernelName", has_text="Sandboxed Python").wait_for()
        text = run_cell(page, panel, CODE, "interfaces:")
        panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
        page.screenshot(path=str(ARTIFACTS / "jupyterlab.png"))
        assert "hostname: sandbox" in text
        assert "interfaces: ['lo']" in text

        (session,) = [s for s in _sessions(lab_server) if s["id"] not in before]  # (the server is shared)
        assert session["kernel"]["name"] == "sandboxed-python"
        kernels = kernel_containers(docker_engine, lab_server.process.pid, session["kernel"]["id"])
        assert len(kernels) == 1  # the notebook's kernel runs in a container owned by the server
    outside = [url for url in requests if not url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))]
    assert outside == []  # the page loaded nothing from anywhere but the local server
