"""What the JupyterLab and browser tests share: a free port, a JupyterLab server, `kernel-sandbox lab`, Chromium.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel_sandbox.docker.containers import LABEL, LABEL_OWNER_PID, kernel_of, remove_container
from kernel_sandbox.lab import LABEXTENSIONS

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = os.environ.get("KERNEL_SANDBOX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
QUIET_LAB = ["--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url="]
FRAME_EXTENSION = [f"--LabApp.extra_labextensions_path={LABEXTENSIONS}"]
"""kernel-sandbox-frame from this checkout, as a wheel or `pip install -e` installs it (the shared venv may lack it)."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(process: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM ``process``; SIGKILL it if it has not exited ``timeout`` seconds later."""
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def remove_kernels_of(engine: Any, pid: int) -> list[Any]:
    """Remove the kernel containers that process ``pid`` owned; return them (empty when it left none)."""
    left = engine.containers.list(all=True, ignore_removed=True, filters={"label": [LABEL, f"{LABEL_OWNER_PID}={pid}"]})
    for container in left:
        remove_container(container)
    return left


def kernel_containers(engine: Any, pid: int, kernel_id: str) -> list[Any]:
    """The running containers that process ``pid`` owns and that serve kernel ``kernel_id`` (a kernel
    that started as an adopted standby keeps the standby's id label: kernel_of reads the right one)."""
    owned = engine.containers.list(ignore_removed=True, filters={"label": [LABEL, f"{LABEL_OWNER_PID}={pid}"]})
    return [container for container in owned if kernel_of(container.labels) == kernel_id]


@dataclass
class LabServer:
    """A JupyterLab server on 127.0.0.1, its token and process."""

    url: str
    token: str
    process: subprocess.Popen[bytes]
    root_dir: Path
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}


@contextlib.contextmanager
def jupyterlab(
    base: Path,
    jupyter_path: Path,
    artifact: str,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    root: Path | None = None,
) -> Iterator[LabServer]:
    """JupyterLab on a random port of 127.0.0.1 with a token, seeing only the kernelspecs under ``jupyter_path``.

    kernel-sandbox-frame is on, as the package installs it; ``args`` go on its command line.
    Its config, data, runtime, settings and workspace directories are under ``base`` (``env`` may
    name others), so the user's own Jupyter set-up neither leaks in nor gets touched; news and update
    checks are off. It serves ``root`` (default: a new ``base``/root). Stopped on the way out, its log
    kept as ``test-artifacts/ARTIFACT``.
    """
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    if root is None:
        root = base / "root"
        root.mkdir()
    full_env = {
        **os.environ,
        "JUPYTER_PATH": str(jupyter_path),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_DATA_DIR": str(base / "data"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        **(env or {}),
    }
    port, token = free_port(), secrets.token_hex(16)
    log = base / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", *QUIET_LAB, *FRAME_EXTENSION, "--KernelSpecManager.ensure_native_kernel=False",
             *args],
            stdout=out, stderr=subprocess.STDOUT, env=full_env,
        )
    server = LabServer(f"http://127.0.0.1:{port}", token, process, root, log)
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/api/status", headers=server.headers, timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"JupyterLab did not answer:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    try:
        yield server
    finally:
        stop(process)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / artifact).write_bytes(log.read_bytes())


@contextlib.contextmanager
def kernel_sandbox_lab(
    args: list[str], *, root: Path, logs: Path, env: Mapping[str, str], timeout: float = 120
) -> Iterator[LabServer]:
    """`kernel-sandbox lab ARGS` on a random port, serving ``root``, until it prints its URL; stopped on the way out.

    Its output goes to ``logs``.out and ``logs``.err (``LabServer.log`` is the .err file, where the server logs).
    """
    port = free_port()
    out, err = logs.with_suffix(".out"), logs.with_suffix(".err")
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "kernel_sandbox.cli", "lab", *args, "--no-browser", "--port", str(port),
             "--notebook-dir", str(root), "--allow-root", *QUIET_LAB],
            stdout=stdout, stderr=stderr, env=dict(env),
        )
    deadline = time.monotonic() + timeout
    pattern = re.compile(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)")
    while not (found := pattern.search(out.read_text())):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"kernel-sandbox lab printed no URL:\n{out.read_text()}\n{err.read_text()[-3000:]}")
        time.sleep(0.2)
    try:
        yield LabServer(f"http://127.0.0.1:{port}", found.group(1), process, root, err)
    finally:
        stop(process, 60)


@contextlib.contextmanager
def recording_page(browser: Any, failure_png: str, *, height: int = 800, timeout_ms: float = 90_000) -> Iterator[tuple[Any, list[str]]]:
    """A page of a new context of ``browser`` and the list of every URL it requests.

    When the block fails, a screenshot goes to ``test-artifacts/FAILURE_PNG``; the context is closed on the way out.
    """
    context = browser.new_context(viewport={"width": 1280, "height": height})
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    try:
        yield page, requests
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / failure_png), full_page=True)
        raise
    finally:
        context.close()


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's headless chromium through Playwright (never Playwright's own download), closed on the way out."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium not found at {CHROMIUM} (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def in_frames(page: Any, selector: str, text: str | None = None, seconds: float = 0) -> int:
    """How many elements ``selector`` (with ``text``) the page's frames hold, kernel-sandbox-frame's outputs among them;
    waiting up to ``seconds`` for one to appear."""
    from playwright.sync_api import Error

    deadline = time.monotonic() + seconds
    while True:
        found = 0
        for frame in page.frames:
            with contextlib.suppress(Error):  # a frame that went away meanwhile (an output drawn again) holds none
                found += frame.locator(selector, has_text=text).count() if frame != page.main_frame else 0
        if found or time.monotonic() >= deadline:
            return found
        page.wait_for_timeout(250)


def frame_with(page: Any, selector: str, text: str | None = None, seconds: float = 60) -> Any:
    """The first of the page's frames that holds ``selector`` (with ``text``), waiting up to ``seconds``; fails naming it."""
    deadline = time.monotonic() + seconds
    while True:
        for frame in page.frames:
            if frame != page.main_frame and frame.locator(selector, has_text=text).count():
                return frame
        if time.monotonic() >= deadline:
            shown = "\n---\n".join(frame.locator("body").inner_text()[:500] for frame in page.frames if frame != page.main_frame)
            raise AssertionError(f"no frame shows {selector!r} with {text!r} after {seconds} s; the frames show:\n{shown}")
        page.wait_for_timeout(250)


def click_in_frame(page: Any, locator: Any, button: str = "left") -> None:
    """Click ``locator`` (an element in an output frame) as a user does: the pointer first moves over it, which makes
    its frame take pointer events (kernel-sandbox-frame keeps the others ``inert``), then presses there."""
    # the frame into view first: Chromium runs no animation frame in a frame out of view, and Playwright waits for
    # one before it scrolls to an element there
    locator.element_handle().owner_frame().frame_element().scroll_into_view_if_needed()
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x - 1, y - 1)
    page.mouse.move(x, y)
    page.wait_for_timeout(200)
    page.mouse.click(x, y, button=button)


def page_outputs(page: Any) -> list[str]:
    """The mime types of the outputs JupyterLab's page draws itself (kernel-sandbox-frame's framed areas draw none)."""
    return page.evaluate("[...document.querySelectorAll('.jp-OutputArea-output[data-mime-type]')].map(node => node.dataset.mimeType)")


def wait_for_kernel(page: Any, panel: Any) -> None:
    """Wait until notebook ``panel`` has a connected, idle kernel.

    The notebook's execution indicator says "idle" before a kernel is attached, and JupyterLab
    silently leaves a cell unrun when it is run with no kernel yet ("[ ]:", nothing sent); the status
    bar's "NAME | Idle" is the kernel's own status once it is connected.
    """
    from playwright.sync_api import TimeoutError

    try:
        panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
        page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r" \| Idle$")).wait_for()
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{lab_state(page)}") from None


def lab_state(page: Any) -> str:
    """What a JupyterLab page shows of its notebooks' kernels, for a failure message: the URL, the
    panels, their execution indicators, the status bar, and any dialog."""
    state = page.evaluate("""() => {
        const texts = selector => [...document.querySelectorAll(selector)].map(node => node.innerText.slice(0, 300));
        return {
            url: location.href,
            panels: texts('.jp-NotebookPanel').length,
            indicators: [...document.querySelectorAll('.jp-Notebook-ExecutionIndicator')].map(node => node.dataset.status),
            status: texts('.jp-StatusBar-TextItem'),
            dialogs: texts('.jp-Dialog'),
            notifications: texts('.jp-Notification-Toast'),
        };
    }""")
    return "the page shows " + json.dumps(state, indent=1)


def run_cell(page: Any, panel: Any, code: str, shows: str) -> str:
    """Type ``code`` into the last cell of notebook ``panel``, run it once its kernel is ready, and
    return the text of the output that shows ``shows``; a failure quotes what the notebook shows."""
    wait_for_kernel(page, panel)
    panel.locator(".jp-Cell .cm-content").last.click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # in the page (a local kernel's) or in an output frame (a sandboxed kernel's)
        for outputs in [panel.locator(".jp-OutputArea-output", has_text=shows)] + [
            frame.locator(".jp-OutputArea-output", has_text=shows) for frame in page.frames if frame != page.main_frame
        ]:
            if outputs.count():
                return str(outputs.last.inner_text())
        page.wait_for_timeout(250)
    shown = "\n".join(frame.locator("body").inner_text() for frame in page.frames if frame != page.main_frame)
    raise AssertionError(f"no output showing {shows!r} after running {code!r}; the notebook shows:\n"
                         f"{panel.inner_text()[-3000:]}\nand its frames:\n{shown[-3000:]}")


def put_notebook(lab: dict, path: str, kernelspec: str, sources: Iterable[str]) -> None:
    """Write a notebook of ``sources`` (code cells, not run) for ``kernelspec`` at ``path`` through the contents API."""
    cells = [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None} for src in sources]
    notebook = {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
                "metadata": {"kernelspec": {"name": kernelspec, "display_name": kernelspec, "language": "python"}}}
    put = httpx.put(f"{lab['url']}/api/contents/{path}", headers=lab["headers"],
                    json={"type": "notebook", "format": "json", "content": notebook})
    assert put.status_code in (200, 201), put.text


def run_all_cells(page: Any, lab: dict, workspace: str, path: str) -> Any:
    """Open the notebook at ``path`` in a JupyterLab workspace of its own (no other notebook reopens, so "Run All"
    cannot run in another tab), wait for its kernel, run all its cells; return the notebook's panel."""
    page.goto(f"{lab['url']}/lab/workspaces/{workspace}/tree/{path}?reset&token={lab['token']}")
    panel = page.locator(".jp-NotebookPanel:visible")
    try:
        wait_for_kernel(page, panel)
    except AssertionError as exc:
        log = lab["log"].read_text().splitlines()[-40:] if "log" in lab else ["(not kept)"]
        raise AssertionError(f"{exc}\nthe server's log ends:\n" + "\n".join(log)) from None
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    return panel
