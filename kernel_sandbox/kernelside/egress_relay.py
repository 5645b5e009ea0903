"""The kernel's end of its egress proxy when the launcher cannot listen in the container itself.

The launcher runs ``python -I -S -c SOURCE PORT`` through one Docker exec stream. This relay
listens on 127.0.0.1:PORT in the container and carries every connection made to it over the
stream, as frames of :data:`HEADER` (connection id, kind, length) and a payload: ``OPEN`` (a
client connected), ``DATA``, ``EOF`` (no more bytes this way), ``CLOSE``, and from the launcher
``PAUSE``/``RESUME`` (stop and go on reading that client). The launcher decides everything; the
relay only moves bytes, so a kernel that replaces it gains nothing but its own proxy, and a frame
or a byte past what this relay would send ends the kernel's egress
(:mod:`kernel_sandbox.launch.egress_stream`). It ends when the stream ends.

Only built-in modules are imported (``_socket``, not ``socket``), as in the connector.
"""

import _socket
import os
import select
import struct
import sys

HEADER = struct.Struct(">IBI")
OPEN, DATA, EOF, CLOSE, PAUSE, RESUME = range(1, 7)
CHUNK = 64 * 1024
MAX_CLIENTS = 1024
"""Connections held at once; more are closed as they arrive (the launcher takes an opening past
them for a forged frame and ends the kernel's egress)."""


def write_all(fd, data):
    """Write every byte of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send(kind, ident, payload=b""):
    """Write one frame to the launcher."""
    write_all(1, HEADER.pack(ident, kind, len(payload)) + payload)


def frames(buffer):
    """Take the complete frames at the start of ``buffer`` (a bytearray, consumed); yield (kind, id,
    payload)."""
    while len(buffer) >= HEADER.size:
        ident, kind, length = HEADER.unpack_from(buffer)
        if len(buffer) < HEADER.size + length:
            return
        payload = bytes(buffer[HEADER.size : HEADER.size + length])
        del buffer[: HEADER.size + length]
        yield kind, ident, payload


def listen(port):
    """A socket listening on 127.0.0.1:``port``."""
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


def serve(listener):  # noqa: C901
    """Relay until the launcher's stream ends."""
    clients = {}
    reading = set()
    pending = bytearray()
    serial = 0
    while True:
        watched = [0, listener.fileno(), *(clients[i].fileno() for i in reading)]
        ready, _, _ = select.select(watched, [], [])
        if 0 in ready:
            try:
                data = os.read(0, CHUNK)
            except OSError:
                data = b""
            if not data:
                return
            pending += data
            for kind, ident, payload in frames(pending):
                sock = clients.get(ident)
                if sock is None:
                    continue
                if kind == DATA:
                    try:
                        sock.sendall(payload)
                    except OSError:
                        kind = CLOSE
                        send(CLOSE, ident)
                if kind == EOF:
                    try:
                        sock.shutdown(_socket.SHUT_WR)
                    except OSError:
                        pass
                elif kind == CLOSE:
                    reading.discard(ident)
                    clients.pop(ident).close()
                elif kind == PAUSE:
                    reading.discard(ident)
                elif kind == RESUME:
                    reading.add(ident)
        if listener.fileno() in ready:
            try:
                fd, _ = listener._accept()
            except OSError:
                fd = None
            if fd is not None:
                sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
                if len(clients) >= MAX_CLIENTS:
                    sock.close()
                else:
                    serial += 1
                    clients[serial] = sock
                    reading.add(serial)
                    send(OPEN, serial)
        for ident in [i for i in reading if clients[i].fileno() in ready]:
            try:
                data = clients[ident].recv(CHUNK, _socket.MSG_DONTWAIT)
            except BlockingIOError:  # readiness of a descriptor number reused meanwhile
                continue
            except OSError:
                data = None
            if data:
                send(DATA, ident, data)
            elif data == b"":
                reading.discard(ident)
                send(EOF, ident)
            else:
                reading.discard(ident)
                clients.pop(ident).close()
                send(CLOSE, ident)


def main(argv):
    """Listen on the port in ``argv[0]`` and relay over stdin and stdout."""
    try:
        listener = listen(int(argv[0]))
    except OSError as exc:
        sys.stderr.write(f"egress relay: cannot listen on port {argv[0]}: {exc}\n")
        return 1
    try:
        serve(listener)
    except OSError:  # the launcher's end is gone (a write to it failed)
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
