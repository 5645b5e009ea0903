"""Egress by name in JupyterLab: a notebook on the default Sandboxed Python (Docker) kernel whose
kernelspec's ``network`` lists the test index ``%pip install``s from it and reaches nothing else.

One browser session (Playwright + Debian's chromium) on a JupyterLab of its own, started with the
resolver map that sends ``index.test`` to 127.0.0.1 (:mod:`support.package_index`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.package_index import Index, serve_index
from kernel_sandbox.kernelspecs import install as install_kernelspec
from support.launcher_hooks import TEST_RESOLVER_ENV
from support.lab import chromium, jupyterlab, recording_page, remove_kernels_of, run_cell

pytestmark = pytest.mark.security("attack", "egress")

FETCH = """import urllib.request
try:
    urllib.request.urlopen('http://elsewhere.test/simple/', timeout=20)
    print('reached')
except Exception as exc:
    print('refused', getattr(exc, 'code', None), exc)"""


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    with serve_index(tmp_path, {"labpkg": 17}) as served:
        yield served


def test_a_notebook_pip_installs_from_the_listed_index_and_reaches_nothing_else(
    docker_engine, tmp_path: Path, index: Index
) -> None:
    prefix = tmp_path / "prefix"
    install_kernelspec(
        "sandboxed-python", prefix=str(prefix), install_as="sandboxed-python-index",
        display_name="Sandboxed Python (index)",
        config={"network": [index.entry], "package_index": [index.url, index.entry], "standby": 0},
    )
    lab_env = {TEST_RESOLVER_ENV: str(index.resolver_file)}
    with jupyterlab(tmp_path / "lab", prefix / "share" / "jupyter", "egress-lab-server.log", env=lab_env) as lab:
        with chromium() as browser, recording_page(browser, "egress-lab-failure.png") as (page, _):
            page.goto(f"{lab.url}/lab?token={lab.token}")
            page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python (index)"]').click()
            notebook = page.locator(".jp-NotebookPanel:visible")
            assert "Successfully installed labpkg-0.1" in run_cell(page, notebook, "%pip install labpkg", "Successfully installed")
            assert run_cell(page, notebook, "import labpkg\nprint('VALUE', labpkg.VALUE)", "VALUE").strip() == "VALUE 17"
            refused = run_cell(page, notebook, FETCH, "refused")
            assert refused.startswith("refused 403") and "kernel-sandbox refused elsewhere.test" in refused
            assert "'network' option" in refused, refused
        assert any(path.endswith("labpkg-0.1-py3-none-any.whl") for path in index.served)
    assert not remove_kernels_of(docker_engine, lab.process.pid), "JupyterLab left a kernel container behind"
