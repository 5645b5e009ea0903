"""`kernel-sandbox setup` and `kernel-sandbox lab` from a machine with no image and no kernelspec.

The state is made fresh, not borrowed: a temporary image tag nobody has built and an empty
Jupyter prefix, config, data and runtime directory. The first `setup` builds the image through
the real build path; Docker's layer cache (filled by `.ci/run`'s image phase, or any earlier
build on this engine) makes that take seconds instead of minutes. The tag is removed at the end;
the layers stay with the image that shares them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from docker.errors import ImageNotFound
from test_jupyter_server_api import KernelChannels

from kernel_sandbox.docker.containers import LABEL
from kernel_sandbox.docker.connect import has_image

from support.lab import ARTIFACTS, LabServer, chromium, free_port, kernel_sandbox_lab, remove_kernels_of, run_cell, wait_for_kernel
from support.notebooks import cli

SPEC = "sandboxed-python"
STATUS_BAR_LOADED = "kernel-sandbox: the status bar's memory counts the sandboxed kernels"


@dataclass
class Fresh:
    """A temporary image tag and Jupyter directories, and the environment that points at them."""

    image: str
    base: Path
    prefix: Path
    env: dict[str, str]

    def setup(self) -> subprocess.CompletedProcess[str]:
        return cli("setup", "--prefix", str(self.prefix), "--image", self.image, env=self.env, timeout=900)


@pytest.fixture(scope="module")
def fresh(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fresh]:
    base = tmp_path_factory.mktemp("first-contact")
    image = f"kernel-sandbox-test-{uuid.uuid4().hex[:12]}:latest"
    assert not has_image(docker_engine, image)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JUPYTER", "JPY_"))}
    env.update({
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_DATA_DIR": str(base / "data"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
    })
    try:
        yield Fresh(image, base, base / "prefix", env)
    finally:
        try:
            docker_engine.images.remove(image)  # untags; layers another image uses stay
        except ImageNotFound:
            pass


@pytest.fixture(scope="module")
def first_setup(fresh: Fresh) -> subprocess.CompletedProcess[str]:
    result = fresh.setup()
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_setup_builds_the_missing_image_and_installs_the_kernelspec(fresh: Fresh, first_setup, docker_engine) -> None:
    out = first_setup.stdout
    assert "[ok] docker engine: reachable" in out
    assert f"[..] kernel image: {fresh.image} is missing; building it" in out
    assert re.search(rf"\[ok\] kernel image: {re.escape(fresh.image)} built in \d+ s", out)
    assert "Step 16/16" in out  # the build's progress is shown
    spec_dir = fresh.prefix / "share" / "jupyter" / "kernels" / SPEC
    assert f"[ok] kernelspec: {SPEC} installed in {spec_dir}" in out
    extension = fresh.prefix / "share" / "jupyter" / "labextensions" / "kernel-sandbox-frame"
    assert f"installed in {extension}" in out and (extension / "package.json").is_file()
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"] == {"suspend_after": 1800, "image": fresh.image}
    assert docker_engine.images.get(fresh.image).labels.get(LABEL) == "true"


def test_a_second_setup_rebuilds_and_reinstalls_nothing(fresh: Fresh, first_setup, docker_engine) -> None:
    image_id = docker_engine.images.get(fresh.image).id
    spec_file = fresh.prefix / "share" / "jupyter" / "kernels" / SPEC / "kernel.json"
    written = spec_file.stat().st_mtime_ns
    again = fresh.setup()
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"[ok] kernel image: {fresh.image} is present" in again.stdout
    assert f"[ok] kernelspec: {SPEC} is up to date in {spec_file.parent}" in again.stdout
    assert "[ok] lab extension: kernel-sandbox-frame is up to date in" in again.stdout
    assert "Step " not in again.stdout and "building" not in again.stdout
    assert docker_engine.images.get(fresh.image).id == image_id
    assert spec_file.stat().st_mtime_ns == written


def start_lab(fresh: Fresh, engine, name: str, *extra: str) -> Iterator[LabServer]:
    root = fresh.base / f"root-{name}"
    root.mkdir()
    logs = fresh.base / name
    try:
        # these tests check that a stopped server leaves nothing: kernels shut down with it, not kept for the next
        with kernel_sandbox_lab(["--prefix", str(fresh.prefix), "--image", fresh.image,
                                 "--ReattachingKernelManager.keep_kernels_on_exit=False", *extra],
                                root=root, logs=logs, env=fresh.env) as lab:
            yield lab
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"kernel-sandbox-lab-{name}.log").write_text(
            logs.with_suffix(".out").read_text() + logs.with_suffix(".err").read_text())
    left = remove_kernels_of(engine, lab.process.pid)
    assert not left, f"kernel-sandbox lab left {len(left)} kernel container(s) behind"


@pytest.fixture(scope="module")
def lab(fresh: Fresh, first_setup, docker_engine) -> Iterator[LabServer]:
    yield from start_lab(fresh, docker_engine, "default")


@pytest.fixture(scope="module")
def locked_lab(fresh: Fresh, first_setup, docker_engine) -> Iterator[LabServer]:
    yield from start_lab(fresh, docker_engine, "locked", "--locked-down")


async def hostname_of_a_new_default_kernel(lab: LabServer) -> str:
    """Start a kernel without naming one, as JupyterLab's "New notebook" does, and return what it prints."""
    async with httpx.AsyncClient(base_url=lab.url, headers=lab.headers, timeout=120) as http:
        response = await http.post("/api/kernels", json={})
        assert response.status_code == 201, response.text
        kernel = response.json()
        try:
            assert kernel["name"] == SPEC
            async with KernelChannels(lab, kernel["id"]) as channels:
                reply, out = await channels.until_reply(
                    await channels.execute("import socket\nprint(socket.gethostname())")
                )
            assert reply["status"] == "ok", reply
            return out.strip()
        finally:
            assert (await http.delete(f"/api/kernels/{kernel['id']}")).status_code == 204


async def test_lab_serves_sandboxed_python_as_the_default_kernel(fresh: Fresh, lab: LabServer) -> None:
    assert httpx.get(f"{lab.url}/api/status").status_code == 403  # the token is required
    async with httpx.AsyncClient(base_url=lab.url, headers=lab.headers, timeout=30) as http:
        assert (await http.get("/api/status")).status_code == 200
        assert (await http.get("/api/terminals")).status_code == 200  # an ordinary server: terminals on
        specs = (await http.get("/api/kernelspecs")).json()
    assert specs["default"] == SPEC
    assert "python3" in specs["kernelspecs"]  # an ordinary server offers the local kernel too
    spec = specs["kernelspecs"][SPEC]["spec"]
    assert spec["display_name"] == "Sandboxed Python"
    assert spec["metadata"]["kernel_provisioner"]["config"]["image"] == fresh.image
    assert await hostname_of_a_new_default_kernel(lab) == "sandbox"
    assert STATUS_BAR_LOADED in lab.log.read_text()  # jupyter-resource-usage is installed here


def test_new_notebook_from_the_file_menu_starts_sandboxed_python(lab: LabServer) -> None:
    """JupyterLab's File → New → Notebook starts the kernel the new file's metadata names (else it asks,
    preselecting the alphabetically first kernel, "Python 3"): the server writes the default kernel there."""
    with chromium() as browser:  # per test: Playwright's event loop ends with it, before the next async test
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(90_000)
        try:
            page.goto(f"{lab.url}/lab?token={lab.token}")
            page.locator('.jp-LauncherCard[data-category="Notebook"]').first.wait_for()
            assert page.evaluate("document.body.dataset.kernelSandboxFrame") == "active"  # kernel-sandbox-frame is loaded
            page.locator('div.lm-MenuBar-itemLabel:text-is("File")').click()
            page.locator('.lm-Menu-itemLabel:text-is("New")').click()
            page.locator('.lm-Menu-itemLabel:text-is("Notebook")').click()
            panel = page.locator(".jp-NotebookPanel:visible")
            panel.locator(".jp-Toolbar-kernelName", has_text="Sandboxed Python").wait_for()
            wait_for_kernel(page, panel)
            assert page.locator(".jp-Dialog").count() == 0  # no "Select Kernel" question
            assert run_cell(page, panel, "import socket; print('host', socket.gethostname())", "host").strip() == "host sandbox"
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "kernel-sandbox-lab-new-notebook-failure.png"))
            raise


async def test_a_new_notebook_names_the_default_kernel_but_others_keep_theirs(lab: LabServer) -> None:
    async with httpx.AsyncClient(base_url=lab.url, headers=lab.headers, timeout=30) as http:
        created = (await http.post("/api/contents", json={"type": "notebook"})).json()
        content = (await http.get(f"/api/contents/{created['path']}")).json()["content"]
        assert content["metadata"]["kernelspec"] == {
            "name": SPEC, "display_name": "Sandboxed Python", "language": "python",
        }
        mine = {"cells": [], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
                "nbformat": 4, "nbformat_minor": 5}
        saved = await http.put("/api/contents/mine.ipynb", json={"type": "notebook", "content": mine})
        assert saved.status_code == 201, saved.text
        content = (await http.get("/api/contents/mine.ipynb")).json()["content"]
        assert content["metadata"]["kernelspec"]["name"] == "python3"


async def test_locked_down_lab_offers_and_starts_only_sandboxed_kernels(locked_lab: LabServer) -> None:
    async with httpx.AsyncClient(base_url=locked_lab.url, headers=locked_lab.headers, timeout=30) as http:
        specs = (await http.get("/api/kernelspecs")).json()
        assert specs["default"] == SPEC and list(specs["kernelspecs"]) == [SPEC]

        # python3 is refused by name: as a kernel, in a session, and its spec is unknown
        refused = await http.post("/api/kernels", json={"name": "python3"})
        assert refused.status_code >= 400
        session = await http.post(
            "/api/sessions", json={"path": "x.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
        )
        assert session.status_code == 501 and "python3 not found" in session.text
        assert (await http.get("/api/kernelspecs/python3")).status_code == 404
        assert (await http.get("/api/kernels")).json() == []

        # no terminals, no extension installs, no language servers
        assert (await http.get("/api/terminals")).status_code == 404
        assert (await http.post("/api/terminals")).status_code == 404
        install = await http.post("/lab/api/extensions", json={"cmd": "install", "extension_name": "anything"})
        assert install.status_code >= 400
        assert (await http.get("/lsp/status")).status_code == 404
        hidden = await http.put("/api/contents/.bashrc", json={"type": "file", "format": "text", "content": "x"})
        assert hidden.status_code >= 400
    assert await hostname_of_a_new_default_kernel(locked_lab) == "sandbox"
    assert STATUS_BAR_LOADED in locked_lab.log.read_text()  # beside jupyter_lsp=False in the same setting


def locked_down_refusal(fresh: Fresh, root: Path, env: dict[str, str]) -> str:
    """Run `kernel-sandbox lab --locked-down` where it must refuse to start; return its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "kernel_sandbox.cli", "lab", "--locked-down", "--prefix", str(fresh.prefix),
         "--image", fresh.image, "--no-browser", "--port", str(free_port()), "--notebook-dir", str(root),
         "--allow-root"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "lab?token=" not in result.stdout
    return result.stderr


def test_locked_down_lab_refuses_to_serve_its_own_jupyter_directories(fresh: Fresh, first_setup) -> None:
    stderr = locked_down_refusal(fresh, fresh.base, fresh.env)
    assert f"--locked-down will not serve {fresh.base}: it contains" in stderr
    assert str(fresh.prefix / "share" / "jupyter") in stderr


def test_locked_down_lab_refuses_a_config_file_that_undoes_it(fresh: Fresh, first_setup, tmp_path: Path) -> None:
    (tmp_path / "jupyter_server_config.py").write_text("c.FileContentsManager.allow_hidden = True\n")
    root = tmp_path / "root"
    root.mkdir()
    stderr = locked_down_refusal(fresh, root, {**fresh.env, "JUPYTER_CONFIG_DIR": str(tmp_path)})
    assert "--locked-down could not take effect: the server has ContentsManager.allow_hidden=True" in stderr
