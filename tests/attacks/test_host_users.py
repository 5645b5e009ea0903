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
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from jupyter_client import AsyncKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.manager import AsyncKernelManager

from kernel_sandbox.containers import LABEL_KERNEL_ID
from kernel_sandbox.errors import KernelLaunchError
from kernel_sandbox.kernelspecs import install

from attack_kit import MiB, PeakRSS, launcher_pid, outputs
from lab_kit import stop

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
sock = socket.create_connection((host, port), timeout=10)
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
# it or not, and every directory it can list or enter under the private roots.
EXPLORE = r'''
import json, os, sys
keys = [k.encode() for k in sys.argv[1:]]
found = {'readable_with_key': [], 'entered': [], 'listed': []}
roots = ['/tmp', '/var/tmp', '/dev/shm', '/run', '/root', '/work']
for top in roots:
    for folder, dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if os.path.isfile(path) and os.path.getsize(path) < 10_000_000:
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


@pytest.mark.security("attack", "channel")
async def test_another_account_finds_no_key_and_reaches_no_kernel(kernel, docker_engine, other_user, record_property) -> None:
    """Another account searches the shared places for keys and connects to every socket the launcher serves."""
    km, kc = kernel
    launcher = launcher_pid(km)
    client_key = km.session.key.decode()
    container = docker_engine.containers.list(filters={"label": f"{LABEL_KERNEL_ID}={km.kernel_id}"})[0]
    kernel_key = next(e.split("=", 1)[1] for e in container.attrs["Config"]["Env"] if e.startswith("KERNEL_SANDBOX_KEY="))
    private = km.provisioner.private.path
    places = [str(private), str(private.parent)]  # the connection file (0600) is found by the walk, if readable
    explored = subprocess.run(
        ["runuser", "-u", other_user.name, "--", "/usr/bin/python3", "-I", "-c", EXPLORE, client_key, kernel_key],
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


@pytest.fixture
def argv_kernel(docker_engine, tmp_path):
    """A kernel started the way VS Code starts one: the kernelspec's argv, a TCP connection file."""
    prefix = tmp_path / "prefix"
    spec_dir = install("sandboxed-python", prefix=str(prefix))
    argv = json.loads((Path(spec_dir) / "kernel.json").read_text())["argv"]
    connection_file, info = write_connection_file(str(tmp_path / "kernel-argv.json"), ip="127.0.0.1",
                                                  transport="tcp", key=os.urandom(16).hex().encode())
    launcher = subprocess.Popen([part.replace("{connection_file}", connection_file) for part in argv])
    try:
        yield launcher, connection_file, info
    finally:
        stop(launcher)


async def _argv_client(connection_file: str) -> AsyncKernelClient:
    kc = AsyncKernelClient()
    kc.load_connection_file(connection_file)
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return kc


@pytest.mark.security("attack", "channel")
async def test_another_account_cannot_read_an_argv_kernels_output(argv_kernel, other_user) -> None:
    """A kernel started by a client that ran the kernelspec's argv over TCP: another account subscribes to IOPub."""
    launcher, connection_file, info = argv_kernel
    kc = await _argv_client(connection_file)
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


@pytest.mark.security("attack", "channel")
async def test_another_account_cannot_make_the_launcher_hold_a_huge_message(argv_kernel, other_user, record_property) -> None:
    """Another account sends one 400 MiB message to an argv kernel's shell port: the launcher must not hold it."""
    launcher, connection_file, info = argv_kernel
    kc = await _argv_client(connection_file)
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
