"""The kernel channel attacked from inside the kernel: raw ZMTP into the launcher, floods, the lifeline.

The kernel's user can signal and read the connector processes the launcher runs in the container
(same uid): it stops one and writes raw bytes into the pipe that carries that connector's stdout
to the launcher (``/proc/PID/fd/1``), so whatever it writes is parsed by the launcher's ZMTP peer.
The heartbeat's connector is attacked: it is an exec stream in every design of the channel.

Bounds: the largest message a legitimate kernel sends through the launcher is one 4 MiB file
chunk of the execution API plus a small content; the launcher holds a few messages at a time.
So whatever a kernel does, the launcher's resident memory may not rise by more than
:data:`LAUNCHER_BOUND` (the container's memory limit is 1 GiB; the launcher has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import docker.errors
import pytest
import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient

from kernel_sandbox.kernelspecs import started_client

from support.attacks import KERNEL_TOOLS, MiB, PeakRSS, launcher_pid, outputs, request, wait_for
from support.kernel import RUNTIMES

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

LAUNCHER_BOUND = 128 * MiB
"""How far the launcher's resident memory may rise while a kernel attacks it."""

INJECTIONS = {
    # One frame that declares a length of 1 TiB, then 400 MiB of its body.
    "one frame declaring 1 TiB": "fd = hijack()\nos.write(fd, struct.pack('>BQ', 2, 1 << 40))\n"
                                 "sent = pour(fd, b'\\0' * (1 << 20), 400 << 20)",
    # Frames of 1 MiB with MORE set, never a last one: one message without end (300 MiB sent, over twice the bound).
    "a message without end, 1 MiB frames": "fd = hijack()\n"
                                           "sent = pour(fd, frame(b'\\0' * (1 << 20), more=True) * 4, 300 << 20)",
    # Ten million one-byte frames with MORE set: 30 MiB on the wire, each a Python object on the host.
    "ten million one-byte parts": "fd = hijack()\nsent = pour(fd, frame(b'x', more=True) * (1 << 18), 30 << 20)",
    # PING commands with a 1 MiB context while the connector reads nothing: PONGs pile up unsent.
    "pings that are never read": "fd = hijack()\nping = frame(bytes([4]) + b'PING' + b'\\0\\0' + b'p' * (1 << 20), command=True)\n"
                                 "sent = pour(fd, ping, 400 << 20)",
}


RAW_CASES = [(runtime, attack) for attack in INJECTIONS for runtime in RUNTIMES
             if runtime == "runc" or attack in ("one frame declaring 1 TiB", "ten million one-byte parts")]
"""Every injection on runc; on gVisor, whose only difference is the pipe the bytes cross (the
launcher parses them with the same code), the two that show the hijack works there and cost little:
gVisor lets the kernel go on writing after the launcher has closed the stream (the endless message
took 35 s of both cores there, the unread PINGs 11 s of CPU)."""


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize(("kernel", "attack"), RAW_CASES, indirect=["kernel"])
async def test_raw_zmtp_from_the_kernel_does_not_grow_the_launcher(kernel, attack, record_property) -> None:
    """A kernel writes raw ZMTP into its channel: huge frames, endless messages, millions of parts, PINGs."""
    km, kc = kernel
    launcher = launcher_pid(km)
    peak = PeakRSS(launcher=launcher, client=os.getpid())
    try:
        outcome = await request(km, kc, KERNEL_TOOLS + INJECTIONS[attack] + "\nsent", timeout=300)
    finally:
        peak.stop()
    record_property("outcome", outcome.status)
    for name, value in peak.figures().items():
        record_property(name, value)
    assert outcome.status != "timeout", "the attack did not end within 300 s"
    assert peak.growth("launcher") <= LAUNCHER_BOUND, (
        f"{attack}: the launcher's memory rose by {peak.growth('launcher') / MiB:.0f} MiB "
        f"(bound {LAUNCHER_BOUND // MiB} MiB): it buffers what the kernel sends without a cap"
    )


FLOOD = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range({count}):\n    sys.stdout.write(chunk); sys.stdout.flush()\n"


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize("kernel", ["runc"], indirect=True)  # the launcher's delivery: the runtime plays no part
async def test_a_stalled_client_does_not_make_the_launcher_hold_a_kernels_flood(kernel, record_property) -> None:
    """A kernel floods IOPub while its client reads nothing: the launcher must not keep the flood."""
    km, kc = kernel  # subscribed to IOPub, never reading it (a slow browser tab, a stuck program)
    launcher = launcher_pid(km)
    peak = PeakRSS(launcher=launcher, client=os.getpid())
    try:
        outcome = await request(km, kc, FLOOD.format(count=1300), timeout=400)
    finally:
        peak.stop()
    for name, value in peak.figures().items():
        record_property(name, value)
    assert outcome.status == "ok", outcome
    assert peak.growth("launcher") <= 2 * LAUNCHER_BOUND, (
        f"1300 x 1 MiB of stdout to a client that reads nothing: the launcher's memory rose by "
        f"{peak.growth('launcher') / MiB:.0f} MiB (bound {2 * LAUNCHER_BOUND // MiB} MiB): it queues up to "
        "ZMQ's default high-water mark of 1000 messages per subscriber, whatever their size"
    )


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize("kernel", ["runc"], indirect=True)  # the launcher's delivery: the runtime plays no part
async def test_a_client_that_never_reads_iopub_does_not_hold_back_another_clients_output(kernel) -> None:
    """A second client of the kernel subscribes to IOPub and takes nothing (a suspended `jupyter
    console`): the first client's cell, thousands of output messages, still ends with its output.
    Before, every client's IOPub waited for the stalled one: the cell never ended."""
    km, kc = kernel
    stalled = AsyncKernelClient()  # a session of its own, as another program's client has
    stalled.load_connection_info(km.get_connection_info())
    stalled.start_channels(shell=False, stdin=False, hb=False, control=False)  # IOPub only, never read
    try:
        text = await outputs(kc, "for i in range(3000):\n    print(i, flush=True)\nprint('done')", timeout=120)
    finally:
        stalled.stop_channels()
    assert text.endswith("2999\ndone\n"), text[-200:]


FLOOD_SECONDS = 6
"""How long each flood lasts; heartbeats and control requests are timed during its first 4 s."""
HEAVY_FLOODS = {
    "small prints": f"import time\nt = time.time()\nwhile time.time() - t < {FLOOD_SECONDS}:\n    print('x' * 100, flush=True)\n",
    "1 MiB stdout messages": "import sys, time\nc = 'y' * (1 << 20)\nt = time.time()\n"
                             f"while time.time() - t < {FLOOD_SECONDS}:\n    sys.stdout.write(c); sys.stdout.flush()\n",
    "HTML tables": "import time\nfrom IPython.display import HTML, display\n"
                   "h = HTML('<table>' + '<tr><td>x</td><td><b>y</b></td></tr>' * 20000 + '</table>')\n"
                   f"t = time.time()\nwhile time.time() - t < {FLOOD_SECONDS}:\n    display(h)\n",
}


FLOOD_CASES = [("runc" if flood == "small prints" else "runsc", flood) for flood in HEAVY_FLOODS]
"""Each flood once: the runtimes differ only in the kernel's way to the launcher (its delivery and
policy are the same code), so the flood of the most messages runs on runc, the others on gVisor."""


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize(("kernel", "flood"), FLOOD_CASES, indirect=["kernel"])
async def test_heartbeat_and_control_answer_during_an_iopub_flood(kernel, flood, record_property) -> None:
    """Heartbeats and control requests are answered while the kernel floods IOPub (none starves)."""
    km, kc = kernel
    context = zmq.asyncio.Context()
    hb = context.socket(zmq.REQ)
    hb.linger = 0
    hb.connect(km._make_url("hb"))
    drained = 0

    async def drain() -> None:
        nonlocal drained
        while True:
            await kc.get_iopub_msg()
            drained += 1

    reader = asyncio.ensure_future(drain())
    heartbeats: list[float] = []
    control: list[float] = []
    try:
        msg_id = kc.execute(HEAVY_FLOODS[flood])
        end = time.monotonic() + FLOOD_SECONDS - 2
        while time.monotonic() < end:
            start = time.monotonic()
            await hb.send(b"ping")
            try:
                await asyncio.wait_for(hb.recv(), 10)
            except asyncio.TimeoutError:
                pytest.fail(f"no heartbeat answer within 10 s during a flood of {flood}")
            heartbeats.append(time.monotonic() - start)
            start = time.monotonic()
            msg = kc.session.msg("kernel_info_request")
            kc.control_channel.send(msg)
            while True:
                try:
                    reply = await kc.get_control_msg(timeout=10)
                except Exception:
                    pytest.fail(f"no control reply within 10 s during a flood of {flood}")
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    break
            control.append(time.monotonic() - start)
            await asyncio.sleep(0.5)
        while True:
            reply = await kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
    finally:
        reader.cancel()
        hb.close()
        context.term()
    record_property("heartbeat_max_s", round(max(heartbeats), 3))
    record_property("control_max_s", round(max(control), 3))
    record_property("iopub_messages_read", drained)
    record_property("cases", len(heartbeats) + len(control))


@pytest.mark.security("attack", "channel")
async def test_a_malformed_message_from_the_kernel_is_dropped_and_the_session_goes_on(kernel) -> None:
    """A correctly signed IOPub message whose header is not JSON: dropped, the kernel and its channels live on."""
    km, kc = kernel
    code = (
        "k = get_ipython().kernel\n"
        "parts = [b'{\"msg_type\": \"iopub_welcome\", broken', b'{}', b'{}', b'{\"x\": 1}']\n"
        "k.iopub_socket.send_multipart([b'x', b'<IDS|MSG>', k.session.sign(parts), *parts])\n"
        "parts = [b'[]', b'{}', b'{}', b'{}']\n"
        "k.iopub_socket.send_multipart([b'x', b'<IDS|MSG>', k.session.sign(parts), *parts])\n"
        "import time; time.sleep(1)\n"
    )
    outcome = await request(km, kc, code, timeout=60)
    assert outcome.status == "ok", outcome
    alive = await request(km, kc, "print('next cell')", timeout=60)
    assert alive.status == "ok", (
        f"after one malformed message from the kernel the next cell ended as {alive.status!r}: the relay let "
        "the parse error out, closed the kernel's IOPub stream, and the connector took that for the launcher's "
        "death and killed the kernel"
    )
    assert "next cell" in await outputs(kc, "print('next cell')")


@pytest.mark.security("attack", "channel")
async def test_messages_the_kernel_signs_with_another_key_never_reach_the_client(kernel, record_property) -> None:
    """The kernel sends display messages signed with a wrong key, with none, and with its own: only its own pass."""
    km, kc = kernel
    code = (
        "from jupyter_client.session import Session\n"
        "k = get_ipython().kernel\n"
        "for key, text in ((b'wrong-key', 'forged-wrong-key'), (b'', 'forged-unsigned'), (k.session.key, 'signed-ok')):\n"
        "    s = Session(key=key, session=k.session.session, username=k.session.username)\n"
        "    s.send(k.iopub_socket, 'display_data', {'data': {'text/plain': text}, 'metadata': {}},\n"
        "           parent=k.get_parent(), ident=k._topic('display_data'))\n"
    )
    seen: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "display_data":
            seen.append(msg["content"]["data"].get("text/plain", ""))

    await kc.execute_interactive(code, timeout=60, output_hook=hook)
    record_property("cases", 3)
    assert seen == ["signed-ok"], seen


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize("kernel", ["runc"], indirect=True)  # the same container spec on every runtime
async def test_the_clients_key_never_enters_the_container(kernel) -> None:
    """Search every process's environment and command line and every readable file for the client's key
    (on runc: what enters the container is the launcher's spec, the same on gVisor, where the walk
    through the image's files takes four times as long)."""
    km, kc = kernel
    key = km.session.key.decode()
    assert len(key) >= 32
    code = (
        "import os\nkey = %r[::-1]\nhits = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    for part in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            if key.encode() in open(f'/proc/{pid}/{part}', 'rb').read(): hits.append(f'/proc/{pid}/{part}')\n"
        "        except OSError: pass\n"
        "for top in ('/tmp', '/home', '/run', '/etc', '/dev/shm', '/var', '/opt'):\n"
        "    for folder, _, names in os.walk(top):\n"
        "        for name in names:\n"
        "            path = os.path.join(folder, name)\n"
        "            try:\n"
        "                if os.path.isfile(path) and os.path.getsize(path) < 50_000_000 and key.encode() in open(path, 'rb').read():\n"
        "                    hits.append(path)\n"
        "            except OSError: pass\n"
        "print('hits:', hits)\n"
    ) % key[::-1]  # the cell holds the key reversed: IPython keeps cells in its history
    text = await outputs(kc, code, timeout=120)
    assert "hits: []" in text, text


@pytest.mark.security("attack", "channel")
async def test_the_kernel_finds_no_way_to_the_host(kernel, docker_engine, record_property) -> None:
    """No interface but lo, no route out, no engine socket, every writable place a tmpfs that fills to ENOSPC."""
    km, kc = kernel
    root = docker_engine.info().get("DockerRootDir", "/var/lib/docker")
    free_before = shutil.disk_usage(root).free
    code = r'''
import errno, os
print('interfaces', sorted(os.listdir('/sys/class/net')))
routes = [line.split()[0] for line in open('/proc/net/route').readlines()[1:]]
routes += [line.split()[-1] for line in open('/proc/net/ipv6_route') if line.split()[-1] != 'lo']
print('routes', routes)
sockets = [p for p in ('/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock') if os.path.exists(p)]
print('engine sockets', sockets)
writable = []
for line in open('/proc/self/mountinfo'):
    fields = line.split()
    point, options = fields[4], fields[5].split(',')
    fstype = fields[fields.index('-') + 1]
    if 'rw' in options and fstype not in ('proc', 'sysfs', 'cgroup2', 'cgroup', 'devpts', 'mqueue'):
        writable.append((point, fstype))
print('writable', writable)
written, filled = 0, []
for point, fstype in writable:  # every writable directory filled at once, kept full until the end
    if fstype != 'tmpfs' or not os.path.isdir(point) or not os.access(point, os.W_OK):
        continue
    path = os.path.join(point, 'fill.bin')
    filled.append(path)
    try:
        with open(path, 'wb') as f:
            while True:
                f.write(b'\0' * (1 << 20)); written += 1 << 20
    except OSError as exc:
        print('full', point, errno.errorcode.get(exc.errno))
print('written', written)
for path in filled:
    os.unlink(path)
'''
    text = await outputs(kc, code, timeout=300)
    free_after = shutil.disk_usage(root).free
    written = int(text.rsplit("written", 1)[1].split()[0])
    record_property("written_mib", written // MiB)
    record_property("host_free_drop_mib", (free_before - free_after) // MiB)
    assert "interfaces ['lo']" in text, text
    assert "routes []" in text, text  # nowhere to send a packet but lo: shown, never tried
    assert "engine sockets []" in text, text
    writable = eval(text.split("writable", 1)[1].split("\n", 1)[0])  # noqa: S307 (our own printed list)
    assert all(fstype == "tmpfs" for point, fstype in writable), writable
    assert text.count("ENOSPC") >= 3, text  # /tmp, HOME, the work dir (and /dev/shm): each at its own limit
    assert free_before - free_after < written // 2, "the host's disk lost about what the kernel wrote"


@pytest.mark.security("attack", "channel")
async def test_two_kernels_cannot_reach_each_other(docker_engine, jupyter_prefix, record_property) -> None:
    """Kernel A listens on TCP and on an abstract Unix socket and leaves a file in /dev/shm; kernel B finds none of it."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(started_client("sandboxed-python", timeout=90)) for _ in range(2)]
        listen = (
            "import socket, os\n"
            "tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "tcp.bind(('0.0.0.0', 30333)); tcp.listen()\n"
            "uds = socket.socket(socket.AF_UNIX); uds.bind('\\0ks-attack'); uds.listen()\n"
            "open('/dev/shm/ks-attack', 'w').write('a'); open('/tmp/ks-attack', 'w').write('a')\n"
            "print('listening', os.getpid())\n"
        )
        assert "listening" in await outputs(clients[0], listen)
        probe = r'''
import os, socket
found = []
for family, address in ((socket.AF_INET, ('127.0.0.1', 30333)), (socket.AF_UNIX, '\0ks-attack')):
    s = socket.socket(family); s.settimeout(2)
    try:
        s.connect(address); found.append(repr(address))
    except OSError:
        pass
    finally:
        s.close()
found += [p for p in ('/dev/shm/ks-attack', '/tmp/ks-attack') if os.path.exists(p)]
others = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]
found += [c[:60].decode(errors='replace') for c in others if b'30333' in c or b'ks-attack' in c]
print('found', found)
'''
        text = await outputs(clients[1], probe)
        record_property("cases", 5)
        assert "found []" in text, text


OWNER = r'''
import asyncio, json, sys
from jupyter_client.manager import AsyncKernelManager
async def main():
    km = AsyncKernelManager(kernel_name="sandboxed-python")
    await km.start_kernel()
    kc = km.client(); kc.start_channels(); await kc.wait_for_ready(timeout=90)
    msg_id = kc.execute(sys.stdin.read())
    while True:
        reply = await kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    print(json.dumps({"launcher": km.provisioner.pid, "container": km.provisioner.container_id,
                      "status": reply["content"]["status"]}), flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
'''
STOP_CONNECTORS = KERNEL_TOOLS + r'''
import threading
def stop_all():
    time.sleep(1)
    for pid in connectors():
        os.kill(pid, signal.SIGSTOP)
threading.Thread(target=stop_all).start()
'''
ORPHAN_LIMIT = 60.0
"""Issue 12.1: a kernel whose owner died by any signal is removed within 60 s."""


@pytest.mark.security("attack", "sessions")
@pytest.mark.parametrize("kernel_code", ["1", STOP_CONNECTORS], ids=["idle kernel", "kernel stops its connectors"])
def test_a_kernel_cannot_outlive_its_killed_server(docker_engine, jupyter_prefix, kernel_code, record_property) -> None:
    """The server and the launcher are SIGKILLed; the kernel (maybe having stopped its lifeline) must still go."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    container = None
    try:
        assert owner.stdin is not None and owner.stdout is not None
        owner.stdin.write(kernel_code)
        owner.stdin.close()
        info = json.loads(owner.stdout.readline() or "{}")
        assert info.get("status") == "ok", f"the owner did not start its kernel: {info}"
        container = docker_engine.containers.get(info["container"])
        if kernel_code != "1":
            def stopped() -> bool:
                rows = container.top(ps_args="-o pid,stat,args")["Processes"] or []
                lines = [row for row in rows if " -I -S -c " in row[-1]]
                return bool(lines) and all(row[1].startswith("T") for row in lines)

            wait_for(stopped, 30, "the kernel did not manage to stop its connectors")
        os.kill(owner.pid, signal.SIGKILL)
        os.kill(info["launcher"], signal.SIGKILL)
        owner.wait(30)
        start = time.monotonic()

        def gone() -> bool:
            try:
                container.reload()
            except docker.errors.NotFound:
                return True
            return False

        deadline = start + ORPHAN_LIMIT
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.5)
        record_property("seconds_to_removal", round(time.monotonic() - start, 1))
        assert gone(), (
            f"the kernel's container still runs {ORPHAN_LIMIT:g} s after its server and launcher were SIGKILLed: "
            "the only lifeline is a process of the kernel's own uid, which the kernel can stop"
        )
    finally:
        if owner.poll() is None:
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(30)
        if container is not None:
            private = container.labels.get("kernel-sandbox.private-dir")
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            if private and os.path.isdir(private):
                shutil.rmtree(private, ignore_errors=True)
