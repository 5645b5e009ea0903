"""jupyter-resource-usage's kernel usage panel on a sandboxed kernel: the launcher's answer, from the cgroup.

The extension's server handler sends ``usage_request`` on the kernel's control channel and shows
the first reply; the launcher answers it from the container's cgroup (the kernel never sees it).
The figures are compared with the cgroup's own counter, read here from the host.
"""

from __future__ import annotations

import re
import time

import httpx

from support.kernel import memory_in_use
from support.lab import ARTIFACTS, kernel_containers, recording_page, run_cell

SMALL = 256 * 2**20


def _kernel_container(engine, lab_server, kernel_id: str):
    for container in kernel_containers(engine, lab_server.process.pid, kernel_id):
        return container
    raise AssertionError(f"no container serves kernel {kernel_id}")


def test_kernel_usage_handler_gets_the_sandboxes_figures(lab_server, docker_engine) -> None:
    api = httpx.Client(base_url=lab_server.url, headers=lab_server.headers, timeout=60)
    kernel = api.post("/api/kernels", json={"name": "sandboxed-python-small"}).json()
    try:
        container = _kernel_container(docker_engine, lab_server, kernel["id"])
        answer = api.get(f"/api/metrics/v1/kernel_usage/get_usage/{kernel['id']}").json()
        counted = memory_in_use(container.id)
        content = answer["content"]
        assert answer["msg_type"] == "usage_reply" and content["hostname"] == "sandbox"
        assert content["host_virtual_memory"]["total"] == SMALL  # the sandbox's limit, not the machine's
        assert abs(content["kernel_memory"] - counted) <= 8 * 2**20
        assert content["kernel_sandbox"]["pids_limit"] == 64
    finally:
        api.delete(f"/api/kernels/{kernel['id']}")


def test_the_usage_panel_shows_memory_against_the_sandboxes_limit(browser, lab_server, docker_engine) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with recording_page(browser, "usage-panel-failure.png") as (page, _):
        page.goto(f"{lab_server.url}/lab/workspaces/usage-panel?reset&token={lab_server.token}")  # its own workspace: no notebook another test left open hides the launcher
        page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python (small)"]').click()
        notebook = page.locator(".jp-NotebookPanel:visible")
        notebook.locator(".jp-Toolbar-kernelName", has_text="Sandboxed Python (small)").wait_for()
        run_cell(page, notebook, "hog = b'x' * (128 * 2**20)\nprint('allocated')", "allocated")
        page.locator('.lm-TabBar-tab[title="Kernel Usage"]').click()
        usage = page.locator(".jp-KernelUsage-content")
        usage.filter(has_text="Kernel Host: sandbox").wait_for()
        deadline = time.monotonic() + 30
        while (shown := _mb(usage.inner_text(), "Memory")) < 128 and time.monotonic() < deadline:
            time.sleep(0.5)  # the panel asks again every 5 s
        text = usage.inner_text()
        page.screenshot(path=str(ARTIFACTS / "usage-panel.png"))
        kernel_id = re.search(r"Kernel ID:\s*(\S+)", text).group(1)
        counted = memory_in_use(_kernel_container(docker_engine, lab_server, kernel_id).id) / 2**20
        assert shown >= 128 and abs(shown - counted) <= 16, text
        assert _mb(text, "Total") == 256.0, text  # the "host" memory is the sandbox's limit


def _mb(text: str, label: str) -> float:
    found = re.search(rf"{label}:\s*([\d.]+) MB", text)
    return float(found.group(1)) if found else 0.0
