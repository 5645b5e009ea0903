"""Sleeping kernels in the execution API: ``suspend()`` and ``wake()`` on demand, the automatic
sleep after ``suspend_after`` (a ``SandboxPool``'s kernels too), ``metrics()`` while asleep, and
the refusals that name why (a socket without ``suspend_lossy``, no ``suspend_after``, the
OpenSandbox backend's refusal of the checkpoint sleep's options)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kernel_sandbox.docker.containers import LABEL_KERNEL_ID
from kernel_sandbox.docker.connect import docker_client
from kernel_sandbox.errors import ConfigError, SandboxError
from kernel_sandbox.execution import AsyncSandbox, Sandbox, SandboxPool
from kernel_sandbox.launch.sleep import DORMANT_AFTER

from support.kernel import dormant

pytestmark = pytest.mark.usefixtures("docker_engine")

WOKE = "[kernel-sandbox] The kernel slept from "


def containers(kernel_id: str | None) -> list[object]:
    """The engine's containers of this kernel, by its label."""
    return docker_client().containers.list(all=True, filters={"label": f"{LABEL_KERNEL_ID}={kernel_id}"})


def test_suspend_and_wake_on_demand_keep_the_variables() -> None:
    with Sandbox(suspend_after=3600) as sb:
        assert sb.run("import numpy as np\nx = np.arange(4) * 3").error is None
        assert sb.metrics().state == "running"
        time.sleep(DORMANT_AFTER + 0.5)  # quiet for longer than the launcher waits before it makes way
        sb.suspend()  # whose reply comes all the same
        assert containers(sb.kernel_id) == []
        launcher = sb._async._km.provisioner.pid
        deadline = time.monotonic() + 60
        while not dormant(launcher):  # then suspend, metrics and wake reach the dormant process
            assert time.monotonic() < deadline, "the sleeping kernel's launcher did not make way"
            time.sleep(0.2)
        sb.suspend()  # asleep already: nothing to do, and ps still says it sleeps
        usage = sb.metrics()
        assert usage.state == "suspended" and usage.memory == 0
        assert usage.saved and usage.saved > 2**20, usage  # what its container held when it went to sleep
        sb.wake()
        assert len(containers(sb.kernel_id)) == 1 and sb.metrics().state == "running"
        execution = sb.run("print(x.tolist())")
        assert execution.error is None and execution.stdout == "[0, 3, 6, 9]\n", execution
        sb.wake()  # awake already: nothing to do


def test_a_call_wakes_a_suspended_kernel_and_its_first_output_says_so() -> None:
    with Sandbox(suspend_after=3600) as sb:
        sb.run("y = 'kept'")
        sb.suspend()
        execution = sb.run("print(y)")
        assert execution.error is None and execution.stdout == "kept\n", execution
        assert execution.stderr.count(WOKE) == 1, execution.stderr
        sb.upload({"note.txt": b"written after the wake"})  # the helper works in the new container
        assert sb.download("note.txt") == b"written after the wake"


def test_a_suspend_that_would_lose_a_socket_is_refused_and_the_kernel_runs_on() -> None:
    with Sandbox(suspend_after=3600) as sb:
        sb.run("import socket\nsock = socket.socket()")
        with pytest.raises(SandboxError, match=r"not suspended: its checkpoint would leave behind sock \("):
            sb.suspend()
        assert len(containers(sb.kernel_id)) == 1
        usage = sb.metrics()
        assert usage.state == "running" and "would leave behind sock (" in (usage.kept_awake or ""), usage
        assert sb.run("print(sock.fileno() > 0)").stdout == "True\n"


def test_an_idle_pool_kernel_sleeps_by_itself_and_wakes_for_the_next_call() -> None:
    with SandboxPool(size=1, suspend_after=2) as pool:
        with pool.acquire() as sb:
            sb.run("z = 7")
            deadline = time.monotonic() + 120
            while sb.metrics().state != "suspended" or containers(sb.kernel_id):
                assert time.monotonic() < deadline, "the kernel did not sleep"
                time.sleep(0.3)
            assert sb.run("print(z * 6)").stdout == "42\n"


async def test_suspend_without_suspend_after_names_the_option() -> None:
    async with AsyncSandbox() as sb:
        with pytest.raises(ConfigError, match="start the Sandbox with suspend_after"):
            await sb.suspend()


def test_the_opensandbox_backend_checks_how_it_sleeps_by_name() -> None:
    """``suspend_by`` (pause, checkpoint, or auto) and the checkpoint sleep's caps are checked before
    anything starts, naming the option."""
    with pytest.raises(ConfigError, match="suspend_by"):
        Sandbox(backend="opensandbox", suspend_after=60, suspend_by="freeze")
    with pytest.raises(ConfigError, match="max_suspended_bytes"):
        Sandbox(backend="opensandbox", suspend_after=60, max_suspended_bytes="lots")


async def test_opening_the_package_index_wakes_a_sleeping_kernel_first() -> None:
    """install() opens the egress window before its cell: the window must be the new container's."""
    from kernel_sandbox.egress import WINDOW_REQUEST

    async with AsyncSandbox(suspend_after=3600) as sb:
        await sb.run("w = 'kept'")
        await sb.suspend()
        assert containers(sb.kernel_id) == []
        reply = await sb._launcher_request({"open": 5}, WINDOW_REQUEST, 120)
        assert reply.get("status") == "ok", reply
        assert len(containers(sb.kernel_id)) == 1, "the window request woke the kernel"
        assert (await sb.run("print(w)")).stdout == "kept\n"


SLEEPING_OWNER = """
import os
from kernel_sandbox import Sandbox
sandbox = Sandbox(suspend_after=3600).start()
sandbox.run("kept = 'from the first owner'")
sandbox.suspend()
print(sandbox.kernel_id, flush=True)
os._exit(0)  # killed: no close, the launcher of the sleeping kernel waits orphan_timeout for a new owner
"""


async def test_a_program_attaches_to_a_sleeping_kernel_whose_owner_died_and_wakes_it() -> None:
    with tempfile.TemporaryFile("w+") as out:  # not a pipe: the launcher keeps its owner's
        done = subprocess.run([sys.executable, "-c", SLEEPING_OWNER], stdout=out, stderr=subprocess.DEVNULL, timeout=240)
        assert done.returncode == 0
        out.seek(0)
        kernel_id = out.read().strip()
    assert containers(kernel_id) == []
    sandbox = await AsyncSandbox.attach(kernel_id, timeout=120)
    try:
        # attaching opens the helper in the kernel: that woke it
        assert len(containers(kernel_id)) == 1 and (await sandbox.metrics()).state == "running"
        execution = await sandbox.run("print(kept)")
        assert execution.stdout == "from the first owner\n", execution
    finally:
        await sandbox.close()
    assert containers(kernel_id) == []


LONG_CELL = "import time\nfor i in range(300): time.sleep(0.1)\nprint('ran to the end')"


@pytest.mark.security("fault", "sessions")
async def test_a_control_request_during_a_cell_does_not_make_it_idle() -> None:
    """ipykernel wraps a control request (a client's kernel_info) in busy/idle while a cell runs: the
    cell still runs, so the kernel is not put to sleep, and an interrupt stops the cell."""
    async with AsyncSandbox(suspend_after=1) as sb:
        kc = sb._kc
        cell_id = kc.execute(LONG_CELL)
        await until_busy(kc, cell_id)
        probe = kc.session.msg("kernel_info_request", {})
        kc.control_channel.send(probe)
        while (await kc.get_control_msg(timeout=30))["parent_header"].get("msg_id") != probe["header"]["msg_id"]:
            pass
        await asyncio.sleep(3)  # past suspend_after, twice over
        assert (await sb.metrics()).state == "running"
        await sb.interrupt()
        while (msg := await kc.get_iopub_msg(timeout=60))["msg_type"] != "error" or msg["parent_header"].get("msg_id") != cell_id:
            assert msg["msg_type"] != "stream" or "ran to the end" not in msg["content"]["text"], "not interrupted"
        assert msg["content"]["ename"] == "KeyboardInterrupt"


async def until_busy(kc: object, msg_id: str) -> None:
    """Wait until the kernel says it is busy with the request ``msg_id``."""
    while True:
        msg = await kc.get_iopub_msg(timeout=60)  # type: ignore[attr-defined]
        if msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "busy":
            return


SLOW_TO_PICKLE = """
import time
class Slow:
    def __reduce__(self):
        time.sleep(3)
        return (Slow, ())
slow = Slow()
x = 'kept'
"""


@pytest.mark.security("fault", "sessions")
async def test_a_wake_asked_while_the_checkpoint_is_taken_abandons_the_sleep_and_its_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wake request (``wake()``'s) during the sleep's checkpoint (an object slow to pickle) is answered
    once the sleep is abandoned: the kernel runs on in its container, and the blob taken meanwhile goes."""
    from kernel_sandbox.privdir import SLEEP_SLOT, SUSPEND_REQUEST, WAKE_REQUEST, checkpoint_root, stored_bytes

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # a store of this test's own
    async with AsyncSandbox(suspend_after=3600) as sb:
        assert (await sb.run(SLOW_TO_PICKLE)).error is None
        kc, replies = sb._kc, {}
        for kind in (SUSPEND_REQUEST, WAKE_REQUEST):
            msg = kc.session.msg(kind, {})
            kc.control_channel.send(msg)
            replies[msg["header"]["msg_id"]] = kind
            await asyncio.sleep(1)  # the checkpoint takes 3 s
        answers = []
        while len(answers) < 2:
            reply = await kc.get_control_msg(timeout=120)
            if reply["parent_header"].get("msg_id") in replies:
                answers.append((replies[reply["parent_header"]["msg_id"]], reply["content"]))
        assert answers == [
            (SUSPEND_REQUEST, {"status": "error", "evalue": "a client's request came while the checkpoint was taken"}),
            (WAKE_REQUEST, {"status": "ok", "state": "awake"}),
        ]
        assert (await sb.metrics()).state == "running" and len(containers(sb.kernel_id)) == 1
        assert stored_bytes(checkpoint_root(), SLEEP_SLOT) == (0, 0), "the abandoned sleep's blob went"
        assert (await sb.run("print(x)")).stdout == "kept\n"


@pytest.mark.security("fault", "sessions")
def test_a_cell_past_its_deadline_while_the_kernel_wakes_is_interrupted_with_its_state_kept() -> None:
    """The call's deadline passes while the kernel wakes for it: the interrupt is kept for the cell and
    sent as it starts, so the cell stops, and the variables stay (no restart)."""
    with Sandbox(suspend_after=3600, interrupt_grace=60.0) as sb:
        sb.run("x = 'kept'")
        sb.suspend()
        execution = sb.run(LONG_CELL, timeout=0.3)
        assert execution.error is not None and execution.error.name == "TimeoutError", execution
        assert not execution.state_lost and "ran to the end" not in execution.stdout
        assert sb.run("print(x)").stdout == "kept\n"


PACKAGE_ON_THE_PATH = """
import os, sys
os.makedirs('lib/mypkg', exist_ok=True)
open('lib/mypkg/__init__.py', 'w').write('class Model:\\n    def __init__(self): self.w = 42\\n')
sys.path.append('lib')
from mypkg import Model
m = Model()
results = list(range(10))
"""


def test_a_class_from_a_package_the_user_put_on_the_path_wakes_with_its_objects() -> None:
    """The checkpoint keeps the import path with the work directory's files: an object of a class from
    ``lib/`` (``sys.path.append('lib')``) loads again in the new container, so the wake does not fail
    and take every other name with it."""
    with Sandbox(suspend_after=3600) as sb:
        assert sb.run(PACKAGE_ON_THE_PATH).error is None
        sb.suspend()
        execution = sb.run("print(m.w, len(results), 'lib' in sys.path)")
        assert execution.error is None and execution.stdout == "42 10 True\n", execution


DEEP_FRAME = '''
import sys, hashlib
frame = sys._getframe()
while 'marker' not in frame.f_locals:  # the launcher's call that runs now, found on the stack
    frame = frame.f_back
marker = frame.f_locals['marker']
body = '{"meta": ' + '[' * 50000 + ']' * 50000 + ', "parts": []}'
print(f"BEGIN-{marker} {len(body)} {hashlib.sha256(body.encode()).hexdigest()} {body} END-{marker}", flush=True)
'''


@pytest.mark.security("attack", "container")
async def test_a_frame_too_deep_to_decode_fails_the_sleep_or_the_wake_with_the_reason() -> None:
    """A frame with the running call's marker, a valid length and digest, and JSON nested 50,000 deep: the
    host's decoder gives up (RecursionError). During the sleep the kernel stays awake and works; during the
    wake (an object whose unpickling prints it) the kernel ends naming where its checkpoint is kept. Neither
    waits for ever with every request queued."""
    async with AsyncSandbox(suspend_after=3600, standby=0) as sb:
        planted = f"import _kernel_sandbox_magics as m\nm._say = lambda *a, **k: exec({DEEP_FRAME!r})\nx = 'alive'"
        assert (await sb.run(planted)).error is None
        with pytest.raises(SandboxError, match="malformed"):
            await sb.suspend()
        assert (await sb.run("print(x)")).stdout == "alive\n"
    async with AsyncSandbox(suspend_after=3600, standby=0) as sb:
        bomb = f"class Bomb:\n    def __reduce__(self):\n        return (exec, ({DEEP_FRAME!r},))\nbomb = Bomb()"
        assert (await sb.run(bomb)).error is None
        await sb.suspend()
        execution = await sb.run("print('after')")
        assert execution.error is not None and execution.error.name == "KernelDied", execution
        assert "could not wake from sleep" in execution.error.value and "kept at" in execution.error.value


async def test_a_running_thread_keeps_the_kernel_awake_or_is_named_when_it_sleeps() -> None:
    """A background job whose thread no name holds (a common notebook pattern) stops with the container:
    the sleep is refused, saying so, unless suspend_lossy, and then the wake line names it."""
    job = "import threading, time\nthreading.Thread(target=lambda: time.sleep(3600), name='job', daemon=True).start()"
    async with AsyncSandbox(suspend_after=3600, standby=0) as sb:
        assert (await sb.run(job)).error is None
        with pytest.raises(SandboxError, match="thread job"):
            await sb.suspend()
        assert len(containers(sb.kernel_id)) == 1
    async with AsyncSandbox(suspend_after=3600, suspend_lossy=True, standby=0) as sb:
        assert (await sb.run(job + "\ny = 1")).error is None
        await sb.suspend()
        said: list[str] = []
        assert (await sb.run("print(y)", on_stderr=said.append)).stdout == "1\n"
        assert "Not kept: thread job" in "".join(said), said
