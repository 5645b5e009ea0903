"""A sleeping kernel's launcher, made small: the client's channels held with no event loop, no
libzmq and no backend's SDK, so that a sleeping kernel costs the host a few MiB.

Once a sleeping kernel (:mod:`.sleep`) has been quiet for :data:`~.sleep.DORMANT_AFTER` seconds,
the launcher execs ``python -I -S`` into :func:`main`: the same pid (its client, ``kernel-sandbox
ps`` and the provisioner see the same process) with the same locks and listening sockets,
inherited. This process accepts the clients' connections (on TCP only this user's own, as
:mod:`.gate` admits them: :func:`.peers.judge`), speaks ZMTP 3.0 to them (:mod:`.zmtp`) and
answers what the launcher left answers for: heartbeats, IOPub subscriptions, and requests such as
``kernel_info_request`` or ``usage_request`` (with the status messages the launcher publishes
around them). A message whose signature does not verify is dropped, as the launcher drops it.

Anything else (a cell, a shutdown, SIGTERM or SIGHUP, the owner gone) execs the launcher again
with the messages read (:func:`exec_with`), and it handles them as if they had just arrived. A link
with something to do meanwhile (a paused OpenSandbox sandbox's renewal) names a command, which this
process runs every so many seconds in a process of its own (:meth:`Dormant._keep`); any exit status
but 0 hands back to the launcher too. The
clients' connections close at that exec: ZMQ clients reconnect on their own, with the routing
identity they set (jupyter_client and jupyter_server set their session's), and the launcher waits
for their IOPub subscriptions before it answers. A client whose socket sets no routing identity
cannot be told apart after it reconnects: a reply to the request that woke the launcher is then
lost.

The standard library, :mod:`.wire`, :mod:`.peers` and :mod:`.zmtp` only: this module must stay
light to import.
"""

from __future__ import annotations

import binascii
import fcntl
import json
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Iterable
from typing import Any

from ..errors import ChannelProtocolError
from .peers import judge, reset
from .wire import DELIM, Signer, dumps, new_header
from .zmtp import ZmtpPeer

STATE_OPTION = "--state-fd"
"""The option naming the descriptor that holds the state handed across an exec."""
SOCKET_TYPES = {
    "shell": b"ROUTER",
    "control": b"ROUTER",
    "stdin": b"ROUTER",
    "hb": b"ROUTER",
    "iopub": b"XPUB",
}
MAX_PEERS = 32
"""Connections held per channel (the launcher's :data:`.gate.MAX_PER_UID`)."""
MAX_UNSENT = 1024 * 1024
"""Bytes a client may leave unread before its connection is closed."""
MAX_MESSAGE_BYTES = 64 * 2**20
"""The largest message taken from a client (the launcher's ``CLIENT_MAX_BYTES``)."""
READ_SIZE = 16 * 1024
SMALL_FRAME = 4 * 1024
"""A connection's scratch buffer, and the frame size from which a frame gets its own: a sleeping
kernel's clients send a few small requests, and each byte held here is the host's."""
SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
"""The signals the launcher acts on (interrupt, stop)."""
OWNER_EVERY = 1.0
"""Seconds between two looks at the process that owns the kernel."""

BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from kernel_sandbox.launch.dormant import main; main()"
)


def write_state(state: dict[str, Any]) -> int:
    """``state`` as JSON in a new anonymous memory file; its inheritable descriptor, at offset 0."""
    fd = os.memfd_create("kernel-sandbox-state", 0)
    data = memoryview(json.dumps(state).encode())
    while data:
        data = data[os.write(fd, data) :]
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def read_state(fd: int) -> dict[str, Any]:
    """The state :func:`write_state` wrote to ``fd``, which is closed."""
    with os.fdopen(fd, "rb") as source:
        state = json.loads(source.read())
    if not isinstance(state, dict):
        raise ValueError("the state handed over is not a JSON object")
    return state


def exec_with(argv: list[str], state: dict[str, Any], keep: Iterable[int]) -> None:
    """Replace this process with ``argv`` and :data:`STATE_OPTION`, keeping the descriptors
    ``keep`` open (raises OSError when the exec fails: the process then goes on as it was).

    :data:`SIGNALS` are blocked across the exec: one that comes meanwhile waits until the new
    program has its handlers (:func:`handle_signals`), rather than killing it half started.
    """
    for fd in keep:
        os.set_inheritable(fd, True)
    fd = write_state(state)
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        os.execv(argv[0], [*argv, STATE_OPTION, str(fd)])
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        os.close(fd)
        raise


def handle_signals() -> None:
    """Take the signals :func:`exec_with` blocked (call once their handlers are in place)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def dormant_argv(launcher_argv: list[str]) -> list[str]:
    """How the launcher execs this module: ``python -I -S`` (no site: nothing imported that the
    dormant process does not use), the package found where this one was, then the launcher's own
    arguments (unused: they keep naming the kernel's files, for ``kernel-sandbox ps`` and the
    provisioner's re-attach)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.executable, "-I", "-S", "-c", BOOT, root, *launcher_argv[1:]]


def encode_frames(frames: list[Any]) -> list[str]:
    """Frames as JSON strings (base64)."""
    return [binascii.b2a_base64(bytes(frame), newline=False).decode() for frame in frames]


def decode_frames(encoded: list[str]) -> list[bytes]:
    """The frames :func:`encode_frames` wrote."""
    return [binascii.a2b_base64(frame) for frame in encoded]


class _Peer:
    """One client connection: ZMTP framing, and bytes not yet sent."""

    def __init__(self, dormant: Dormant, channel: str, conn: socket.socket) -> None:
        self.channel, self.conn = channel, conn
        self.unsent = bytearray()
        self.topics: set[bytes] = set()
        self.zmtp = ZmtpPeer(
            SOCKET_TYPES[channel],
            self.unsent.extend,
            lambda frames: dormant.message(self, frames),
            max_message_bytes=MAX_MESSAGE_BYTES,
            read_size=READ_SIZE,
            large_frame=SMALL_FRAME,
        )


class Dormant:
    """The sleeping kernel's channels (see the module docstring)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.carried: dict[str, Any] = state["launcher"]
        self.answers: dict[str, Any] = state["answers"]
        self.signer = Signer(bytes.fromhex(state["key"]), state["signature_scheme"])
        self.session = os.urandom(16).hex()
        self.tcp = state["transport"] == "tcp"
        self.uid = os.geteuid()
        self.selector = selectors.DefaultSelector()
        self.listeners: dict[str, socket.socket] = {}
        self.peers: dict[str, set[_Peer]] = {channel: set() for channel in SOCKET_TYPES}
        self.pending: list[tuple[str, list[bytes]]] = []
        self.why: str | None = None
        self.keeping: int | None = None
        """The pid of the ``keep`` command running, if one is."""
        self.next_keep = 0.0
        for fd in state["locks"]:  # inherited by the launcher only (:func:`exec_with`), never
            os.set_inheritable(fd, False)  # by the ``keep`` command
        for channel, fd in self.carried["listeners"].items():
            os.set_inheritable(fd, False)
            listener = socket.socket(fileno=fd)
            listener.setblocking(False)
            self.listeners[channel] = listener
            self.selector.register(listener, selectors.EVENT_READ, channel)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until something needs the launcher: a message, a signal, the owner gone."""
        for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")):
            signal.signal(signum, lambda *_, name=name: self._stop(f"stopped by {name}"))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing runs: nothing to interrupt
        handle_signals()
        next_look = 0.0
        keep = self.state.get("keep")
        self.next_keep = time.monotonic() + (keep["every"] if keep is not None else 0)
        while self.why is None and not self.pending:
            for key, events in self.selector.select(OWNER_EVERY):
                if isinstance(key.data, str):
                    self._accept(key.fileobj, key.data)  # type: ignore[arg-type]
                elif key.data not in self.peers[key.data.channel]:
                    continue  # closed by an earlier event of this round (its parser is gone)
                elif events & selectors.EVENT_READ:
                    self._read(key.data)
                else:
                    self._flush(key.data)
            if self.why is None and time.monotonic() >= next_look:  # a signal's reason stands
                next_look = time.monotonic() + OWNER_EVERY
                self._look_at_owner()
            if self.why is None and keep is not None:
                self._keep(keep)

    def _keep(self, keep: dict[str, Any]) -> None:
        """Run ``keep["argv"]`` every ``keep["every"]`` seconds, ``keep["state"]`` and the launch
        request on the descriptor after its :data:`STATE_OPTION`, one at a time (one that outlasts
        its period is killed); an exit status but 0 hands back to the launcher."""
        now = time.monotonic()
        if self.keeping is not None:
            done, status = os.waitpid(self.keeping, os.WNOHANG)
            if not done and now < self.next_keep:
                return
            if not done:
                os.kill(self.keeping, signal.SIGKILL)
                os.waitpid(self.keeping, 0)
            self.keeping = None
            if not done or os.waitstatus_to_exitcode(status) != 0:
                self.why = "kept"
        elif now >= self.next_keep:
            fd = write_state({**keep["state"], "request": self.carried["request"]})
            argv = [*keep["argv"], STATE_OPTION, str(fd)]
            try:
                self.keeping = os.posix_spawn(argv[0], argv, os.environ)
            except OSError:
                self.why = "kept"
            finally:
                os.close(fd)
            self.next_keep = now + keep["every"]

    def _stop(self, why: str) -> None:
        self.why = why

    def _look_at_owner(self) -> None:
        owner = self.state["owner"]
        if "pid" in owner:
            if os.getppid() != owner["pid"]:
                self.why = "owner"
            return
        try:
            fd = os.open(owner["lock"], os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self.why = "owner"
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # held: the owner is there
        finally:
            os.close(fd)
        self.why = "owner"

    def _accept(self, listener: socket.socket, channel: str) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        if len(self.peers[channel]) >= MAX_PEERS:
            reset(conn)
            return
        if self.tcp:
            why, _ = judge(conn, self.uid)
            if why is not None:
                reset(conn)
                return
        conn.setblocking(False)
        peer = _Peer(self, channel, conn)
        self.peers[channel].add(peer)
        self.selector.register(conn, selectors.EVENT_READ, peer)
        self._flush(peer)

    def _read(self, peer: _Peer) -> None:
        try:
            count = peer.conn.recv_into(peer.zmtp.get_buffer())
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            count = 0
        if not count:
            self._close(peer)
            return
        try:
            peer.zmtp.buffer_updated(count)
        except ChannelProtocolError:
            self._close(peer)
            return
        self._flush(peer)

    def _flush(self, peer: _Peer) -> None:
        if peer.unsent:
            try:
                sent = peer.conn.send(peer.unsent)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close(peer)
                return
            del peer.unsent[:sent]
        if len(peer.unsent) > MAX_UNSENT:
            self._close(peer)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.unsent else 0)
        self.selector.modify(peer.conn, events, peer)

    def _close(self, peer: _Peer) -> None:
        if peer in self.peers[peer.channel]:
            self.peers[peer.channel].discard(peer)
            self.selector.unregister(peer.conn)
            peer.conn.close()
            # the parser refers to its peer: dropped here, what it held (a refused message of up
            # to 64 MiB) goes now, not at a collection this quiet process may never reach
            del peer.zmtp

    # -- messages ------------------------------------------------------------------------------

    def message(self, peer: _Peer, frames: list[Any]) -> None:
        """A whole message from ``peer``: answered, or kept for the launcher."""
        if peer.channel == "hb":
            peer.zmtp.send(frames)  # the echo
        elif peer.channel == "iopub":
            self._subscription(peer, bytes(frames[0]) if frames else b"")
        else:
            self._request(peer, [bytes(frame) for frame in frames])

    def _subscription(self, peer: _Peer, event: bytes) -> None:
        if not event or event[0] not in (0, 1):
            return
        topic = event[1:]
        if event[0] == 0:
            peer.topics.discard(topic)
            return
        peer.topics.add(topic)
        welcome = dumps({"subscription": topic.decode(errors="replace")})
        parts = [self._header("iopub_welcome"), b"{}", b"{}", welcome]
        peer.zmtp.send([*([topic] if topic else []), DELIM, self.signer.sign(parts), *parts])

    def _request(self, peer: _Peer, frames: list[bytes]) -> None:
        try:
            at = frames.index(DELIM)
        except ValueError:
            return
        signature, parts = frames[at + 1 : at + 2], frames[at + 2 :]
        if len(parts) < 4 or not self.signer.verify(signature[0], parts):
            return  # as the launcher: unsigned or forged, dropped
        try:
            header = json.loads(parts[0])
        except ValueError:
            return
        msg_type = header.get("msg_type") if isinstance(header, dict) else None
        answer = self.answers.get(msg_type) if isinstance(msg_type, str) else None
        if answer is None or peer.channel not in answer["channels"]:
            self.pending.append((peer.channel, [peer.zmtp.identity, *frames]))
            return
        if answer["status"]:
            self._publish(parts[0], "status", b'{"execution_state":"busy"}')
        reply = [self._header(answer["reply"]), parts[0], b"{}", answer["content"].encode()]
        peer.zmtp.send([*frames[:at], DELIM, self.signer.sign(reply), *reply])
        if answer["status"]:
            self._publish(parts[0], "status", b'{"execution_state":"idle"}')

    def _publish(self, parent: bytes, msg_type: str, content: bytes) -> None:
        parts = [self._header(msg_type), parent, b"{}", content]
        frames = [DELIM, self.signer.sign(parts), *parts]
        for peer in list(self.peers["iopub"]):
            if any(DELIM.startswith(topic) for topic in peer.topics):
                peer.zmtp.send(frames)
                self._flush(peer)

    def _header(self, msg_type: str) -> bytes:
        return dumps(new_header(msg_type, self.session))

    # -- back to the launcher ------------------------------------------------------------------

    def back(self) -> None:
        """Exec the launcher again with what it must handle (never returns)."""
        state = {
            **self.carried,
            "pending": [[channel, encode_frames(frames)] for channel, frames in self.pending],
            "why": self.why,
            "subscribers": sum(1 for peer in self.peers["iopub"] if peer.topics),
        }
        if self.keeping is not None:  # the launcher does it itself from now on
            os.kill(self.keeping, signal.SIGKILL)
            os.waitpid(self.keeping, 0)
        keep = [*self.carried["listeners"].values(), *self.state["locks"]]
        try:
            exec_with(self.carried["argv"], state, keep)
        except OSError as exc:
            print(
                f"kernel-sandbox: the sleeping kernel's launcher could not start again: {exc}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)


def _parse_args(argv: list[str]) -> int:
    if len(argv) < 2 or argv[-2] != STATE_OPTION or not argv[-1].isdigit():
        raise SystemExit(f"usage: {BOOT!r} ROOT [ARG ...] {STATE_OPTION} FD (run by the launcher)")
    return int(argv[-1])


def _remove_dir(path: str | None) -> None:
    """Remove the launcher's directory of ZMQ sockets (flat: sockets and a lock)."""
    if not path:
        return
    try:
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
    except OSError:
        pass  # gone already, or left to `kernel-sandbox gc`


def main() -> None:
    """Serve a sleeping kernel's channels until the launcher is needed, then exec it."""
    dormant = Dormant(read_state(_parse_args(sys.argv[1:])))
    _remove_dir(dormant.state.get("remove"))
    dormant.run()
    dormant.back()
