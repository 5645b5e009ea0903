"""Install the published OpenSandbox server in its own virtualenv and build the local images it needs.

Run by ``.ci/run`` (and by the ``opensandbox_server`` fixture, so ``pytest -m opensandbox_server``
works alone)::

    python tests/opensandbox/server/prepare.py

Everything is cached and reused when present: the server's virtualenv (never the project's) under
``~/.cache/kernel-sandbox/``, and each image, rebuilt only when its inputs changed (a hash of the
stand-in files and of the kernel image it is built from, which is also the image's tag:
``NAME:h-<hash>``, so checkouts with different stand-ins share an engine without clashing). No image is
pulled: each is built FROM the local kernel image ``kernel-sandbox-python:latest``.

Images (all local, all STAND-INS where named so):

* ``kernel-sandbox-osb-execd-standin``: the server's ``execd_image``: ``/execd`` (the execd
  stand-in, a Python execd-protocol server over real ipykernels) and ``/bootstrap.sh``.
* ``kernel-sandbox-python:latest``: the sandbox image, our kernel image as it is.
* ``kernel-sandbox-osb-egress-standin``: answers ``/healthz`` and ``/policy`` on 18080 so the
  server accepts a ``networkPolicy``; it enforces nothing.
* ``kernel-sandbox-osb-code-interpreter-standin``: our kernel image plus jupyter_server, ipywidgets and tqdm, with
  ``/opt/code-interpreter/code-interpreter.sh`` starting it on 127.0.0.1:44771 with a token (the
  layout of upstream's code-interpreter image).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker
from kernel_sandbox.docker.settings import DEFAULT_IMAGE
from kernel_sandbox.docker.connect import docker_client
from kernel_sandbox.docker.image import _fill_wheelhouse, _probe_python

SERVER_VERSION = "1.1.1"
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kernel-sandbox"
SERVER_VENV = CACHE / f"opensandbox-server-{SERVER_VERSION}"
SANDBOX_IMAGE = DEFAULT_IMAGE
EXECD_IMAGE = "kernel-sandbox-osb-execd-standin:test"
EGRESS_IMAGE = "kernel-sandbox-osb-egress-standin:test"
CODE_INTERPRETER_IMAGE = "kernel-sandbox-osb-code-interpreter-standin:test"
HASH_LABEL = "kernel-sandbox.osb-standin-hash"

DOCKERFILES = {
    EXECD_IMAGE: (
        ["execd_standin.py", "bootstrap_standin.sh"],
        """FROM {base}
LABEL kernel-sandbox.osb-standin=execd {hash_label}={hash}
COPY execd_standin.py /execd
COPY bootstrap_standin.sh /bootstrap.sh
""",
    ),
    EGRESS_IMAGE: (
        ["egress_standin.py"],
        """FROM {base}
LABEL kernel-sandbox.osb-standin=egress {hash_label}={hash}
COPY egress_standin.py /opt/egress_standin.py
CMD ["python3", "/opt/egress_standin.py"]
""",
    ),
    CODE_INTERPRETER_IMAGE: (
        ["code_interpreter_standin.sh"],
        """FROM {base}
LABEL kernel-sandbox.osb-standin=code-interpreter {hash_label}={hash}
USER root
COPY wheelhouse/ /tmp/wheelhouse/
COPY code_interpreter_standin.sh /opt/code-interpreter/code-interpreter.sh
RUN pip install --no-index --find-links /tmp/wheelhouse jupyter_server ipywidgets tqdm && rm -rf /tmp/wheelhouse
USER sandbox
""",
    ),
}
WHEELHOUSE_REQUIREMENTS = {CODE_INTERPRETER_IMAGE: "jupyter_server>=2\nipywidgets>=8\ntqdm>=4.66\n"}


@dataclass(frozen=True)
class Prepared:
    """What the harness made: the server's console script and the image names."""

    server_bin: Path
    sandbox_image: str = SANDBOX_IMAGE
    execd_image: str = EXECD_IMAGE
    egress_image: str = EGRESS_IMAGE
    code_interpreter_image: str = CODE_INTERPRETER_IMAGE


def log(message: str) -> None:
    print(f"[opensandbox-server harness] {message}", flush=True)


def install_server(force: bool = False) -> Path:
    """Install ``opensandbox-server`` into its own virtualenv (reused when its version matches)."""
    server_bin = SERVER_VENV / "bin" / "opensandbox-server"
    stamp = SERVER_VENV / "installed-version"
    if not force and server_bin.exists() and stamp.exists() and stamp.read_text().strip() == SERVER_VERSION:
        log(f"server {SERVER_VERSION}: reusing {SERVER_VENV}")
        return server_bin
    started = time.monotonic()
    shutil.rmtree(SERVER_VENV, ignore_errors=True)
    SERVER_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(SERVER_VENV)], check=True)
    pip = [str(SERVER_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, f"opensandbox-server=={SERVER_VERSION}"], check=True)
    stamp.write_text(SERVER_VERSION + "\n")
    log(f"server {SERVER_VERSION}: installed into {SERVER_VENV} in {time.monotonic() - started:.1f} s")
    return server_bin


def _inputs_hash(client: docker.DockerClient, base: str, files: list[str], dockerfile: str) -> str:
    digest = hashlib.sha256(client.images.get(base).id.encode())
    digest.update(dockerfile.encode())
    for name in files:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def build_image(client: docker.DockerClient, name: str, force: bool = False) -> str:
    """Build one stand-in image FROM the kernel image unless an image with the same inputs exists.

    The tag is the hash of the inputs (``name:h-<hash>``), so checkouts with different stand-ins
    on one engine each keep their own image instead of rebuilding each other's. Returns the tag.
    """
    files, template = DOCKERFILES[name]
    wanted = _inputs_hash(client, SANDBOX_IMAGE, files, template + WHEELHOUSE_REQUIREMENTS.get(name, ""))
    tag = f"{name.partition(':')[0]}:h-{wanted}"
    try:
        existing = client.images.get(tag).labels.get(HASH_LABEL)
    except docker.errors.ImageNotFound:
        existing = None
    if existing == wanted and not force:
        log(f"{tag}: up to date")
        return tag
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ksbx-osb-build-") as tmp:
        context = Path(tmp)
        for file in files:
            shutil.copy2(HERE / file, context / file)
        (context / "Dockerfile").write_text(template.format(base=SANDBOX_IMAGE, hash_label=HASH_LABEL, hash=wanted))
        if name in WHEELHOUSE_REQUIREMENTS:
            requirements = context / "requirements.txt"
            requirements.write_text(WHEELHOUSE_REQUIREMENTS[name])
            target = _probe_python(client, SANDBOX_IMAGE)
            _fill_wheelhouse(context / "wheelhouse", requirements, target, log)
        for chunk in client.api.build(path=str(context), tag=tag, rm=True, forcerm=True, pull=False, decode=True):
            if "error" in chunk:
                raise RuntimeError(f"building {tag} failed: {chunk['error'].strip()}")
    log(f"{tag}: built in {time.monotonic() - started:.1f} s")
    return tag


def prepare(force: bool = False) -> Prepared:
    """Install the server and build the images (each step cached); return what was made."""
    started = time.monotonic()
    client = docker_client()
    try:
        client.images.get(SANDBOX_IMAGE)
    except docker.errors.ImageNotFound:
        missing = f"the kernel image {SANDBOX_IMAGE} is missing: run `kernel-sandbox image build` first"
        raise RuntimeError(missing) from None
    server_bin = install_server(force)
    tags = {name: build_image(client, name, force) for name in DOCKERFILES}
    log(f"ready in {time.monotonic() - started:.1f} s")
    return Prepared(
        server_bin=server_bin,
        execd_image=tags[EXECD_IMAGE],
        egress_image=tags[EGRESS_IMAGE],
        code_interpreter_image=tags[CODE_INTERPRETER_IMAGE],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="reinstall the server and rebuild every image")
    try:
        prepare(force=parser.parse_args().force)
    except Exception as exc:  # noqa: BLE001 (a CI phase: say why, exit non-zero)
        raise SystemExit(f"[opensandbox-server harness] failed: {type(exc).__name__}: {exc}") from exc


if __name__ == "__main__":
    main()
