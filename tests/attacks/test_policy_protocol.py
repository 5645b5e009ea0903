"""The policy attacked with the shape of the messages, not their values (issue 23, findings 1, 5, 6).

A kernel forges messages of protocol 4 (``pyout`` without a ``version``, which jupyter_client's
adapter turns into an ``execute_result`` for every Python client), streams whose ``text`` is a
list or is rewritten by ``\\r``, and widget values that are JSON lists (which the browser joins
with commas before writing them as HTML). The Docker tests go through the launcher's relay and
the execution API, as a program would meet such a kernel.
"""

from __future__ import annotations

import copy

import pytest

from kernel_sandbox.policy.output import OutputPolicy
from kernel_sandbox.policy.text import compose

from support.policy_checks import html_problems, text_problems

pytestmark = [pytest.mark.timeout(300)]

JS = "fetch('/api/contents/pwned.txt', {method: 'PUT'})"
HANDLER = '<img src=x onerror="alert(document.cookie)">'

# Code for the kernel: send a message as the kernel's own session would, but with a header of our own.
FORGE = """
k = get_ipython().kernel
def forge(msg_type, content, version=None, channel=None):
    msg = k.session.msg(msg_type, content, parent=k.get_parent())
    msg["header"].pop("version")
    if version is not None:
        msg["header"]["version"] = version
    k.session.send(channel or k.iopub_socket, msg, ident=k._topic(msg_type))
"""


@pytest.mark.security("attack", "policy")
@pytest.mark.docker
def test_a_protocol_4_pyout_reaches_execution_results_cleaned(docker_engine) -> None:
    """Finding 5: a ``pyout`` without version (and one with 4.1) became an execute_result with a script bundle."""
    from kernel_sandbox.execution import Sandbox

    bundle = {"application/javascript": JS, "text/html": HANDLER, "text/plain": "forged"}
    code = FORGE + (
        f"forge('pyout', {{'data': {bundle!r}, 'execution_count': 1, 'metadata': {{}}}})\n"
        f"forge('pyout', {{'data': {bundle!r}, 'execution_count': 1, 'metadata': {{}}}}, version='4.1')\n"
        "forge('stream', {'name': 'stdout', 'data': 'javascript://%0aalert(document.cookie)'})\n"
        "forge('pyerr', {'ename': 'E', 'evalue': 'v', 'traceback': ['javascript://%0aalert(document.cookie)']}, version='4.0')\n"
        "import time; time.sleep(0.5)\n"
    )
    with Sandbox() as sandbox:
        execution = sandbox.run(code)
    forged = [r for r in execution.results if r.get("text/plain") == "forged"]
    assert len(forged) == 2, execution.results  # translated as the client would, then cleaned: not lost
    for result in forged:
        assert "application/javascript" not in result and html_problems(result["text/html"]) == [], result
    assert "alert" in execution.stdout and text_problems(execution.stdout) == [], execution.stdout


@pytest.mark.security("attack", "policy")
def test_an_html_widget_value_sent_as_a_list_never_reaches_the_browser(local_kernel) -> None:
    """Finding 1: ipywidgets writes ``String(value)`` as HTML, and a list's string is its items joined by commas."""
    run = local_kernel.run(
        "import ipywidgets as w\nh = w.HTML('<b>ok</b>')\ndisplay(h)\n"
        "h.comm.send({'method': 'update', 'state': {'value': ['<img src=x onerror=\"0', 'alert(document.cookie)\">']}, 'buffer_paths': []})\n"
        "h.comm.send({'method': 'update', 'state': {'description': [['<img src=x onerror=alert(1)>']], 'description_allow_html': True}})\n"
    )
    policy = OutputPolicy()
    seen = [policy.filter(m["header"]["msg_type"], copy.deepcopy(m["content"])) for m in run.iopub]
    states = [c["data"]["state"] for c in seen if c is not None and c.get("data", {}).get("state") is not None]
    assert states and all(isinstance(s.get("value", ""), str) and isinstance(s.get("description", ""), str) for s in states)
    assert all(html_problems(s.get("value", "")) == [] for s in states)


@pytest.mark.security("attack", "policy")
def test_stream_links_hidden_in_lists_and_rewrites_are_broken(local_kernel) -> None:
    """Finding 6: a ``javascript:`` link in a stream's ``text`` list, and one composed by ``\\r`` over two messages."""
    run = local_kernel.run(FORGE + (
        "forge('stream', {'name': 'stdout', 'text': ['java', 'script:', '//%0aalert(document.cookie)']}, version='5.3')\n"
        "forge('stream', {'name': 'stdout', 'text': '\\nXXXXXcript://%0aalert(document.cookie)\\r'}, version='5.3')\n"
        "forge('stream', {'name': 'stdout', 'text': 'javas'}, version='5.3')\n"
    ))
    policy = OutputPolicy()
    text, cursor = "", 0
    for message in run.of("stream"):
        out = policy.filter_message("iopub", message["header"], message["parent_header"], message["metadata"], message["content"])
        text, cursor = compose(cursor, out[3]["text"], text)  # what JupyterLab's output area shows
    assert "alert" in text and text_problems(text) == [], text


# ---- issue 33: what a real kernel's widgets and replies could still do past the policy --------------

IMG = '<img src=x onerror="fetch(\'/api/contents/pwned.txt\', {method: \'PUT\'})">'


def _through(run) -> list[tuple[str, dict | None]]:
    policy = OutputPolicy()
    return [(m["header"]["msg_type"], policy.filter(m["header"]["msg_type"], copy.deepcopy(m["content"]))) for m in run.iopub]


@pytest.mark.security("attack", "policy")
def test_a_comm_of_another_target_restored_as_a_widget_is_refused(local_kernel) -> None:
    """Issue 33: an id opened for another target, then served as an HTML widget by ipywidgets' own
    full-state reply (what a reloaded page asks for), then updated: its updates passed unchecked."""
    run = local_kernel.run(
        "import comm, ipywidgets as w\n"
        "c = comm.create_comm(target_name='not-a-widget')\n"
        f"h = w.HTML('<b>harmless</b>', comm=c)  # the widget lives on the other target's comm\n"
        f"h.value = {IMG!r}\n"
        "try: w.Widget.get_manager_state()  # (makes the lazy layouts and styles first)\n"
        "except RuntimeError: pass\n"
        "w.Widget._control_comm = comm.create_comm(target_name='jupyter.widget.control')\n"
        "w.Widget._handle_control_comm_msg({'content': {'data': {'method': 'request_states'}}})\n"
        f"h.value = {IMG + 'again'!r}\n"
        "print(c.comm_id)\n"
    )
    seen = _through(run)
    comm_id = run.of("stream")[0]["content"]["text"].strip()
    [reply] = [c for t, c in seen if t == "comm_msg" and c and c["data"].get("method") == "update_states"]
    entry = reply["data"]["states"][comm_id]
    assert "refused" in entry["state"]["value"] and "opened for" in entry["state"]["value"]
    assert not any(t == "error" for t, _ in seen)
    updates = [c for (t, c), m in zip(seen, run.iopub) if t == "comm_msg" and m["content"]["comm_id"] == comm_id]
    before, after = updates[:-1], updates[-1]
    assert [u["data"]["state"]["value"] for u in before] == ["<b>harmless</b>", "<img>"]  # policed as a widget's from the start
    assert after is None  # refused from the full-state reply on


@pytest.mark.security("attack", "policy")
def test_a_widget_kept_focused_by_custom_messages_gets_none(local_kernel) -> None:
    """Issue 33: ``{"do": "focus"}`` every 100 ms kept a 2-px Text widget focused (a keylogger)."""
    run = local_kernel.run(
        "import ipywidgets as w\nt = w.Text(layout=w.Layout(width='2px', height='2px'))\ndisplay(t)\n"
        "for _ in range(3): t.focus()\nt.blur()\nt.send({'do': 'focus'})\n"
    )
    seen = _through(run)
    customs = [(c, m) for (t, c), m in zip(seen, run.iopub) if t == "comm_msg" and m["content"]["data"].get("method") == "custom"]
    assert len(customs) == 5 and all(c is None for c, _ in customs)
    assert any(t == "comm_open" and c["data"]["state"]["_model_name"] == "TextModel" for t, c in seen)


@pytest.mark.security("attack", "policy")
def test_widget_names_buffers_and_url_media_from_a_real_kernel(local_kernel) -> None:
    """Issue 33: names written into the error box, buffer paths into Object.prototype or onto
    ``description_allow_html``, an Image with ``format='url'`` pointing at the server's API."""
    run = local_kernel.run(
        "import ipywidgets as w, traitlets as t\n"
        "class Named(w.DOMWidget):\n"
        f"    _model_name = t.Unicode({IMG!r}).tag(sync=True)\n"
        "    _model_module = t.Unicode('@jupyter-widgets/controls').tag(sync=True)\n"
        "n = Named()\n"
        "h = w.HTML('<b>x</b>', description='d')\n"
        "h.comm.send({'method': 'update', 'state': {}, 'buffer_paths': [['__proto__', 'innerHTML']]}, buffers=[b'x'])\n"
        "h.comm.send({'method': 'update', 'state': {'description': '<b>y</b>'}, 'buffer_paths': [['description_allow_html']]}, buffers=[b'\\x01'])\n"
        "i = w.Image(value=b'/api/contents/secret.txt', format='url')\n"
        "png = w.Image(value=b'\\x89PNG\\r\\n\\x1a\\n', format='png')\n"
    )
    seen = _through(run)
    opens = [c for t, c in seen if t == "comm_open"]
    assert any("name is not one that" in str(c["data"]["state"].get("value")) for c in opens)
    assert IMG not in str([c for _, c in seen])
    dropped = [c for (t, c), m in zip(seen, run.iopub) if t == "comm_msg" and m["content"]["data"].get("buffer_paths")]
    assert dropped == [None, None]
    images = [c for t, c in seen if t == "comm_open" and c["data"]["state"].get("_model_name") == "ImageModel"]
    assert len(images) == 2 and "format" not in images[0]["data"]["state"] and images[1]["data"]["state"]["format"] == "png"
    assert images[1]["data"]["buffer_paths"] == [["value"]]  # bytes on a bytes field stay


@pytest.mark.security("attack", "policy")
@pytest.mark.parametrize("mode", ["strict", "trusted"])
def test_replies_do_not_rewrite_the_cell_link_out_or_name_an_exporter(local_kernel, mode) -> None:
    """Issue 33: ``set_next_input(replace=True)`` rewrote the user's cell; ``help_links`` put a kernel-chosen
    page in the Help menu; ``language_info.nbconvert_exporter`` named a module the server imports."""
    run = local_kernel.run(
        "get_ipython().set_next_input('import os  # the kernel wrote this', replace=True)\n"
        "k = get_ipython().kernel\n"
        "k.help_links = [{'text': 'Reset your password', 'url': 'https://attacker.example/login'}]\n"
        "k.language_info = {**k.language_info, 'nbconvert_exporter': 'attacker_module:Exporter', 'name': '<b>py</b>'}\n"
    )
    policy = OutputPolicy(mode)
    [payload] = policy.filter("execute_reply", run.reply["content"])["payload"]
    assert payload["replace"] is False and payload["text"].startswith("import os")
    info = policy.filter("kernel_info_reply", local_kernel.request("kernel_info")["content"])
    assert info["help_links"] == [] and "nbconvert_exporter" not in info["language_info"] and "name" not in info["language_info"]
    assert info["language_info"]["file_extension"] == ".py"


@pytest.mark.security("attack", "policy")
@pytest.mark.docker
def test_kernel_sandbox_run_saves_the_frame_mark_a_kernel_cannot_remove(docker_engine, tmp_path) -> None:
    """Issue 33: a saved notebook reopened on a local kernel showed its outputs unframed. The executed
    notebook keeps the mark on every display output, whatever metadata the kernel gave them."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from kernel_sandbox.notebooks import run_notebook

    source = tmp_path / "marked.ipynb"
    nbformat.write(new_notebook(cells=[
        new_code_cell("from IPython.display import display, HTML\n"
                      "display(HTML('<b>x</b>'), metadata={'kernel_sandbox': {'framed': False}})"),
        new_code_cell("6 * 7"),
        new_code_cell("print('text')"),
    ]), str(source))
    run_notebook(source, progress=False)
    outputs = [o for cell in nbformat.read(str(tmp_path / "marked.out.ipynb"), as_version=4).cells for o in cell.outputs]
    kinds = [o["output_type"] for o in outputs]
    assert kinds == ["display_data", "execute_result", "stream"], kinds
    assert [o["metadata"]["kernel_sandbox"] for o in outputs[:2]] == [{"framed": True}, {"framed": True}]
