"""``kernel-sandbox run`` and ``exec``: parameters, failures, output routing, kernelspec fallback."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.kernelspecs import SandboxKernelSpecManager, shipped_kernelspecs
from kernel_sandbox.notebooks import (
    INJECTED_TAG,
    default_output_path,
    inject_parameters,
    parse_parameter,
    tagged_source,
)

from support.notebooks import cli

# ---------------------------------------------------------------- without Docker


def test_parameters_parse_as_literals_else_strings() -> None:
    assert parse_parameter("n=3") == ("n", 3)
    assert parse_parameter("ratio=0.5") == ("ratio", 0.5)
    assert parse_parameter("names=['a', 'b']") == ("names", ["a", "b"])
    assert parse_parameter("flag=True") == ("flag", True)
    assert parse_parameter("city=Paris") == ("city", "Paris")
    assert parse_parameter("quoted='3'") == ("quoted", "3")
    assert parse_parameter("expr=__import__('os')") == ("expr", "__import__('os')")  # never evaluated
    assert parse_parameter("empty=") == ("empty", "")
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_parameter("no-equals")
    with pytest.raises(ConfigError, match="identifier"):
        parse_parameter("1x=2")


def test_injected_cell_follows_the_parameters_cell_and_replaces_an_old_one() -> None:
    nb = new_notebook(cells=[
        new_markdown_cell("# title"),
        new_code_cell("n = 1", metadata={"tags": ["parameters"]}),
        new_code_cell("print(n)"),
    ])
    inject_parameters(nb, {"n": 5, "name": "x'y"})
    assert [c.source.splitlines()[0] for c in nb.cells] == ["# title", "n = 1", "# Parameters", "print(n)"]
    assert nb.cells[2].metadata.tags == [INJECTED_TAG]
    assert "n = 5\nname = \"x'y\"" in nb.cells[2].source
    inject_parameters(nb, {"n": 6})
    assert sum(INJECTED_TAG in c.metadata.get("tags", []) for c in nb.cells) == 1
    assert nb.cells[2].source == "# Parameters\nn = 6\n"


def test_without_a_parameters_cell_parameters_go_first() -> None:
    nb = new_notebook(cells=[new_code_cell("print(n)")])
    inject_parameters(nb, {"n": 1})
    assert nb.cells[0].source == "# Parameters\nn = 1\n"


def test_default_output_and_tagged_source() -> None:
    assert default_output_path(Path("a/report.ipynb")) == Path("a/report.out.ipynb")
    nb = new_notebook(cells=[new_code_cell("def f(): pass", metadata={"tags": ["tool"]}), new_code_cell("f()")])
    assert tagged_source(nb, "tool") == "def f(): pass\n"
    with pytest.raises(ConfigError, match="tagged 'skill'"):
        tagged_source(nb, "skill")


@pytest.mark.parametrize(
    ("content", "says"),
    [("not json", "does not appear to be JSON"), ('{"cells": 3}', "not iterable"), (None, "No notebook at")],
)
def test_run_refuses_a_file_that_is_not_a_notebook_with_one_line(tmp_path: Path, content: str | None, says: str) -> None:
    source = tmp_path / "x.ipynb"
    if content is not None:
        source.write_text(content)
    result = cli("run", str(source))
    assert result.returncode == 1
    assert result.stderr.startswith("kernel-sandbox: ") and says in result.stderr
    assert "Traceback" not in result.stderr


def test_shipped_kernelspec_is_used_when_none_is_installed(tmp_path: Path) -> None:
    manager = SandboxKernelSpecManager(kernel_dirs=[str(tmp_path)])
    spec = manager.get_kernel_spec("sandboxed-python")
    assert spec.resource_dir == str(shipped_kernelspecs()["sandboxed-python"])
    assert spec.metadata["kernel_provisioner"]["provisioner_name"] == "kernel-sandbox-docker"
    assert "sandboxed-python" in manager.find_kernel_specs()


# ---------------------------------------------------------------- on the sandboxed kernel

docker = pytest.mark.usefixtures("docker_engine")


def _notebook(path: Path, *sources: str, parameters: str | None = None) -> Path:
    cells = [new_markdown_cell("test notebook")]
    if parameters is not None:
        cells.append(new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    cells += [new_code_cell(src) for src in sources]
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}), str(path))
    return path


def _without_installed_specs(tmp_path: Path) -> dict[str, str]:
    """An environment in which no kernel-sandbox kernelspec is installed: the shipped one is used."""
    env = os.environ.copy()
    env["JUPYTER_PATH"] = str(tmp_path / "empty-jupyter-path")
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "empty-jupyter-data")
    return env


@docker
def test_run_executes_in_the_sandbox_with_parameters(tmp_path: Path) -> None:
    source = _notebook(
        tmp_path / "report.ipynb",
        "import socket, os\nprint(socket.gethostname(), sorted(os.listdir('/sys/class/net')))",
        "print(f'{greeting}, {name}! x{repeat}', type(repeat).__name__, type(name).__name__)",
        parameters="greeting = 'Hello'\nname = 'nobody'\nrepeat = 1",
    )
    result = cli("run", str(source), "-p", "name=world", "-p", "repeat=3", env=_without_installed_specs(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "4/4" in result.stderr  # the progress line (parameters, injected and 2 cells), tqdm's or the plain one
    out = nbformat.read(str(tmp_path / "report.out.ipynb"), as_version=4)
    assert nbformat.read(str(source), as_version=4).cells[-1].outputs == []  # the input is untouched
    assert out.metadata.kernelspec.name == "sandboxed-python"
    injected = out.cells[2]
    assert injected.metadata.tags == [INJECTED_TAG]
    assert injected.source == "# Parameters\nname = 'world'\nrepeat = 3\n"
    assert out.cells[3].outputs[0].text == "sandbox ['lo']\n"
    assert out.cells[4].outputs[0].text == "Hello, world! x3 int str\n"


@docker
def test_run_failure_exits_non_zero_with_the_cell_and_traceback(tmp_path: Path) -> None:
    source = _notebook(
        tmp_path / "broken.ipynb",
        "ok = 'before the failure'\nprint(ok)",
        "def divide(a, b):\n    return a / b\n\ndivide(1, 0)",
        "print('never runs')",
    )
    stale = nbformat.read(str(source), as_version=4)
    stale.cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="stale output\n")]
    nbformat.write(stale, str(source))
    target = tmp_path / "result.ipynb"
    result = cli("run", str(source), "-o", str(target), "--no-progress")
    assert result.returncode == 1
    assert "Cell 2 failed" in result.stderr
    assert "def divide(a, b):" in result.stderr  # the failing cell's source
    assert "ZeroDivisionError" in result.stderr and "division by zero" in result.stderr
    assert "return a / b" in result.stderr  # the traceback, not only the message
    assert "\x1b[" not in result.stderr  # no colour codes when stderr is not a terminal
    assert str(target) in result.stderr
    out = nbformat.read(str(target), as_version=4)
    assert out.cells[1].outputs[0].text == "before the failure\n"
    assert out.cells[2].outputs[-1].output_type == "error"
    assert out.cells[3].outputs == []  # the saved output of a cell that did not run is gone


@docker
def test_run_allows_errors_in_cells_tagged_raises_exception_and_fails_on_the_others(tmp_path: Path) -> None:
    source = _notebook(tmp_path / "teaching.ipynb", "print('after the allowed error')", "undefined_name", "print('never runs')")
    nb = nbformat.read(str(source), as_version=4)
    nb.cells.insert(1, new_code_cell("raise ValueError('shown on purpose')", metadata={"tags": ["raises-exception"]}))
    nbformat.write(nb, str(source))
    result = cli("run", str(source), "--no-progress")
    assert result.returncode == 1
    assert "Cell 3 failed" in result.stderr and "NameError" in result.stderr
    assert "shown on purpose" not in result.stderr  # the allowed error is not the one reported
    out = nbformat.read(str(tmp_path / "teaching.out.ipynb"), as_version=4)
    assert out.cells[1].outputs[-1].ename == "ValueError"  # kept in the executed notebook
    assert out.cells[2].outputs[0].text == "after the allowed error\n"
    assert out.cells[4].outputs == []
    del nb.cells[3]  # without the untagged failure the run succeeds
    nbformat.write(nb, str(source))
    result = cli("run", str(source), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert nbformat.read(str(tmp_path / "teaching.out.ipynb"), as_version=4).cells[3].outputs[0].text == "never runs\n"


@docker
def test_run_inplace_with_an_installed_kernelspec(tmp_path: Path, jupyter_prefix: Path) -> None:
    source = _notebook(
        tmp_path / "limits.ipynb",
        "print(open('/sys/fs/cgroup/pids/pids.max').read().strip() if __import__('os').path.exists('/sys/fs/cgroup/pids') else open('/sys/fs/cgroup/pids.max').read().strip())",
    )
    result = cli("run", str(source), "--inplace", "--kernel", "sandboxed-python-small")
    assert result.returncode == 0, result.stderr
    out = nbformat.read(str(source), as_version=4)
    assert out.cells[1].outputs[0].text == "64\n"
    assert out.metadata.kernelspec.name == "sandboxed-python-small"


@docker
def test_exec_string_routes_stdout_stderr_and_results(tmp_path: Path) -> None:
    code = "import sys, socket\nprint('out', socket.gethostname())\nprint('err', file=sys.stderr)\n6 * 7"
    result = cli("exec", code, env=_without_installed_specs(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "out sandbox\n42\n"
    assert result.stderr == "err\n"


@docker
def test_exec_file_and_stdin_and_errors(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import os\nprint('cwd', os.getcwd())\nraise ValueError('bad input')\n")
    result = cli("exec", str(script))
    assert result.returncode == 1
    assert result.stdout == "cwd /home/sandbox/work\n"
    assert "ValueError" in result.stderr and "bad input" in result.stderr
    assert "raise ValueError" in result.stderr

    result = cli("exec", "-", stdin="print(sum(range(10)))\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "45\n"


@docker
def test_exec_timeout_interrupts_and_fails(tmp_path: Path) -> None:
    result = cli("exec", "--timeout", "3", "import time\nprint('start', flush=True)\ntime.sleep(600)")
    assert result.returncode == 1
    assert result.stdout == "start\n"
    assert "did not finish within 3 s" in result.stderr
