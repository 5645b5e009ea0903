"""Sessions on real Docker kernels: run, callbacks, timeouts, output cap, files, install."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from support.execution import container_of
from support.host_memory import RssPeak
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import (
    AsyncSandbox,
    CallTimeoutError,
    PathError,
    Sandbox,
    SandboxError,
    SandboxFileError,
)

MiB = 1024 * 1024


def test_run_returns_streams_results_and_count(sandbox: Sandbox) -> None:
    execution = sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7")
    assert execution.stdout == "out\n"
    assert execution.stderr == "err\n"
    assert execution.text == "42"
    assert execution.error is None
    assert isinstance(execution.execution_count, int)


def test_errors_are_returned_not_raised(sandbox: Sandbox) -> None:
    execution = sandbox.run("raise ValueError('bad input')")
    assert (execution.error.name, execution.error.value) == ("ValueError", "bad input")
    assert "ValueError" in execution.error.traceback
    assert sandbox.run("1 + 1").text == "2"


def test_display_data_and_images_are_results(sandbox: Sandbox) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import display, HTML\n"
        "display(HTML('<b>hi</b>'))\nplt.plot([1, 2, 3])\nplt.show()\n"
    )
    execution = sandbox.run("%matplotlib inline\n" + code)
    assert execution.error is None, execution.error
    assert any(bundle.get("text/html") == "<b>hi</b>" for bundle in execution.results)
    png = [bundle["image/png"] for bundle in execution.results if "image/png" in bundle]
    assert png and png[0].startswith("iVBOR")


def test_callbacks_see_output_while_the_cell_still_runs(docker_engine, sandbox: Sandbox) -> None:
    """The cell prints, then blocks on a FIFO that the test writes only after the callback saw the print."""
    container = container_of(docker_engine, sandbox)
    seen = threading.Event()
    released: list[object] = []

    def release() -> None:
        if seen.wait(timeout=60):
            user = container.attrs["Config"]["User"]
            released.append(container.exec_run(["sh", "-c", "echo go > /tmp/stream-gate"], user=user))

    releaser = threading.Thread(target=release)
    releaser.start()
    code = (
        "import os, select\n"
        "os.mkfifo('/tmp/stream-gate')\n"
        "print('first', flush=True)\n"
        "gate = os.open('/tmp/stream-gate', os.O_RDONLY | os.O_NONBLOCK)\n"
        "ready, _, _ = select.select([gate], [], [], 60)\n"
        "print('released' if ready and os.read(gate, 10) == b'go\\n' else 'never released')\n"
    )
    outputs: list[str] = []

    def on_stdout(text: str) -> None:
        outputs.append(text)
        if "first" in text:
            seen.set()

    execution = sandbox.run(code, on_stdout=on_stdout)
    seen.set()
    releaser.join()
    assert execution.error is None, execution.error
    assert outputs[0] == "first\n" and execution.stdout == "first\nreleased\n"
    assert released and released[0].exit_code == 0


def test_every_callback_is_called(sandbox: Sandbox) -> None:
    seen: list[tuple[str, object]] = []
    sandbox.run(
        "import sys\nprint('a')\nprint('b', file=sys.stderr)\n1\n",
        on_stdout=lambda text: seen.append(("out", text)),
        on_stderr=lambda text: seen.append(("err", text)),
        on_result=lambda bundle: seen.append(("result", bundle["text/plain"])),
    )
    errors: list[str] = []
    sandbox.run("1/0", on_error=lambda error: errors.append(error.name))
    streamed = {kind: "".join(str(text) for k, text in seen if k == kind) for kind in ("out", "err")}
    assert streamed == {"out": "a\n", "err": "b\n"}, seen  # a print may arrive in several stream messages
    assert ("result", "1") in seen
    assert errors == ["ZeroDivisionError"]


def test_timeout_interrupts_and_keeps_state(sandbox: Sandbox) -> None:
    sandbox.run("kept = 'still here'")
    execution = sandbox.run("import time\nwhile True: time.sleep(0.1)", timeout=1)
    assert execution.error.name == "TimeoutError"
    assert "1 s" in execution.error.value and not execution.state_lost
    assert sandbox.run("kept").text == "'still here'"


def test_timeout_restarts_a_kernel_that_ignores_interrupts(docker_engine) -> None:
    with Sandbox(interrupt_grace=1) as sb:
        sb.run("lost = True")
        code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.1)"
        execution = sb.run(code, timeout=1)
        assert execution.state_lost
        assert "restarted" in execution.error.value
        assert sb.run("'lost' in globals()").text == "False"


def test_output_cap_keeps_host_memory_bounded(docker_engine) -> None:
    cap = 1_000_000
    with Sandbox(max_output_bytes=cap, memory="1g") as sb:
        with RssPeak() as rss:
            execution = sb.run("chunk = 'x' * 999_999\nfor _ in range(100): print(chunk)")
        assert execution.error is None
        assert len(execution.stdout.encode()) < cap + 200
        assert "[output truncated: 99000000 bytes over the cap" in execution.stdout
        assert execution.truncated_bytes == 99_000_000
        assert sb.run("'alive'").text == "'alive'"
    assert rss.growth < 100 * MiB, f"host RSS grew by {rss.growth / MiB:.0f} MiB for 100 MB of output"


def test_kernel_death_is_reported_and_recovered(docker_engine) -> None:
    with Sandbox(memory="128m") as sb:
        execution = sb.run("blocks = []\nwhile True: blocks.append(bytearray(16 * 1024 * 1024))", timeout=60)
        assert execution.state_lost
        assert execution.error.name == "KernelDied"
        assert "memory" in execution.error.value
        assert sb.run("2 + 2").text == "4"


def test_files_round_trip_and_listing(sandbox: Sandbox) -> None:
    payload = bytes(range(256)) * 10
    assert sandbox.upload({"data/blob.bin": payload, "notes.txt": "hello"}) == ["data/blob.bin", "notes.txt"]
    assert sandbox.download("data/blob.bin") == payload
    assert sandbox.download(f"{sandbox.work_dir}/notes.txt") == b"hello"
    listing = {entry.path: entry for entry in sandbox.list_files("data")}
    assert listing["data/blob.bin"].size == len(payload) and not listing["data/blob.bin"].is_dir
    assert any(entry.name == "data" and entry.is_dir for entry in sandbox.list_files())
    assert sandbox.run("open('data/blob.bin', 'rb').read() == bytes(range(256)) * 10").text == "True"


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../x"])
def test_paths_outside_the_work_dir_are_refused_on_the_host(sandbox: Sandbox, path: str) -> None:
    with pytest.raises(PathError):
        sandbox.download(path)
    with pytest.raises(PathError):
        sandbox.upload({path: b"x"})


def test_symlink_escapes_are_refused_in_the_kernel(sandbox: Sandbox) -> None:
    sandbox.run("import os\nos.symlink('/etc', 'etc-link')\nos.symlink('/tmp/outside', 'out-file')")
    with pytest.raises(PathError, match="outside the work directory"):
        sandbox.download("etc-link/passwd")
    with pytest.raises(PathError):
        sandbox.list_files("etc-link")
    with pytest.raises(PathError):
        sandbox.upload({"out-file": b"x"})
    with pytest.raises(PathError):
        sandbox.upload({"etc-link/new": b"x"})
    assert sandbox.run("import os; os.path.exists('/tmp/outside')").text == "False"


def test_missing_files_are_clear_errors(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxFileError, match="not a file"):
        sandbox.download("no-such-file")


def test_install_from_a_local_wheel_with_network_on(docker_engine, tmp_path) -> None:
    wheel = _tiny_wheel(tmp_path)
    with Sandbox(network=True) as sb:
        sb.upload({wheel.name: wheel.read_bytes()})
        result = sb.install([f"./{wheel.name}"], pip_args=["--no-index"])
        assert result.error is None, result.stderr
        assert sb.run("import tinypkg; tinypkg.VALUE").text == "42"


def _tiny_wheel(tmp_path):
    import base64
    import hashlib
    import zipfile

    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
        "tinypkg-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinypkg-0.1.dist-info/RECORD,,")
    path = tmp_path / "tinypkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("tinypkg-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


async def test_async_sandbox_with_async_callbacks(docker_engine) -> None:
    chunks: list[str] = []

    async def on_stdout(text: str) -> None:
        await asyncio.sleep(0)
        chunks.append(text)

    async with AsyncSandbox(image="kernel-sandbox-python:latest") as sb:
        execution = await sb.run("for i in range(3): print(i, flush=True)", on_stdout=on_stdout)
        assert "".join(chunks) == execution.stdout == "0\n1\n2\n"
        assert (await sb.run("import os; os.listdir('/sys/class/net')")).text == "['lo']"


def test_local_backend_warns_it_is_not_a_sandbox() -> None:
    with pytest.warns(UserWarning, match="NOT a sandbox"):
        sb = Sandbox("local")
    with warnings.catch_warnings(), sb:
        assert sb.run("import os; os.getcwd()").text.strip("'") == sb.work_dir


def test_a_closed_sandbox_says_it_is_closed_not_that_it_was_never_started() -> None:
    with pytest.warns(UserWarning, match="NOT a sandbox"):
        sb = Sandbox("local")
    with pytest.raises(SandboxError, match="not started"):
        sb.run("1")
    with warnings.catch_warnings(), sb:
        assert sb.run("1").text == "1"
    for call in (lambda: sb.run("1"), lambda: sb.run_tool(lambda: 1), lambda: sb.download("x")):
        with pytest.raises(SandboxError, match="This sandbox is closed"):
            call()


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ConfigError, match="Unknown backend"):
        Sandbox("nope")


def test_sandbox_writes_out_the_options_of_async_sandbox() -> None:
    """``help(Sandbox)`` and IDEs show the options: the same parameters (names, defaults, kinds) as AsyncSandbox's."""

    def parameters(init: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.default, p.kind) for p in inspect.signature(init).parameters.values()]

    assert parameters(Sandbox.__init__) == parameters(AsyncSandbox.__init__)
    assert len(parameters(Sandbox.__init__)) > 3, "written out, not **options"
    with pytest.raises(ConfigError, match="timeout must be a positive number"):
        Sandbox(timeout=0)


def test_nothing_is_left_behind_by_failures_or_forgotten_sandboxes(docker_engine, own_containers) -> None:
    import gc

    from kernel_sandbox.errors import KernelSandboxError

    before = own_containers()
    with pytest.raises(KernelSandboxError, match="kernel-sandbox image build"):
        Sandbox(image="kernel-sandbox-no-such-image:0").start()
    assert own_containers() == before
    forgotten = Sandbox().start()
    assert len(own_containers() - before) == 1
    del forgotten
    gc.collect()
    assert own_containers() == before


async def test_a_cancelled_close_still_ends_the_kernel(docker_engine, own_containers) -> None:
    """A close cancelled midway (a pool closing while a start cleans up after itself) ends the kernel
    all the same: the sandbox has let go of it, so nothing else would until this process exits."""
    before = own_containers()
    sandbox = await AsyncSandbox().start()
    assert len(own_containers() - before) == 1
    closing = asyncio.ensure_future(sandbox.close())
    await asyncio.sleep(0.05)  # the shutdown is under way
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert own_containers() == before


SECRET = "sk-test-7f3a9c2e41b8d6"


def test_per_call_env_is_set_for_that_call_only(sandbox: Sandbox) -> None:
    read = "import os; (os.environ.get('KS_TOKEN'), os.environ.get('HOME'))"
    assert sandbox.run(read, env={"KS_TOKEN": SECRET, "HOME": "/elsewhere"}).text == repr((SECRET, "/elsewhere"))
    assert sandbox.run(read).text == repr((None, "/home/sandbox"))

    def tool(name: str) -> str | None:
        import os

        return os.environ.get(name)

    assert sandbox.run_tool(tool, {"name": "KS_TOKEN"}, env={"KS_TOKEN": SECRET}).func_return == SECRET
    assert sandbox.run_tool(tool, {"name": "KS_TOKEN"}).func_return is None
    failed = sandbox.run("import os\nraise RuntimeError(os.environ['KS_TOKEN'][:3])", env={"KS_TOKEN": SECRET})
    assert failed.error.value == SECRET[:3]
    assert sandbox.run(read).text == repr((None, "/home/sandbox"))
    timed_out = sandbox.run("import time\nwhile True: time.sleep(0.05)", timeout=1, env={"KS_TOKEN": SECRET})
    assert timed_out.error.name == "TimeoutError" and not timed_out.state_lost
    assert sandbox.run(read).text == repr((None, "/home/sandbox"))


def test_secrets_in_env_stay_out_of_history_reprs_errors_and_logs(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    execution = sandbox.run("import os; len(os.environ['KS_TOKEN'])", env={"KS_TOKEN": SECRET})
    result = sandbox.run_tool(lambda: "ok", env={"KS_TOKEN": SECRET})
    timed_out = sandbox.run_tool(lambda: __import__("time").sleep(30), env={"KS_TOKEN": SECRET}, timeout=1)
    errors = []
    for bad in ({"KS_TOKEN": SECRET.encode()}, {"KS_TOKEN": SECRET + "\x00"}, {"BAD=NAME": SECRET}, [SECRET]):
        with pytest.raises(ConfigError) as info:
            sandbox.run("1", env=bad)  # type: ignore[arg-type]
        errors.append(str(info.value))
    history = sandbox.run("'\\n'.join(get_ipython().history_manager.input_hist_raw)").text
    visible = [repr(execution), repr(result), repr(timed_out), repr(sandbox._async), history, caplog.text, *errors]
    assert execution.text == str(len(SECRET)) and result.func_return == "ok"
    assert [text for text in visible if SECRET in text] == []
    assert "env['KS_TOKEN'] must be a string" in errors[0]


def test_every_call_has_a_deadline_by_default(docker_engine) -> None:
    assert AsyncSandbox().timeout == 300
    for bad in (0, -1, None, "10", True):
        with pytest.raises(ConfigError, match="timeout"):
            AsyncSandbox(timeout=bad)  # type: ignore[arg-type]


def test_a_fifo_planted_at_the_target_does_not_hang_file_transfers(sandbox: Sandbox) -> None:
    sandbox.run("import os\nos.mkfifo('planted')\nos.mkfifo('read-me')")
    with pytest.raises(PathError, match="not a regular file"):
        sandbox.upload({"planted": b"data"}, timeout=30)
    with pytest.raises(PathError, match="not a regular file"):
        sandbox.download("read-me", timeout=30)
    sandbox.upload({"after.txt": b"fine"})
    assert sandbox.download("after.txt") == b"fine"


def test_a_kernel_that_stalls_a_transfer_hits_its_deadline(docker_engine) -> None:
    with Sandbox(interrupt_grace=5) as sb:
        sb.upload({"warm.txt": b"x"})
        sb.run(
            "import sys, time\nfiles = sys.modules['_kernel_sandbox_workfiles']\n"
            "def stalled(*args):\n    while True: time.sleep(0.05)\n"
            "files.write_chunk = files.read_chunk = stalled"
        )
        with pytest.raises(CallTimeoutError, match="did not finish within 2 s"):
            sb.upload({"stalled.txt": b"data"}, timeout=2)
        with pytest.raises(CallTimeoutError, match="did not finish within 2 s"):
            sb.download("warm.txt", timeout=2)
        assert sb.run("1 + 1").text == "2"


def test_a_gigabyte_moves_in_chunks_with_the_default_limits(docker_engine, tmp_path: Path) -> None:
    """1 GiB up and down through a 512 MiB kernel, streamed: neither side holds the file."""
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    source, back = tmp_path / "source.bin", tmp_path / "back.bin"
    digest = hashlib.sha256()
    block = os.urandom(MiB)
    with open(source, "wb") as handle:
        for index in range(1024):
            piece = index.to_bytes(8, "little") + block[8:]
            handle.write(piece)
            digest.update(piece)
    with Sandbox(memory="512m", mounts=[f"{work}:/home/sandbox/work:rw"]) as sb, RssPeak() as rss:
        assert sb.upload({"big.bin": source}) == ["big.bin"]
        assert sb.list_files()[0].size == 1024 * MiB
        assert sb.download_to("big.bin", back) == 1024 * MiB
        assert sb.run("1").text == "1"
    copied = hashlib.sha256()
    with open(back, "rb") as handle:
        while piece := handle.read(8 * MiB):
            copied.update(piece)
    assert copied.hexdigest() == digest.hexdigest()
    assert rss.growth < 128 * MiB, f"host RSS grew by {rss.growth / MiB:.0f} MiB moving 1 GiB"
