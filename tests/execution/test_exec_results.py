"""The result model every path returns: short, human reprs that never hold a whole image."""

from __future__ import annotations

from kernel_sandbox.opensandbox.events import parse_lines
from kernel_sandbox.results import Execution, ExecutionError, ToolResult


def test_reprs_are_short_and_never_hold_a_whole_image() -> None:
    image = "iVBORw0KGgo" + "A" * 200_000
    execution = Execution(
        stdout="x" * 10_000,
        results=[{"text/plain": "<Figure size 640x480>", "image/png": image}],
        error=ExecutionError("ValueError", "bad", "Traceback\n  line\nValueError: bad"),
        execution_count=3,
    )
    text = repr(execution)
    assert len(text) < 400 and image[:20] not in text
    assert "image/png" in text and "'<Figure size 640x480>'" in text and "error=ValueError: bad" in text
    assert repr(execution.error) == "ExecutionError(ValueError: 'bad', traceback: 3 lines)"
    assert len(repr(ToolResult("success", func_return=list(range(10_000))))) < 300


def test_an_execd_run_is_an_execution() -> None:
    run = parse_lines(['{"type": "stdout", "text": "hi"}', '{"type": "execution_complete"}'])
    assert isinstance(run, Execution) and run.complete
    assert repr(run) == "ExecdRun(stdout='hi', stderr='')"
