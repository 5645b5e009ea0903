"""Sessions on real Docker kernels: run, callbacks, timeouts, output cap, files, install."""

from __future__ import annotations

import asyncio
import resource
import warnings

import pytest

from kernel_sandbox.execution import (
    AsyncSandbox,
    NetworkDisabledError,
    PathError,
    Sandbox,
    SandboxFileError,
)


def test_run_returns_streams_results_and_count(sandbox: Sandbox) -> None:
    execution = sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7")
    assert execution.stdout == "out\n"
    assert execution.stderr == "err\n"
    assert execution.text == "42"
    assert execution.error is None
    assert isinstance(execution.execution_count, int)


def test_errors_are_returned_not_raised(sandbox: Sandbox) -> None:
    execution = sandbox.run("raise ValueError('bad input')")
    assert execution.error is not None
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


def test_callbacks_see_output_while_it_runs(sandbox: Sandbox) -> None:
    seen: list[tuple[str, object]] = []
    sandbox.run(
        "import sys\nprint('a')\nprint('b', file=sys.stderr)\n1\n",
        on_stdout=lambda text: seen.append(("out", text)),
        on_stderr=lambda text: seen.append(("err", text)),
        on_result=lambda bundle: seen.append(("result", bundle["text/plain"])),
    )
    errors: list[str] = []
    sandbox.run("1/0", on_error=lambda error: errors.append(error.name))
    assert ("out", "a\n") in seen and ("err", "b\n") in seen and ("result", "1") in seen
    assert errors == ["ZeroDivisionError"]


def test_timeout_interrupts_and_keeps_state(sandbox: Sandbox) -> None:
    sandbox.run("kept = 'still here'")
    execution = sandbox.run("import time\nwhile True: time.sleep(0.1)", timeout=1)
    assert execution.error is not None and execution.error.name == "TimeoutError"
    assert "1 s" in execution.error.value and not execution.state_lost
    assert sandbox.run("kept").text == "'still here'"


def test_timeout_restarts_a_kernel_that_ignores_interrupts(docker_engine) -> None:
    with Sandbox(interrupt_grace=1) as sb:
        sb.run("lost = True")
        code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.1)"
        execution = sb.run(code, timeout=1)
        assert execution.state_lost
        assert execution.error is not None and "restarted" in execution.error.value
        assert sb.run("'lost' in globals()").text == "False"


def test_output_cap_keeps_host_memory_bounded(docker_engine) -> None:
    cap = 1_000_000
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with Sandbox(max_output_bytes=cap, memory="1g") as sb:
        execution = sb.run("chunk = 'x' * 999_999\nfor _ in range(100): print(chunk)")
        assert execution.error is None
        assert len(execution.stdout.encode()) < cap + 200
        assert "[output truncated: 99000000 bytes over the cap" in execution.stdout
        assert execution.truncated_bytes == 99_000_000
        assert sb.run("'alive'").text == "'alive'"
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 400, f"host peak RSS grew by {grown_mib:.0f} MiB for 100 MB of output"


def test_kernel_death_is_reported_and_recovered(docker_engine) -> None:
    with Sandbox(memory="128m") as sb:
        execution = sb.run("blocks = []\nwhile True: blocks.append(bytearray(16 * 1024 * 1024))", timeout=60)
        assert execution.state_lost
        assert execution.error is not None and execution.error.name == "KernelDied"
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


def test_install_with_network_off_fails_fast(sandbox: Sandbox) -> None:
    with pytest.raises(NetworkDisabledError, match="network=True"):
        sandbox.install(["requests"])


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


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown backend"):
        Sandbox("nope")


def test_nothing_is_left_behind_by_failures_or_forgotten_sandboxes(docker_engine, own_containers) -> None:
    import gc

    from kernel_sandbox.errors import ImageMissing, KernelSandboxError

    before = own_containers()
    with pytest.raises(ImageMissing, match="kernel-sandbox image build") as info:
        Sandbox(image="kernel-sandbox-no-such-image:0").start()
    assert isinstance(info.value, KernelSandboxError)
    assert own_containers() == before
    forgotten = Sandbox().start()
    assert len(own_containers() - before) == 1
    del forgotten
    gc.collect()
    assert own_containers() == before
