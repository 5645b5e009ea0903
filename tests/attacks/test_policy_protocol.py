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

from kernel_sandbox.policy import OutputPolicy, _compose

from checks import html_problems, text_problems

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
        text, cursor = _compose(cursor, out[3]["text"], text)  # what JupyterLab's output area shows
    assert "alert" in text and text_problems(text) == [], text
