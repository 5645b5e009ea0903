"""jupyter_kernel_test, the Jupyter project's conformance suite, on Sandboxed Python through both launch paths.

The same suite runs on a local ``python3`` in the same session, so a difference between a sandboxed
kernel and a local one fails here whichever side it is on: through the provisioner (JupyterLab,
nbclient) and through the kernelspec's ``argv`` run without provisioner (VS Code, PyCharm: a kernelspec
whose metadata names no provisioner is started by jupyter_client's local provisioner from its argv).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from support import conformance
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_engine", "conformance_specs")]

ARGV_KERNEL = "sandboxed-python-argv"


@pytest.fixture(scope="module")
def conformance_specs(jupyter_prefix: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The installed Sandboxed Python kernelspec, and a copy of it without provisioner (its argv alone)."""
    data_dir = tmp_path_factory.mktemp("argv-spec")
    target = data_dir / "kernels" / ARGV_KERNEL
    shutil.copytree(jupyter_prefix / "kernels" / "sandboxed-python", target)
    spec = json.loads((target / "kernel.json").read_text())
    spec["metadata"].pop("kernel_provisioner")
    (target / "kernel.json").write_text(json.dumps(spec))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JUPYTER_PATH", os.pathsep.join([str(data_dir), os.environ["JUPYTER_PATH"]]))
        yield


class TestLocalPython(conformance.PythonKernelTests):
    """The floor: a local ipykernel, run in the same session as the sandboxed ones."""

    kernel_name = "python3"


class TestSandboxedPython(conformance.PythonKernelTests):
    """Sandboxed Python through its provisioner, as JupyterLab and nbclient start it."""

    kernel_name = "sandboxed-python"


class TestSandboxedPythonArgv(conformance.PythonKernelTests):
    """Sandboxed Python's argv run by jupyter_client's local provisioner, as clients without provisioners run it."""

    kernel_name = ARGV_KERNEL
