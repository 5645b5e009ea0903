"""Kernels that sleep when idle and wake on the next message, with their variables
(``suspend_after``, :mod:`kernel_sandbox.launch.sleep`), on real Docker kernels and ipykernels.

Asleep, the kernel has no container (asked of the engine by its kernel-id label) and the launcher
answers heartbeats and kernel_info; the next cell wakes it in a new container with its variables,
its execution count goes on, and the cell's first output says once that it slept. What a sleep
would lose keeps the kernel awake unless ``suspend_lossy``; a checkpoint over its cap leaves the
container running; a blob changed on the host is refused at the wake, which says why.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session
from traitlets.config import Config

from kernel_sandbox.docker.containers import LABEL_KERNEL_ID
from kernel_sandbox.docker.connect import docker_client
from kernel_sandbox.kernelspecs import install, started_client
from kernel_sandbox.provisioners.standby import POOL
from kernel_sandbox.privdir import SLEEP, SLEEP_SLOT, checkpoint_root, kept_checkpoint, remove_private, stored_bytes

from support.kernel import DORMANT_GOAL, RUNTIMES, ArgvKernel, cell, dormant, runtime_option, unique_memory

pytestmark = pytest.mark.usefixtures("docker_engine", "jupyter_prefix", "sleepy", "own_store")

SLEEP_AFTER = 2
"""Seconds of idleness before a test's kernel sleeps."""
WOKE = "[kernel-sandbox] The kernel slept from "



@pytest.fixture
def own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint store of this test's own (its launchers inherit ``XDG_STATE_HOME``)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return checkpoint_root()


@pytest.fixture(scope="module")
def sleepy(jupyter_prefix: Path) -> Path:
    """The kernelspec ``sleepy``: the Docker kernelspec with ``suspend_after`` a few seconds (the
    kernelspec's config wins over the traitlets config)."""
    return Path(install("sandboxed-python", prefix=str(jupyter_prefix.parent.parent), install_as="sleepy",
                        config={"suspend_after": SLEEP_AFTER}))


def manager(**settings: Any) -> AsyncKernelManager:
    """A manager of the ``sleepy`` kernelspec with these provisioner settings besides."""
    km = AsyncKernelManager(kernel_name="sleepy", config=Config({"DockerProvisioner": settings}))
    km.autorestart = False
    return km


def containers(kernel_id: str) -> list[Any]:
    """The engine's containers of this kernel, by its label."""
    return docker_client().containers.list(
        all=True, ignore_removed=True, filters={"label": f"{LABEL_KERNEL_ID}={kernel_id}"}
    )


def sleep_state(km: AsyncKernelManager) -> dict[str, Any]:
    """What the launcher wrote in the kernel's ``sleep.json`` (empty: nothing)."""
    path = km.provisioner.private / SLEEP
    return json.loads(path.read_text()) if path.exists() else {}


async def until(check: Any, timeout: float = 120, what: str = "") -> None:
    """Wait until ``check()`` is true (fail after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        await asyncio.sleep(0.2)


async def kept_awake(km: AsyncKernelManager) -> str:
    """Wait until the launcher refuses the kernel's sleep; why, as its ``sleep.json`` says."""
    await until(lambda: sleep_state(km).get("state") == "awake", what="a refused sleep")
    return sleep_state(km)["why"]


async def debug_request(kc: Any, command: str, seq: int) -> dict[str, Any]:
    """Send the debugger's request ``command`` on control and return the content of its reply."""
    request = kc.session.msg("debug_request", {"type": "request", "seq": seq, "command": command, "arguments": {}})
    kc.control_channel.send(request)
    while True:
        reply = await kc.get_control_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
            assert reply["msg_type"] == "debug_reply", reply
            return reply["content"]


async def asleep(km: AsyncKernelManager) -> None:
    """Wait until the kernel sleeps: its sleep.json says so and the engine has no container of it."""
    await until(lambda: sleep_state(km).get("state") == "suspended" and not containers(km.kernel_id),
                what="the kernel to sleep and its container to go")


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_an_idle_kernel_sleeps_without_a_container_and_wakes_with_its_variables(runtime: str) -> None:
    km = manager(**runtime_option(runtime))
    async with started_client(km) as kc:
        text, reply = await cell(kc, "import numpy as np\nx = 41 + 1\nbig = np.arange(10**6)\ndef f(v):\n    return v * x")
        assert reply["status"] == "ok", text
        first = km.provisioner.container_id
        count = reply["execution_count"]
        debug_info = await debug_request(kc, "debugInfo", 1)  # JupyterLab's debugger asks this of the kernel
        assert debug_info["success"] and debug_info["body"]["isStarted"] is False, debug_info
        await asleep(km)
        assert kept_checkpoint(km.provisioner.private.path, SLEEP_SLOT).is_file()
        launcher = km.provisioner.process.pid
        await until(lambda: dormant(launcher), what="the launcher to make way for the dormant process")
        assert unique_memory(launcher) <= DORMANT_GOAL, f"{unique_memory(launcher) / 2**20:.1f} MiB"
        listed = subprocess.run([sys.executable, "-m", "kernel_sandbox.cli", "ps"], capture_output=True, text=True, timeout=120)
        assert f"-\tsuspended\tkernel {km.kernel_id}\t0\t" in listed.stdout, listed.stdout + listed.stderr
        assert re.search(r"asleep since \d\d:\d\d, \d+ MiB saved, checkpoint 7\.\d MiB on the host", listed.stdout), listed.stdout
        usage = kc.session.msg("usage_request", {})
        kc.control_channel.send(usage)
        answer = await kc.get_control_msg(timeout=30)
        assert answer["parent_header"]["msg_id"] == usage["header"]["msg_id"]
        assert re.fullmatch(r"sandbox \(sleeping, \d+ MiB saved\)", answer["content"]["hostname"]), answer["content"]
        assert answer["content"]["kernel_memory"] == 0
        assert await km.is_alive(), "a sleeping kernel is alive to its manager"
        info = await kc.kernel_info(reply=True, timeout=30)  # answered by the launcher
        assert info["content"]["implementation"] == "ipython"
        listing = await kc.comm_info(reply=True, timeout=30)  # as JupyterLab asks when a page opens the notebook
        assert listing["content"] == {"status": "ok", "comms": {}}  # a sleep closed them: the woken kernel has none
        assert dormant(launcher), "usage, kernel_info or comm_info took the dormant launcher's place"
        asleep_info = await debug_request(kc, "debugInfo", 7)  # as a page that opens the notebook asks
        assert asleep_info["body"] == debug_info["body"] and asleep_info["request_seq"] == 7, asleep_info
        history = await kc.history(raw=True, output=False, hist_access_type="tail", n=500, reply=True, timeout=30)
        assert history["content"] == {"status": "ok", "history": []}  # so JupyterLab asks; the woken kernel's is new
        assert containers(km.kernel_id) == [], "kernel_info, comm_info, debugInfo or history woke the kernel"

        text, reply = await cell(kc, "print(x, f(2), int(big.sum()))")
        assert reply["status"] == "ok", text
        assert text.count(WOKE) == 1 and "woke up in a new container with its variables" in text
        assert text.endswith("42 84 499999500000\n"), text
        assert reply["execution_count"] == count + 1, "the execution count goes on"
        assert len(containers(km.kernel_id)) == 1 and km.provisioner.container_id != first
        assert sleep_state(km) == {}

        text, reply = await cell(kc, "print(x)")
        assert text == "42\n" and reply["execution_count"] == count + 2, "the line is said once"
        history = await kc.history(raw=True, output=False, hist_access_type="tail", n=500, reply=True, timeout=30)
        assert [entry[2] for entry in history["content"]["history"]] == ["print(x, f(2), int(big.sum()))", "print(x)"]


async def test_a_standby_that_slept_wakes_for_its_adopter_without_a_word_of_sleep() -> None:
    """A standby idle past ``suspend_after`` sleeps like any kernel (it holds no memory while it waits). The
    kernel that adopts it wakes it at its first cell, which says nothing of a sleep: no cell had run in it."""
    before = set(POOL.standbys())
    first = manager(pids_limit=77)  # a configuration of its own: its standby is the one the second adopts
    async with started_client(first):
        def slept() -> list[int]:
            return [s.process.pid for s in set(POOL.standbys()) - before
                    if s.started.done() and s.started.result() and s.process is not None and dormant(s.process.pid)]
        await until(lambda: slept(), what="the standby to sleep")
        (standby,) = slept()
        second = manager(pids_limit=77)
        async with started_client(second) as kc:
            assert second.provisioner.process.pid == standby, "the second kernel is the standby that slept"
            text, reply = await cell(kc, "print(6 * 7)")
            assert reply["status"] == "ok" and reply["execution_count"] == 1, reply
            assert text == "42\n", text


async def test_a_kernel_with_an_open_socket_stays_awake_and_ps_says_why() -> None:
    km = manager()
    async with started_client(km) as kc:
        assert (await cell(kc, "import socket\nsock = socket.socket()\nx = 1"))[1]["status"] == "ok"
        why = await kept_awake(km)
        listed = subprocess.run([sys.executable, "-m", "kernel_sandbox.cli", "ps"], capture_output=True, text=True, timeout=120)
        assert "\tawake: its checkpoint would leave behind sock (" in listed.stdout, listed.stdout + listed.stderr
        assert "its checkpoint would leave behind sock (TypeError: cannot pickle 'socket' object)" in why
        assert "suspend_lossy" in why
        assert len(containers(km.kernel_id)) == 1
        text, reply = await cell(kc, "print(x, sock.fileno() > 0)")
        assert text == "1 True\n", "the kernel kept running untouched"


async def test_with_suspend_lossy_a_kernel_with_a_socket_sleeps_and_says_what_was_lost() -> None:
    km = manager(suspend_lossy=True)
    async with started_client(km) as kc:
        assert (await cell(kc, "import socket\nsock = socket.socket()\nx = 1"))[1]["status"] == "ok"
        await asleep(km)
        text, _ = await cell(kc, "print(x, 'sock' in globals())")
        assert "Not kept: sock (TypeError: cannot pickle 'socket' object)." in text
        assert text.endswith("1 False\n")


def test_a_client_that_ran_argv_keeps_its_connection_across_a_sleep(tmp_path: Path, sleepy: Path) -> None:
    kernel_id = f"sleepy-{uuid.uuid4().hex[:8]}"
    kernel = ArgvKernel(sleepy, tmp_path, kernel_id=kernel_id)
    try:
        kernel.ready()
        assert kernel.run("y = 'kept'")[1]["status"] == "ok"
        deadline = time.monotonic() + 120
        while containers(kernel_id) or not dormant(kernel.process.pid):
            assert time.monotonic() < deadline, "the kernel did not sleep, or its launcher did not make way"
            time.sleep(0.2)
        assert kernel.client.is_alive()
        text, reply = kernel.run("print(y)")
        assert reply["status"] == "ok" and text.count(WOKE) == 1 and text.endswith("kept\n"), text
        assert len(containers(kernel_id)) == 1
    finally:
        stderr = kernel.stop()
    assert containers(kernel_id) == [], stderr


async def test_a_kernel_with_an_open_widget_stays_awake() -> None:
    km = manager()
    async with started_client(km) as kc:
        text, reply = await cell(kc, "import ipywidgets\nslider = ipywidgets.IntSlider(value=3)\ndisplay(slider)")
        assert reply["status"] == "ok", text
        assert "widget(s) are open and a sleep closes them" in await kept_awake(km)
        assert len(containers(km.kernel_id)) == 1


async def test_a_sleeping_kernel_counts_no_memory_in_the_budget_and_an_awake_one_its_limit() -> None:
    km = manager(memory="256m")
    async with started_client(km) as kc:
        reservation = km.provisioner._reservation
        assert reservation is not None and reservation.memory == 256 * 2**20
        await asleep(km)
        assert reservation.memory == 0, "a sleeping kernel's memory counts 0"
        await cell(kc, "x = 1")
        assert reservation.memory == 256 * 2**20, "awake again, it counts its limit"


@pytest.mark.security("attack", "container")
async def test_a_kernel_that_makes_its_checkpoint_huge_is_refused_and_keeps_running() -> None:
    km = manager(checkpoint_max_bytes="1m")
    async with started_client(km) as kc:
        assert (await cell(kc, "import os\nbig = os.urandom(4 * 2**20)\nmark = 'alive'"))[1]["status"] == "ok"
        assert "over checkpoint_max_bytes=1048576; nothing was pulled" in await kept_awake(km)
        assert len(containers(km.kernel_id)) == 1
        assert not kept_checkpoint(km.provisioner.private.path, SLEEP_SLOT).exists()
        text, _ = await cell(kc, "print(mark, len(big))")
        assert text == f"alive {4 * 2**20}\n"


@pytest.mark.security("attack", "container")
async def test_a_kernel_that_inflates_its_sleep_fills_max_suspended_bytes_and_never_goes_past_it(own_store: Path) -> None:
    """One kernel's big state takes most of the sleeping kernels' disk: the next kernel's sleep is refused
    (it stays awake, counted with its whole memory, and ps says why), the cap is never passed, and the
    room comes back when the first one wakes (its sleep's blob goes)."""
    cap = 6 * 2**20
    first, second = (manager(memory="256m", max_suspended_bytes="6m", standby=0) for _ in range(2))
    async with started_client(first) as kc1:
        assert (await cell(kc1, "import os\nbig = os.urandom(4 * 2**20)"))[1]["status"] == "ok"
        await asleep(first)
        async with started_client(second) as kc2:
            assert (await cell(kc2, "import os\nmine = os.urandom(3 * 2**20)\nmark = 'alive'"))[1]["status"] == "ok"
            why = await kept_awake(second)
            assert "over max_suspended_bytes=6291456 with the " in why and "raise max_suspended_bytes" in why, why
            assert stored_bytes(own_store, SLEEP_SLOT)[0] <= cap
            assert not kept_checkpoint(second.provisioner.private.path, SLEEP_SLOT).exists()
            assert len(containers(second.kernel_id)) == 1
            assert second.provisioner._reservation.memory == 256 * 2**20, "awake, it counts its memory limit"
            listed = subprocess.run([sys.executable, "-m", "kernel_sandbox.cli", "ps"], capture_output=True, text=True, timeout=120)
            line = next((row for row in listed.stdout.splitlines() if f"kernel {second.kernel_id}" in row), "")
            assert "\tawake: Refused the checkpoint: it needs " in line and "over max_suspended_bytes=6291456" in line, listed.stdout
            assert (await cell(kc2, "print(mark, len(mine))"))[0] == f"alive {3 * 2**20}\n"

            # awake again, the first gives its room back (a socket keeps it awake from now on)
            text, reply = await cell(kc1, "import socket\nheld = socket.socket()\nprint(len(big))")
            assert reply["status"] == "ok" and text.endswith(f"{4 * 2**20}\n"), text
            assert not kept_checkpoint(first.provisioner.private.path, SLEEP_SLOT).exists()
            await asleep(second)
            assert 3 * 2**20 < stored_bytes(own_store, SLEEP_SLOT)[0] <= cap


@pytest.mark.security("attack", "container")
async def test_a_kernel_that_understates_its_sleep_to_slip_under_max_suspended_bytes_stays_awake(own_store: Path) -> None:
    """It states a small checkpoint to the launcher and keeps a big one: the launcher counts what it
    reserved, pulls no byte past it, and keeps nothing."""
    km = manager(max_suspended_bytes="2m", standby=0)
    async with started_client(km) as kc:
        code = (
            "import os, _kernel_sandbox_magics as magics\nbig = os.urandom(4 * 2**20)\nreal = magics._say\n"
            "def lying(marker, meta, buffers=()):\n"
            "    if 'sha256' in meta:\n        meta = dict(meta, size=2**20)\n"
            "    return real(marker, meta, buffers)\n"
            "magics._say = lying"
        )
        assert (await cell(kc, code))[1]["status"] == "ok"
        why = await kept_awake(km)
        assert "not the 1048576 stated; nothing was kept" in why, why
        assert stored_bytes(own_store, SLEEP_SLOT) == (0, 0), "no blob, no partial file left"
        assert len(containers(km.kernel_id)) == 1
        assert (await cell(kc, "print(len(big))"))[0] == f"{4 * 2**20}\n"


@pytest.mark.security("attack", "container")
async def test_a_kernel_that_keeps_itself_awake_is_counted_as_awake() -> None:
    km = manager(memory="256m")
    async with started_client(km) as kc:
        # a thread of the kernel's says "busy" now and then, with no request of a client's
        code = (
            "import threading, time\nk = get_ipython().kernel\n"
            "def busy():\n    while True:\n        time.sleep(0.5)\n"
            "        k.session.send(k.iopub_socket, 'status', {'execution_state': 'busy'}, ident=b'status')\n"
            "threading.Thread(target=busy, daemon=True).start()"
        )
        assert (await cell(kc, code))[1]["status"] == "ok"
        await asyncio.sleep(SLEEP_AFTER * 4)
        assert sleep_state(km).get("state") != "suspended" and len(containers(km.kernel_id)) == 1
        assert km.provisioner._reservation.memory == 256 * 2**20, "it counts its whole memory limit"


@pytest.mark.security("attack", "results")
@pytest.mark.parametrize("where", ["blob", "header and blob"])
async def test_a_checkpoint_changed_on_the_host_while_the_kernel_sleeps_is_refused_at_the_wake(where: str) -> None:
    from kernel_sandbox.checkpoint_file import header_bytes, read_header

    km = manager()
    async with started_client(km) as kc:
        assert (await cell(kc, "secret = 'theirs'"))[1]["status"] == "ok"
        await asleep(km)
        private = km.provisioner.private.path
        kept = kept_checkpoint(private, SLEEP_SLOT)
        with open(kept, "rb") as handle:
            header = read_header(handle, str(kept), 2**30, "test")
            blob = bytearray(handle.read())
        blob[-1] ^= 0xFF
        if where == "header and blob":
            import hashlib

            header["sha256"] = hashlib.sha256(blob).hexdigest()
        kept.write_bytes(header_bytes(header) + bytes(blob))
        msg_id = kc.execute("print(secret)")
        await until(lambda: km.provisioner.process is None or km.provisioner.process.poll() is not None, what="the kernel to end")
        exit_reason = json.loads((km.provisioner.private / "exit.json").read_text())["reason"]
        assert "the kernel could not wake from sleep" in exit_reason and str(kept) in exit_reason
        expected = "it was changed on the host since" if where == "header and blob" else "did not arrive intact"
        assert expected in exit_reason, exit_reason
        assert containers(km.kernel_id) == []
        del msg_id
    # a failed wake keeps its directory and blob for the user (the reason names them): the test removes its own
    remove_private(private)


async def test_a_kernel_with_packages_it_installed_stays_awake_even_when_lossy() -> None:
    km = manager(suspend_lossy=True)
    async with started_client(km) as kc:
        # what pip leaves in PIP_TARGET (the packages tmpfs), which a new container would not have
        code = "import os\nos.makedirs(os.path.join(os.environ['PIP_TARGET'], 'tinypkg'))\nx = 1"
        assert (await cell(kc, code))[1]["status"] == "ok"
        assert "packages installed in this kernel (tinypkg) would be gone after a sleep" in await kept_awake(km)
        assert len(containers(km.kernel_id)) == 1


@pytest.mark.security("attack", "results")
async def test_a_kernel_that_fakes_its_checkpoint_is_not_put_to_sleep() -> None:
    """Its sleep's kernel side answers without saving anything, or states a blob of its choosing: the
    launcher trusts what it pulled and hashed, not the kernel's word."""
    km = manager()
    async with started_client(km) as kc:
        silent = "import _kernel_sandbox_magics as m\nm.sleep_save = lambda marker: None\nx = 'alive'"
        assert (await cell(kc, silent))[1]["status"] == "ok"
        assert "the kernel gave no answer to sleep_save" in await kept_awake(km)
        forged = (
            "report = {'size': 4, 'sha256': '0' * 64, 'saved': ['x'], 'not_saved': {}, 'files': 0, "
            "'files_not_saved': {}, 'blob': '/etc/hostname'}\n"
            "m.sleep_save = lambda marker: m._say(marker, report)"
        )
        assert (await cell(kc, forged))[1]["status"] == "ok"
        await until(lambda: "Refused the checkpoint" in sleep_state(km)["why"], what="the forged sleep refused")
        assert len(containers(km.kernel_id)) == 1
        assert (await cell(kc, "print(x)"))[0] == "alive\n"


async def test_a_sleeping_kernel_shuts_down_without_waking_and_its_checkpoint_goes() -> None:
    """Through its dormant launcher: a request signed with another key wakes nothing, an interrupt
    and a shutdown are answered, and the kernel ends cleanly with its checkpoint."""
    km = manager()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        assert (await cell(kc, "x = 1"))[1]["status"] == "ok"
        await asleep(km)
        kept = kept_checkpoint(km.provisioner.private.path, SLEEP_SLOT)
        assert kept.is_file()
        launcher = km.provisioner.process.pid
        await until(lambda: dormant(launcher), what="the dormant launcher")
        forger = AsyncKernelClient(session=Session(key=b"not-the-key"))  # its request is dropped: nothing wakes
        forger.load_connection_info({**km.get_connection_info(), "key": b"not-the-key"})
        forger.start_channels(iopub=False, stdin=False, hb=False, control=False)
        try:
            forger.execute("x = 'forged'")
            await asyncio.sleep(2)
        finally:
            forger.stop_channels()
        assert dormant(launcher) and containers(km.kernel_id) == [], "a forged request woke the kernel"
        await km.interrupt_kernel()  # nothing runs: nothing to interrupt, and no wake
        msg_id = kc.shutdown()
        reply = await kc.get_control_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
        await until(lambda: km.provisioner.process.poll() is not None, what="the launcher to end")
        assert km.provisioner.process.returncode == 0, "a clean shutdown"
        await km.shutdown_kernel(now=True)
        assert containers(km.kernel_id) == [], "the shutdown woke the kernel"
        assert not kept.exists(), "the sleep's checkpoint goes with the kernel"
    finally:
        kc.stop_channels()


def test_the_launcher_that_stays_for_a_sleeping_kernel_does_not_load_jupyter_client() -> None:
    """What a sleeping kernel costs on the host is its launcher: jupyter_client (13 MiB with tornado and
    traitlets) is the client's, never loaded there (its protocol 4 adapter only at a protocol 4 message)."""
    code = (
        "import sys, kernel_sandbox.launch, kernel_sandbox.launch.sleep, kernel_sandbox.docker.link\n"
        "from kernel_sandbox import backends\n"
        "backends.entries()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'jupyter_client', 'tornado', 'traitlets'}))"
    )
    loaded = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert loaded.stdout == "[]\n", loaded.stdout + loaded.stderr
