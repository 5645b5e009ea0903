"""The host-side programs shown in the agent-tool, skill and MCP notebooks run and print what they say.

Each of those notebooks ends with a markdown cell holding a ```python program and the ```text it
prints; the program takes the tool or skill from the notebook's tagged cell and calls
``run_tool``/``run_skill`` on a fresh sandbox, or ``run_code`` through ``kernel-sandbox mcp``. Running them here keeps the docs honest.
"""

from __future__ import annotations

import re
import subprocess
import sys

import nbformat
import pytest

from support.notebooks import NOTEBOOKS, REPO

BLOCK = re.compile(r"```(python|text)\n(.*?)```", re.S)


def program_and_output(name: str) -> tuple[str, str]:
    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and "```python" in cell.source and "```text" in cell.source:
            blocks = dict((kind, body) for kind, body in reversed(BLOCK.findall(cell.source)))
            return blocks["python"], blocks["text"]
    raise AssertionError(f"{name} has no program cell")


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


@pytest.mark.usefixtures("docker_engine")
@pytest.mark.parametrize("name", ["03-agent-tool.ipynb", "04-skill.ipynb", "05-mcp-tool.ipynb"])
def test_notebook_program_prints_what_the_notebook_says(name: str) -> None:
    program, expected = program_and_output(name)
    result = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _lines(result.stdout) == _lines(expected), result.stdout
