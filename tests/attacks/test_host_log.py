"""The kernel writes to the host's log and terminal (issue 23, item 5).

What a kernel does can make the launcher log, and the launcher's stderr is the Jupyter server's
log, VS Code's output pane, or the user's terminal under ``kernel-sandbox exec``. A kernel that
floods wrongly signed IOPub messages must not fill the host's disk; terminal control sequences it
prints (OSC 52 clipboard writes, clear screen, cursor moves, ``\\r`` overwrites) must reach no
host terminal or log raw.
"""

from __future__ import annotations

import asyncio

import os
import pty
import subprocess
import sys
import tty

import pytest

from support.attacks import argv_client, outputs
from support.lab import stop

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

FLOOD_SECONDS = 6
LOG_BYTES = 16 * 1024
LOG_LINES = 20
"""What the launcher may write for a whole flood: a few lines, whatever the number of messages."""

# Display messages signed with a key that is not the kernel's, sent on its own IOPub socket as
# fast as it goes for FLOOD_SECONDS: before the journal, one log line each (13-14 MB per 20 s).
FLOOD = f"""
import time
from jupyter_client.session import Session
k = get_ipython().kernel
forger = Session(key=b'not-the-kernels-key', session=k.session.session, username=k.session.username)
sent, end = 0, time.monotonic() + {FLOOD_SECONDS}
while time.monotonic() < end:
    for _ in range(100):
        forger.send(k.iopub_socket, 'display_data', {{'data': {{'text/plain': 'forged'}}, 'metadata': {{}}}},
                    ident=k._topic('display_data'))
    sent += 100
print(sent)
"""

# Terminal control sequences from the kernel on every way out it has: its stdout and stderr
# (IOPub streams), a traceback, and the container's own stderr (what the launcher logs).
HOSTILE = "\\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b[2J\\x1b[H\\x9b1;1H\\rfake prompt$ \\x08"
CONTROLS = f"""
import os, sys
hostile = '{HOSTILE}'
print('out' + hostile)
print('err' + hostile, file=sys.stderr)
container = os.open('/proc/1/fd/2', os.O_WRONLY)
os.write(container, ('container' + hostile + '\\n').encode())
os.close(container)
raise ValueError('boom' + hostile)
"""
RAW = ("\x1b]", "\x1b[2J", "\x1b[H", "\x9b", "\x07", "\r", "\x08")
"""What must not reach a terminal or a log as it is (colours, ``\\x1b[...m``, may: tracebacks keep them)."""


@pytest.mark.security("attack", "channel")
async def test_a_flood_of_wrongly_signed_iopub_leaves_a_few_log_lines(logged_argv_kernel, record_property) -> None:
    connection_file, _, log = logged_argv_kernel
    kc = await argv_client(connection_file)
    try:
        sent = int((await outputs(kc, FLOOD, timeout=120)).split()[-1])
        assert "still here" in await outputs(kc, "print('still here')")
        during = log.read_bytes()
    finally:
        kc.stop_channels()
    lines = during.count(b"\n")
    record_property("forged_messages", sent)
    record_property("log_bytes_during_flood", len(during))
    assert sent > 1000, f"the kernel sent only {sent} forged messages: no flood"
    assert len(during) <= LOG_BYTES and lines <= LOG_LINES, (
        f"{sent} wrongly signed messages made the launcher write {len(during)} bytes, {lines} lines"
    )
    assert b"bad signature from the kernel on iopub" in during


@pytest.mark.security("attack", "channel")
async def test_control_sequences_from_the_kernel_reach_the_log_escaped(logged_argv_kernel) -> None:
    connection_file, _, log = logged_argv_kernel
    kc = await argv_client(connection_file)
    try:
        await outputs(kc, CONTROLS.replace("raise ValueError", "pass  #"))
        assert "alive" in await outputs(kc, "print('alive')")
    finally:
        kc.stop_channels()
    for _ in range(300):  # the container's stderr comes on its own stream, maybe after the cell's output
        text = log.read_text(errors="replace")
        if "container\\x1b]52;c;" in text:
            break
        await asyncio.sleep(0.1)
    assert "container\\x1b]52;c;" in text, f"the container's stderr did not reach the launcher's log: {text[-2000:]}"
    assert not [raw for raw in RAW if raw in text], repr(text[-2000:])


@pytest.mark.security("attack", "channel")
def test_exec_on_a_terminal_shows_control_sequences_escaped(docker_engine, jupyter_prefix) -> None:
    """``kernel-sandbox exec`` under a pseudo-terminal (its stdout, stderr and the launcher's stderr)."""
    main, terminal = pty.openpty()
    tty.setraw(terminal)  # no newline translation: a \\r seen is the kernel's
    process = subprocess.Popen([sys.executable, "-m", "kernel_sandbox.cli", "exec", CONTROLS],
                               stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen = bytearray()
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other side is closed: the command has ended
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(main)
        if process.poll() is None:
            stop(process)
    assert process.wait(60) == 1
    text = seen.decode(errors="replace")
    assert "out\\x1b]52;c;" in text and "err\\x1b]52;c;" in text and "boom\\x1b]52;c;" in text, text
    assert "container\\x1b]52;c;" in text, text
    assert not [raw for raw in RAW if raw in text], repr(text)
