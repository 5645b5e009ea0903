"""The output policy in the launcher's relay, on a real Docker kernel: what a client receives.

A kernel in the sandbox publishes every payload of hostile.json (HTML, Markdown, SVG, text), a
script output, a widget carrying code and a swapped display; a BlockingKernelClient receives
what the launcher let through, on IOPub, shell and control, through the provisioner and through
the kernelspec's argv as a client that ignores provisioners runs it. Nothing script-capable may
arrive; the benign outputs of issue 16 item 2 must arrive intact.
"""

from __future__ import annotations

import json
import queue
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import AsyncKernelClient, BlockingKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from kernel_sandbox.kernelspecs import install
from kernel_sandbox.launch.sockets import Connection
from kernel_sandbox.launch.front import Front
from kernel_sandbox.policy.output import OutputPolicy

from support.policy_checks import bundle_problems, html_problems, text_problems

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300), pytest.mark.security("attack", "policy")]

CORPUS = json.loads((Path(__file__).parent / "hostile.json").read_text())
ESM = "export default {render() {document.body.dataset.pwned = 1}}"

HOSTILE = f"""
import json
from IPython.display import display, HTML
from comm import create_comm
corpus = json.loads({json.dumps(CORPUS)!r})
for p in corpus["html"]:
    display({{"text/html": p, "text/plain": "html"}}, raw=True)
for p in corpus["markdown"]:
    display({{"text/markdown": p, "text/plain": "md"}}, raw=True)
for p in corpus["svg"]:
    display({{"image/svg+xml": p, "text/plain": "svg"}}, raw=True)
for p in corpus["text"]:
    print(p, flush=True)
    display({{"text/plain": p}}, raw=True)
display({{"application/javascript": "alert(1)", "text/plain": "js"}}, raw=True)
h = display(HTML("<b>harmless</b>"), display_id=True)
h.update(HTML('<img src=x onerror="alert(1)">'))
c = create_comm(target_name="jupyter.widget", metadata={{"version": "2.1.0"}}, data={{"buffer_paths": [], "state": {{
    "_model_module": "anywidget", "_model_name": "AnyModel", "_view_module": "anywidget", "_view_name": "AnyView",
    "_esm": {ESM!r}}}}})
"""
PAYLOADS = len(CORPUS["html"]) + len(CORPUS["markdown"]) + len(CORPUS["svg"]) + len(CORPUS["text"]) + 1

BENIGN = """
import pandas as pd, ipywidgets as w
from IPython.display import display, Markdown
%matplotlib inline
import matplotlib.pyplot as plt
display(pd.DataFrame({'city': ['Paris', 'Lyon'], 'n': [1, 2]}))
plt.plot([1, 3, 2]); plt.show()
display(Markdown('**benign-bold** and `a < b`'))
display(w.IntSlider(value=7, description='benign-slider'))
from tqdm.notebook import tqdm
for i in tqdm(range(3), desc='benign-tqdm'): pass
"""


class Kernel:
    """A sandboxed kernel and a BlockingKernelClient, started through the provisioner or the argv."""

    def __init__(self, spec_dir: Path, path: str, tmp_path: Path) -> None:
        self.manager: KernelManager | None = None
        self.process: subprocess.Popen[bytes] | None = None
        if path == "provisioner":
            specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
            self.manager = KernelManager(kernel_name=spec_dir.name, kernel_spec_manager=specs)
            self.manager.start_kernel()
            self.client = self.manager.client()
        else:
            connection_file, _ = write_connection_file(str(tmp_path / "kernel-policy.json"), key=secrets.token_hex(16).encode())
            argv = json.loads((spec_dir / "kernel.json").read_text())["argv"]
            cmd = [part.replace("{connection_file}", connection_file) for part in argv]
            self.process = subprocess.Popen(cmd, cwd=tmp_path)
            self.client = BlockingKernelClient(connection_file=connection_file)
            self.client.load_connection_file()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every IOPub message of one execution up to idle, and its reply."""
        msg_id = self.client.execute(code)
        messages = []
        while True:
            msg = self.client.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            messages.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while (reply := self.client.get_shell_msg(timeout=60))["parent_header"].get("msg_id") != msg_id:
            pass
        return messages, reply

    def stop(self) -> None:
        self.client.stop_channels()
        if self.manager is not None:
            self.manager.shutdown_kernel(now=True)
        if self.process is not None:
            self.process.terminate()
            self.process.wait(60)


@pytest.fixture(scope="module")
def specs(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    prefix = str(tmp_path_factory.mktemp("relay-policy"))
    return {
        "strict": Path(install("sandboxed-python", prefix=prefix, install_as="relay-strict",
                               config={"allow_help_links": ["https://jupyter.org"]})),
        "trusted": Path(install("sandboxed-python", prefix=prefix, install_as="relay-trusted",
                                config={"output_policy": "trusted"})),
    }


@pytest.fixture(scope="module", params=["provisioner", "argv"])
def strict_kernel(request: pytest.FixtureRequest, specs, tmp_path_factory) -> Iterator[Kernel]:
    kernel = Kernel(specs["strict"], request.param, tmp_path_factory.mktemp("argv"))
    yield kernel
    kernel.stop()


def test_no_hostile_output_reaches_the_client(strict_kernel: Kernel) -> None:
    messages, reply = strict_kernel.run(HOSTILE)
    assert reply["content"]["status"] == "ok", reply["content"]
    shown = [m for m in messages if m["msg_type"] in ("display_data", "update_display_data", "execute_result")]
    problems = {i: p for i, m in enumerate(shown) if (p := bundle_problems(m["content"]["data"]))}
    assert problems == {}
    streams = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert text_problems(streams) == [] and streams.count("\n") >= len(CORPUS["text"])
    assert len(shown) == PAYLOADS + 2  # every payload arrived, cleaned: none was lost on the way
    [swap] = [m for m in shown if m["msg_type"] == "update_display_data"]
    assert "onerror" not in swap["content"]["data"]["text/html"]
    [widget] = [m for m in messages if m["msg_type"] == "comm_open"]
    state = widget["content"]["data"]["state"]
    assert "_esm" not in state and state["_model_module"] == "@jupyter-widgets/controls"
    assert "refused" in state["value"]


def test_the_outputs_users_rely_on_arrive_intact(strict_kernel: Kernel) -> None:
    messages, reply = strict_kernel.run(BENIGN)
    assert reply["content"]["status"] == "ok", reply["content"]
    data = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    [table] = [d["text/html"] for d in data if "text/html" in d and "dataframe" in d["text/html"]]
    assert '<table border="1" class="dataframe">' in table and "<td>Lyon</td>" in table
    assert any(d.get("image/png", "").startswith("iVBOR") for d in data)
    assert any(d.get("text/markdown") == "**benign-bold** and `a < b`" for d in data)
    states = [m["content"]["data"]["state"] for m in messages if m["msg_type"] == "comm_open"]
    [slider] = [s for s in states if s.get("_model_name") == "IntSliderModel"]
    assert slider["value"] == 7 and slider["description"] == "benign-slider"
    assert {"FloatProgressModel", "HBoxModel"} <= {s.get("_model_name") for s in states}  # tqdm's bar
    bars = [m["content"]["data"]["state"].get("value") for m in messages if m["msg_type"] == "comm_msg"]
    assert "3/3" in " ".join(str(value) for value in bars)


def test_a_large_output_is_cleaned_and_keeps_its_place(strict_kernel: Kernel) -> None:
    """Past INLINE_BYTES the content is filtered in a thread: still cleaned, still in order."""
    code = (
        "from IPython.display import HTML, display\n"
        "print('before', flush=True)\n"
        "display(HTML('<table>' + '<tr><td onclick=\"alert(1)\">cell</td></tr>' * 40000 + '</table>'))\n"
        "print('after', flush=True)\n"
    )
    messages, _ = strict_kernel.run(code)
    order = [m["msg_type"] for m in messages if m["msg_type"] in ("stream", "display_data")]
    assert order == ["stream", "display_data", "stream"]
    [big] = [m for m in messages if m["msg_type"] == "display_data"]
    html = big["content"]["data"]["text/html"]
    assert html.count("<td>cell</td>") == 40000 and "onclick" not in html


def test_replies_on_shell_and_control_are_filtered_too(strict_kernel: Kernel) -> None:
    client = strict_kernel.client
    _, reply = strict_kernel.run(
        "get_ipython().kernel.help_links = [{'text': 'ok', 'url': 'https://jupyter.org'},"
        " {'text': 'evil', 'url': 'javascript:alert(1)'}]\n"
        "get_ipython().payload_manager.write_payload({'source': 'page', 'start': 0,"
        " 'data': {'text/html': '<img src=x onerror=alert(1)>', 'text/plain': 'doc'}})"
    )
    [page] = reply["content"]["payload"]
    assert page["data"]["text/plain"] == "doc" and html_problems(page["data"]["text/html"]) == []
    msg_id = client.kernel_info()
    while (info := client.get_shell_msg(timeout=60))["parent_header"]["msg_id"] != msg_id:
        pass
    assert info["content"]["help_links"] == [{"text": "ok", "url": "https://jupyter.org"}]
    request = client.session.msg("kernel_info_request")
    client.control_channel.send(request)
    while (info := client.get_control_msg(timeout=60))["parent_header"]["msg_id"] != request["header"]["msg_id"]:
        pass
    assert info["content"]["help_links"] == [{"text": "ok", "url": "https://jupyter.org"}]


def test_trusted_passes_outputs_unchanged_but_marks_them_and_checks_replies(specs, tmp_path: Path) -> None:
    """Trusted passes what runs in the page; what acts on the notebook or the server is checked still
    (issue 33), and every display output is marked to be framed, whatever the kernel put there."""
    kernel = Kernel(specs["trusted"], "provisioner", tmp_path)
    try:
        messages, reply = kernel.run(
            "from IPython.display import display, HTML\n"
            "display({'application/javascript': 'alert(1)', 'text/plain': 'js'}, raw=True,"
            " metadata={'kernel_sandbox': {'framed': False}})\n"
            "display(HTML('<img src=x onerror=\"alert(1)\">'))\n"
            "get_ipython().set_next_input('rewritten', replace=True)\n"
            "k = get_ipython().kernel\n"
            "k.language_info = {**k.language_info, 'nbconvert_exporter': 'attacker_module'}\n"
        )
        msg_id = kernel.client.kernel_info()
        while (info := kernel.client.get_shell_msg(timeout=60))["parent_header"]["msg_id"] != msg_id:
            pass
    finally:
        kernel.stop()
    displays = [m["content"] for m in messages if m["msg_type"] == "display_data"]
    assert displays[0]["data"]["application/javascript"] == "alert(1)"
    assert displays[1]["data"]["text/html"] == '<img src=x onerror="alert(1)">'
    assert all(d["metadata"]["kernel_sandbox"] == {"framed": True} for d in displays)
    assert [p["replace"] for p in reply["content"]["payload"] if p["source"] == "set_next_input"] == [False]
    assert "nbconvert_exporter" not in info["content"]["language_info"] and info["content"]["help_links"] == []


@pytest.mark.parametrize("mode", ["strict", "trusted"])
def test_the_execution_api_sets_the_relays_policy(docker_engine, mode: str) -> None:
    from kernel_sandbox.execution import Sandbox

    with Sandbox(output_policy=mode) as sandbox:
        execution = sandbox.run("display({'application/javascript': 'alert(1)', 'text/plain': 'js'}, raw=True)")
    [result] = execution.results
    assert ("application/javascript" in result) is (mode == "trusted")

# ---- the front on its own: what a kernel sends that the policy cannot read ------------------------


async def test_the_front_drops_what_the_policy_cannot_read(tmp_path: Path) -> None:
    """Bytes a client might read otherwise than the policy did never reach it; the rest goes on in order."""
    connection_file, info = write_connection_file(str(tmp_path / "kernel-front.json"), key=secrets.token_hex(16).encode())
    front = Front(Connection.from_info(info), OutputPolicy())
    front.bind()
    client = AsyncKernelClient(connection_file=connection_file)
    client.load_connection_file()
    client.start_channels()
    try:
        assert (await client.get_iopub_msg(timeout=30))["msg_type"] == "iopub_welcome"

        def message(msg_type: str, content: bytes, header: bytes | None = None) -> list[bytes]:
            header = header or json.dumps({"msg_id": msg_type, "msg_type": msg_type, "session": "k", "username": "k",
                                           "date": "2026-01-01T00:00:00Z", "version": "5.4"}).encode()
            return [header, b"{}", b"{}", content]

        html = json.dumps({"data": {"text/html": "<img src=x onerror=alert(1)>"}, "metadata": {}}).encode()
        for parts in (
            message("display_data", html.decode().encode("utf-16")),  # UTF-16: detected by some JSON readers
            message("display_data", b"\xef\xbb\xbf" + html),  # a BOM, which browsers' decoders strip
            message("display_data", b'{"data": {"text/html": "<b>\xff</b>"}, "metadata": {}}'),  # not UTF-8
            message("display_data", b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),  # nested past the stack
            message("display_data", html, header=b'{"msg_type": "display_data"' + b" " * 10 + b"\xff}"),
            message("display_data", html.replace(b'"metadata": {}', b'"metadata": {"x": NaN}')),  # cleaned, then not writable as JSON
        ):
            front.from_kernel("iopub", [], parts)
        front.from_kernel("shell", [client.session.bsession], message("comm_open", b'{"comm_id": "c", "data": {}}'))
        front.from_kernel("iopub", [], message("display_data", html))
        front.from_kernel("iopub", [], message("stream", b'{"name": "stdout", "text": "last"}'))
        first = await client.get_iopub_msg(timeout=30)
        assert first["msg_type"] == "display_data" and first["content"]["data"]["text/html"] == '<img src="x">'
        assert (await client.get_iopub_msg(timeout=30))["content"]["text"] == "last"
        with pytest.raises(queue.Empty):
            await client.get_shell_msg(timeout=0.5)  # the comm_open on shell was dropped too
    finally:
        client.stop_channels()
        front.close()


def test_a_pandas_styler_renders_its_table_cleaned(specs, tmp_path: Path) -> None:
    """``df.style`` needs jinja2 in the kernel image (issue 33); strict shows its table, without its <style>."""
    kernel = Kernel(specs["strict"], "provisioner", tmp_path)
    try:
        messages, reply = kernel.run("import pandas as pd\npd.DataFrame({'a': [1, 2]}).style.highlight_max()")
    finally:
        kernel.stop()
    assert reply["content"]["status"] == "ok", reply["content"].get("evalue")
    [result] = [m["content"]["data"] for m in messages if m["msg_type"] == "execute_result"]
    assert "<td" in result["text/html"] and "<style" not in result["text/html"] and html_problems(result["text/html"]) == []
