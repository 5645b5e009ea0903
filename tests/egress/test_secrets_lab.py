"""A secret in JupyterLab: a notebook on a Sandboxed Python kernelspec installed with ``--secret`` calls
the local HTTPS API (:mod:`support.secrets_servers`) and sees only the answer, while the API receives the value
that the Jupyter server's environment holds.

One browser session (Playwright + Debian's chromium) on a JupyterLab of its own, started with the
value in its environment, the test resolver map and the test CA in ``SSL_CERT_FILE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_sandbox.cli import main as cli
from support.lab import chromium, jupyterlab, recording_page, remove_kernels_of, run_cell
from support.secrets_servers import Servers, serve

pytestmark = pytest.mark.security("attack", "egress")

VALUE = "sk-lab-test-value-that-only-the-jupyter-server-holds-0000"

CALL = """import os, urllib.request
request = urllib.request.Request('https://api.test:{port}/lab', headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}})
print('answer', urllib.request.urlopen(request, timeout=30).read().decode())"""

LOOK = """import os
print('holds', len(os.environ['API_KEY']), os.environ['API_KEY'][:4] == {prefix!r})"""


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    (tmp_path / "servers").mkdir()
    with serve(tmp_path / "servers") as running:
        yield running
        assert running.guard_fired == []


def test_a_notebook_calls_the_api_with_a_secret_it_never_sees(docker_engine, tmp_path: Path, servers: Servers) -> None:
    prefix = tmp_path / "prefix"
    argv = ["install", "--prefix", str(prefix), "--name", "sandboxed-python-secret", "--display-name", "Sandboxed Python (secret)",
            "--secret", f"API_KEY@api.test:{servers.tls_port}", "--set", "standby=0"]
    for entry in servers.network():
        argv += ["--allow", entry]
    assert cli(argv) == 0
    spec = prefix / "share" / "jupyter" / "kernels" / "sandboxed-python-secret" / "kernel.json"
    assert VALUE not in spec.read_text()
    before = len(servers.requests)
    with jupyterlab(tmp_path / "lab", prefix / "share" / "jupyter", "secrets-lab-server.log", env={"API_KEY": VALUE}) as lab:
        with chromium() as browser, recording_page(browser, "secrets-lab-failure.png") as (page, _):
            page.goto(f"{lab.url}/lab?token={lab.token}")
            page.locator('.jp-LauncherCard[data-category="Notebook"][title="Sandboxed Python (secret)"]').click()
            notebook = page.locator(".jp-NotebookPanel:visible")
            assert run_cell(page, notebook, CALL.format(port=servers.tls_port), "answer").strip() == "answer ok"
            held = run_cell(page, notebook, LOOK.format(prefix=VALUE[:4]), "holds").strip()
            assert held.startswith("holds ") and held.endswith(" False"), held
            shown = "\n".join(frame.locator("body").inner_text() for frame in page.frames)
            assert "answer ok" in shown and VALUE not in shown
    assert ["Authorization", f"Bearer {VALUE}"] in servers.requests[before]["headers"]
    assert VALUE not in lab.log.read_text()
    assert not remove_kernels_of(docker_engine, lab.process.pid), "JupyterLab left a kernel container behind"
