"""Docker exec streams: a plain socket of our own for a stream the SDK hijacked, and the
demultiplexing of the engine's framing (stdout and stderr in one stream)."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import EngineUnavailable
from .connect import engine_address

_HEADER = struct.Struct(">BxxxL")


def own_socket(sdk_socket: Any) -> socket.socket:
    """A plain non-blocking socket of our own for a stream the docker SDK hijacked from HTTP."""
    raw = getattr(sdk_socket, "_sock", sdk_socket)
    if not isinstance(raw, socket.socket) or isinstance(raw, ssl.SSLSocket):
        sdk_socket.close()
        raise EngineUnavailable(
            f"the Docker engine at {engine_address()} is reached over a transport the launcher "
            "cannot stream through (TLS or ssh); use a unix:// or tcp:// DOCKER_HOST"
        )
    ours = socket.socket(fileno=os.dup(raw.fileno()))
    sdk_socket.close()
    raw.close()
    ours.setblocking(False)
    return ours


class Demux:
    """Split Docker's multiplexed stream (8-byte header: stream, 0, 0, 0, big-endian length) by
    stream.

    Payloads are passed on as they arrive, as views of the bytes given to :meth:`feed` (valid
    during the call), so a large frame is not gathered here first.
    """

    def __init__(
        self, stdout: Callable[[memoryview], None], stderr: Callable[[memoryview], None]
    ) -> None:
        self._out = {1: stdout, 2: stderr}
        self._header = bytearray()
        self._kind = 0
        self._left = 0

    def feed(self, data: Any) -> None:
        """Take the next bytes of the stream and hand on the payload bytes among them."""
        view = memoryview(data).cast("B")
        while view:
            if not self._left:
                need = _HEADER.size - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < _HEADER.size:
                    return
                self._kind, self._left = _HEADER.unpack(self._header)
                self._header.clear()
                continue
            count = min(self._left, len(view))
            self._left -= count
            handler = self._out.get(self._kind)
            if handler is not None:
                handler(view[:count])
            view = view[count:]


ERROR_TAIL_BYTES = 4096
"""Bytes of a one-shot exec's stderr kept to say why it failed."""
EXIT_POLLS = 50
EXIT_POLL_SECONDS = 0.02


def run_once(
    client: Any,
    container_id: str,
    cmd: list[str],
    stdin: Iterable[bytes],
    stdout: Callable[[memoryview], None],
    idle_timeout: float,
) -> tuple[int, str]:
    """Run ``cmd`` in the container, send it ``stdin``, hand its stdout to ``stdout`` as it arrives
    (which may raise to stop it); return its exit code and the end of its stderr. Blocking: call
    it in a thread. A stream quiet for ``idle_timeout`` s raises :class:`TimeoutError`."""
    exec_id = client.api.exec_create(container_id, cmd, stdin=True, stdout=True, stderr=True)["Id"]
    errors = bytearray()

    def stderr(data: memoryview) -> None:
        errors.extend(data[: max(0, ERROR_TAIL_BYTES - len(errors))])

    sock = own_socket(client.api.exec_start(exec_id, socket=True))
    try:
        sock.settimeout(idle_timeout)
        for block in stdin:
            sock.sendall(block)
        demux = Demux(stdout, stderr)
        while data := sock.recv(1024 * 1024):
            demux.feed(data)
    finally:
        sock.close()
    for _ in range(EXIT_POLLS):  # the stream may end a moment before the engine records the exit
        found = client.api.exec_inspect(exec_id)
        if not found.get("Running"):
            break
        time.sleep(EXIT_POLL_SECONDS)
    code = found.get("ExitCode")
    return (code if isinstance(code, int) else -1), errors.decode(errors="replace").strip()
