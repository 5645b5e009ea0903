"""The parts of `setup`/`lab` that need no server: the locked-down kernelspec manager, JupyterLab's
command line, and the commands `--install-engine` would run (never run here: the engine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from traitlets import Unicode
from traitlets.config import Configurable

from kernel_sandbox.docker import engine
from kernel_sandbox import lab as lab_module
from kernel_sandbox.docker.engine import Host, install_commands, start_command
from kernel_sandbox.errors import EngineUnavailable, SetupError
from kernel_sandbox.kernelspecs import install
from kernel_sandbox.lab import LABEXTENSIONS, LOCKED_DOWN, SandboxedKernelSpecManager, lab_arguments

from support.notebooks import cli


class FakeServer(Configurable):
    """Stands in for the ServerApp that owns a kernelspec manager: only its root directory matters."""

    root_dir = Unicode()


def plain_kernelspec(kernels: Path, name: str) -> Path:
    spec_dir = kernels / name
    spec_dir.mkdir(parents=True)
    argv = ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))
    return spec_dir


def manager(root: Path, *kernel_dirs: Path) -> SandboxedKernelSpecManager:
    return SandboxedKernelSpecManager(parent=FakeServer(root_dir=str(root)), kernel_dirs=[str(d) for d in kernel_dirs])


def test_locked_down_manager_offers_only_sandboxed_kernelspecs(tmp_path: Path) -> None:
    install("sandboxed-python", prefix=str(tmp_path / "prefix"))
    kernels = tmp_path / "prefix" / "share" / "jupyter" / "kernels"
    plain_kernelspec(kernels, "local-python")
    root = tmp_path / "root"
    root.mkdir()
    ksm = manager(root, kernels)
    assert set(ksm.find_kernel_specs()) == {"sandboxed-python"}
    assert set(ksm.get_all_specs()) == {"sandboxed-python"}
    assert ksm.get_kernel_spec("sandboxed-python").display_name == "Sandboxed Python"
    for name in ("local-python", "python3"):  # python3: the native kernel jupyter_client would add
        with pytest.raises(NoSuchKernel):
            ksm.get_kernel_spec(name)
    assert ksm.refused == {}
    # jupyter_client's own allow-list hides names from the list but still starts them by name:
    allowing = KernelSpecManager(kernel_dirs=[str(kernels)], allowed_kernelspecs={"sandboxed-python"})
    assert set(allowing.find_kernel_specs()) == {"sandboxed-python"}
    assert allowing.get_kernel_spec("local-python").display_name == "local-python"
    assert allowing.get_kernel_spec("python3").language == "python"


def test_locked_down_manager_keeps_the_kernelspecs_it_read_at_start(tmp_path: Path) -> None:
    spec_dir = Path(install("sandboxed-python", prefix=str(tmp_path / "prefix")))
    ksm = manager(tmp_path / "root", spec_dir.parent)
    spec_file = spec_dir / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["metadata"]["kernel_provisioner"]["config"]["mounts"] = ["/:host:rw"]
    spec_file.write_text(json.dumps(spec))
    plain_kernelspec(spec_dir.parent, "added-later")
    assert ksm.get_kernel_spec("sandboxed-python").metadata["kernel_provisioner"]["config"] == {"suspend_after": 1800}
    assert "mounts" not in ksm.get_all_specs()["sandboxed-python"]["spec"]["metadata"]["kernel_provisioner"]["config"]
    with pytest.raises(NoSuchKernel):
        ksm.get_kernel_spec("added-later")


def test_locked_down_manager_refuses_kernelspecs_pages_could_rewrite(tmp_path: Path) -> None:
    visible = Path(install("sandboxed-python", prefix=str(tmp_path / "venv")))  # under the root, not hidden
    hidden = Path(install("sandboxed-python", prefix=str(tmp_path / ".venv"), install_as="hidden-sandbox"))
    ksm = manager(tmp_path, visible.parent, hidden.parent)
    assert set(ksm.find_kernel_specs()) == {"hidden-sandbox"}  # the contents API refuses hidden paths
    assert "inside the server's root directory" in ksm.refused["sandboxed-python"]
    with pytest.raises(NoSuchKernel):
        ksm.get_kernel_spec("sandboxed-python")


def test_lab_arguments_default_to_loopback_a_token_and_sandboxed_python() -> None:
    arguments = lab_arguments(["--port", "9999"], locked_down=False)
    assert arguments[0] == "--ServerApp.ip=127.0.0.1"
    assert arguments[1].startswith("--IdentityProvider.token=") and len(arguments[1]) > 40
    assert arguments[2] == "--MappingKernelManager.default_kernel_name=sandboxed-python"
    assert arguments[3:5] == [  # kernels and notebook sessions that outlive the server
        "--ServerApp.kernel_manager_class=kernel_sandbox.server.ReattachingKernelManager",
        "--ServerApp.session_manager_class=kernel_sandbox.server.ReattachingSessionManager",
    ]
    assert arguments[5] == f"--LabApp.extra_labextensions_path={LABEXTENSIONS}"
    assert (LABEXTENSIONS / "kernel-sandbox-frame" / "package.json").is_file()
    assert arguments[6] == "--ServerApp.contents_manager_class=kernel_sandbox.contents.RootConfinedFileManager"
    assert arguments[7] == "--ServerApp.jpserver_extensions=kernel_sandbox.statusbar=True"  # status bar counts containers
    assert arguments[8:] == ["--port", "9999"]
    assert lab_arguments(["--port", "9999"], locked_down=False)[1] != arguments[1]  # a fresh token each start


def test_lab_arguments_leave_what_the_user_sets_to_the_user() -> None:
    arguments = lab_arguments(["--ip=0.0.0.0", "--IdentityProvider.token", "mine"], locked_down=False)
    assert not any(a.startswith(("--ServerApp.ip", "--IdentityProvider.token=")) for a in arguments)
    assert arguments[-3:] == ["--ip=0.0.0.0", "--IdentityProvider.token", "mine"]
    mine = lab_arguments(["--ServerApp.contents_manager_class=x.Y"], locked_down=False)
    assert [a for a in mine if a.startswith("--ServerApp.contents_manager_class")] == ["--ServerApp.contents_manager_class=x.Y"]
    off = lab_arguments(["--ServerApp.jpserver_extensions=kernel_sandbox.statusbar=False"], locked_down=False)
    assert [a for a in off if "kernel_sandbox.statusbar" in a] == ["--ServerApp.jpserver_extensions=kernel_sandbox.statusbar=False"]


def test_locked_down_settings_come_last_and_cannot_be_argued_with() -> None:
    arguments = lab_arguments(["--no-browser"], locked_down=True)
    tail = arguments[arguments.index("--no-browser") + 1:]
    assert "--ServerApp.terminals_enabled=False" in tail
    assert "--ServerApp.kernel_spec_manager_class=kernel_sandbox.lab.SandboxedKernelSpecManager" in tail
    assert "--ServerApp.jpserver_extensions=jupyter_lsp=False" in tail
    assert len(tail) == len(LOCKED_DOWN)
    with pytest.raises(SetupError, match="--locked-down decides ServerApp.terminals_enabled"):
        lab_arguments(["--ServerApp.terminals_enabled=True"], locked_down=True)


DEBIAN_ROOT = Host(root=True, debian_like=True, has_dockerd=False, systemd=False)


def test_install_engine_commands() -> None:
    assert install_commands(DEBIAN_ROOT) == [
        ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "docker.io"],
    ]
    assert install_commands(Host(root=False, debian_like=True, has_dockerd=True, systemd=True)) == []
    with pytest.raises(EngineUnavailable, match="needs root; start the engine: `sudo systemctl start docker`"):
        install_commands(Host(root=False, debian_like=True, has_dockerd=False, systemd=True))
    with pytest.raises(EngineUnavailable, match="Debian and Ubuntu only.*docs.docker.com/engine/install"):
        install_commands(Host(root=True, debian_like=False, has_dockerd=False, systemd=True))


def test_start_engine_command() -> None:
    systemd = Host(root=True, debian_like=True, has_dockerd=True, systemd=True)
    assert start_command(systemd) == ["systemctl", "start", "docker"]
    assert Path(start_command(DEBIAN_ROOT)[0]).name == "dockerd"  # in the background, no systemd
    with pytest.raises(EngineUnavailable, match="needs root"):
        start_command(Host(root=False, debian_like=True, has_dockerd=True, systemd=False))


def test_os_release_detection(tmp_path: Path) -> None:
    release = tmp_path / "os-release"
    for text, expected in (
        ('ID=debian\nVERSION_ID="12"\n', True),
        ('ID=ubuntu\nID_LIKE=debian\n', True),
        ('ID=linuxmint\nID_LIKE="ubuntu debian"\n', True),
        ('ID="fedora"\n', False),
    ):
        release.write_text(text)
        assert engine._debian_like(release) is expected
    assert engine._debian_like(tmp_path / "missing") is False


def test_install_engine_with_a_running_engine_runs_nothing(docker_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    said: list[str] = []
    client = engine.ensure_engine(install=True, progress=said.append)
    assert client.ping() and said == []


def test_setup_without_an_engine_says_what_to_run(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = cli("setup", "--prefix", str(tmp_path), env=env)
    assert result.returncode == 1
    assert "kernel-sandbox: docker engine: Cannot reach the Docker engine at unix:///nonexistent" in result.stderr
    assert "fix: start the engine: `sudo systemctl start docker`" in result.stderr
    assert "as root on Debian/Ubuntu, `kernel-sandbox setup --install-engine` does both" in result.stderr
    assert not (tmp_path / "share").exists()  # it stopped at the first step


def test_lab_checks_jupyterlab_and_its_arguments_before_setting_up(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_setup(**options):
        raise AssertionError("setup ran")

    monkeypatch.setattr(lab_module, "setup", no_setup)
    with pytest.raises(SetupError, match="--locked-down decides ServerApp.terminals_enabled"):
        lab_module.lab(["--ServerApp.terminals_enabled=True"], locked_down=True)
    monkeypatch.setitem(sys.modules, "jupyterlab.labapp", None)
    missing = r"JupyterLab is not installed in .*\n  fix: pip install 'kernel-sandbox\[lab\]'"
    with pytest.raises(SetupError, match=missing):
        lab_module.lab([])


def test_exposed_paths_are_the_servers_own_directories_pages_could_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    visible, hidden = tmp_path / "venv" / "share" / "jupyter", tmp_path / ".venv" / "share" / "jupyter"
    visible.mkdir(parents=True)
    hidden.mkdir(parents=True)
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join([str(visible), str(hidden)]))
    assert lab_module.exposed_paths(str(tmp_path)) == [str(visible)]
    assert lab_module.exposed_paths(str(tmp_path / "elsewhere")) == []


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple]:
    """No command, process start or signal reaches the machine; pid files are temporary. Returns what was tried."""
    tried: list[tuple] = []

    def record(kind):
        def fake(*args, **kwargs):
            tried.append((kind, *args))
            if kind != "kill":
                raise AssertionError(f"{kind} {args}")
        return fake

    monkeypatch.setattr(subprocess, "run", record("run"))
    monkeypatch.setattr(subprocess, "Popen", record("Popen"))
    monkeypatch.setattr(engine.os, "kill", record("kill"))
    monkeypatch.setattr(engine, "DOCKER_PID", tmp_path / "docker.pid")
    monkeypatch.setattr(engine, "CONTAINERD_PID", tmp_path / "containerd.pid")
    monkeypatch.setattr(engine, "DOCKERD_LOG", tmp_path / "dockerd.log")
    return tried


def test_install_engine_leaves_an_engine_named_by_docker_host_alone(nothing_runs, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(EngineUnavailable, match="DOCKER_HOST is unix:///nonexistent/docker.sock, and --install-engine"):
        engine.ensure_engine(install=True, progress=print)
    assert nothing_runs == []


def test_a_running_dockerd_that_does_not_answer_is_never_stopped(nothing_runs, monkeypatch) -> None:
    monkeypatch.setattr(engine, "_running", lambda name: [4242] if name == "dockerd" else [])
    monkeypatch.setattr(engine, "_wait_for_engine", lambda process: False)
    said: list[str] = []
    with pytest.raises(EngineUnavailable, match=r"dockerd \(pid 4242\) runs but does not answer; it is left alone"):
        engine._start_dockerd(["dockerd"], said.append)
    assert nothing_runs == [] and said == ["dockerd (pid 4242) is running but not answering yet; waiting for it"]


def test_without_dockerd_the_leftovers_of_a_dead_one_are_cleared(nothing_runs, monkeypatch) -> None:
    engine.DOCKER_PID.write_text("4141\n")
    engine.CONTAINERD_PID.write_text("4343\n")
    monkeypatch.setattr(engine, "_running", lambda name: [])
    monkeypatch.setattr(engine, "_alive", lambda pid, name: (pid, name) == (4343, "containerd"))
    monkeypatch.setattr(engine.time, "sleep", lambda seconds: None)
    with pytest.raises(AssertionError, match="Popen"):
        engine._start_dockerd(["dockerd"], print)
    assert nothing_runs == [("kill", 4343, 9), ("Popen", ["dockerd"])]
    assert not engine.DOCKER_PID.exists() and not engine.CONTAINERD_PID.exists()


def test_every_command_says_what_it_does() -> None:
    import argparse

    from kernel_sandbox.cli import build_parser

    parser = build_parser()
    assert parser.description.startswith("Run Jupyter kernels in disposable, locked-down Docker containers")
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {action.dest: action.help for action in subparsers._choices_actions}
    assert set(helps) == set(subparsers.choices)
    for name, text in helps.items():
        assert text and text[0].isupper() and text.endswith("."), f"{name}: {text!r}"
        assert subparsers.choices[name].description, f"`kernel-sandbox {name} --help` has no description"
    out = cli("--help").stdout
    assert "Start here: `kernel-sandbox lab`" in out and "lab " in out and "setup " in out
