"""The channel's parts as code, without an engine: kernel-side modules, ZMTP, signatures, private dirs."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import threading
from pathlib import Path

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from support.security_figures import examples

from kernel_sandbox.errors import ChannelProtocolError, KernelLaunchError
from kernel_sandbox.kernelside import boot, connector, source
from kernel_sandbox.docker.exec_stream import Demux
from kernel_sandbox.launch.messages import DELIM, Signer, split
from kernel_sandbox.launch.sockets import Connection, client_socket
from kernel_sandbox.launch.zmtp import (
    GREETING,
    GROW_FROM,
    LARGE_FRAME,
    MAX_COMMAND_BYTES,
    MAX_FRAMES,
    ZmtpPeer,
    encode,
    ready,
)
from kernel_sandbox.privdir import OWNER_LOCK, PrivateDir, require_private, user_root


# -- kernel-side modules ------------------------------------------------------------------------


def test_kernelside_sources_are_the_modules_themselves() -> None:
    for module in (boot, connector):
        assert source(module.__name__.rsplit(".", 1)[1]) == Path(module.__file__).read_text()
        compile(source(module.__name__.rsplit(".", 1)[1]), "<kernelside>", "exec")


def test_boot_writes_a_private_connection_file_once(tmp_path: Path) -> None:
    path = tmp_path / "connection.json"
    boot.write_connection_file(str(path), boot.connection_info("k3y"))
    info = json.loads(path.read_text())
    assert info["key"] == "k3y" and info["ip"] == "127.0.0.1" and info["shell_port"] == boot.PORTS["shell_port"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        boot.write_connection_file(str(path), boot.connection_info("other"))
    assert boot.kernel_argv(["python", "-f", "{connection_file}"], "/tmp/c.json") == ["python", "-f", "/tmp/c.json"]
    assert all(port < 32768 for port in boot.PORTS.values())  # below the ephemeral range


def test_boot_drops_only_the_loopback_tcp_warning() -> None:
    import logging

    quiet = boot.DropLoopbackWarning()
    record = logging.LogRecord("IPKernelApp", logging.WARNING, "", 0, boot.LOOPBACK_WARNING + ". All...", (), None)
    assert not quiet.filter(record)
    other = logging.LogRecord("IPKernelApp", logging.WARNING, "", 0, "something else", (), None)
    assert quiet.filter(other)


def test_boot_refuses_to_run_without_a_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv(boot.KEY_ENV, raising=False)
    assert boot.main(["python", "-m", "ipykernel_launcher"]) == 2
    assert boot.KEY_ENV in capsys.readouterr().err


def test_connector_pumps_both_ways_and_tells_who_ended() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()

    def echo_once() -> None:
        peer, _ = server.accept()
        peer.sendall(peer.recv(100).upper())
        peer.close()

    threading.Thread(target=echo_once, daemon=True).start()
    sock = connector.connect(port, 5)
    os.write(in_write, b"hello")
    assert connector.pump(sock, in_read, out_write) is False  # the kernel's side closed
    assert os.read(out_read, 100) == b"HELLO"
    sock.close()
    accepting = threading.Thread(target=lambda: server.accept()[0].recv(1), daemon=True)
    accepting.start()
    sock = connector.connect(port, 5)
    os.close(in_write)
    assert connector.pump(sock, in_read, out_write) is True  # stdin ended: the launcher is gone
    sock.close()
    accepting.join(5)  # the connect can finish in the listen backlog before accept() runs
    for fd in (in_read, out_read, out_write):
        os.close(fd)
    server.close()


def test_connector_gives_up_after_its_wait() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(OSError):
        connector.connect(port, 0.05)


# -- the launcher's wire ------------------------------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=5), min_size=1, max_size=5), st.integers(1, 64))
def test_zmtp_frames_survive_any_split_of_the_stream(messages: list[list[bytes]], chunk: int) -> None:
    received: list[list[bytes]] = []
    peer = ZmtpPeer(b"DEALER", lambda data: None, received.append)
    wire = GREETING + ready(b"ROUTER")
    wire += b"".join(b"".join(bytes(part) for part in encode(message)) for message in messages)
    for start in range(0, len(wire), chunk):
        peer.feed(wire[start : start + chunk])
    assert received == messages


def _wire(messages: list[list[bytes]]) -> bytes:
    return GREETING + ready(b"ROUTER") + b"".join(b"".join(bytes(part) for part in encode(m)) for m in messages)


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.integers(0, 3 * GROW_FROM), min_size=1, max_size=4), st.lists(st.integers(1, 300_000), min_size=1, max_size=8))
def test_zmtp_large_frames_read_into_their_own_buffers_at_any_split(sizes: list[int], reads: list[int]) -> None:
    """As a BufferedProtocol transport reads: into whatever get_buffer gives, in reads of any size."""
    messages = [[b"head", bytes([index % 251]) * size] for index, size in enumerate(sizes)]
    wire = memoryview(_wire(messages))
    received: list[list[bytes]] = []
    peer = ZmtpPeer(b"DEALER", lambda data: None, lambda frames: received.append([bytes(f) for f in frames]))
    turn = 0
    while wire:
        with peer.get_buffer(-1) as target:
            count = min(len(target), len(wire), reads[turn % len(reads)])
            target[:count] = wire[:count]
        peer.buffer_updated(count)
        wire, turn = wire[count:], turn + 1
    assert received == messages


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=2000), st.integers(1, 64))
def test_zmtp_any_bytes_after_the_handshake_are_messages_or_a_protocol_error(garbage: bytes, chunk: int) -> None:
    peer = ZmtpPeer(b"DEALER", lambda data: None, lambda frames: None, max_message_bytes=1_000_000)
    peer.feed(GREETING + ready(b"ROUTER"))
    try:
        for start in range(0, len(garbage), chunk):
            peer.feed(garbage[start : start + chunk])
    except ChannelProtocolError:
        pass


def test_zmtp_bounds_frames_commands_and_claimed_sizes() -> None:
    def peer() -> ZmtpPeer:
        p = ZmtpPeer(b"SUB", lambda data: None, lambda frames: None)
        p.feed(GREETING + ready(b"XPUB"))
        return p

    with pytest.raises(ChannelProtocolError, match="frames"):
        peer().feed(b"\x01\x00" * (MAX_FRAMES + 1))  # empty frames, each still counted
    with pytest.raises(ChannelProtocolError, match="command"):
        peer().feed(bytes([0x06]) + (MAX_COMMAND_BYTES + 1).to_bytes(8, "big"))
    claimed = peer()
    claimed.feed(b"\x02" + (60 * 2**20).to_bytes(8, "big") + b"x" * LARGE_FRAME)  # 60 MiB claimed
    assert len(claimed.get_buffer()) + LARGE_FRAME == GROW_FROM  # what is held grows with what arrives


def test_zmtp_refuses_a_peer_that_is_not_zmtp3() -> None:
    peer = ZmtpPeer(b"SUB", lambda data: None, lambda frames: None)
    with pytest.raises(ChannelProtocolError):
        peer.feed(b"GET / HTTP/1.1\r\n" + b"x" * 64)


def test_zmtp_refuses_a_message_over_the_cap_before_buffering_it() -> None:
    peer = ZmtpPeer(b"SUB", lambda data: None, lambda frames: None, max_message_bytes=1000)
    peer.feed(GREETING + ready(b"XPUB"))
    peer.feed(b"\x01\xff" + b"x" * 255)  # 255 bytes, more to come
    with pytest.raises(ChannelProtocolError, match="over"):
        peer.feed(b"\x02" + (2**40).to_bytes(8, "big"))  # a frame claiming a terabyte


async def test_zmtp_talks_to_libzmq_and_waits_for_the_handshake() -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    got: asyncio.Queue[list[bytes]] = asyncio.Queue()

    class Side(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.WriteTransport)
            self.peer = ZmtpPeer(b"DEALER", transport.write, got.put_nowait, identity=b"me")
            self.peer.send([b"sent", b"before the handshake"])  # held until the peer's READY

        def data_received(self, data: bytes) -> None:
            self.peer.feed(data)

    transport, _ = await asyncio.get_running_loop().create_connection(Side, "127.0.0.1", port)
    frames = await asyncio.to_thread(router.recv_multipart)
    assert frames == [b"me", b"sent", b"before the handshake"]
    router.send_multipart([b"me", b"x" * 70000])
    assert await asyncio.wait_for(got.get(), 10) == [b"x" * 70000]
    transport.close()
    router.close(linger=0)
    context.term()


def test_a_client_that_reuses_a_routing_id_still_in_use_is_heard(tmp_path: Path) -> None:
    """jupyter_client names a client's shell socket by its session, which every client of one
    manager shares: a new client may connect while the old connection with that id is still
    there (closed, not yet seen gone). The launcher's ROUTER hands the id over to it; without
    that, its requests were never read, and the kernel never answered it."""
    context = zmq.Context()
    router = client_socket(context, "shell")
    router.bind(f"ipc://{tmp_path}/shell")
    old, new = (context.socket(zmq.DEALER) for _ in range(2))
    try:
        for dealer in (old, new):
            dealer.setsockopt(zmq.IDENTITY, b"the-session")
        old.connect(f"ipc://{tmp_path}/shell")
        old.send(b"from the old client")
        assert router.poll(10_000) and router.recv_multipart() == [b"the-session", b"from the old client"]
        new.connect(f"ipc://{tmp_path}/shell")  # the old connection is still there
        new.send(b"from the new client")
        assert router.poll(10_000), "the new client's request was never read"
        assert router.recv_multipart() == [b"the-session", b"from the new client"]
        router.send_multipart([b"the-session", b"reply"])
        assert new.poll(10_000) and new.recv() == b"reply", "the reply went to the old connection"
    finally:
        for sock in (old, new, router):
            sock.close(linger=0)
        context.term()


def test_demux_splits_docker_streams_at_any_boundary() -> None:
    out, err = [], []
    demux = Demux(lambda view: out.append(bytes(view)), lambda view: err.append(bytes(view)))
    stream = b"\x01\x00\x00\x00\x00\x00\x00\x03abc" + b"\x02\x00\x00\x00\x00\x00\x00\x02no" + b"\x01\x00\x00\x00\x00\x00\x00\x01d"
    for byte in stream:
        demux.feed(bytes([byte]))
    assert b"".join(out) == b"abcd" and b"".join(err) == b"no"  # payloads pass on as they arrive


def test_signatures_are_checked_and_made_per_key() -> None:
    parts = [b'{"msg_type": "x"}', b"{}", b"{}", b"{}", b"buffer"]
    client, kernel = Signer(b"client"), Signer(b"kernel")
    assert client.verify(client.sign(parts), parts)
    assert not kernel.verify(client.sign(parts), parts)
    assert client.sign(parts) == client.sign(parts[:4])  # buffers are not signed, as in Jupyter
    assert Signer(b"").verify(b"", parts)
    with pytest.raises(KernelLaunchError, match="signature_scheme"):
        Signer(b"k", "md5")
    assert split([b"id", DELIM, b"sig", *parts]) == ([b"id"], b"sig", parts)
    assert split([b"id", b"no delimiter"]) is None


def test_connection_files_are_read_as_clients_write_them() -> None:
    info = {f"{name}_port": 9000 + i for i, name in enumerate(("shell", "control", "stdin", "iopub", "hb"))}
    tcp = Connection.from_info({**info, "ip": "127.0.0.1", "transport": "tcp", "key": "abc"})
    assert tcp.address("iopub") == "tcp://127.0.0.1:9003" and tcp.key == b"abc"
    ipc = Connection.from_info({**info, "ip": "/run/k", "transport": "ipc", "key": "abc"})
    assert ipc.address("hb") == "ipc:///run/k-9004"
    with pytest.raises(KernelLaunchError, match="transport"):
        Connection.from_info({**info, "transport": "udp"})
    with pytest.raises(KernelLaunchError, match="port"):
        Connection.from_info({"transport": "tcp"})


# -- private directories ------------------------------------------------------------------------


def test_a_root_made_by_someone_else_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    root = user_root()
    assert root == runtime / "kernel-sandbox" and stat.S_IMODE(root.stat().st_mode) == 0o700
    root.chmod(0o755)
    with pytest.raises(KernelLaunchError, match="not a private directory"):
        user_root()
    root.rmdir()
    root.symlink_to(tmp_path)
    with pytest.raises(KernelLaunchError, match="not a private directory"):
        user_root()
    root.unlink()
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(root, 4242, 4242)  # another account made it first
        with pytest.raises(KernelLaunchError, match="owner uid 4242"):
            user_root()


def test_private_dirs_hold_0600_files_and_exclusive_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    private = PrivateDir.create()
    written = private.write_json("config.json", {"a": 1})
    assert stat.S_IMODE(written.stat().st_mode) == 0o600 and private.read_json("config.json") == {"a": 1}
    assert stat.S_IMODE(private.path.stat().st_mode) == 0o700
    assert private.hold(OWNER_LOCK) and private.held(OWNER_LOCK)
    other = PrivateDir(private.path)
    assert not other.hold(OWNER_LOCK) and other.held(OWNER_LOCK)
    private.release(OWNER_LOCK)
    assert other.hold(OWNER_LOCK)
    private.remove()
    assert not private.path.exists()
    with pytest.raises(KernelLaunchError):
        require_private(private.path)
