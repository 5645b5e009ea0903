"""JupyterLab's status-bar memory (jupyter-resource-usage's ``/api/metrics/v1``) counts the sandboxed
kernels' containers, with kernel_sandbox.statusbar enabled by the config line docs/docker.md gives.

jupyter-resource-usage's own handler sums the server's process tree, where a container's memory
never is (it lives under the Docker engine): the figure growing with the kernel's allocation shows
this extension's handler answers the path, whichever extension loaded first.
"""

from __future__ import annotations

from collections.abc import Iterator

import re
import time

import httpx
import psutil
import pytest

from kernel_sandbox.kernelspecs import install

from support.kernel import memory_in_use
from support.lab import ARTIFACTS, LabServer, jupyterlab, kernel_containers, recording_page, remove_kernels_of, run_cell
from test_jupyter_server_api import KernelChannels

MiB = 2**20
HOG = 200 * MiB
CONFIG = """
c.ServerApp.jpserver_extensions = {"kernel_sandbox.statusbar": True}

def memory_limit(rss, pss=None):  # the limit the test wrote last: the warning is decided on the sum
    with open(%r) as file:
        return int(file.read())

c.ResourceUseDisplay.mem_limit = memory_limit
c.ResourceUseDisplay.mem_warning_threshold = 0.5
"""


@pytest.fixture(scope="module")
def counting_lab(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab with Sandboxed Python and the status-bar extension, its memory limit read from a
    file (``limit``)."""
    base = tmp_path_factory.mktemp("status-bar")
    prefix = base / "prefix"
    install("sandboxed-python", prefix=str(prefix))
    (base / "limit").write_text("0")
    (base / "config").mkdir()
    (base / "config" / "jupyter_server_config.py").write_text(CONFIG % str(base / "limit"))
    with jupyterlab(base, prefix / "share" / "jupyter", "status-bar-server.log") as server:
        yield server
    left = remove_kernels_of(docker_engine, server.process.pid)
    assert not left, f"JupyterLab left {len(left)} kernel container(s) behind"


def _tree_rss(pid: int) -> int:
    """What jupyter-resource-usage's own handler counts: the server's process tree."""
    server = psutil.Process(pid)
    return sum(process.memory_info().rss for process in [server, *server.children(recursive=True)])


async def _run(channels: KernelChannels, code: str) -> None:
    reply, _ = await channels.until_reply(await channels.execute(code), timeout=120)
    assert reply["status"] == "ok", reply


async def test_the_status_bar_counts_a_sandboxed_kernels_memory_and_warns_on_it(counting_lab, docker_engine) -> None:
    limit_file = counting_lab.root_dir.parent / "limit"
    async with httpx.AsyncClient(base_url=counting_lab.url, headers=counting_lab.headers, timeout=60) as api:

        async def metrics() -> dict:
            answer = await api.get("/api/metrics/v1")
            assert answer.status_code == 200, answer.text
            return answer.json()

        kernel = (await api.post("/api/kernels", json={"name": "sandboxed-python"})).json()
        try:
            async with KernelChannels(counting_lab, kernel["id"]) as channels:
                await _run(channels, "import gc")
                container = kernel_containers(docker_engine, counting_lab.process.pid, kernel["id"])[0]
                before, tree_before = await metrics(), _tree_rss(counting_lab.process.pid)
                limit = before["rss"] + 2 * HOG  # half of it left: no warning yet
                limit_file.write_text(str(limit))
                quiet = await metrics()
                assert quiet["limits"]["memory"] == {"rss": limit, "pss": limit, "warn": False}, quiet

                await _run(channels, f"x = b'x' * {HOG}")
                held = await metrics()
                assert held["rss"] - before["rss"] >= 150 * MiB, (before, held)
                assert held["pss"] - before["pss"] >= 150 * MiB, (before, held)
                assert memory_in_use(container.id) >= HOG  # where the memory is: the container ...
                assert _tree_rss(counting_lab.process.pid) - tree_before < 100 * MiB  # ... not the server's tree
                assert held["limits"]["memory"]["warn"] is True, held  # less than half the limit left

                await _run(channels, "del x; gc.collect()")
                freed = await metrics()
                assert held["rss"] - freed["rss"] >= 150 * MiB, (held, freed)
                assert freed["limits"]["memory"]["warn"] is False, freed
                await _run(channels, f"x = b'x' * {HOG}")
                held = await metrics()
        finally:
            await api.delete(f"/api/kernels/{kernel['id']}")
            limit_file.write_text("0")
        assert held["rss"] - (await metrics())["rss"] >= 150 * MiB  # the kernel's container is gone


@pytest.mark.security("attack", "lab")
async def test_the_status_bar_asks_for_the_servers_login(counting_lab) -> None:
    """A page without the server's token asks for the containers' memory: refused (403)."""
    async with httpx.AsyncClient(base_url=counting_lab.url, timeout=60) as api:
        answer = await api.get("/api/metrics/v1")
    assert answer.status_code == 403


@pytest.mark.security("fault", "sessions")
async def test_a_container_killed_under_the_status_bar_counts_0_and_the_bar_still_answers(counting_lab, docker_engine) -> None:
    """A kernel's container is killed out of band while the status bar keeps its cgroup: the bar answers, counting it 0."""
    async with httpx.AsyncClient(base_url=counting_lab.url, headers=counting_lab.headers, timeout=60) as api:
        kernel = (await api.post("/api/kernels", json={"name": "sandboxed-python"})).json()
        try:
            async with KernelChannels(counting_lab, kernel["id"]) as channels:
                await _run(channels, f"x = b'x' * {HOG}")
                held = (await api.get("/api/metrics/v1")).json()  # its cgroup is found and kept
                container = kernel_containers(docker_engine, counting_lab.process.pid, kernel["id"])[0]
                container.kill()  # out of band: the kept cgroup is gone; the restarter starts another
                answers = [await api.get("/api/metrics/v1") for _ in range(5)]
            assert [answer.status_code for answer in answers] == [200] * 5, answers[-1].text
            assert held["rss"] - answers[-1].json()["rss"] >= 150 * MiB, (held, answers[-1].json())
        finally:
            await api.delete(f"/api/kernels/{kernel['id']}")


def test_the_status_bar_shows_the_sandboxed_kernels_memory(browser, counting_lab, docker_engine) -> None:
    with recording_page(browser, "status-bar-failure.png") as (page, _):
        tree = _tree_rss(counting_lab.process.pid)  # before the kernel's launcher joins it
        page.goto(f"{counting_lab.url}/lab/workspaces/status-bar?reset&token={counting_lab.token}")
        page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python"]').click()
        notebook = page.locator(".jp-NotebookPanel:visible")
        run_cell(page, notebook, f"x = b'x' * {HOG}\nprint('allocated')", "allocated")
        [kernel] = httpx.get(f"{counting_lab.url}/api/kernels", headers=counting_lab.headers).json()
        container = kernel_containers(docker_engine, counting_lab.process.pid, kernel["id"])[0]
        # the server's tree and the container, in MiB: what the bar shows (in MB or MiB) is at least that
        at_least = 0.9 * (tree + memory_in_use(container.id)) / MiB
        memory = page.locator("#jp-main-statusbar").get_by_text("Mem:")
        deadline = time.monotonic() + 30
        while (shown := _mb(memory.inner_text())) < at_least and time.monotonic() < deadline:
            time.sleep(0.5)  # the bar asks again every 5 s
        page.screenshot(path=str(ARTIFACTS / "status-bar.png"))
        assert shown >= at_least, (memory.inner_text(), at_least)  # the server's tree alone is 200 MiB less


def _mb(text: str) -> float:
    found = re.search(r"Mem:\s*([\d.]+)", text)
    return float(found.group(1)) if found else 0.0
