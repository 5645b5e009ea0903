"""Build the kernel image from ``docker/`` where neither a registry nor a package index may be
reachable.

The base image is ``python:3.11-slim`` when the engine has it or can pull it, else a Debian
bookworm made with debootstrap and imported into the engine. The Python packages are downloaded
on the host into a wheelhouse matching the base's Python, so the build itself needs no network.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import deque
from pathlib import Path
from typing import Callable

import docker
from docker.errors import APIError, DockerException

from .containers import LABEL, own_ulimits
from .settings import DEFAULT_IMAGE
from .connect import docker_client, has_image
from ..errors import ConfigError, ImageBuildError
from ..resources import data_path

BASE_FALLBACK = "kernel-sandbox-base:bookworm"
UPSTREAM_BASE = "python:3.11-slim"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
WHEEL_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "kernel-sandbox"
    / "wheelhouse"
)

_PROBE = (
    "import json, os, platform, sys;"
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2],"
    " 'libc': os.confstr('CS_GNU_LIBC_VERSION'), 'machine': platform.machine()}))"
)
_BASE_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
]

Progress = Callable[[str], None]


def build_image(
    tag: str = DEFAULT_IMAGE,
    base_image: str | None = None,
    progress: Progress = print,
    rebuild_base: bool = False,
    engine: str = "auto",
) -> str:
    """Build the kernel image ``tag`` from ``docker/`` into ``engine``'s store (the engine
    option's values) and return the tag.

    ``base_image`` overrides the choice of base; ``rebuild_base`` makes the debootstrap base
    (``BASE_FALLBACK``) again and builds on it.
    """
    if rebuild_base and base_image not in (None, BASE_FALLBACK):
        raise ConfigError(
            f"rebuild_base rebuilds {BASE_FALLBACK}; it cannot be combined with "
            f"base_image={base_image!r}"
        )
    client = docker_client(engine=engine)
    if rebuild_base:
        base = _bootstrap_base(client, progress)
    elif base_image:
        if not has_image(client, base_image):
            raise ImageBuildError(
                f"base image {base_image!r} is not in the local Docker engine; `docker pull "
                f"{base_image}` first"
            )
        base = base_image
    else:
        base = _pick_base(client, progress)
    target = _probe_python(client, base)
    progress(f"base image {base}: Python {target['python']}, {target['libc']}, {target['machine']}")
    with tempfile.TemporaryDirectory(prefix="kernel-sandbox-build-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(
            data_path("docker"), context, ignore=shutil.ignore_patterns("wheelhouse", "__pycache__")
        )
        _fill_wheelhouse(context / "wheelhouse", context / "requirements.txt", target, progress)
        _docker_build(client, context, tag, base, progress)
    return tag


def _pick_base(client: docker.DockerClient, progress: Progress) -> str:
    if has_image(client, UPSTREAM_BASE):
        return UPSTREAM_BASE
    progress(f"pulling {UPSTREAM_BASE} ...")
    try:
        client.images.pull(UPSTREAM_BASE)
        return UPSTREAM_BASE
    except APIError as exc:
        progress(f"cannot pull {UPSTREAM_BASE} ({exc.explanation or exc}); using {BASE_FALLBACK}")
    if has_image(client, BASE_FALLBACK):
        return BASE_FALLBACK
    return _bootstrap_base(client, progress)


def _debian_mirror() -> str:
    """Return the Debian mirror the host's apt uses for bookworm, or deb.debian.org."""
    apt = Path("/etc/apt")
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]
    for path in [p for p in files if p.is_file()]:
        for line in path.read_text(errors="replace").splitlines():
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == "bookworm":
                return words[1]
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        for stanza in path.read_text(errors="replace").split("\n\n"):
            fields = dict(
                (key.strip(), value.split())
                for key, _, value in (line.partition(":") for line in stanza.splitlines())
            )
            if (
                "deb" in fields.get("Types", [])
                and "bookworm" in fields.get("Suites", [])
                and fields.get("URIs")
            ):
                return fields["URIs"][0]
    return DEFAULT_MIRROR


def _bootstrap_base(client: docker.DockerClient, progress: Progress) -> str:
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if debootstrap is None or os.geteuid() != 0:
        why = "debootstrap is not installed" if debootstrap is None else "debootstrap needs root"
        raise ImageBuildError(
            f"no base image: {UPSTREAM_BASE} is not present and cannot be pulled, and {why} to "
            f"make {BASE_FALLBACK}",
            f"{'apt-get install debootstrap, then ' if debootstrap is None else ''}the same "
            f"command again as root; `docker pull {UPSTREAM_BASE}` where a registry answers; or "
            "--base-image with a local Debian-based image that has python3-venv",
        )
    mirror = _debian_mirror()
    progress(f"making {BASE_FALLBACK} with debootstrap from {mirror} (about a minute) ...")
    with tempfile.TemporaryDirectory(prefix="kernel-sandbox-rootfs-") as root:
        cmd = [
            debootstrap,
            "--variant=minbase",
            "--include=python3,python3-venv",
            "bookworm",
            root,
            mirror,
        ]
        _run_streamed(cmd, progress, "debootstrap")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in Path(root, cache).glob("*"):
                if item.is_file():
                    item.unlink()
        progress(f"importing {BASE_FALLBACK} into the engine ...")
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        repository, _, tag = BASE_FALLBACK.partition(":")
        try:
            answer = client.api.import_image_from_stream(
                tar.stdout, repository=repository, tag=tag, changes=_BASE_CHANGES
            )
        finally:
            tar.stdout.close()
            tar.wait()
        if tar.returncode != 0 or not has_image(client, BASE_FALLBACK):
            raise ImageBuildError(
                f"importing the debootstrap root failed (tar exit code {tar.returncode}): {answer}"
            )
    return BASE_FALLBACK


def _run_streamed(cmd: list[str], progress: Progress, name: str) -> None:
    """Run ``cmd``, showing the first line of each phase (its leading verb); raise with the output's
    tail on failure."""
    tail: deque[str] = deque(maxlen=40)
    seen: set[str] = set()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail.append(line)
            words = line.split()
            phase = words[1] if len(words) > 1 and words[0].endswith(":") else "".join(words[:1])
            if phase not in seen:
                progress(f"{name}: {line}")
                seen.add(phase)
    if proc.returncode != 0:
        output = "\n".join(tail)
        raise ImageBuildError(f"{name} failed with exit code {proc.returncode}:\n{output}")


def _probe_python(client: docker.DockerClient, base: str) -> dict[str, str]:
    name = f"kernel-sandbox-probe-{uuid.uuid4().hex[:12]}"
    try:
        out = client.containers.run(
            base,
            ["python3", "-c", _PROBE],
            name=name,
            remove=True,
            network_mode="none",
            labels={LABEL: "true"},
            ulimits=own_ulimits(64),  # root's Podman would ask for more than a host may allow
        )
    except DockerException as exc:
        with contextlib.suppress(DockerException):  # a container that failed to start stays
            client.containers.get(name).remove(force=True)
        raise ImageBuildError(
            f"base image {base!r} cannot run python3 ({exc}); it needs python3 and python3-venv"
        ) from exc
    return json.loads(out.decode().strip().splitlines()[-1])


def _platform_args(target: dict[str, str]) -> list[str]:
    """pip's --platform flags for every manylinux tag the base's glibc accepts (pip does not expand
    them itself)."""
    machine = target["machine"]
    libc_name, _, libc_version = target["libc"].partition(" ")
    if libc_name != "glibc":
        raise ImageBuildError(
            f"the base image uses {target['libc']!r}; only glibc-based images are supported"
        )
    minor = int(libc_version.split(".")[1])
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 16, -1)] + [
        f"manylinux2014_{machine}"
    ]
    return [arg for tag in tags for arg in ("--platform", tag)]


def _fill_wheelhouse(
    wheelhouse: Path, requirements: Path, target: dict[str, str], progress: Progress
) -> None:
    """Put the wheels of ``requirements`` for the base's Python into ``wheelhouse``, via the cache
    in WHEEL_CACHE."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        target["python"],
        *_platform_args(target),
        "-r",
        str(requirements),
    ]
    offline = [*pip, "--no-index", "--find-links", str(WHEEL_CACHE), "-d", str(wheelhouse)]
    if subprocess.run(offline, capture_output=True, text=True).returncode == 0:
        progress(f"wheelhouse: {len(list(wheelhouse.glob('*.whl')))} wheels from {WHEEL_CACHE}")
        return
    progress(f"downloading wheels for Python {target['python']} into {WHEEL_CACHE} ...")
    _run_streamed([*pip, "-d", str(WHEEL_CACHE)], progress, "pip download")
    result = subprocess.run(offline, capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageBuildError(
            f"pip could not assemble the wheelhouse:\n{result.stdout}{result.stderr}"
        )
    progress(f"wheelhouse: {len(list(wheelhouse.glob('*.whl')))} wheels")


def _docker_build(
    client: docker.DockerClient, context: Path, tag: str, base: str, progress: Progress
) -> None:
    """Run the Dockerfile with the legacy builder, showing each step; raise with the failing step's
    output."""
    step = "(before the first step)"
    output: list[str] = []
    stream = client.api.build(
        path=str(context),
        tag=tag,
        buildargs={"BASE_IMAGE": base},
        rm=True,
        forcerm=True,
        pull=False,
        decode=True,
    )
    for chunk in stream:
        if "error" in chunk:
            detail = "".join(output).strip()
            raise ImageBuildError(
                f"docker build failed at {step}: {chunk['error'].strip()}\n{detail}"
            )
        text = chunk.get("stream", "")
        if text.startswith("Step "):
            step = text.strip()
            output = []
            progress(step)
        elif text and not text.startswith((" ---> ", "Removing intermediate container")):
            output.append(text)
