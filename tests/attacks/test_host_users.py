"""Another account on the host attacks a user's kernels (issue 8, item 2).

A second account is made with ``useradd`` for each test and removed after it. It runs only the
system interpreter with the standard library: it speaks ZMTP by hand (:data:`ZMTP_CLIENT`), as any
local user could. It looks for keys, connection files and private directories, and connects to
every socket and TCP port the kernel's launcher serves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from jupyter_client.connect import write_connection_file
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.docker.containers import LABEL_KERNEL_ID
from kernel_sandbox.errors import KernelLaunchError
from kernel_sandbox.kernelspecs import install

from support.attacks import MiB, PeakRSS, argv_client, launcher_pid, outputs, wait_for_async
from support.kernel import DORMANT_GOAL, dormant, unique_memory
from support.lab import stop

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

# A ZMTP 3.0 peer in the standard library: greet, READY, then (SUB) subscribe and print what
# arrives for a few seconds, or (DEALER) send one message of N MiB as fast as the socket takes it.
ZMTP_CLIENT = r'''
import json, socket, struct, sys, time
def frame(body, more=False, command=False):
    flags = (1 if more else 0) | (4 if command else 0)
    return (bytes([flags | 2]) + struct.pack('>Q', len(body)) if len(body) > 255 else bytes([flags, len(body)])) + body
def greet(sock, kind):
    signature = b'\xff' + b'\0' * 8 + b'\x7f' + bytes([3, 0]) + b'NULL'.ljust(20, b'\0') + b'\0' * 32
    prop = bytes([11]) + b'Socket-Type' + struct.pack('>I', len(kind)) + kind
    sock.sendall(signature + frame(bytes([5]) + b'READY' + prop, command=True))
    data = b''
    while b'READY' not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError('closed during the handshake')
        data += chunk
mode, host, port, amount = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
try:
    sock = socket.create_connection((host, port), timeout=10)
except ConnectionResetError as exc:  # the port answered and the launcher's gate reset the connection at once
    print(json.dumps({'connected': True, 'refused': repr(exc), 'bytes': 0, 'text': ''}))
    sys.exit(0)
if mode == 'sub':
    try:
        greet(sock, b'SUB')
        sock.sendall(frame(b'\x01'))
    except OSError as exc:  # connected, then refused by the launcher before any ZMTP: it read nothing
        print(json.dumps({'connected': True, 'refused': repr(exc), 'bytes': 0, 'text': ''}))
        sys.exit(0)
    data, end = b'', time.monotonic() + amount
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    print(json.dumps({'connected': True, 'bytes': len(data), 'text': data.decode('latin-1')}))
else:
    greet(sock, b'DEALER')
    size = int(amount * (1 << 20))
    sock.sendall(frame(b'<IDS|MSG>', more=True) + struct.pack('>BQ', 2, size))
    chunk, sent = b'\0' * (1 << 20), 0
    try:
        while sent < size:
            sock.sendall(chunk)
            sent += len(chunk)
        time.sleep(3)
    except OSError:
        pass
    print(json.dumps({'sent': sent}))
'''

# What another account finds: every file it can read under the shared places, with the key in
# it or not, and every directory it can list or enter under the private roots. A file can hold a
# key only if it was written after the key was made, and a write sets its ctime (which no program
# can set back): files whose ctime is older than argv[1] are not read (the walk read gigabytes of
# other checkouts and earlier tests' files, 50 s of the CI run).
EXPLORE = r'''
import json, os, stat, sys
since = float(sys.argv[1])
keys = [k.encode() for k in sys.argv[2:]]
found = {'readable_with_key': [], 'entered': [], 'listed': []}
roots = ['/tmp', '/var/tmp', '/dev/shm', '/run', '/root', '/work']
for top in roots:
    for folder, dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            try:
                info = os.stat(path)
                if stat.S_ISREG(info.st_mode) and info.st_size < 10_000_000 and info.st_ctime >= since:
                    data = open(path, 'rb').read()
                    if any(k in data for k in keys):
                        found['readable_with_key'].append(path)
            except OSError:
                pass
for path in sys.stdin.read().split():
    if os.access(path, os.X_OK):
        found['entered'].append(path)
    try:
        os.listdir(path)
        found['listed'].append(path)
    except OSError:
        pass
print(json.dumps(found))
'''


def _socket_inodes(pid: int) -> set[str]:
    """Inode numbers of the sockets ``pid`` holds open (its /proc/PID/fd links ``socket:[N]``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _listening_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on (its socket inodes matched in /proc/net/tcp)."""
    inodes = _socket_inodes(pid)
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


def _unix_sockets_of(pid: int) -> list[str]:
    """Paths of the Unix sockets ``pid`` has bound (/proc/net/unix)."""
    inodes = _socket_inodes(pid)
    paths = []
    with open("/proc/net/unix") as rows:
        for row in list(rows)[1:]:
            fields = row.split()
            if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith("/"):
                paths.append(fields[7])
    return paths


CONNECT = r'''
import json, socket, sys
reached = []
for target in sys.argv[1:]:
    if target.startswith('/'):
        s = socket.socket(socket.AF_UNIX)
        address = target
    else:
        s = socket.socket()
        address = ('127.0.0.1', int(target))
    s.settimeout(3)
    try:
        s.connect(address)
        reached.append(target)
    except OSError:
        pass
    finally:
        s.close()
print(json.dumps(reached))
'''


@pytest.fixture
def before_kernel() -> float:
    """The time before the test's kernel (and so its keys) was made: listed before ``kernel``, it runs first."""
    return time.time() - 1  # ctime lags the clock by a tick


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize("kernel", ["runc"], indirect=True)  # host files and sockets: the container's runtime plays no part
async def test_another_account_finds_no_key_and_reaches_no_kernel(
    before_kernel, kernel, docker_engine, other_user, record_property
) -> None:
    """Another account searches the shared places for keys and connects to every socket the launcher serves."""
    km, kc = kernel
    launcher = launcher_pid(km)
    assert before_kernel < psutil.Process(launcher).create_time(), "the walk's start time is not before the kernel's"
    client_key = km.session.key.decode()
    container = docker_engine.containers.list(filters={"label": f"{LABEL_KERNEL_ID}={km.kernel_id}"})[0]
    kernel_key = next(e.split("=", 1)[1] for e in container.attrs["Config"]["Env"] if e.startswith("KERNEL_SANDBOX_KEY="))
    private = km.provisioner.private.path
    places = [str(private), str(private.parent)]  # the connection file (0600) is found by the walk, if readable
    explored = subprocess.run(
        ["runuser", "-u", other_user.name, "--", "/usr/bin/python3", "-I", "-c", EXPLORE, str(before_kernel), client_key, kernel_key],
        input="\n".join(places), capture_output=True, text=True, timeout=300,
    )
    found = json.loads(explored.stdout)
    targets = [*map(str, _listening_ports(launcher)), *_unix_sockets_of(launcher)]
    reached = json.loads(other_user.python(CONNECT, *targets).stdout)
    record_property("cases", 3 + len(places) + len(targets))
    record_property("targets", targets)
    assert found["readable_with_key"] == [], f"files another account reads that hold a kernel key: {found}"
    assert found["entered"] == [] and found["listed"] == [], f"private places another account enters: {found}"
    assert targets, "the launcher serves nothing this test could find"
    assert reached == [], f"another account connected to the launcher's {reached}"
    for path in places:
        mode = os.lstat(path).st_mode
        assert stat.S_IMODE(mode) == 0o700, f"{path} is {oct(mode)}"


def _argv_kernel(tmp_path: Path, config: dict | None = None):
    """Start a kernel the way VS Code starts one: the kernelspec's argv, a TCP connection file."""
    spec_dir = install("sandboxed-python", prefix=str(tmp_path / "prefix"), config=config)
    argv = json.loads((Path(spec_dir) / "kernel.json").read_text())["argv"]
    connection_file, info = write_connection_file(str(tmp_path / "kernel-argv.json"), ip="127.0.0.1",
                                                  transport="tcp", key=os.urandom(16).hex().encode())
    launcher = subprocess.Popen([part.replace("{connection_file}", connection_file) for part in argv])
    try:
        yield launcher, connection_file, info
    finally:
        stop(launcher)


@pytest.fixture
def argv_kernel(docker_engine, tmp_path):
    """A kernel started the way VS Code starts one: the kernelspec's argv, a TCP connection file."""
    yield from _argv_kernel(tmp_path)


@pytest.mark.security("attack", "channel")
async def test_another_account_cannot_read_an_argv_kernels_output(argv_kernel, other_user) -> None:
    """A kernel started by a client that ran the kernelspec's argv over TCP: another account subscribes to IOPub."""
    launcher, connection_file, info = argv_kernel
    kc = await argv_client(connection_file)
    try:
        spy = subprocess.Popen(
            ["runuser", "-u", other_user.name, "--", "/usr/bin/python3", "-I", "-c", ZMTP_CLIENT,
             "sub", "127.0.0.1", str(info["iopub_port"]), "10"],
            stdout=subprocess.PIPE, text=True,
        )
        time.sleep(2)
        secret = "the-users-secret-" + os.urandom(4).hex()
        assert secret in await outputs(kc, f"print({secret!r})")
        seen = json.loads(spy.communicate(timeout=60)[0])
    finally:
        kc.stop_channels()
    assert seen["connected"], "the other account's client never reached the IOPub port"
    assert secret not in seen["text"], (
        f"another host account read the kernel's output ({seen['bytes']} bytes of IOPub, the cell's code and its "
        "stdout included): the launcher binds the client's TCP ports on 127.0.0.1 for every local account"
    )


@pytest.fixture
def sleepy_argv_kernel(docker_engine, tmp_path):
    """An argv kernel (TCP) that sleeps after 2 s idle, its launcher then the dormant process."""
    yield from _argv_kernel(tmp_path, {"suspend_after": 2})


@pytest.mark.security("attack", "channel")
async def test_another_account_gets_nothing_from_a_sleeping_kernels_dormant_launcher(sleepy_argv_kernel, other_user) -> None:
    """The dormant process holds a sleeping kernel's TCP ports with no gate thread of the launcher's:
    another account subscribes to IOPub while the owner's kernel_info is answered (with its status
    messages), and sends a 400 MiB message to shell. It reads nothing, the dormant process holds
    nothing, and it is still the dormant process (nothing woke). Then SIGTERM to it ends the kernel
    cleanly, as it ends an awake one."""
    launcher, connection_file, info = sleepy_argv_kernel
    kc = await argv_client(connection_file)
    try:
        assert "ready" in await outputs(kc, "print('ready')")
        await wait_for_async(lambda: dormant(launcher.pid), 120, "the dormant launcher")
        spy = subprocess.Popen(
            ["runuser", "-u", other_user.name, "--", "/usr/bin/python3", "-I", "-c", ZMTP_CLIENT,
             "sub", "127.0.0.1", str(info["iopub_port"]), "6"],
            stdout=subprocess.PIPE, text=True,
        )
        huge = other_user.run("/usr/bin/python3", "-I", "-c", ZMTP_CLIENT, "dealer", "127.0.0.1",
                              str(info["shell_port"]), "400", timeout=300)
        reply = await kc.kernel_info(reply=True, timeout=30)
        seen = json.loads(spy.communicate(timeout=60)[0])
        assert reply["content"]["status"] == "ok"
        assert dormant(launcher.pid), "another account's connections took the dormant process's place"
        assert unique_memory(launcher.pid) <= DORMANT_GOAL, f"{unique_memory(launcher.pid) / MiB:.1f} MiB"
        launcher.send_signal(signal.SIGTERM)  # to the dormant process: the kernel ends as an awake one does
        assert launcher.wait(60) == 0, "SIGTERM to a sleeping kernel's launcher is a clean stop"
    finally:
        kc.stop_channels()
    assert seen["connected"], seen
    # reset at the connect, in the handshake, or while the message was sent
    assert "refused" in huge.stdout or "reset" in huge.stderr or json.loads(huge.stdout)["sent"] < 400 * MiB, huge
    assert seen["bytes"] == 0 and "execution_state" not in seen["text"], (
        "another account read a sleeping kernel's IOPub from its dormant launcher")


@pytest.mark.security("attack", "channel")
async def test_another_account_cannot_make_the_launcher_hold_a_huge_message(argv_kernel, other_user, record_property) -> None:
    """Another account sends one 400 MiB message to an argv kernel's shell port: the launcher must not hold it."""
    launcher, connection_file, info = argv_kernel
    kc = await argv_client(connection_file)
    try:
        peak = PeakRSS(launcher=launcher.pid)
        try:
            result = other_user.run("/usr/bin/python3", "-I", "-c", ZMTP_CLIENT, "dealer", "127.0.0.1",
                                    str(info["shell_port"]), "400", timeout=300)
        finally:
            peak.stop()
        for name, value in peak.figures().items():
            record_property(name, value)
        record_property("sent", result.stdout.strip())
        assert "alive" in await outputs(kc, "print('alive')")
    finally:
        kc.stop_channels()
    assert peak.growth("launcher") <= 128 * MiB, (
        f"a 400 MiB unsigned message from another account raised the launcher's memory by "
        f"{peak.growth('launcher') / MiB:.0f} MiB: libzmq reads a whole message before the launcher can refuse it "
        "(no ZMQ_MAXMSGSIZE on the client-facing sockets)"
    )


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize("squat", ["directory", "symlink"])
async def test_another_account_cannot_plant_the_private_root(other_user, jupyter_prefix, docker_engine, squat,
                                                             monkeypatch) -> None:
    """Another account makes the user's private root first (a directory, or a symlink to its own): refused, never used."""
    shared = Path(tempfile.mkdtemp(prefix="ksattack-shared-", dir="/tmp"))  # a world-writable sticky dir, like /tmp
    shared.chmod(0o1777)
    try:
        monkeypatch.setenv("TMPDIR", str(shared))
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        monkeypatch.setattr(tempfile, "tempdir", str(shared))
        root = shared / f"kernel-sandbox-{os.geteuid()}"
        theirs = shared / "theirs"
        script = (f"import os\nos.mkdir({str(theirs)!r}, 0o777)\nos.chmod({str(theirs)!r}, 0o777)\n"
                  + (f"os.mkdir({str(root)!r}, 0o700)\n" if squat == "directory"
                     else f"os.symlink({str(theirs)!r}, {str(root)!r})\n"))
        made = other_user.python(script)
        assert made.returncode == 0, made.stderr
        km = AsyncKernelManager(kernel_name="sandboxed-python")
        with pytest.raises(KernelLaunchError, match="not a private directory"):
            await km.start_kernel()
        assert list(theirs.iterdir()) == [], "the user's kernel put files where another account can read them"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ---- the TCP gate (issue 23, item 4): closed peers, races, knock floods, an empty key ------------

# Another account's client with the standard library. ``execute``: COUNT times, connect to a
# shell port, send a whole ZMTP handshake and an execute_request signed with KEY (the test hands
# the key over, so that only the gate stands between it and the kernel), and close at once.
# ``subscribe``: for SECONDS, from 8 threads, connect to IOPub, subscribe and keep what arrives.
# ``knock``: for SECONDS, connect to every port given and close, as fast as it goes.
GATE_ATTACK = r'''
import hashlib, hmac, json, socket, struct, sys, threading, time, uuid
def frame(body, more=False, command=False):
    flags = (1 if more else 0) | (4 if command else 0)
    return (bytes([flags | 2]) + struct.pack('>Q', len(body)) if len(body) > 255 else bytes([flags, len(body)])) + body
def handshake(kind):
    signature = b'\xff' + b'\0' * 8 + b'\x7f' + bytes([3, 0]) + b'NULL'.ljust(20, b'\0') + b'\0' * 32
    prop = bytes([11]) + b'Socket-Type' + struct.pack('>I', len(kind)) + kind
    return signature + frame(bytes([5]) + b'READY' + prop, command=True)
mode, host = sys.argv[1], sys.argv[2]
if mode == 'execute':
    port, key, count, code = int(sys.argv[3]), sys.argv[4].encode(), int(sys.argv[5]), sys.argv[6]
    connected = sent = 0
    for index in range(count):
        header = json.dumps({'msg_id': uuid.uuid4().hex, 'msg_type': 'execute_request', 'username': 'x',
                             'session': uuid.uuid4().hex, 'date': '', 'version': '5.3'}).encode()
        content = json.dumps({'code': code.replace('N', str(index)), 'silent': False, 'store_history': False,
                              'user_expressions': {}, 'allow_stdin': False}).encode()
        parts = [header, b'{}', b'{}', content]
        digest = hmac.new(key, digestmod='sha256')
        for part in parts:
            digest.update(part)
        frames = [b'<IDS|MSG>', digest.hexdigest().encode(), *parts]
        message = b''.join(frame(f, more=i < len(frames) - 1) for i, f in enumerate(frames))
        try:
            sock = socket.create_connection((host, port), timeout=5)
            connected += 1
            sock.sendall(handshake(b'DEALER') + message)
            sock.close()
            sent += 1
        except OSError:  # reset by the gate before the whole message went out
            pass
    print(json.dumps({'connected': connected, 'sent': sent}))
elif mode == 'subscribe':
    port, seconds = int(sys.argv[3]), float(sys.argv[4])
    seen, connections, end = [], [0], time.monotonic() + seconds
    def spy():
        while time.monotonic() < end:
            try:
                sock = socket.create_connection((host, port), timeout=2)
                connections[0] += 1
                sock.sendall(handshake(b'SUB') + frame(b'\x01'))
                while time.monotonic() < end:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    seen.append(chunk)
            except OSError:
                pass
    threads = [threading.Thread(target=spy) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    data = b''.join(seen)
    print(json.dumps({'connections': connections[0], 'bytes': len(data), 'text': data.decode('latin-1')}))
else:
    ports, seconds = [int(p) for p in sys.argv[3].split(',')], float(sys.argv[4])
    knocks, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for port in ports:
            try:
                socket.create_connection((host, port), timeout=2).close()
                knocks += 1
            except OSError:
                pass
    print(json.dumps({'knocks': knocks}))
'''
CHANNEL_NAMES = ("shell", "control", "stdin", "iopub", "hb")


def _attack(other_user, *args: str, timeout: float = 120) -> subprocess.Popen[str]:
    return subprocess.Popen(["runuser", "-u", other_user.name, "--", "/usr/bin/python3", "-I", "-c", GATE_ATTACK, *args],
                            stdout=subprocess.PIPE, text=True)


def _result(attack: subprocess.Popen[str], timeout: float = 120) -> dict:
    out, _ = attack.communicate(timeout=timeout)
    assert attack.returncode == 0, out
    return json.loads(out)


@pytest.mark.security("attack", "channel")
async def test_another_accounts_connection_that_closes_at_once_is_never_admitted(logged_argv_kernel, other_user,
                                                                                 record_property) -> None:
    """Connect, send a signed execute_request, close: the peer's socket is gone (TIME_WAIT, uid 0) when the
    gate looks, and a launcher running as root once took that for root's own connection."""
    connection_file, info, log = logged_argv_kernel
    kc = await argv_client(connection_file)
    try:
        attack = _attack(other_user, "execute", "127.0.0.1", str(info["shell_port"]), info["key"], "60",
                         "open('/tmp/admitted-N', 'w').close()")
        tried = _result(attack)
        await outputs(kc, "import time; time.sleep(1)")  # whatever was admitted ran before this
        planted = await outputs(kc, "import os; print(sorted(f for f in os.listdir('/tmp') if f.startswith('admitted')))")
    finally:
        kc.stop_channels()
    record_property("attempts", tried)
    assert tried["sent"] > 0, f"no signed execute_request of the other account reached the port: {tried}"
    assert planted.strip() == "[]", f"another account's closed connections ran code in the kernel: {planted}"
    assert "refused a connection to the shell channel" in log.read_text()


async def test_the_owners_own_heartbeat_reconnects_leave_no_warning(logged_argv_kernel) -> None:
    """jupyter_client's heartbeat makes a new connection after a missed beat (a launcher starting under load misses
    some): the owner's connections that let go before the gate's check are refused without a warning, and the
    kernel answers on."""
    connection_file, info, log = logged_argv_kernel
    kc = await argv_client(connection_file)
    try:
        for _ in range(200):  # connect and let go at once: some close before the gate looks
            socket.create_connection(("127.0.0.1", info["hb_port"])).close()
        assert "alive" in await outputs(kc, "print('alive')")
    finally:
        kc.stop_channels()
    said = log.read_text()
    assert "WARNING" not in said and "refused a connection" not in said, said[-3000:]


@pytest.mark.security("attack", "channel")
async def test_another_account_racing_the_owners_connections_reads_nothing(logged_argv_kernel, other_user) -> None:
    """Another account keeps connecting to IOPub from 8 threads while the owner's client connects and runs a cell."""
    connection_file, info, _ = logged_argv_kernel
    spy = _attack(other_user, "subscribe", "127.0.0.1", str(info["iopub_port"]), "8")
    secret = "the-users-secret-" + os.urandom(4).hex()
    for _ in range(3):  # the owner's client connects anew each time, racing the spy
        kc = await argv_client(connection_file)
        try:
            assert secret in await outputs(kc, f"print({secret!r})")
        finally:
            kc.stop_channels()
    seen = _result(spy)
    assert seen["connections"] > 0, "the other account never reached the IOPub port"
    assert secret not in seen["text"] and seen["bytes"] == 0, f"another account read {seen['bytes']} bytes of IOPub"


@pytest.mark.security("attack", "channel")
async def test_a_knock_flood_from_another_account_does_not_stall_the_owner(logged_argv_kernel, other_user,
                                                                           record_property) -> None:
    """Another account connects and closes on all five ports without pause while the owner asks kernel_info."""
    connection_file, info, log = logged_argv_kernel
    kc = await argv_client(connection_file)
    ports = ",".join(str(info[f"{name}_port"]) for name in CHANNEL_NAMES)
    try:
        knockers = [_attack(other_user, "knock", "127.0.0.1", ports, "6") for _ in range(2)]
        replies = []
        while any(knocker.poll() is None for knocker in knockers):
            reply = await kc.kernel_info(reply=True, timeout=60)
            replies.append(reply["content"])
        knocks = sum(_result(knocker)["knocks"] for knocker in knockers)
        assert "alive" in await outputs(kc, "print('alive')")
    finally:
        kc.stop_channels()
    record_property("knocks", knocks)
    record_property("kernel_info_replies", len(replies))
    assert knocks > 100, f"only {knocks} knocks: the flood did not happen"
    assert replies and all(r["status"] == "ok" and r["implementation"] == "ipython" for r in replies)
    refusals = [line for line in log.read_text().splitlines() if "refused a connection" in line]
    assert len(refusals) <= 2 * len(CHANNEL_NAMES), f"{knocks} knocks made {len(refusals)} log lines"


@pytest.mark.security("attack", "channel")
def test_a_connection_file_with_an_empty_key_is_refused_naming_the_fix(docker_engine, tmp_path) -> None:
    """Jupyter's "no signing" (key ''): every local account could run code; the launcher starts nothing."""
    spec_dir = install("sandboxed-python", prefix=str(tmp_path / "prefix"))
    argv = json.loads((Path(spec_dir) / "kernel.json").read_text())["argv"]
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-unsigned.json"), ip="127.0.0.1", key=b"")
    result = subprocess.run([part.replace("{connection_file}", connection_file) for part in argv],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "the key is empty" in result.stderr and "Session.key" in result.stderr, result.stderr
    assert not docker_engine.containers.list(all=True, filters={"label": f"{LABEL_KERNEL_ID}=unsigned"})
