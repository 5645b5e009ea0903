"""Checks of the local set-up, each with the command that fixes it."""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path
from importlib.metadata import entry_points

from .docker.containers import OURS, is_orphan
from .docker.settings import DEFAULT_IMAGE
from .errors import EngineUnavailable, ImageMissing
from .docker.connect import PODMAN_FIX, docker_client, engine_fix, podman_address, require_image
from .docker.checks import check_podman, podman_host
from .docker.settings import DockerSettings
from .backends import GROUP, provisioner_names
from .errors import ConfigError, KernelLaunchError
from .kernelspecs import DOCKER_SPEC, installed
from .privdir import abandoned_dirs

RUNSC_ARGS = ["--network=none"]


@dataclass
class Check:
    """One check's outcome: what was checked, whether it passed, and the fix when it did not."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        line = f"[{'ok' if self.ok else 'FAIL'}] {self.name}: {self.detail}"
        return line if self.ok or not self.fix else f"{line}\n       fix: {self.fix}"


def run_checks(image: str = DEFAULT_IMAGE) -> list[Check]:
    """Check the provisioners, the Docker engine, the kernel image, leftovers and kernelspecs."""
    checks = []
    names = {ep.name for ep in entry_points(group="jupyter_client.kernel_provisioners")}
    try:
        wanted = provisioner_names()
    except KernelLaunchError:
        wanted = frozenset({f"the {GROUP} entry points"})
    missing = wanted - names
    checks.append(
        Check(
            "provisioners",
            not missing,
            "registered with jupyter_client"
            if not missing
            else f"not registered: {sorted(missing)}",
            "reinstall the package: `pip install kernel-sandbox` (or `pip install -e .`)",
        )
    )
    try:
        client = docker_client()
        version = client.version().get("Version", "?")
    except EngineUnavailable as exc:
        checks.append(Check("docker engine", False, str(exc).split(". Start")[0], engine_fix(exc)))
        client = None
    else:
        checks.append(Check("docker engine", True, f"reachable, version {version}"))
    if client is not None:
        try:
            require_image(client, image)
        except ImageMissing:
            checks.append(Check("kernel image", False, f"{image} is missing", image_fix(image)))
        else:
            checks.append(Check("kernel image", True, f"{image} is present"))
        ours = client.containers.list(all=True, filters={"label": OURS}, ignore_removed=True)
        orphans = [c.name for c in ours if is_orphan(c)]
        dirs = abandoned_dirs()
        checks.append(
            Check(
                "leftovers",
                not orphans and not dirs,
                f"{len(ours)} kernel containers, {len(orphans)} left by dead launchers; "
                f"{len(dirs)} abandoned private directories",
                "kernel-sandbox gc",
            )
        )
        checks.append(runsc_check(client.info().get("Runtimes") or {}))
    checks += podman_checks(image)
    specs = installed()
    checks.append(
        Check(
            "kernelspecs",
            DOCKER_SPEC in specs,
            ", ".join(f"{name} ({path})" for name, path in specs.items()) or "none installed",
            KERNELSPEC_FIX,
        )
    )
    return checks


CATATONIT = ("/usr/libexec/podman/catatonit", "/usr/lib/podman/catatonit", "/usr/bin/catatonit")
"""Where distributions put catatonit, the init Podman runs for ``--init``."""


def podman_checks(image: str) -> list[Check]:
    """Podman, when installed (optional: ``engine: podman``): its API socket, catatonit, the image
    in its store, the limits it can enforce, and subordinate ids for a rootless user."""
    if shutil.which("podman") is None:
        return [Check("podman", True, "not installed (optional: `engine: podman` needs it)")]
    checks = [
        Check(
            "podman init",
            any(os.path.exists(path) for path in CATATONIT),
            "catatonit (Podman's --init) is installed",
            "apt-get install catatonit",
        )
    ]
    if os.geteuid() != 0:
        user = pwd.getpwuid(os.geteuid()).pw_name
        ranges = Path("/etc/subuid").read_text() if Path("/etc/subuid").exists() else ""
        checks.append(
            Check(
                "podman subuid",
                any(
                    line.split(":")[0] in (user, str(os.geteuid())) for line in ranges.splitlines()
                ),
                f"subordinate uids of {user} in /etc/subuid",
                f"sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}",
            )
        )
    try:
        client = docker_client(engine="podman")
    except EngineUnavailable as exc:
        return [*checks, Check("podman socket", False, str(exc).split(". Start")[0], PODMAN_FIX)]
    checks.append(Check("podman socket", True, f"answers at {podman_address()}"))
    try:
        require_image(client, image)
        checks.append(Check("podman image", True, f"{image} is in Podman's store"))
    except ImageMissing:
        fix = f"kernel-sandbox image build --engine podman --tag {image}"
        checks.append(Check("podman image", False, f"{image} is missing", fix))
    try:
        check_podman(podman_host(client), DockerSettings.from_config({}))
        checks.append(Check("podman limits", True, "memory, pids and CPU limits can be enforced"))
    except ConfigError as exc:
        detail, _, fix = str(exc).partition(". ")
        checks.append(Check("podman limits", False, detail, fix))
    return checks


def runsc_check(runtimes: dict) -> Check:
    """gVisor's runsc, when registered, must run ``--network none`` containers (Debian's needs a
    flag)."""
    if "runsc" not in runtimes:
        return Check("gVisor (runsc)", True, "not registered (optional: `runtime: runsc` needs it)")
    args = runtimes["runsc"].get("runtimeArgs") or []
    return Check(
        "gVisor (runsc)",
        all(arg in args for arg in RUNSC_ARGS),
        f"registered as {runtimes['runsc'].get('path')} with runtimeArgs {args}",
        'add "runtimeArgs": ["--network=none"] to the runsc entry of /etc/docker/daemon.json, '
        "then `kill -HUP $(pidof dockerd)`",
    )


KERNELSPEC_FIX = (
    "`kernel-sandbox install --sys-prefix` (this Python environment) or `kernel-sandbox install "
    "--user`"
)


def image_fix(image: str) -> str:
    """The command that builds the kernel image ``image``."""
    return f"kernel-sandbox image build --tag {image}"
