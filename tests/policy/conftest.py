"""Fixtures of the policy tests: a real local ipykernel, and JupyterLab with Docker kernels in Chromium."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kernel_sandbox.docker.containers import owner_labels
from kernel_sandbox.docker.settings import DEFAULT_IMAGE
from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC, install, shipped_kernelspecs

from support.lab import chromium, jupyterlab, remove_kernels_of
from test_policy_jupyterlab import ARGV_SUFFIX, KERNELSPECS
from ipykernel.kernelspec import get_kernel_dict
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager


@dataclass
class Run:
    """Every iopub message of one execution (up to idle) and its execute_reply."""

    iopub: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)

    def of(self, *msg_types: str) -> list[dict[str, Any]]:
        return [m for m in self.iopub if m["header"]["msg_type"] in msg_types]


class LocalKernel:
    """A local ipykernel (this interpreter) driven through jupyter_client's blocking client."""

    def __init__(self) -> None:
        # A kernelspec of its own for this interpreter, whatever python3 specs the machine has.
        self._specs = tempfile.TemporaryDirectory()
        spec_dir = Path(self._specs.name) / "policy-test-python"
        spec_dir.mkdir()
        (spec_dir / "kernel.json").write_text(json.dumps(get_kernel_dict()))
        specs = KernelSpecManager(kernel_dirs=[self._specs.name], ensure_native_kernel=False)
        self.manager = KernelManager(kernel_name="policy-test-python", kernel_spec_manager=specs)
        self.manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
        assert self.manager.kernel_spec.argv[0] == sys.executable, self.manager.kernel_spec.argv
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60) -> Run:
        msg_id = self.client.execute(code)
        run = Run()
        while True:
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            run.iopub.append(msg)
            if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        # wait_for_ready may have sent kernel_info more than once (under load): skip late replies to it
        while (reply := self.client.get_shell_msg(timeout=timeout))["parent_header"].get("msg_id") != msg_id:
            assert reply["header"]["msg_type"] == "kernel_info_reply", reply["header"]
        run.reply = reply
        return run

    def request(self, send: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        msg_id = getattr(self.client, send)(*args, **kwargs)
        while True:
            reply = self.client.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self._specs.cleanup()


@pytest.fixture(scope="module")
def kernel() -> Iterator[LocalKernel]:
    k = LocalKernel()
    try:
        yield k
    finally:
        k.close()


# ---- JupyterLab in Chromium (test_policy_jupyterlab.py) -------------------------------------------

@pytest.fixture(scope="module")
def widget_image(docker_engine) -> str:
    """The kernel image, which must have ipywidgets and tqdm (issue 16 item 2: they work in the sandbox)."""
    try:
        docker_engine.containers.run(DEFAULT_IMAGE, ["python", "-c", "import ipywidgets, tqdm"], remove=True, network_mode="none",
                                     labels=owner_labels("widget-probe", owner_pid=os.getpid()))  # gc removes it if we die
    except Exception as exc:
        pytest.fail(f"{DEFAULT_IMAGE} lacks ipywidgets or tqdm ({exc}): rebuild it with `kernel-sandbox image build`")
    return DEFAULT_IMAGE


@pytest.fixture(scope="module")
def opensandbox_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The published opensandbox-server on 127.0.0.1 (tests/opensandbox/server), for the OpenSandbox kernelspec."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensandbox" / "server"))
    from local_server import LocalServer
    from prepare import prepare

    server = LocalServer(prepare(), tmp_path_factory.mktemp("policy-opensandbox")).start()
    try:
        yield server
    finally:
        leftovers = server.stop()
    assert not leftovers, f"sandboxes of the browser test were left behind: {leftovers}"


def _opensandbox_config(server: Any) -> dict[str, Any]:
    """The OpenSandbox kernelspec on the harness: the code-interpreter stand-in, websocket mode."""
    return {"api_base": server.api_base, "image": server.prepared.code_interpreter_image,
            "entrypoint": ["/opt/code-interpreter/code-interpreter.sh"], "mode": "websocket",
            "metadata": dict(server.run_label), "resource_limits": {"cpu": "1", "memory": "1Gi"}}


def _install_argv_only(name: str, prefix: Path, staging: Path) -> None:
    """Install ``NAME-argv``: the shipped kernelspec NAME's argv with no provisioner in its metadata.

    JupyterLab then runs the argv itself (jupyter_client's local provisioner), exactly as VS Code
    or PyCharm run the shipped kernelspec: the launcher reads its settings from NAME's kernel.json.
    """
    source = Path(install(name[: -len(ARGV_SUFFIX)], prefix=str(staging), install_as=f"{name}-settings"))
    spec = json.loads((source / "kernel.json").read_text())
    staged = staging / name
    staged.mkdir()
    (staged / "kernel.json").write_text(json.dumps({
        "argv": spec["argv"], "display_name": f"{spec['display_name']} (argv)", "language": spec["language"],
        "interrupt_mode": spec["interrupt_mode"], "metadata": {"debugger": False},
    }))
    KernelSpecManager().install_kernel_spec(str(staged), name, prefix=str(prefix))


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, docker_engine, widget_image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """JupyterLab on 127.0.0.1 with the kernelspecs under test and nothing else; the policy is the relay's."""
    base = tmp_path_factory.mktemp("policy-lab")
    prefix = base / "prefix"
    shipped = shipped_kernelspecs()
    extra_env: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    for name in KERNELSPECS:
        if name.endswith(ARGV_SUFFIX) and name[: -len(ARGV_SUFFIX)] in shipped:
            _install_argv_only(name, prefix, base / "argv-settings")
            continue
        if name not in shipped:
            pytest.fail(f"kernelspec {name!r} is not shipped with kernel-sandbox (shipped: {', '.join(shipped)})")
        if name == OPENSANDBOX_SPEC:
            try:
                server = request.getfixturevalue("opensandbox_harness")
            except Exception as exc:  # noqa: BLE001 (no PyPI, no images: the test of this kernelspec says so)
                unavailable[name] = f"the OpenSandbox server harness could not be prepared: {type(exc).__name__}: {exc}"
                continue
            install(name, prefix=str(prefix), config=_opensandbox_config(server))
            extra_env["OPEN_SANDBOX_API_KEY"] = server.api_key
            continue
        install(name, prefix=str(prefix))
    with jupyterlab(base, prefix / "share" / "jupyter", "policy-jupyterlab.log", extra_env) as server:
        yield {"url": server.url, "token": server.token, "headers": server.headers, "root": server.root_dir,
               "unavailable": unavailable}
    remove_kernels_of(docker_engine, server.process.pid)


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser
