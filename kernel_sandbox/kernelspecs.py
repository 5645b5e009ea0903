"""Install the shipped kernelspecs into Jupyter's data directories, with per-install settings."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.provisioning import KernelProvisionerFactory

from .resources import data_path

DOCKER_SPEC = "sandboxed-python"
OPENSANDBOX_SPEC = "sandboxed-python-opensandbox"


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

    ``config`` entries override the provisioner config in kernel.json (image, memory, mounts...);
    ``install_as`` and ``display_name`` let several configurations sit side by side.
    """
    specs = shipped_kernelspecs()
    if name not in specs:
        raise ValueError(f"Unknown kernelspec {name!r}; choose one of {', '.join(specs)}")
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / (install_as or name)
        shutil.copytree(specs[name], staged)
        spec_file = staged / "kernel.json"
        spec = json.loads(spec_file.read_text())
        if display_name:
            spec["display_name"] = display_name
        if config:
            provisioner = spec["metadata"]["kernel_provisioner"]
            _check_options(provisioner["provisioner_name"], config)
            provisioner["config"].update(config)
        spec_file.write_text(json.dumps(spec, indent=2) + "\n")
        return KernelSpecManager().install_kernel_spec(
            str(staged), install_as or name, user=user, prefix=prefix
        )


def _check_options(provisioner_name: str, config: dict[str, Any]) -> None:
    provisioner = KernelProvisionerFactory.instance().provisioners[provisioner_name].load()
    known = set(provisioner.class_trait_names(config=True))
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(
            f"{provisioner_name} has no option {', '.join(unknown)}; its options are {', '.join(sorted(known))}"
        )


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
