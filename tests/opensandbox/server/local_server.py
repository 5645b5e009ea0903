"""Run the published ``opensandbox-server`` on 127.0.0.1 with its Docker runtime, for the tests.

Every setting that shared/opensandbox-server.md lists as wrong by default on this machine is set
here: loopback host, ``resolve_internal = false``, bridge networking published on 127.0.0.1 over a
port range, a local ``execd_image`` and ``[egress] image`` (both stand-ins), its own HOME and
store. The server runs in its own virtualenv (see prepare.py) with an API key.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
from prepare import Prepared  # noqa: I001 (a sibling script, put on sys.path by the tests' conftest)

import docker

LABEL_SANDBOX = "opensandbox.io/id"
LABEL_EGRESS = "opensandbox.io/egress-sidecar-for"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_range(size: int = 200) -> tuple[int, int]:
    """A range of ``size`` ports on 127.0.0.1 that are free right now (below the ephemeral range)."""
    for start in range(20000 + secrets.randbelow(80) * 100, 32000, size):
        ports = range(start, start + size)
        try:
            for port in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return start, start + size - 1
    raise RuntimeError("no free port range for the sandboxes")


def config_toml(
    prepared: Prepared, port: int, api_key: str, home: Path, port_range: tuple[int, int], egress: bool = True
) -> str:
    egress_table = (
        f"""
[egress]
image = "{prepared.egress_image}"
mode = "dns"
readiness_timeout_seconds = 30.0
"""
        if egress
        else ""
    )
    return f"""\
[server]
host = "127.0.0.1"
port = {port}
api_key = "{api_key}"
max_sandbox_timeout_seconds = 3600

[proxy]
resolve_internal = false

[log]
level = "INFO"

[runtime]
type = "docker"
execd_image = "{prepared.execd_image}"

[store]
type = "sqlite"
path = "{home}/opensandbox.db"

[docker]
network_mode = "bridge"
publish_host = "127.0.0.1"
port_range_min = {port_range[0]}
port_range_max = {port_range[1]}
no_new_privileges = true
pids_limit = 4096
{egress_table}"""


class LocalServer:
    """One ``opensandbox-server`` process; :meth:`stop` ends it and removes what it left."""

    def __init__(self, prepared: Prepared, workdir: Path, egress: bool = True) -> None:
        self.prepared = prepared
        self.egress = egress
        self.workdir = workdir
        self.port = free_port()
        self.api_key = secrets.token_urlsafe(24)
        self.api_base = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = workdir / "server.log"
        self.run_label = {"kernel-sandbox-harness": secrets.token_hex(6)}
        """Metadata every test sandbox carries, so that only this run's containers are ever touched."""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> LocalServer:
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.toml"
        config.write_text(config_toml(self.prepared, self.port, self.api_key, home, free_port_range(), self.egress))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPEN_SANDBOX_", "OPENSANDBOX_"))}
        env["HOME"] = str(home)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(self.prepared.server_bin), "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"opensandbox-server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"opensandbox-server did not answer /health within {timeout:g} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def containers(self) -> list[docker.models.containers.Container]:
        """Containers of this run's sandboxes (by the run label) and their egress sidecars."""
        client = docker.from_env()
        ((key, value),) = self.run_label.items()
        sandboxes = client.containers.list(all=True, filters={"label": f"{key}={value}"}, ignore_removed=True)
        ids = {c.labels.get(LABEL_SANDBOX) for c in sandboxes} - {None}
        sidecars = [
            c
            for c in client.containers.list(all=True, filters={"label": LABEL_EGRESS}, ignore_removed=True)
            if c.labels.get(LABEL_EGRESS) in ids
        ]
        return sandboxes + sidecars

    def stop(self) -> list[str]:
        """Stop the server; remove and return the names of this run's containers it left behind."""
        leftovers = []
        for container in self.containers():
            leftovers.append(container.name)
            container.remove(force=True)
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return leftovers
