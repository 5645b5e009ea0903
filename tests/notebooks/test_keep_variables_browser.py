"""JupyterLab's "Restart Kernel, Keep Variables" (kernel-sandbox-frame) in headless Chromium (issue 29, item 2).

One notebook on Sandboxed Python defines ``x`` and an open socket ``s``; the command, picked in the
Kernel menu as a user would, runs ``%checkpoint``, restarts the kernel (a new container) and runs
``%restore``: ``x`` is back, and the notification names ``s`` as not saved. When ``%checkpoint``
fails, the error is shown (as text: the kernel wrote it) and the kernel is not restarted. On a local
kernel the command is disabled.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import httpx
import nbformat
import pytest

from support.lab import LabServer, kernel_containers, recording_page, run_cell, wait_for_kernel

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

COMMAND = "Restart Kernel, Keep Variables"
HOSTILE = '<img src=x onerror="document.body.dataset.pwnedKeep=1">no room'


def _open(page: Any, lab: LabServer, kernelspec: str, display_name: str) -> tuple[str, Any]:
    """A new notebook for ``kernelspec``, opened alone in a workspace of its own; its path and panel, its kernel idle."""
    path = f"keep-{secrets.token_hex(4)}.ipynb"
    metadata = {"kernelspec": {"name": kernelspec, "display_name": display_name, "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell()], metadata=metadata), str(lab.root_dir / path))
    page.goto(f"{lab.url}/lab/workspaces/keep-variables/tree/{path}?reset&token={lab.token}")
    panel = page.locator(".jp-NotebookPanel:visible")
    panel.locator(".jp-Toolbar-kernelName", has_text=display_name).wait_for()
    wait_for_kernel(page, panel)
    return path, panel


def _menu_item(page: Any) -> Any:
    """The command's item in the opened Kernel menu."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
    item = page.locator(".lm-Menu-item", has_text=COMMAND)
    item.wait_for()
    return item


def _kernel_id(lab: LabServer, path: str) -> str:
    (session,) = [s for s in httpx.get(f"{lab.url}/api/sessions", headers=lab.headers).json() if s["path"] == path]
    return session["kernel"]["id"]


def _container(docker_engine, lab: LabServer, kernel_id: str) -> str:
    (container,) = kernel_containers(docker_engine, lab.process.pid, kernel_id)
    return container.id


def _toast(page: Any, text: str) -> Any:
    toast = page.locator(".Toastify__toast", has_text=text).last
    toast.wait_for()
    return toast


def test_restart_keep_variables_keeps_x_names_s_as_not_saved_and_is_disabled_on_a_local_kernel(
    browser, lab_server, docker_engine
) -> None:
    opened: list[str] = []
    try:
        with recording_page(browser, "keep-variables-failure.png") as (page, _):
            # a local kernel has no %checkpoint: the command is there, disabled
            path, _ = _open(page, lab_server, "local-python", "Local Python")
            opened.append(path)
            assert "lm-mod-disabled" in (_menu_item(page).get_attribute("class") or "")
            page.keyboard.press("Escape")

            path, panel = _open(page, lab_server, "sandboxed-python", "Sandboxed Python")
            opened.append(path)
            run_cell(page, panel, "x = 41 + 1\nimport socket; s = socket.socket()\nprint('defined', x)", "defined 42")
            kernel_id = _kernel_id(lab_server, path)
            before = _container(docker_engine, lab_server, kernel_id)

            item = _menu_item(page)
            assert "lm-mod-disabled" not in (item.get_attribute("class") or "")
            item.click()
            toast = _toast(page, "Kernel restarted, variables kept")
            message = toast.inner_text()
            not_saved = re.search(r"Not saved: (.*)", message)
            assert not_saved and "s" in not_saved.group(1).split(", "), message
            assert "x" not in not_saved.group(1).split(", "), message

            # a new container, under the same kernel id, and the old one gone
            after = _container(docker_engine, lab_server, kernel_id)
            assert after != before
            assert before not in {c.id for c in docker_engine.containers.list(all=True, ignore_removed=True)}
            out = run_cell(page, panel, "print('x =', x, '| s kept:', 's' in globals())", "x =")
            assert out.strip() == "x = 42 | s kept: False"

            # the whole reports, behind the notification's Details
            toast.get_by_role("button", name="Details").click()
            details = page.locator(".jp-Dialog .kernel-sandbox-keep-details")
            details.wait_for()
            assert re.search(r"^Not saved: s \(", details.inner_text(), re.MULTILINE), details.inner_text()
            assert "%restore: " in details.inner_text()
            page.locator(".jp-Dialog .jp-mod-accept").click()

            # %checkpoint fails (here the kernel's own magic of that name raises, with markup in its error):
            # an error shown as text, and no restart
            run_cell(page, panel, f"def broken(line): raise RuntimeError({HOSTILE!r})\n"
                                  "get_ipython().register_magic_function(broken, 'line', 'checkpoint'); print('broken')", "broken")
            _menu_item(page).click()
            message = _toast(page, "Kernel not restarted").inner_text()
            assert f"%checkpoint failed (RuntimeError: {HOSTILE})" in message, message
            assert page.evaluate("document.body.dataset.pwnedKeep") is None
            assert _container(docker_engine, lab_server, kernel_id) == after
            assert run_cell(page, panel, "print('still', x)", "still").strip() == "still 42"
    finally:
        for session in httpx.get(f"{lab_server.url}/api/sessions", headers=lab_server.headers).json():
            if session["path"] in opened:
                httpx.delete(f"{lab_server.url}/api/sessions/{session['id']}", headers=lab_server.headers, timeout=60)
