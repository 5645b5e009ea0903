"""Every notebook in notebooks/ still gives its saved outputs on the sandboxed kernel (nbval).

nbval runs in a subprocess so that its pytest plugin and kernel do not mix with this session;
outputs that change between runs are sanitised by nbval_sanitize.cfg next to this file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from support.notebooks import NOTEBOOKS, REPO

SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")
EXAMPLES = sorted(p for p in NOTEBOOKS.glob("*.ipynb") if not p.name.endswith(".out.ipynb"))


def test_there_are_example_notebooks_saved_with_outputs() -> None:
    assert len(EXAMPLES) >= 4, [p.name for p in EXAMPLES]
    for path in EXAMPLES:
        nb = nbformat.read(str(path), as_version=4)
        assert nb.metadata.kernelspec.name == "sandboxed-python", path.name
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(c.execution_count for c in code), f"{path.name} is not saved executed"
        assert any(c.outputs for c in code), path.name


@pytest.mark.usefixtures("docker_engine")
@pytest.mark.parametrize("notebook", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_notebook_outputs_match_on_the_sandboxed_kernel(notebook: Path, jupyter_prefix: Path) -> None:
    env = {**os.environ, "JUPYTER_PATH": os.environ["JUPYTER_PATH"]}
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
        "--nbval", "--nbval-kernel-name", "sandboxed-python",
        "--nbval-sanitize-with", str(SANITIZE),
        "--nbval-cell-timeout", "120",
        str(notebook.relative_to(REPO)),
    ]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, f"nbval failed for {notebook.name}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
