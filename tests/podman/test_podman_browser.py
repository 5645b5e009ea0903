"""JupyterLab in headless Chromium on a Podman-backed Sandboxed Python (issue 39): a cell runs in a Podman
container (the Docker engine holds none of the kernel's), an interrupt stops a running cell, a restart gives
a fresh interpreter, and shutting the kernel down removes its container from Podman's store.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import nbformat
import pytest

from kernel_sandbox.kernelspecs import install

from support.kernel import PODMAN
from support.lab import LabServer, chromium, in_frames, jupyterlab, kernel_containers, recording_page, remove_kernels_of, run_cell

pytestmark = [pytest.mark.timeout(300)]

SPEC, DISPLAY = "sandboxed-python-podman", "Sandboxed Python (Podman)"


@pytest.fixture(scope="module")
def podman_lab(podman_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab with one kernelspec, Sandboxed Python on Podman (``engine: podman``), as `kernel-sandbox install` makes it."""
    base = tmp_path_factory.mktemp("podman-lab")
    prefix = base / "prefix"
    install("sandboxed-python", prefix=str(prefix), install_as=SPEC, display_name=DISPLAY, config={"engine": PODMAN})
    with jupyterlab(base, prefix / "share" / "jupyter", "podman-jupyterlab-server.log") as server:
        yield server
    left = remove_kernels_of(podman_engine, server.process.pid)
    assert not left, f"JupyterLab left {len(left)} kernel container(s) behind in Podman after it shut down"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as browser:
        yield browser


def _kernel_menu(page: Any, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
    page.locator(".lm-Menu-item:not(.lm-mod-disabled)", has_text=re.compile(rf"^{re.escape(item)}")).first.click()


def _kernel_id(lab: LabServer, path: str) -> str:
    (session,) = [s for s in httpx.get(f"{lab.url}/api/sessions", headers=lab.headers).json() if s["path"] == path]
    return session["kernel"]["id"]


def test_a_cell_interrupt_restart_and_shutdown_on_podman(browser, podman_lab, podman_engine, docker_engine) -> None:
    path = f"podman-{secrets.token_hex(4)}.ipynb"
    metadata = {"kernelspec": {"name": SPEC, "display_name": DISPLAY, "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell()], metadata=metadata), str(podman_lab.root_dir / path))
    server = podman_lab.process.pid
    with recording_page(browser, "podman-jupyterlab-failure.png") as (page, requests):
        page.goto(f"{podman_lab.url}/lab/workspaces/podman/tree/{path}?reset&token={podman_lab.token}")
        panel = page.locator(".jp-NotebookPanel:visible")
        panel.locator(".jp-Toolbar-kernelName", has_text=DISPLAY).wait_for()

        # a cell runs, in a container of Podman's: the sandbox's hostname, only `lo`, a uid that is not root
        shown = run_cell(page, panel, "import os, socket\nx = 42\nprint('in', socket.gethostname(), sorted(os.listdir('/sys/class/net')), os.getuid() != 0)", "in ")
        assert shown.strip() == "in sandbox ['lo'] True", shown
        kernel_id = _kernel_id(podman_lab, path)
        (first,) = kernel_containers(podman_engine, server, kernel_id)
        assert kernel_containers(docker_engine, server, kernel_id) == []

        # an interrupt stops a running cell, and the kernel goes on with its variables
        run_cell(page, panel, "import time\nprint('sleeping', flush=True)\ntime.sleep(600)", "sleeping")
        _kernel_menu(page, "Interrupt Kernel")
        assert in_frames(page, ".jp-OutputArea-output", "KeyboardInterrupt", seconds=60), "the interrupt did not stop the cell"
        assert run_cell(page, panel, "print('still', x)", "still").strip() == "still 42"

        # a restart: a fresh interpreter (x is gone), still on Podman
        _kernel_menu(page, "Restart Kernel…")
        page.locator(".jp-Dialog .jp-mod-accept").click()
        page.locator(".jp-Dialog").wait_for(state="detached")
        assert run_cell(page, panel, "print('restarted', 'x' in globals())", "restarted").strip() == "restarted False"
        assert len(kernel_containers(podman_engine, server, kernel_id)) == 1

        # shutting the kernel down removes its container from Podman
        _kernel_menu(page, "Shut Down Kernel")  # a notebook's: no dialog
        def gone() -> bool:
            listed = {kernel["id"] for kernel in httpx.get(f"{podman_lab.url}/api/kernels", headers=podman_lab.headers).json()}
            left = {c.id for c in podman_engine.containers.list(all=True, ignore_removed=True)}
            return kernel_id not in listed and first.id not in left and not kernel_containers(podman_engine, server, kernel_id)

        deadline = time.monotonic() + 60
        while not gone():
            assert time.monotonic() < deadline, "the kernel or its Podman container outlived its shutdown by 60 s"
            time.sleep(0.5)
    outside = [url for url in requests if not url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))]
    assert outside == []
