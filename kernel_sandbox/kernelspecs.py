"""Install the shipped kernelspecs into Jupyter's data directories, with per-install settings."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from .errors import KernelLaunchError
from .resources import data_path
from .settings import DockerSettings

DOCKER_SPEC = "sandboxed-python"
OPENSANDBOX_SPEC = "sandboxed-python-opensandbox"
PYTHON_PLACEHOLDER = "{kernel_sandbox_python}"
SPEC_DIR_PLACEHOLDER = "{kernel_sandbox_spec_dir}"
"""The shipped kernel.json files name the launcher with these; ``install`` writes absolute paths.

A kernelspec copied by hand keeps them, so its argv cannot start anything: it fails closed."""


def shipped_kernelspecs() -> dict[str, Path]:
    """Map each kernelspec shipped with kernel-sandbox to its source directory."""
    root = data_path("kernelspecs")
    return {path.name: path for path in sorted(root.iterdir()) if (path / "kernel.json").is_file()}


def install(
    name: str = DOCKER_SPEC,
    *,
    user: bool = False,
    prefix: str | None = None,
    install_as: str | None = None,
    display_name: str | None = None,
    config: dict[str, Any] | None = None,
) -> str:
    """Install the shipped kernelspec ``name`` and return the directory it was installed in.

    ``config`` entries override the provisioner config in kernel.json (image, memory, mounts...),
    checked before anything is written; ``install_as`` and ``display_name`` let several
    configurations sit side by side. The kernelspec's argv runs the launcher with this
    interpreter's absolute path (as ``ipykernel install`` does), so clients that ignore
    provisioners get the same sandbox.
    """
    specs = shipped_kernelspecs()
    if name not in specs:
        raise ValueError(f"Unknown kernelspec {name!r}; choose one of {', '.join(specs)}")
    _require_isolated_import()
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / (install_as or name)
        shutil.copytree(specs[name], staged)
        spec = json.loads((staged / "kernel.json").read_text())
        if display_name:
            spec["display_name"] = display_name
        provisioner = spec["metadata"]["kernel_provisioner"]
        provisioner["config"].update(config or {})
        _check_options(provisioner["provisioner_name"], provisioner["config"])
        (staged / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
        destination = KernelSpecManager().install_kernel_spec(
            str(staged), install_as or name, user=user, prefix=prefix
        )
    spec_file = Path(destination) / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["argv"] = launcher_argv(spec["argv"], Path(destination).resolve())
    spec_file.write_text(json.dumps(spec, indent=2) + "\n")
    return destination


def launcher_argv(argv: list[str], spec_dir: Path) -> list[str]:
    """``argv`` with the placeholders replaced by this interpreter and ``spec_dir``, both absolute."""
    values = {PYTHON_PLACEHOLDER: sys.executable, SPEC_DIR_PLACEHOLDER: str(spec_dir)}
    return [values.get(part, part) for part in argv]


def _require_isolated_import() -> None:
    """The launcher runs as ``python -I`` (no current directory on sys.path): it must import so."""
    probe = subprocess.run([sys.executable, "-I", "-c", "import kernel_sandbox.launch"], capture_output=True, text=True)
    if probe.returncode:
        raise KernelLaunchError(
            f"{sys.executable} -I cannot import kernel_sandbox ({probe.stderr.strip().splitlines()[-1:]}); "
            "the kernelspecs run the launcher in isolated mode, so install kernel-sandbox into a virtual "
            "environment or the system site-packages rather than the user site"
        )


def _check_options(provisioner_name: str, config: dict[str, Any]) -> None:
    if provisioner_name == "kernel-sandbox-opensandbox":
        from .opensandbox.settings import OpenSandboxSettings

        OpenSandboxSettings.from_config(config)
        return
    DockerSettings.from_config(config)


def installed() -> dict[str, str]:
    """Installed kernelspecs that select a kernel-sandbox provisioner, by name."""
    found = {}
    manager = KernelSpecManager()
    for spec_name, resource_dir in manager.find_kernel_specs().items():
        spec_file = Path(resource_dir) / "kernel.json"
        try:
            spec = json.loads(spec_file.read_text())
        except (OSError, ValueError):
            continue
        provisioner = spec.get("metadata", {}).get("kernel_provisioner", {})
        if str(provisioner.get("provisioner_name", "")).startswith("kernel-sandbox-"):
            found[spec_name] = resource_dir
    return found
