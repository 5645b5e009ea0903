"""The output policy on the OpenSandbox backend: hostile outputs through the launcher, both modes.

A kernel in a sandbox of the published server (the harness in tests/opensandbox/server/) sends
every payload of tests/policy/hostile.json, a script output, a display swapped for a hostile one
and a widget carrying code; a client receives what the launcher let through. What it must receive
is exactly what :class:`~kernel_sandbox.policy.OutputPolicy` itself makes of each message the
kernel sent (``strict`` cleans or drops, ``trusted`` passes everything unchanged but for the frame mark it adds
to each display output): the launcher
applies the policy to every message, drops nothing else and changes nothing else.

* ``websocket`` mode: the sandbox's Jupyter server runs an ipykernel; the payloads arrive as
  ``display_data``, the swap as ``update_display_data``, the widget as ``comm_open``/``comm_msg``.
* ``execd`` mode: execd forwards only a cell's result, stdout and stderr, so each payload is the
  result of its own cell (``execute_result``).
"""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.kernelspecs import OPENSANDBOX_SPEC as KERNEL_NAME
from kernel_sandbox.kernelspecs import started_client
from kernel_sandbox.opensandbox.relay import IMPLEMENTATION
from kernel_sandbox.policy.output import OutputPolicy

from support.kernel import reply_to, until_idle
from support.policy_checks import bundle_problems, text_problems, untouched

POLICY_TESTS = Path(__file__).resolve().parents[1] / "policy"

pytestmark = [pytest.mark.opensandbox_server, pytest.mark.timeout(600), pytest.mark.security("attack", "policy")]

CORPUS = json.loads((POLICY_TESTS / "hostile.json").read_text())
BUNDLES: list[dict[str, str]] = (
    [{"text/html": p, "text/plain": "html"} for p in CORPUS["html"]]
    + [{"text/markdown": p, "text/plain": "md"} for p in CORPUS["markdown"]]
    + [{"image/svg+xml": p, "text/plain": "svg"} for p in CORPUS["svg"]]
    + [{"text/plain": p} for p in CORPUS["text"]]
    + [{"application/javascript": "alert(document.cookie)", "text/plain": "js"},
       {"text/javascript": "alert(1)", "text/html": "<b>kept</b>", "text/plain": "js2"},
       {"application/x-unknown+javascript": "alert(1)", "application/json": {"kept": True}, "text/plain": "unknown"}]
)
SWAP = ({"text/html": "<b>harmless</b>", "text/plain": "swap"},
        {"text/html": '<img src=x onerror="alert(1)">', "text/plain": "swap"})
WIDGET = {"buffer_paths": [], "state": {
    "_model_module": "anywidget", "_model_name": "AnyModel", "_view_module": "anywidget", "_view_name": "AnyView",
    "_esm": "export default {render() {document.body.dataset.pwned = 1}}"}}
LATER = {"method": "update", "state": {"_esm": "export default {}"}, "buffer_paths": []}

SETUP = f"""
import json
class Raw:
    def __init__(self, bundle): self.bundle = bundle
    def _repr_mimebundle_(self, include=None, exclude=None): return self.bundle
bundles = json.loads({json.dumps(BUNDLES)!r})
texts = json.loads({json.dumps(CORPUS["text"])!r})
"""
PRINTS = "for t in texts: print(t, flush=True)"
DISPLAYS = f"""
from IPython.display import display
from comm import create_comm
for b in bundles:
    display(b, raw=True)
display({SWAP[0]!r}, raw=True, display_id="swap")
display({SWAP[1]!r}, raw=True, display_id="swap", update=True)
c = create_comm(comm_id="hostile-widget", target_name="jupyter.widget", metadata={{"version": "2.1.0"}}, data={WIDGET!r})
c.send({LATER!r})
"""
SHOWN = ("display_data", "update_display_data", "execute_result", "comm_open", "comm_msg", "comm_close")


def sent(mode: str) -> list[tuple[str, dict[str, Any]]]:
    """The messages (type, content) the kernel sends in ``mode``, as ipykernel / the execd relay make them."""
    if mode == "execd":
        return [("execute_result", {"data": b, "metadata": {}}) for b in BUNDLES]
    messages = [("display_data", {"data": b, "metadata": {}, "transient": {}}) for b in BUNDLES]
    messages.append(("display_data", {"data": SWAP[0], "metadata": {}, "transient": {"display_id": "swap"}}))
    messages.append(("update_display_data", {"data": SWAP[1], "metadata": {}, "transient": {"display_id": "swap"}}))
    messages.append(("comm_open", {"data": WIDGET, "comm_id": "hostile-widget", "target_name": "jupyter.widget",
                                   "target_module": None}))
    messages.append(("comm_msg", {"data": LATER, "comm_id": "hostile-widget"}))
    return messages


class _Canonical(HTMLParser):
    """Markup with every tag's attributes sorted: nh3 adds the SVG namespaces in a per-process order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.out: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.append(f"<{tag} {sorted(attrs, key=str)}>")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.append(f"<{tag} {sorted(attrs, key=str)}/>")

    def unknown_decl(self, data: str) -> None:
        self.out.append(f"<![{data}]>")

    def handle_endtag(self, tag: str) -> None:
        self.out.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        self.out.append(data)

    def handle_entityref(self, name: str) -> None:
        self.out.append(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self.out.append(f"&#{name};")

    def handle_comment(self, data: str) -> None:
        self.out.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.out.append(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.out.append(f"<?{data}>")


def canonical(messages: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``messages`` with the markup of every bundle in canonical form (equal markup: equal for a browser)."""
    result = []
    for msg_type, content in messages:
        content = copy.deepcopy(content)
        for mime, value in content.get("data", {}).items():
            if mime in ("text/html", "image/svg+xml", "text/markdown") and isinstance(value, str):
                parser = _Canonical()
                parser.feed(value)
                parser.close()
                content["data"][mime] = "".join(parser.out) + parser.rawdata
        result.append((msg_type, content))
    return result


def expected(policy_name: str, mode: str) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """What OutputPolicy makes of every message the kernel sends (one instance: it tracks comms), and of stdout."""
    policy = OutputPolicy.from_name(policy_name)
    shown = []
    for msg_type, content in sent(mode):
        out = policy.filter(msg_type, copy.deepcopy(content)) if policy.inspects(msg_type) else content
        if out is not None:
            shown.append((msg_type, json.loads(json.dumps(out))))
    stdout = "".join(policy.filter("stream", {"name": "stdout", "text": t + "\n"})["text"] for t in CORPUS["text"])
    return shown, stdout


@pytest.fixture
async def kernel(request: pytest.FixtureRequest, deployment: Any, deployment_jupyter_path: Path) -> AsyncIterator[Any]:
    """A kernel of the OpenSandbox kernelspec in (mode, output_policy) of the test's parameters."""
    mode, policy = request.param
    deployment.kernelspec(deployment_jupyter_path, mode, output_policy=policy)
    async with started_client(AsyncKernelManager(kernel_name=KERNEL_NAME), timeout=300) as kc:
        info = await reply_to(kc.shell_channel, kc.kernel_info())
        assert (info["content"]["implementation"] == IMPLEMENTATION) is (mode == "execd"), info["content"]
        yield mode, policy, kc


async def run(kc: Any, code: str) -> list[dict[str, Any]]:
    """Every IOPub message of one execution up to idle; the cell must succeed."""
    msg_id = kc.execute(code)
    messages = await until_idle(kc, msg_id)
    reply = await reply_to(kc.shell_channel, msg_id)
    assert reply["content"]["status"] == "ok", reply["content"]
    return messages


@pytest.mark.parametrize(
    "kernel", [(mode, policy) for mode in ("websocket", "execd") for policy in ("strict", "trusted")],
    indirect=True, ids=lambda param: "-".join(param),
)
async def test_the_client_receives_what_the_output_policy_makes_of_each_message(kernel: Any) -> None:
    mode, policy, kc = kernel
    messages = await run(kc, SETUP)
    messages += await run(kc, PRINTS)
    if mode == "execd":
        for index in range(len(BUNDLES)):  # execd forwards a cell's result only: one payload per cell
            messages += await run(kc, f"Raw(bundles[{index}])")
    else:
        messages += await run(kc, DISPLAYS)
    received = [(m["msg_type"], m["content"]) for m in messages if m["msg_type"] in SHOWN]
    for msg_type, content in received:
        if msg_type == "execute_result":  # numbered by the relay, not part of what was sent
            assert isinstance(content.pop("execution_count"), int)
    shown, stdout = expected(policy, mode)
    assert canonical(received) == canonical(shown)
    assert "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream") == stdout
    if policy == "strict":  # beside the equality: nothing script-capable by the corpus' own checks
        problems = {i: p for i, (_, content) in enumerate(received) if (p := bundle_problems(content.get("data", {})))}
        assert problems == {} and text_problems(stdout) == []
    else:  # trusted passes each message as it was, a display output with the policy's mark alone added
        originals = [(t, json.loads(json.dumps(c))) for t, c in sent(mode)]
        assert [t for t, _ in received] == [t for t, _ in originals]
        assert all(untouched(got, was) for (_, got), (_, was) in zip(received, originals)), received


@pytest.mark.parametrize("policy", [None, "trusted"])
@pytest.mark.parametrize("mode", ["websocket", "execd"])
def test_execution_results_on_opensandbox_pass_the_output_policy(
    deployment: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, policy: str | None
) -> None:
    """Execution.results, which a program may render in a web page: strict unless asked for trusted."""
    from kernel_sandbox.execution import Sandbox

    monkeypatch.chdir(tmp_path)
    options = deployment.options(mode)
    options.pop("resource_limits")
    hostile = {"application/javascript": "alert(document.cookie)", "text/html": '<img src=x onerror="alert(1)">',
               "text/plain": "hostile"}
    with Sandbox("opensandbox", memory="1g", cpus=1, output_policy=policy, **options) as sandbox:
        execution = sandbox.run(SETUP + f"Raw({hostile!r})")
    want = OutputPolicy.from_name(policy).filter("execute_result", {"data": hostile, "metadata": {}})
    assert want is not None
    assert [bundle for bundle in execution.results if "text/plain" in bundle] == [want["data"]]
    assert ("application/javascript" in want["data"]) is (policy == "trusted")
