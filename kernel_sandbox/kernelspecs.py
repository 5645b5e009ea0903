"""Kernelspecs: the shipped ones, installing them, finding them, and starting a kernel from one.

The one home of the kernelspec manager that falls back to the shipped kernelspecs, and of
:func:`started_client` (start, wait until ready, stop); which backend answers to a provisioner
name is :mod:`.backends`'s to say.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Config

from . import backends
from .backends import provisioner_settings
from .errors import ConfigError, KernelLaunchError
from .resources import data_path

DOCKER_SPEC = "sandboxed-python"
OPENSANDBOX_SPEC = "sandboxed-python-opensandbox"
PYTHON_PLACEHOLDER = "{kernel_sandbox_python}"
SPEC_DIR_PLACEHOLDER = "{kernel_sandbox_spec_dir}"
"""The shipped kernel.json files name the launcher with these; ``install`` writes absolute paths.

A kernelspec copied by hand keeps them, so its argv cannot start anything: it fails closed."""
IDENTITY_KEY = "kernel_sandbox"
"""The key of an installed kernelspec's metadata that names its backend
(:meth:`~kernel_sandbox.backends.BackendEntry.identity`)."""


def shipped_kernelspecs() -> dict[str, Path]:
    """Map each kernelspec shipped with kernel-sandbox to its source directory."""
    root = data_path("kernelspecs")
    return {path.name: path for path in sorted(root.iterdir()) if (path / "kernel.json").is_file()}


def shipped_spec(name: str, config: dict[str, Any] | None = None) -> KernelSpec:
    """The shipped kernelspec ``name`` (in memory), with ``config`` as its provisioner config when
    given."""
    spec = KernelSpec.from_resource_dir(str(shipped_kernelspecs()[name]))
    if config is not None:
        spec.metadata["kernel_provisioner"]["config"] = config
    return spec


def is_sandboxed(spec: KernelSpec) -> bool:
    """True when the kernelspec starts its kernels through a kernel-sandbox provisioner."""
    return _selects_sandbox(spec.metadata)


def _selects_sandbox(metadata: Any) -> bool:
    """True when a kernelspec's ``metadata`` (as read, of any shape) names a kernel-sandbox
    provisioner."""
    provisioner = metadata.get("kernel_provisioner") if isinstance(metadata, dict) else None
    return (
        isinstance(provisioner, dict)
        and backends.by_provisioner(provisioner.get("provisioner_name")) is not None
    )


class SandboxKernelSpecManager(KernelSpecManager):
    """A KernelSpecManager that also knows the kernelspecs shipped with kernel-sandbox.

    In-memory ``specs`` (the execution API's, built per sandbox) come first, then installed
    kernelspecs (they carry the user's limits and mounts), then the shipped one of that name.
    """

    def __init__(self, specs: Mapping[str, KernelSpec] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._specs = dict(specs or {})

    def find_kernel_specs(self) -> dict[str, str]:
        """The shipped kernelspecs, overridden by installed ones, and the in-memory ones (no
        directory)."""
        found = {name: str(path) for name, path in shipped_kernelspecs().items()}
        found.update(super().find_kernel_specs())
        found.update({name: "" for name in self._specs})
        return found

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        """The in-memory kernelspec ``kernel_name``, else the installed one, else the shipped
        one."""
        if kernel_name in self._specs:
            return self._specs[kernel_name]
        try:
            return super().get_kernel_spec(kernel_name)
        except NoSuchKernel:
            shipped = shipped_kernelspecs().get(kernel_name)
            if shipped is None:
                raise
            return KernelSpec.from_resource_dir(str(shipped))


def kernel_manager(
    kernel_name: str = DOCKER_SPEC,
    *,
    spec: KernelSpec | None = None,
    standby: int | None = None,
    **kwargs: Any,
) -> AsyncKernelManager:
    """An AsyncKernelManager for ``kernel_name`` (``spec`` when given, else installed, else
    shipped).

    ``standby``: the Docker provisioner's option, where the kernelspec does not set it (0 for a
    process that starts one kernel).
    """
    if standby is not None:
        kwargs["config"] = Config({"DockerProvisioner": {"standby": standby}})
    specs = {kernel_name: spec} if spec is not None else {}
    return AsyncKernelManager(
        kernel_name=kernel_name, kernel_spec_manager=SandboxKernelSpecManager(specs), **kwargs
    )


@asynccontextmanager
async def started_client(
    kernel: AsyncKernelManager | str = DOCKER_SPEC, *, timeout: float = 120, **kwargs: Any
) -> AsyncIterator[AsyncKernelClient]:
    """Start a kernel, wait until it answers, and yield its client; on the way out stop the
    client's channels and shut the kernel down (at once), unless it is already gone.

    ``kernel`` is a kernel manager, or a kernelspec name for :func:`kernel_manager` (with
    ``kwargs``). ``timeout`` bounds the whole start, and the kernel is stopped when it runs out:
    KernelLaunchError when the launch was still under way (it is given up), jupyter_client's
    RuntimeError when the kernel did not answer.
    """
    km = kernel if isinstance(kernel, AsyncKernelManager) else kernel_manager(kernel, **kwargs)
    deadline = time.monotonic() + timeout
    try:
        await asyncio.wait_for(km.start_kernel(), timeout)
    except asyncio.TimeoutError:
        if km.has_kernel:  # it came up as the time ran out
            await km.shutdown_kernel(now=True)
        raise KernelLaunchError(
            f"the kernel did not start within started_client's timeout ({timeout:g} s)"
        ) from None
    kc = km.client()
    try:
        kc.start_channels()
        await kc.wait_for_ready(timeout=max(deadline - time.monotonic(), 1.0))
        yield kc
    finally:
        kc.stop_channels()
        # a kernel that ended (or was shut down) inside the block is not stopped again
        if km.has_kernel:
            await km.shutdown_kernel(now=True)


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
        raise ConfigError(f"Unknown kernelspec {name!r}; choose one of {', '.join(specs)}")
    _require_isolated_import()
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / (install_as or name)
        shutil.copytree(specs[name], staged)
        spec = json.loads((staged / "kernel.json").read_text())
        if display_name:
            spec["display_name"] = display_name
        provisioner = spec["metadata"]["kernel_provisioner"]
        provisioner["config"].update(config or {})
        settings = provisioner_settings(provisioner["provisioner_name"], provisioner["config"])
        # JupyterLab's debugger toggle reads it
        spec["metadata"]["debugger"] = getattr(settings, "mode", "") != "execd"
        # the lab extension reads it (labextension/src/index.js: isSandboxedSpec)
        spec["metadata"][IDENTITY_KEY] = backends.for_settings(settings).identity()
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
    """``argv`` with the placeholders replaced by this interpreter and ``spec_dir``, both
    absolute."""
    values = {PYTHON_PLACEHOLDER: sys.executable, SPEC_DIR_PLACEHOLDER: str(spec_dir)}
    return [values.get(part, part) for part in argv]


def _require_isolated_import() -> None:
    """The launcher runs as ``python -I`` (no current directory on sys.path): it must import so."""
    probe = subprocess.run(
        [sys.executable, "-I", "-c", "import kernel_sandbox.launch"], capture_output=True, text=True
    )
    if probe.returncode:
        raise KernelLaunchError(
            f"{sys.executable} -I cannot import kernel_sandbox "
            f"({probe.stderr.strip().splitlines()[-1:]}); the kernelspecs run the launcher in "
            "isolated mode, so install kernel-sandbox into a virtual environment or the system "
            "site-packages rather than the user site"
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
        if isinstance(spec, dict) and _selects_sandbox(spec.get("metadata")):
            found[spec_name] = resource_dir
    return found
