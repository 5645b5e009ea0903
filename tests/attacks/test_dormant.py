"""The dormant process (kernel_sandbox/launch/dormant.py) attacked by clients of the user's own account.

A sleeping kernel's channels are held by a small process that speaks ZMTP itself. It is started
here as the launcher starts it (``python -I -S``, a state in a memfd, listening sockets inherited),
with TCP ports on 127.0.0.1 and, as the launcher it would exec again, a small program that writes
down what it was handed. Then clients connect too often, subscribe and never read, send frames of
any size or bytes that are not ZMTP, and forge requests: the process keeps its memory bounded,
keeps answering the clients that behave, and execs the launcher only for a signed request it cannot
answer. Another account's clients are refused before a byte is read
(tests/attacks/test_host_users.py, on a real sleeping kernel).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from jupyter_client.session import Session

from kernel_sandbox.launch.asleep import dormant_answers
from kernel_sandbox.launch.zmtp import GREETING, ready
from kernel_sandbox.launch.dormant import MAX_PEERS, MAX_UNSENT, SOCKET_TYPES, STATE_OPTION, dormant_argv, write_state

from support.kernel import unique_memory

KERNEL_INFO = {"status": "ok", "protocol_version": "5.3", "implementation": "ipython", "banner": "asleep"}
HANDED = f"""\
import json, sys
fd = int(sys.argv[sys.argv.index({STATE_OPTION!r}) + 1])
with open(sys.argv[1], 'w') as out:
    json.dump(json.load(open(fd)), out)
"""
"""The launcher the dormant process execs: it writes down the state it was handed."""
GROWTH = 16 * 2**20
"""How far the dormant process's unique memory may stay above where it started once an attack is
over (a refused 64 MiB message included: what the closed connection held goes back)."""


@dataclass
class Dormant:
    process: subprocess.Popen[bytes]
    ports: dict[str, int]
    session: Session
    handed: Path
    context: zmq.Context[zmq.Socket[bytes]]

    def url(self, channel: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[channel]}"

    def client(self, channel: str, kind: int, **options: int) -> zmq.Socket[bytes]:
        sock = self.context.socket(kind)
        sock.linger = 0
        sock.rcvtimeo = 10_000
        for name, value in options.items():
            setattr(sock, name, value)
        if kind == zmq.DEALER:
            sock.identity = os.urandom(8).hex().encode()
        if kind == zmq.SUB:
            sock.subscribe(b"")
        sock.connect(self.url(channel))
        return sock

    def ask(self, sock: zmq.Socket[bytes], msg_type: str) -> dict:
        """Send a signed request on ``sock`` and return its reply."""
        self.session.send(sock, msg_type, {})
        _, reply = self.session.feed_identities(sock.recv_multipart())
        return self.session.deserialize(reply)

    def heartbeat(self) -> None:
        sock = self.client("hb", zmq.REQ)
        try:
            sock.send(b"ping")
            assert sock.recv() == b"ping"
        finally:
            sock.close()

    def memory(self) -> int:
        return unique_memory(self.process.pid)


@pytest.fixture
def dormant(tmp_path: Path) -> Iterator[Dormant]:
    with started_dormant(tmp_path, {"pid": os.getpid()}) as found:
        yield found


@contextlib.contextmanager
def started_dormant(tmp_path: Path, owner: dict) -> Iterator[Dormant]:
    """The dormant process as the launcher starts it, its owner watched as ``owner`` says (a pid, a lock)."""
    listeners = {}
    for channel in SOCKET_TYPES:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.set_inheritable(True)
        listeners[channel] = listener
    key = os.urandom(32).hex()
    handed = tmp_path / "handed.json"
    answers = {
        kind: {"channels": channels, "reply": reply, "content": json.dumps(content), "status": status}
        for kind, (channels, reply, content, status) in dormant_answers(KERNEL_INFO, {}).items()
    }
    fds = {channel: listener.fileno() for channel, listener in listeners.items()}
    ports = {channel: listener.getsockname()[1] for channel, listener in listeners.items()}
    state = {
        "launcher": {"listeners": fds, "argv": [sys.executable, "-c", HANDED, str(handed)]},
        "answers": answers, "key": key, "signature_scheme": "hmac-sha256", "transport": "tcp",
        "locks": [], "owner": owner, "remove": None,
    }
    state_fd = write_state(state)
    process = subprocess.Popen([*dormant_argv(["launcher"]), STATE_OPTION, str(state_fd)], pass_fds=[state_fd, *fds.values()])
    os.close(state_fd)
    for listener in listeners.values():
        listener.close()
    found = Dormant(process, ports, Session(key=bytes.fromhex(key), signature_scheme="hmac-sha256"), handed, zmq.Context())
    try:
        found.heartbeat()
        yield found
    finally:
        process.kill()
        process.wait(10)
        found.context.destroy(linger=0)


@pytest.mark.security("fault", "sessions")
def test_a_signal_stands_when_the_owner_lets_go_at_once(tmp_path: Path) -> None:
    """SIGTERM, then the owner's lock let go (a pool of standbys clearing: each told to stop, then
    let go): the launcher is exec'd to stop, not to keep the kernel for the owner's return
    (``orphan_timeout``, 30 s by default) as it is when the owner goes first."""
    lock = tmp_path / "owner.lock"
    lock.touch()
    held = os.open(lock, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    with started_dormant(tmp_path, {"lock": str(lock)}) as dormant:
        dormant.process.send_signal(signal.SIGSTOP)  # both come before its next look at its owner
        dormant.process.send_signal(signal.SIGTERM)
        os.close(held)
        time.sleep(1.5)
        dormant.process.send_signal(signal.SIGCONT)
        assert dormant.process.wait(30) == 0
        assert json.loads(dormant.handed.read_text())["why"] == "stopped by SIGTERM"


def _raw(dormant: Dormant, channel: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", dormant.ports[channel]), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


def _wait_closed(sock: socket.socket) -> None:
    """Read ``sock`` until the dormant process closes or resets it (a timeout raises)."""
    sock.settimeout(10)
    with contextlib.suppress(ConnectionResetError):
        while sock.recv(65536):
            pass


@pytest.mark.security("attack", "channel")
def test_a_signed_request_it_cannot_answer_execs_the_launcher_with_it_and_a_forged_one_nothing(dormant: Dormant) -> None:
    shell = dormant.client("shell", zmq.DEALER)
    assert dormant.ask(shell, "kernel_info_request")["content"]["banner"] == "asleep"
    forged = Session(key=os.urandom(32).hex().encode(), signature_scheme="hmac-sha256")
    forged.send(shell, "execute_request", {"code": "1"})
    dormant.heartbeat()
    assert dormant.process.poll() is None, "a forged request woke the launcher"
    sent = dormant.session.send(shell, "execute_request", {"code": "x = 1", "silent": False})
    assert dormant.process.wait(30) == 0, "no exec of the launcher for a cell"
    handed = json.loads(dormant.handed.read_text())
    ((channel, frames),) = handed["pending"]
    assert channel == "shell" and handed["why"] is None
    assert any(sent["header"]["msg_id"].encode() in base64.b64decode(frame) for frame in frames)


@pytest.mark.security("attack", "channel")
def test_connections_past_the_limit_are_refused_and_a_client_gets_in_once_they_go(dormant: Dormant) -> None:
    held = []
    for _ in range(MAX_PEERS + 8):
        with contextlib.suppress(ConnectionResetError):  # reset before the connect returned
            held.append(_raw(dormant, "shell"))
    greeted = 0
    for sock in held:
        sock.settimeout(5)
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            greeted += len(sock.recv(10, socket.MSG_WAITALL)) == 10
    assert greeted == MAX_PEERS, f"{greeted} connections of {MAX_PEERS + 8} were served"
    dormant.heartbeat()  # a channel of its own: not crowded out
    for sock in held:
        sock.close()
    time.sleep(0.5)
    assert dormant.ask(dormant.client("shell", zmq.DEALER), "kernel_info_request")["content"]["status"] == "ok"


@pytest.mark.security("attack", "channel")
def test_a_subscriber_that_never_reads_is_cut_off_and_the_process_stays_small(dormant: Dormant) -> None:
    before = dormant.memory()
    stalled = dormant.client("iopub", zmq.SUB, rcvhwm=1, rcvbuf=4096)  # takes one message, then nothing
    watcher = dormant.client("iopub", zmq.SUB)
    shell = dormant.client("shell", zmq.DEALER)
    time.sleep(0.5)  # both subscriptions in
    requests, statuses = 6000, 0  # two status messages each: 3 MiB, past MAX_UNSENT and the socket buffers
    assert requests * 2 * 250 > MAX_UNSENT
    for _ in range(requests):
        dormant.session.send(shell, "kernel_info_request", {})
        shell.recv_multipart()
        while watcher.poll(0):
            _, parts = dormant.session.feed_identities(watcher.recv_multipart())
            statuses += dormant.session.deserialize(parts)["msg_type"] == "status"
    while watcher.poll(2000):
        _, parts = dormant.session.feed_identities(watcher.recv_multipart())
        statuses += dormant.session.deserialize(parts)["msg_type"] == "status"
    grown = dormant.memory() - before
    assert grown <= GROWTH, f"the dormant process grew by {grown / 2**20:.1f} MiB for a subscriber that never reads"
    assert statuses == 2 * requests, f"the subscriber that reads got {statuses} of {2 * requests} status messages"
    stalled.close()


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize("attack", ["not ZMTP", "a frame declaring 1 TiB", "a message past 64 MiB"])
def test_bytes_that_are_not_a_bounded_zmtp_message_close_the_connection_and_cost_nothing(dormant: Dormant, attack: str) -> None:
    before = dormant.memory()
    sock = _raw(dormant, "shell")
    if attack == "not ZMTP":
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
    else:
        sock.sendall(GREETING + ready(b"DEALER", b"attacker"))
        huge = bytes([0x02]) + (1 << 40).to_bytes(8, "big") + b"\0" * (8 << 20)
        chunk = bytes([0x03]) + (1 << 20).to_bytes(8, "big") + b"\0" * (1 << 20)  # MORE: one message
        with pytest.raises((BrokenPipeError, ConnectionResetError)):  # the process ends the connection
            for _ in range(200):
                sock.sendall(huge if attack == "a frame declaring 1 TiB" else chunk)
    _wait_closed(sock)
    dormant.heartbeat()
    assert dormant.ask(dormant.client("shell", zmq.DEALER), "kernel_info_request")["content"]["status"] == "ok"
    assert dormant.process.poll() is None
    grown = dormant.memory() - before
    assert grown <= GROWTH, f"grew by {grown / 2**20:.1f} MiB and kept it after the connection closed"
