"""The locked-down lab (``kernel-sandbox lab --locked-down``) attacked by a script in its page.

The script has what a page has: the login cookie and the ``_xsrf`` cookie, sent back with
``X-XSRFToken`` as JupyterLab's own requests do (no token header). It tries to start a kernel
that is not sandboxed or a terminal, to read hidden files, to write outside the served root,
to install an extension, and to have a sandboxed kernel mount a host directory of its choosing.

The kernelspec is installed with ``mount_cwd: ro`` (the notebook's folder mounted read-only in
the kernel, a documented option): the page then decides which folder that is.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from kernel_sandbox.kernelspecs import install

from support.lab import kernel_sandbox_lab, remove_kernels_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

SPEC = "sandboxed-python"
SECRET = "host-secret-" + uuid.uuid4().hex[:8]


@dataclass
class Page:
    """What a script in the lab's page holds: the base URL and the cookies of the logged-in page."""

    url: str
    http: httpx.Client
    root: Path
    outside: Path

    def headers(self) -> dict[str, str]:
        return {"X-XSRFToken": self.http.cookies.get("_xsrf") or ""}

    def get(self, path: str) -> httpx.Response:
        return self.http.get(self.url + path)

    def send(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return self.http.request(method, self.url + path, headers=self.headers(),
                                 content=None if body is None else json.dumps(body))

    def cookie_header(self) -> str:
        return "; ".join(f"{name}={value}" for name, value in self.http.cookies.items())


@pytest.fixture(scope="module")
def page(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """A locked-down lab (mount_cwd: ro) on a project folder, and a logged-in page of it."""
    base = tmp_path_factory.mktemp("locked-lab")
    prefix, root, outside = base / "prefix", base / "project", base / "outside"
    for folder in (root, root / ".secret", outside):
        folder.mkdir()
    (root / "notes.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (root / ".secret" / "token.txt").write_text(SECRET)
    (root / ".env").write_text(SECRET)
    (outside / "id_rsa").write_text(SECRET)
    install(SPEC, prefix=str(prefix), config={"mount_cwd": "ro"})
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JUPYTER", "JPY_"))}
    env.update({name: str(base / name.lower()) for name in (
        "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR")})
    with kernel_sandbox_lab(["--locked-down", "--prefix", str(prefix)], root=root, logs=base / "lab", env=env,
                            timeout=180) as lab:
        http = httpx.Client(timeout=120, follow_redirects=True)
        assert http.get(f"{lab.url}/lab?token={lab.token}").status_code == 200  # the page logs in: cookies set
        assert http.cookies.get("_xsrf"), http.cookies
        try:
            yield Page(lab.url, http, root, outside)
        finally:
            http.close()
    remove_kernels_of(docker_engine, lab.process.pid)


async def _run_in_kernel(page: Page, kernel_id: str, code: str) -> str:
    """Execute ``code`` in a kernel through the page's websocket; return its stdout (and errors)."""
    url = page.url.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
    ws = await websocket_connect(HTTPRequest(url, headers={"Cookie": page.cookie_header()}))
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "page", "session": uuid.uuid4().hex,
              "date": datetime.now(timezone.utc).isoformat(), "version": "5.3"}
    await ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                                       "buffers": [], "content": {"code": code, "silent": False, "store_history": False,
                                                                  "user_expressions": {}, "allow_stdin": False}}))
    text, done = "", False
    try:
        while not done:
            raw = await asyncio.wait_for(ws.read_message(), 120)
            assert raw is not None, "the kernel websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            elif msg["msg_type"] == "error":
                text += f"{msg['content']['ename']}: {msg['content']['evalue']}"
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                done = True
    finally:
        ws.close()
    return text


def _look(page: Page) -> str:
    """Kernel code: which of the places the host's secret could be mounted at hold it (relative to the cwd)."""
    candidates = ["id_rsa", "token.txt", ".env", ".secret/token.txt", "." + str(page.outside / "id_rsa"),
                  "." + str(page.root / ".env")]
    return (
        f"import os\nfound = []\nfor path in {candidates!r}:\n"
        "    try:\n"
        f"        if {SECRET!r} in open(path, errors='replace').read(): found.append(path)\n"
        "    except OSError: pass\n"
        "print('cwd', os.getcwd(), 'found', found)\n"
    )


@pytest.mark.security("attack", "lab")
@pytest.mark.parametrize("path", ["../outside/x.ipynb", "../../../../../../../../x.ipynb", ".secret/x.ipynb"],
                         ids=["folder beside the root", "the host's /", "a hidden folder"])
async def test_a_page_cannot_have_a_kernel_mount_a_folder_of_its_choosing(page, path) -> None:
    """POST /api/kernels with a path outside the root or hidden: the kernel must not get that folder (mount_cwd)."""
    started = page.send("POST", "/api/kernels", {"name": SPEC, "path": path})
    if started.status_code >= 400:
        return  # refused: nothing was mounted
    kernel_id = started.json()["id"]
    try:
        text = await _run_in_kernel(page, kernel_id, _look(page))
    finally:
        page.send("DELETE", f"/api/kernels/{kernel_id}")
    assert "found []" in text, (
        f"a page started a sandboxed kernel with path={path!r} and the kernel read the host's secret ({text.strip()}): "
        "jupyter_server's cwd_for_path keeps the path neither inside the root nor out of hidden folders, and the "
        "provisioner mounts that cwd (mount_cwd)"
    )


@pytest.mark.security("attack", "lab")
async def test_mount_cwd_mounts_a_visible_folder_of_the_root_and_names_itself_when_it_refuses(page) -> None:
    """Only what the server does not serve is refused (the server's log names the option); the notebook's folder is mounted."""
    started = page.send("POST", "/api/kernels", {"name": SPEC, "path": "notes.ipynb"})
    assert started.status_code < 400, started.text
    kernel_id = started.json()["id"]
    try:
        text = await _run_in_kernel(page, kernel_id, "import os; print(sorted(os.listdir('.')))")
    finally:
        page.send("DELETE", f"/api/kernels/{kernel_id}")
    assert "'notes.ipynb'" in text and ".secret" in text, text  # the root, read-only, as mount_cwd says
    refused = page.send("POST", "/api/kernels", {"name": SPEC, "path": ".secret/x.ipynb"})
    assert refused.status_code >= 400, refused.text  # jupyter_server tells a page only "Unhandled error"
    log = (page.root.parent / "lab.err").read_text()
    assert f"mount_cwd='ro': the kernel's working directory {page.root / '.secret'} is hidden" in log, log[-3000:]


HIDDEN_READS = [
    "/api/contents/.env", "/api/contents/.secret/token.txt", "/api/contents/.secret", "/files/.env",
    "/files/.secret/token.txt", "/api/contents/%2Eenv", "/api/contents/.secret%2Ftoken.txt", "/view/.env",
    "/nbconvert/html/.secret/token.txt", "/api/contents/x/../.env", "/files/x/..%2F.env",
    "/api/contents/.env/checkpoints", "/kernelspecs/sandboxed-python/..%2F..%2F..%2F..%2F..%2Fproject%2F.env",
]


@pytest.mark.security("attack", "lab")
def test_a_page_reads_no_hidden_file_by_any_route(page, record_property) -> None:
    """Hidden files asked for through every route that serves files: contents, files, view, nbconvert, kernelspecs."""
    leaks = []
    for route in HIDDEN_READS:
        response = page.get(route)
        if SECRET in response.text:
            leaks.append(f"{route} -> {response.status_code}")
    copied = page.send("POST", "/api/contents", {"copy_from": ".env", "ext": ".txt", "type": "file"})
    if copied.status_code < 400:
        path = copied.json().get("path", "")
        leaks += [f"copy_from .env -> {path}"] if SECRET in page.get(f"/files/{path}").text else []
    renamed = page.send("PATCH", "/api/contents/.env", {"path": "visible.txt"})
    if renamed.status_code < 400:
        leaks.append(f"rename .env -> visible.txt: {renamed.status_code}")
    record_property("cases", len(HIDDEN_READS) + 2)
    assert leaks == [], leaks


OUTSIDE_WRITES = [
    ("PUT", "/api/contents/..%2Foutside%2Fpwned.txt", {"type": "file", "format": "text", "content": "x"}),
    ("PUT", "/api/contents/%2E%2E/outside/pwned.txt", {"type": "file", "format": "text", "content": "x"}),
    ("PUT", "/api/contents/..%5Coutside%5Cpwned.txt", {"type": "file", "format": "text", "content": "x"}),
    ("PATCH", "/api/contents/notes.ipynb", {"path": "../outside/pwned.txt"}),
    ("POST", "/api/contents/..%2Foutside", {"copy_from": "notes.ipynb"}),
    ("PUT", "/api/contents/.bashrc", {"type": "file", "format": "text", "content": "x"}),
]


@pytest.mark.security("attack", "lab")
def test_a_page_writes_nothing_outside_the_root(page, record_property) -> None:
    """Writes through the contents API with traversal in every spelling, renames and copies out of the root."""
    before = sorted(p.name for p in page.outside.iterdir())
    answers = [f"{method} {route} -> {page.send(method, route, body).status_code}" for method, route, body in OUTSIDE_WRITES]
    record_property("cases", len(OUTSIDE_WRITES))
    assert sorted(p.name for p in page.outside.iterdir()) == before, answers
    assert not (page.root.parent / "pwned.txt").exists() and not (page.root / ".bashrc").exists(), answers
    assert (page.root / "notes.ipynb").exists(), answers


@pytest.mark.security("attack", "lab")
def test_a_page_starts_nothing_unsandboxed_and_installs_nothing(page, docker_engine, record_property) -> None:
    """Other kernels (by name, case, session), terminals and extension installs are refused."""
    attempts = {
        "python3 kernel": page.send("POST", "/api/kernels", {"name": "python3"}),
        "Python3 kernel": page.send("POST", "/api/kernels", {"name": "Python3"}),
        "python3 session": page.send("POST", "/api/sessions", {"path": "a.ipynb", "type": "notebook", "kernel": {"name": "python3"}}),
        "terminal": page.send("POST", "/api/terminals", {}),
        "terminal websocket": page.get("/terminals/websocket/1"),
        "extension install": page.send("POST", "/lab/api/extensions", {"cmd": "install", "extension_name": "jupyterlab-evil"}),
        "kernelspec resource of python3": page.get("/kernelspecs/python3/kernel.json"),
    }
    record_property("cases", len(attempts))
    accepted = {name: r.status_code for name, r in attempts.items() if r.status_code < 400}
    kernels = page.get("/api/kernels").json()
    for kernel in kernels:
        page.send("DELETE", f"/api/kernels/{kernel['id']}")
    assert accepted == {} and all(k["name"] == SPEC for k in kernels), (accepted, kernels)


def _page_config(page: Page) -> dict[str, Any]:
    """The page config a fresh load of the lab gets (what JupyterLab reads its disabled extensions from)."""
    html = page.get("/lab").text
    start = html.index('<script id="jupyter-config-data" type="application/json">')
    body = html[html.index(">", start) + 1 : html.index("</script>", start)]
    return json.loads(body)


@pytest.mark.security("attack", "lab")
def test_a_page_cannot_turn_the_frame_extension_off(page, record_property) -> None:
    """Issue 33: a page script disabled kernel-sandbox-frame through the extension manager, for every later
    page load (JupyterLab's read-only manager enables and disables, whatever ``lockedExtensions`` says)."""
    import sys

    labconfig = Path(sys.prefix) / "etc" / "jupyter" / "labconfig" / "page_config.json"
    saved = labconfig.read_bytes() if labconfig.exists() else None
    attempts = {
        f"{route} {cmd} {name}": page.send("POST", route, {"cmd": cmd, key: name})
        for route, key in (("/lab/api/extensions", "extension_name"), ("/lab/api/plugins", "plugin_name"))
        for cmd in ("disable", "enable")
        for name in ("kernel-sandbox-frame", "kernel-sandbox-frame:plugin", "@jupyter-widgets/jupyterlab-manager")
    }
    try:
        record_property("cases", len(attempts))
        accepted = {name: r.status_code for name, r in attempts.items() if r.status_code < 400}
        disabled = _page_config(page).get("disabledExtensions", [])
        assert accepted == {} and not any("kernel-sandbox" in name for name in disabled), (accepted, disabled)
        assert (labconfig.read_bytes() if labconfig.exists() else None) == saved
    finally:  # had it got through, the next tests' pages (in this environment) would load unframed
        if saved is None:
            labconfig.unlink(missing_ok=True)
        else:
            labconfig.write_bytes(saved)
