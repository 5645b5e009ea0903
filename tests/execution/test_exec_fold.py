"""One fold from a run's messages to its ``Execution``, and the host's own verdicts as types (issue 27).

``text`` (the last expression's value) is set on every path: the execution API here,
``kernel-sandbox exec`` (``exec_code``) here, OpenSandbox execd runs in
``tests/opensandbox/test_opensandbox_server.py``. The host's verdicts (a timeout, a dead kernel,
a missing answer, a state the kernel no longer keeps) are types or kernel-side constants, never
error names: code in the sandbox that raises an exception called ``KernelDied`` gets that error
back, and nothing else happens (no restart, no retry, no lost state).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest

from kernel_sandbox.execution import Sandbox
from kernel_sandbox.notebooks import exec_code
from kernel_sandbox.results import (
    Execution,
    ExecutionError,
    HostError,
    KernelDied,
    NoAnswer,
    OutputFold,
    TimedOut,
)

HOST_NAMES = ["KernelDied", "TimeoutError", "StateNotKept", "NoAnswer", "NoReply"]
"""The names of the host's own verdicts (and of the kernel's answer for a state it no longer keeps)."""


# ---------------------------------------------------------------- the fold, without a kernel


def test_the_fold_keeps_the_last_expression_and_survives_odd_shapes() -> None:
    fold = OutputFold(cap=40)
    assert fold.message("stream", {"name": "stdout", "text": "hi\n"}) == ("stdout", "hi\n")
    assert fold.message("stream", {"name": ["stderr"], "text": 7}) == ("stdout", "7")  # not "stderr": stdout
    assert fold.message("display_data", {"data": {"text/plain": "shown"}}) == ("result", {"text/plain": "shown"})
    assert fold.message("execute_result", {"data": ["not", "a", "bundle"]}) is None
    assert fold.message("execute_result", {"data": {"text/plain": "4"}}) == ("result", {"text/plain": "4"})
    kind, error = fold.message("error", {"ename": "E", "evalue": "v", "traceback": "a string, not lines"})
    assert (kind, error.traceback, type(error)) == ("error", "", ExecutionError)
    fold.message("execute_input", {"execution_count": 3})
    assert fold.message("stream", {"name": "stdout", "text": "x" * 100}) == ("stdout", "x" * 29)
    note = fold.finish()
    assert note is not None and "71 bytes over the cap of 40 bytes" in note
    assert fold.finish() is None, "the note is added once"
    execution = fold.execution
    assert (execution.text, execution.execution_count, execution.truncated_bytes) == ("4", 3, 71)
    assert execution.stdout == "hi\n7" + "x" * 29 + note and execution.results[0] == {"text/plain": "shown"}


def test_host_verdicts_are_types_a_kernel_cannot_send() -> None:
    timed_out = TimedOut("Execution exceeded the timeout of 1 s; the kernel was interrupted.")
    assert (timed_out.name, str(timed_out)) == ("TimeoutError", f"TimeoutError: {timed_out.value}")
    assert isinstance(timed_out, HostError) and isinstance(timed_out, ExecutionError)
    assert repr(timed_out).startswith("ExecutionError(TimeoutError: ")
    assert not isinstance(ExecutionError("TimeoutError", "raised by the code"), HostError)
    assert KernelDied("gone").name == "KernelDied" and NoAnswer("none").name == "NoAnswer"


# ---------------------------------------------------------------- `.text` on every path


def test_the_execution_api_gives_the_last_expressions_text(sandbox: Sandbox) -> None:
    execution = sandbox.run("print('hi')\n2+2")
    assert (execution.text, execution.stdout, execution.error) == ("4", "hi\n", None)


def test_exec_code_gives_the_last_expressions_text(docker_engine) -> None:
    """``kernel-sandbox exec``'s Execution is folded as the API's: streams in stdout, the value in ``text``."""
    out, err = io.StringIO(), io.StringIO()
    execution = exec_code("print('hi')\n2+2", stdout=out, stderr=err, standby=0)
    assert isinstance(execution, Execution)
    assert (execution.text, execution.stdout, execution.stderr, execution.error) == ("4", "hi\n", "", None)
    assert execution.results == [{"text/plain": "4"}] and execution.execution_count == 1
    assert (out.getvalue(), err.getvalue()) == ("hi\n4\n", "")


# ---------------------------------------------------------------- the attacker's names


@pytest.mark.parametrize("name", HOST_NAMES)
def test_code_raising_an_exception_named_like_a_host_verdict_gets_its_own_error(sandbox: Sandbox, name: str) -> None:
    restarts = sandbox._async._restarts
    sandbox.run("survivor = 'still here'")
    execution = sandbox.run(f"class {name}(Exception): pass\nraise {name}('mine')")
    assert type(execution.error) is ExecutionError, "the kernel's error, not the host's verdict"
    assert (execution.error.name, execution.error.value, execution.state_lost) == (name, "mine", False)
    assert sandbox.run("survivor").text == "'still here'" and sandbox._async._restarts == restarts


def _raising_on_the_second_call(name: str) -> Callable[[dict[str, Any]], int]:
    def tool(agent_state: dict[str, Any]) -> int:
        import builtins

        calls = builtins.__dict__.setdefault("ks_fold_calls", [])
        calls.append(name)
        if len(calls) > 1:
            raise type(name, (Exception,), {})("mine")
        return len(agent_state["blob"])

    return tool


@pytest.mark.parametrize("name", HOST_NAMES)
def test_a_tool_raising_an_exception_named_like_a_host_verdict_runs_once(sandbox: Sandbox, name: str) -> None:
    """With a large state the kernel keeps, the second call sends only its digest: a tool raising its own
    ``StateNotKept`` there was once taken for a kernel that lost the state, and called again."""
    restarts = sandbox._async._restarts
    tool, state = _raising_on_the_second_call(name), {"blob": "s" * 200_000}
    sandbox.run("import builtins\nbuiltins.ks_fold_calls = []")
    assert sandbox.run_tool(tool, agent_state=state).func_return == 200_000
    result = sandbox.run_tool(tool, agent_state=state)
    assert type(result.error) is ExecutionError, "the tool's error, not the host's verdict"
    assert (result.status, result.error.name, result.error.value, result.state_lost) == ("error", name, "mine", False)
    assert sandbox.run("len(builtins.ks_fold_calls)").text == "2", "the tool ran once per call, never again"
    assert sandbox._async._restarts == restarts


FORGED_ERROR = """
import sys
from IPython import get_ipython
helper, kernel = sys.modules['_kernel_sandbox_toolhost'], get_ipython().kernel

def forge(msg):
    content = {{"ename": {name!r}, "evalue": "forged", "traceback": []}}
    kernel.session.send(kernel.iopub_socket, "error", content, parent=msg)

helper._on_msg = helper._state.channel._msg_callback = forge
"""


@pytest.mark.parametrize("name", ["TimeoutError", "KernelDied"])
def test_a_forged_error_named_like_a_host_verdict_is_no_verdict(docker_engine, name: str) -> None:
    """A helper replaced by one that answers every request with an IOPub error named ``TimeoutError``
    (or ``KernelDied``) and no answer: the host says no answer came, it does not take the name for its own
    (then the next call restarts the kernel, as test_exec_hostile shows for any helper that cannot answer)."""
    with Sandbox(timeout=60, interrupt_grace=5) as sb:
        sb.run(FORGED_ERROR.format(name=name))
        result = sb.run_tool(lambda: 1, timeout=60)
        assert isinstance(result.error, NoAnswer) and not isinstance(result.error, TimedOut), result.error
        assert (result.status, result.state_lost) == ("error", False)
