"""A kernel that sleeps while its notebook is open in JupyterLab (headless Chromium), and wakes for the next cell
(issue 37).

A notebook on a kernelspec with ``suspend_after`` a few seconds defines a 100 MB DataFrame; left idle, its
kernel's container goes (asked of the engine by the kernel's id) while the page stays connected; the next cell
gets the right answer from a new container, under the same kernel id, its execution count going on, with one
line saying that the kernel slept. A page reload while it sleeps (kernel_info, comm_info, history, the
debugger's ``debugInfo``) does not wake it.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import nbformat
import psutil
import pytest

from kernel_sandbox.kernelspecs import install
from kernel_sandbox.reattach import records

from support.kernel import DORMANT_GOAL, dormant, unique_memory
from support.lab import LabServer, jupyterlab, kernel_containers, recording_page, remove_kernels_of, run_cell, wait_for_kernel

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

SLEEPY = "sandboxed-python-sleepy"
DISPLAY = "Sandboxed Python (sleepy)"


@pytest.fixture(scope="module")
def sleepy_lab(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab with a Docker kernelspec whose kernels sleep after 3 idle seconds."""
    base = tmp_path_factory.mktemp("sleepy-lab")
    prefix = base / "prefix"
    install("sandboxed-python", prefix=str(prefix), install_as=SLEEPY, display_name=DISPLAY,
            config={"suspend_after": 3, "memory": "1g"})
    with jupyterlab(base, prefix / "share" / "jupyter", "jupyterlab-sleepy-server.log") as server:
        yield server
    assert not remove_kernels_of(docker_engine, server.process.pid), "JupyterLab left kernel containers behind"


def _kernel_id(lab: LabServer, path: str) -> str:
    (session,) = [s for s in httpx.get(f"{lab.url}/api/sessions", headers=lab.headers).json() if s["path"] == path]
    return session["kernel"]["id"]


def _page_shows(page: Any, text: str) -> bool:
    """True when the page or one of its output frames shows ``text``."""
    return any(text in frame.locator("body").inner_text() for frame in page.frames)


def test_a_notebooks_kernel_sleeps_and_the_next_cell_wakes_it_with_its_dataframe(browser, sleepy_lab: LabServer, docker_engine) -> None:
    path = f"sleepy-{secrets.token_hex(4)}.ipynb"
    metadata = {"kernelspec": {"name": SLEEPY, "display_name": DISPLAY, "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell()], metadata=metadata), str(sleepy_lab.root_dir / path))
    try:
        with recording_page(browser, "sleep-browser-failure.png") as (page, _):
            page.goto(f"{sleepy_lab.url}/lab/workspaces/sleepy/tree/{path}?reset&token={sleepy_lab.token}")
            panel = page.locator(".jp-NotebookPanel:visible")
            panel.locator(".jp-Toolbar-kernelName", has_text=DISPLAY).wait_for()
            wait_for_kernel(page, panel)
            code = ("import numpy as np, pandas as pd\n"
                    "df = pd.DataFrame(np.ones((2**20 * 100 // 8 // 4, 4)))\nprint('made', df.shape)")
            run_cell(page, panel, code, "made (3276800, 4)")
            kernel_id = _kernel_id(sleepy_lab, path)
            assert len(kernel_containers(docker_engine, sleepy_lab.process.pid, kernel_id)) == 1

            deadline = time.monotonic() + 120
            while kernel_containers(docker_engine, sleepy_lab.process.pid, kernel_id):
                assert time.monotonic() < deadline, "the kernel did not sleep"
                time.sleep(0.5)
            page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r" \| Idle$")).wait_for()  # still connected
            (private,) = [record.private for record in records()[0] if record.kernel_id == kernel_id]
            (launcher,) = [child.pid for child in psutil.Process(sleepy_lab.process.pid).children(recursive=True)
                           if child.status() != psutil.STATUS_ZOMBIE and str(private) in " ".join(child.cmdline())]
            while not dormant(launcher):  # the page's connections now reach the small process that holds them
                assert time.monotonic() < deadline, "the sleeping kernel's launcher did not make way"
                time.sleep(0.5)
            page.wait_for_timeout(1000)  # the usage panel's polls, answered by the dormant process
            assert dormant(launcher) and unique_memory(launcher) <= DORMANT_GOAL

            # a reload while it sleeps: the page asks kernel_info, comm_info, history and the debugger's
            # debugInfo again, and the launcher answers them all without waking the kernel
            sent: list[str] = []
            page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(
                payload if isinstance(payload, str) else payload.decode(errors="replace"))))
            page.reload()
            deadline, settled = time.monotonic() + 60, 0.0
            while not settled or time.monotonic() < settled + 2:  # anything that would wake it has come by then
                assert not kernel_containers(docker_engine, sleepy_lab.process.pid, kernel_id), "the reload woke the kernel"
                assert time.monotonic() < deadline, ("the page did not ask debugInfo and show the debugger after the reload; "
                                                         f"debugInfo asked: {any('debugInfo' in frame for frame in sent)}")
                if not settled and any('"debugInfo"' in frame for frame in sent) and page.locator(
                        '.jp-DebuggerBugButton[title="Enable Debugger"]').count():
                    settled = time.monotonic()
                page.wait_for_timeout(250)
            wait_for_kernel(page, panel)

            out = run_cell(page, panel, "print('shape', df.shape)", "shape")
            assert out.strip() == "shape (3276800, 4)", out
            assert _page_shows(page, "[kernel-sandbox] The kernel slept from"), "no line said the kernel slept"
            assert _kernel_id(sleepy_lab, path) == kernel_id, "the same kernel, not a new one"
            assert len(kernel_containers(docker_engine, sleepy_lab.process.pid, kernel_id)) == 1
            prompts = panel.locator(".jp-InputArea-prompt").all_inner_texts()
            assert "[2]:" in prompts, prompts  # the execution count went on
    finally:
        for session in httpx.get(f"{sleepy_lab.url}/api/sessions", headers=sleepy_lab.headers).json():
            if session["path"] == path:
                httpx.delete(f"{sleepy_lab.url}/api/sessions/{session['id']}", headers=sleepy_lab.headers, timeout=60)
