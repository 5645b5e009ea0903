"""The launcher's TCP gate and its log, on their own: real sockets, a real log handler, no kernel.

The gate must admit only a live connection of this user (both ends matched, ESTABLISHED), never
a peer that already closed (whose row has no owner and reads as uid 0); the journal must keep a
flood of one event to a few lines, within its budget, with every control character escaped.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import socket
import struct
from pathlib import Path

import pytest

from kernel_sandbox.controls import ByteEscaper, SafeWriter, escape_controls
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.launch import gate, journal, peers
from kernel_sandbox.launch.sockets import Connection

HOSTILE = "ok\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[H\x9b31m\rfake\bprompt\x00\a\n\tend"
"""OSC 52 (a clipboard write), clear screen and home, a C1 CSI, carriage return, backspace, NUL, BEL."""


def test_control_characters_are_shown_never_obeyed() -> None:
    escaped = escape_controls(HOSTILE)
    assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in escaped), escaped
    assert escaped == "ok\\x1b]52;c;cm0gLXJmIH4=\\a\\x1b[2J\\x1b[H\\x9b31m\\rfake\\bprompt\\x00\\a\n\tend"
    coloured = escape_controls("\x1b[0;31mValueError\x1b[0m\x1b[2J", keep_colour=True)
    assert coloured == "\x1b[0;31mValueError\x1b[0m\\x1b[2J"


def test_bytes_are_escaped_across_chunks_and_invalid_utf8_too() -> None:
    escaper = ByteEscaper()
    data = "é\x1b]52;c;x\x07".encode() + b"\x9b2J"
    text = "".join(escaper.feed(data[i : i + 1]) for i in range(len(data))) + escaper.feed(b"", final=True)
    assert text == "é\\x1b]52;c;x\\a\\x9b2J"


def test_a_terminal_gets_escaped_text_a_file_the_kernels_own() -> None:
    plain = io.StringIO()
    SafeWriter(plain).write(HOSTILE)
    assert plain.getvalue() == HOSTILE
    main, other = os.openpty()
    with open(other, "w", closefd=True) as terminal:
        writer = SafeWriter(terminal)
        assert writer.escape
        writer.write(HOSTILE)
    seen = os.read(main, 4096).decode()
    os.close(main)
    assert "\x1b" not in seen and "\\x1b]52" in seen


def test_an_empty_key_is_refused_naming_the_fix() -> None:
    info = {f"{name}_port": 1000 + index for index, name in enumerate(("shell", "control", "stdin", "iopub", "hb"))}
    for key in ("", b"", None):
        with pytest.raises(ConfigError, match=r"key is empty.*Session\.key"):
            Connection.from_info({**info, "key": key})
    assert Connection.from_info({**info, "key": "abc"}).key == b"abc"


# ---- the gate -------------------------------------------------------------------------------------


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return server, client, accepted


@pytest.mark.parametrize("lookup", [peers.diag_owner, peers.table_owner], ids=["sock_diag", "proc"])
def test_the_owner_lookup_sees_a_live_socket_and_not_a_closed_one(lookup) -> None:
    server, client, accepted = _pair()
    try:
        names = (client.getsockname(), accepted.getsockname())
        assert lookup(*names) == (peers.ESTABLISHED, os.geteuid())
        assert lookup(client.getsockname(), ("127.0.0.1", 1)) is None  # both ends must match
        client.close()  # its row stays (FIN_WAIT, then TIME_WAIT), owned by nobody
        state = lookup(*names)
        assert state is not None and state[0] != peers.ESTABLISHED
    finally:
        for sock in (server, client, accepted):
            sock.close()


class _Inner(asyncio.Protocol):
    """The channel's own socket behind the gate: what it receives."""

    received: list[bytes] = []
    connections = 0

    def connection_made(self, transport) -> None:
        type(self).connections += 1

    def data_received(self, data: bytes) -> None:
        type(self).received.append(data)


@pytest.fixture
async def gated(tmp_path: Path):
    _Inner.received, _Inner.connections = [], 0
    inner = await asyncio.get_running_loop().create_unix_server(_Inner, str(tmp_path / "shell"))
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    door = gate.TcpGate("shell", "127.0.0.1", port, tmp_path / "shell")
    try:
        yield door, port
    finally:
        door.close()
        inner.close()


async def _until(predicate, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_the_gate_joins_a_live_connection_of_this_user(gated) -> None:
    door, port = gated
    client = socket.create_connection(("127.0.0.1", port))
    try:
        client.sendall(b"hello")
        await _until(lambda: b"".join(_Inner.received) == b"hello", "a live connection of this user was not joined")
        assert door.admitted[os.geteuid()] == 1
    finally:
        client.close()


def _peers_gone_before_the_check(door: gate.TcpGate, caplog, reset: bool) -> list[logging.LogRecord]:
    """Twenty peers that connect, send and close (with a reset: their sockets are gone at once) before the
    doorkeeper looks; then it looks. The refusals it logged."""
    caplog.set_level(logging.DEBUG, logger="kernel_sandbox.launch")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    try:
        for _ in range(20):
            client = socket.create_connection(listener.getsockname())
            client.sendall(b"execute_request")
            if reset:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        gate._the_doorkeeper()._accept(listener, door)
    finally:
        listener.close()
    return [r for r in caplog.records if "refused a connection" in r.getMessage()]


async def test_the_gate_refuses_a_peer_that_closed_before_its_check(gated, caplog) -> None:
    """Connect, send, close before the check: refused (what another account's connect-send-close looked like to
    the old gate: a TIME_WAIT row, uid 0). This user's own peers that let go (FIN_WAIT, still naming the uid:
    jupyter_client's heartbeat reconnecting after a missed beat) are refused without a warning."""
    door, _ = gated
    refusals = _peers_gone_before_the_check(door, caplog, reset=False)
    await asyncio.sleep(0.1)
    assert len(refusals) == 20 and all("not connected" in r.getMessage() for r in refusals)
    assert {r.levelno for r in refusals} == {logging.DEBUG}, "this user's own closed peers were warned of"
    assert _Inner.connections == 0 and _Inner.received == [] and not door.admitted, "a closed peer was admitted"


async def test_the_gate_refuses_a_peer_already_gone_without_a_warning(gated, caplog) -> None:
    """A peer whose socket is gone before the check (reset here; under load a closed one is reaped so): refused
    with nothing read, and no warning, for nothing of it is left to act or to be named. A live peer the gate
    cannot find is still warned of (above)."""
    door, _ = gated
    refusals = _peers_gone_before_the_check(door, caplog, reset=True)
    await asyncio.sleep(0.1)
    assert len(refusals) == 20 and all("let go before the check" in r.getMessage() for r in refusals)
    assert {r.levelno for r in refusals} == {logging.DEBUG}
    assert _Inner.connections == 0 and _Inner.received == [] and not door.admitted, "a gone peer was admitted"


async def test_the_gate_bounds_the_connections_of_one_uid(gated, monkeypatch) -> None:
    door, port = gated
    monkeypatch.setattr(gate, "MAX_PER_UID", 2)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    try:
        await _until(lambda: _Inner.connections == 2 and not door._work, "two connections were not joined")
        await asyncio.sleep(0.1)
        assert _Inner.connections == 2 and door.admitted[os.geteuid()] == 2
    finally:
        for client in clients:
            client.close()
    await _until(lambda: door.admitted[os.geteuid()] == 0, "closed connections were not counted out")


# ---- the journal ----------------------------------------------------------------------------------


@pytest.fixture
def logged(monkeypatch):
    stream = io.StringIO()
    handler = journal.Journal(stream, interval=60, budget=4096)
    monkeypatch.setattr(journal, "_installed", handler)
    logger = logging.getLogger("kernel_sandbox.launch.test-journal")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield logger, handler, stream
    finally:
        logger.removeHandler(handler)


def test_a_flood_of_one_event_is_one_line_and_a_count(logged) -> None:
    logger, handler, stream = logged
    for index in range(100_000):
        journal.note(logger, logging.WARNING, "dropped a message with a bad signature from the %s", "kernel on iopub")
    for index in range(1000):
        logger.warning("refused a connection to the %s channel: %s", "shell", f"a process of uid {index}")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    handler.interval = 0  # the interval ends
    handler.tick()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert "from the kernel on iopub (99999 more like it in the last" in lines[2]
    assert "uid 999 (999 more like it" in lines[3]


def test_the_budget_bounds_warnings_not_errors_and_lines_are_escaped(logged) -> None:
    logger, handler, stream = logged
    handler.interval = 0  # every event is its own kind of interval: only the budget holds them
    for index in range(1000):
        logger.warning("output %d: %s", index, HOSTILE * 100)
    logger.error("the kernel ended: %s", HOSTILE)
    text = stream.getvalue()
    assert len(text.encode()) <= 4096 + 2 * journal.LINE_CHARS
    assert "log budget for this kernel" in text and "the kernel ended" in text
    assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in text)
    handler.output(b"\x1b[2J" * 10_000)
    assert "\\x1b[2J" not in stream.getvalue()[len(text):], "container output past the budget was written"
