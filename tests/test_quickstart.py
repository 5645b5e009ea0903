"""./quickstart, the first command from a checkout: its help, and its stops without an engine.

The stops run the real script as a real other account (``nobody``, when the tests run as root)
with this test environment active (so nothing is installed) and ``DOCKER_HOST`` naming a socket
that is absent or refuses that account: no engine answers, and the script must say why and
print the command that fixes it, without starting JupyterLab.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
QUICKSTART = CHECKOUT / "quickstart"
NOBODY = 65534


def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=120, env=env, cwd="/",
        stdin=subprocess.DEVNULL,
    )


def as_other_user(command: list[str]) -> list[str]:
    """``command`` as an account other than root: ``nobody`` when the tests run as root, else ours.

    ``nobody`` keeps one capability, to read what root's directories hold: the test environment's
    Python may live under /root (pyenv's). Writing, and so connecting to a socket, stays refused.
    """
    if os.geteuid() != 0:
        return command
    read = "+dac_read_search"
    user = [f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return ["setpriv", *user, f"--inh-caps={read}", f"--ambient-caps={read}", *command]


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory the other account can enter (pytest's tmp_path is root's alone)."""
    with tempfile.TemporaryDirectory(prefix="ks-quickstart-", dir="/tmp") as path:
        os.chmod(path, 0o755)
        yield Path(path)


def stop_as_user(docker_host: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "USER": "kstester",
        "VIRTUAL_ENV": sys.prefix,
        "DOCKER_HOST": docker_host,
    }
    return run(as_other_user([str(QUICKSTART), "--no-browser"]), env)


def test_help_says_what_it_does_and_stops() -> None:
    result = run([str(QUICKSTART), "--help"])
    assert result.returncode == 0, result.stderr
    assert "./quickstart [JUPYTERLAB ARGUMENTS ...]" in result.stdout
    assert "--allow-root" in result.stdout and ".ci/run" in result.stdout
    assert "=== " not in result.stdout  # --help sets nothing up


def test_no_engine_stops_with_the_command_that_starts_or_installs_it(world_dir: Path) -> None:
    absent = world_dir / "docker.sock"
    result = stop_as_user(f"unix://{absent}", world_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "installed in " + sys.prefix in result.stdout  # the package step found it done
    installed = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin")
    if installed:
        why = "dockerd is installed but not running, and starting it needs root"
        systemd = Path("/run/systemd/system").is_dir()
        fix = "sudo systemctl start docker" if systemd else "sudo sh -c 'dockerd"
    else:
        why = "Docker is not installed, and installing it needs root"
        fix = "sudo apt-get install -y docker.io && sudo usermod -aG docker kstester"
    assert f"quickstart: no Docker engine answers at {absent}: {why}\n  fix: {fix}" in result.stderr
    assert result.stderr.rstrip().endswith("then ./quickstart again")
    assert "[ok]" not in result.stdout  # it stopped before setup and JupyterLab


def test_a_socket_that_refuses_the_user_names_the_docker_group(world_dir: Path) -> None:
    path = world_dir / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        os.chmod(path, 0o600 if os.geteuid() == 0 else 0)
        result = stop_as_user(f"unix://{path}", world_dir)
    finally:
        server.close()
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"quickstart: the Docker engine's socket {path} does not let kstester in\n"
        "  fix: sudo usermod -aG docker kstester, log in again" in result.stderr
    )
