"""The installed kernelspecs' argv, run exactly as a client that ignores provisioners runs them (VS Code).

Each test writes a connection file with jupyter_client, substitutes it into the installed argv,
starts that with subprocess and talks to it with a BlockingKernelClient: the kernel it gets must
be the sandbox's, and every way the client can end it must leave no container behind.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager

from kernel_sandbox.docker.containers import LABEL_KERNEL_ID
from kernel_sandbox.kernelspecs import install

from support.kernel import ArgvKernel

pytestmark = pytest.mark.usefixtures("docker_engine")


def containers(docker_engine, kernel_id: str = "launched") -> list:
    # ignore_removed: a container can auto-remove itself between the SDK's listing and its inspect
    return docker_engine.containers.list(
        all=True, filters={"label": f"{LABEL_KERNEL_ID}={kernel_id}"}, ignore_removed=True
    )


def gone_within(docker_engine, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while containers(docker_engine):
        assert time.monotonic() < deadline, f"the kernel's container was still there after {seconds} s"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("argv-prefix")
    return Path(install("sandboxed-python", prefix=str(prefix), install_as="argv-sandbox"))


@pytest.fixture
def launched(spec_dir: Path, tmp_path: Path) -> Iterator[ArgvKernel]:
    kernel = ArgvKernel(spec_dir, tmp_path)
    kernel.ready()
    yield kernel
    kernel.stop()


def test_the_argv_kernel_is_the_sandbox(launched: ArgvKernel) -> None:
    out, reply = launched.run(
        "import os, socket\nprint(socket.gethostname(), sorted(os.listdir('/sys/class/net')), os.getuid() != 0)"
    )
    assert reply["status"] == "ok"
    assert out == "sandbox ['lo'] True\n"


def test_output_streams_while_the_cell_runs_and_input_reaches_it(launched: ArgvKernel) -> None:
    client = launched.client
    msg_id = client.execute("print('first', flush=True)\nanswer = input('go? ')\nprint('got', answer)", allow_stdin=True)
    seen = []
    while True:
        msg = client.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "stream":
            seen.append(msg["content"]["text"])
            break
    request = client.get_stdin_msg(timeout=30)  # the cell is blocked on input() until we answer
    assert seen == ["first\n"] and request["content"]["prompt"] == "go? "
    client.input("yes")
    while True:
        msg = client.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "stream":
            assert msg["content"]["text"] == "got yes\n"
            break
    while (reply := client.get_shell_msg(timeout=30))["parent_header"]["msg_id"] != msg_id:
        pass
    assert reply["content"]["status"] == "ok"


def test_sigint_interrupts_a_busy_cell_and_the_kernel_lives(launched: ArgvKernel) -> None:
    client = launched.client
    client.execute("import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.01)")
    while client.get_iopub_msg(timeout=30)["msg_type"] != "stream":
        pass
    launched.process.send_signal(signal.SIGINT)
    while (reply := client.get_shell_msg(timeout=30))["msg_type"] != "execute_reply":
        pass
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert launched.run("print('still here')")[0] == "still here\n"


def test_sigterm_removes_the_container_and_exits_cleanly(launched: ArgvKernel, docker_engine) -> None:
    assert containers(docker_engine)
    launched.process.send_signal(signal.SIGTERM)
    assert launched.process.wait(30) == 0
    assert not containers(docker_engine)
    noise = launched.process.stderr.read()
    assert b"exit code" not in noise and b"frozen modules" not in noise and b"without encryption" not in noise, noise


def test_a_shutdown_request_removes_the_container_and_exits_cleanly(launched: ArgvKernel, docker_engine) -> None:
    launched.client.shutdown()
    assert launched.process.wait(60) == 0
    assert not containers(docker_engine)


def test_sigkill_of_the_launcher_leaves_no_container(launched: ArgvKernel, docker_engine) -> None:
    assert launched.run("x = 1")[1]["status"] == "ok"
    launched.process.kill()
    launched.process.wait(30)
    gone_within(docker_engine, 30)


def test_the_launcher_follows_its_client_out(spec_dir: Path, tmp_path: Path, docker_engine) -> None:
    """A client that dies (without killing the launcher) takes the kernel with it."""
    script = tmp_path / "client.py"
    script.write_text(
        "import json, subprocess, sys, time\n"
        f"argv = json.load(open({str(spec_dir / 'kernel.json')!r}))['argv']\n"
        f"subprocess.Popen([a.replace('{{connection_file}}', {str(tmp_path / 'kernel-launched.json')!r}) for a in argv])\n"
        "time.sleep(3600)\n"
    )
    write_connection_file(str(tmp_path / "kernel-launched.json"), key=secrets.token_hex(16).encode())
    client = subprocess.Popen([os.environ.get("PYTHON", "python"), str(script)])
    deadline = time.monotonic() + 90
    while not [c for c in containers(docker_engine) if c.status == "running"]:
        assert time.monotonic() < deadline, "the launcher never started a container"
        time.sleep(0.2)
    client.kill()
    client.wait()
    gone_within(docker_engine, 30)


def test_without_an_engine_the_argv_fails_closed(spec_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    kernel = ArgvKernel(spec_dir, tmp_path, env=env)
    try:
        assert kernel.process.wait(60) == 1
        message = kernel.process.stderr.read().decode()
        assert "Cannot reach the Docker engine" in message and "sudo systemctl start docker" in message
        info = json.loads(Path(kernel.connection_file).read_text())
        for channel in ("shell", "hb"):
            with pytest.raises(ConnectionRefusedError):  # nothing, no local kernel either, serves the ports
                socket.create_connection(("127.0.0.1", info[f"{channel}_port"]), timeout=5).close()
    finally:
        kernel.stop()


def refusal(spec_dir: Path, tmp_path: Path) -> str:
    """Run an argv that must refuse: it exits 1, and its stderr says why."""
    kernel = ArgvKernel(spec_dir, tmp_path)
    try:
        assert kernel.process.wait(60) == 1
        return kernel.process.stderr.read().decode()
    finally:
        kernel.stop()


def test_without_the_image_the_argv_names_the_build_command(tmp_path: Path) -> None:
    spec_dir = Path(install("sandboxed-python", prefix=str(tmp_path), install_as="no-image",
                            config={"image": "kernel-sandbox-python:no-such-tag"}))
    assert "kernel-sandbox image build --tag kernel-sandbox-python:no-such-tag" in refusal(spec_dir, tmp_path)


def test_no_installed_kernelspec_can_start_a_kernel_outside_a_sandbox(jupyter_prefix: Path) -> None:
    """Every kernelspec of ours runs the launcher with an absolute interpreter in isolated mode."""
    specs = {
        name: KernelSpecManager().get_kernel_spec(name)
        for name, path in KernelSpecManager().find_kernel_specs().items()
        if Path(path).is_relative_to(jupyter_prefix)
    }
    assert specs
    for name, spec in specs.items():
        assert Path(spec.argv[0]).is_absolute() and os.access(spec.argv[0], os.X_OK), name
        assert spec.argv[1:4] == ["-I", "-m", "kernel_sandbox.launch"], name
        assert spec.argv[-2:] == ["--kernelspec", spec.resource_dir], name
        assert not any("ipykernel" in part for part in spec.argv), name


def test_iopub_subscribers_are_welcomed_with_the_clients_key(launched: ArgvKernel) -> None:
    """JEP 65: each new IOPub subscription gets an iopub_welcome, signed with the client's key."""
    import zmq
    from jupyter_client.session import Session

    info = json.loads(Path(launched.connection_file).read_text())
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{info['iopub_port']}")
    try:
        assert sub.poll(30_000), "no iopub_welcome within 30 s"
        frames = sub.recv_multipart()
        session = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"])
        _, message = session.feed_identities(frames)
        welcome = session.deserialize(message)  # raises on a bad signature
        assert welcome["msg_type"] == "iopub_welcome" and welcome["content"] == {"subscription": ""}
    finally:
        sub.close(linger=0)
        context.term()


@pytest.mark.security("fault", "sessions")
def test_a_kernel_that_outlives_its_shutdown_request_is_stopped(launched: ArgvKernel, docker_engine) -> None:
    """A thread left running keeps the interpreter from exiting after the reply: the launcher stops it."""
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,)).start()"
    assert launched.run(code)[1]["status"] == "ok"
    launched.client.shutdown()
    assert launched.process.wait(60) == 0
    assert not containers(docker_engine)
    assert b"did not exit within" in launched.process.stderr.read()
