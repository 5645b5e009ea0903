"""Join a process's stdin and stdout to one TCP port on the container's own loopback.

The launcher runs ``python -I -S -c SOURCE PORT WAIT_SECONDS`` through a Docker exec stream,
one per kernel channel: the bytes it writes to the exec's stdin reach the kernel's port, and
what the kernel sends comes back on stdout. The connection is made when the first bytes arrive
on stdin (so nothing from the kernel can precede the engine's answer that opened the stream),
and retried for up to WAIT_SECONDS while the kernel is still starting. Before connecting, the
connector writes :data:`HELLO` on stdout: what precedes it on the stream is the engine's (an
exec that could not start, in a container that is stopping, gets the engine's error text there).

Each connector is also a lifeline: the engine closes its stdin when the launcher ends, by any
signal, and the connector then kills every process it may signal in the container (all but the
container's init), so the kernel stops at once and the container ends and removes itself. When
the kernel's side closes instead, the connector just exits.

Only built-in modules are imported (``_socket``, not ``socket``): a connector costs the
kernel's memory limit about 3 MB.
"""

import _signal
import _socket
import os
import select
import sys
import time

CHUNK = 256 * 1024
RETRY_SECONDS = 0.005
MAX_RETRY_SECONDS = 0.05
"""Refused connections are retried after 5 ms, doubling up to 50 ms (a slow start is not spun
on)."""
HELLO = b"kernel-sandbox connector\n"
"""The connector's first bytes on stdout: the exec started, what follows is the kernel's port."""


def connect(port, wait_seconds):
    """Connect to 127.0.0.1:``port``, retrying refused connections for ``wait_seconds``."""
    deadline = time.monotonic() + wait_seconds
    delay = RETRY_SECONDS
    while True:
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            sock.connect(("127.0.0.1", port))
            if sock.getsockname() == sock.getpeername():
                raise ConnectionRefusedError("connected to itself: nothing listens yet")
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_SECONDS)
        else:
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock


def write_all(fd, data):
    """Write every byte of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pump(sock, fd_in=0, fd_out=1):
    """Copy ``fd_in`` to ``sock`` and ``sock`` to ``fd_out``; return True when ``fd_in`` ended
    first."""
    sock_fd = sock.fileno()
    while True:
        ready, _, _ = select.select([fd_in, sock_fd], [], [])
        if fd_in in ready:
            data = os.read(fd_in, CHUNK)
            if not data:
                return True
            sock.sendall(data)
        if sock_fd in ready:
            data = sock.recv(CHUNK)
            if not data:
                return False
            write_all(fd_out, data)


def end_everything():
    """Kill every other process of the container that this user may signal."""
    os.kill(-1, _signal.SIGKILL)


def main(argv):
    """Once stdin has data, connect to the port in ``argv[0]`` (waiting up to ``argv[1]`` s) and
    pump."""
    port, wait_seconds = int(argv[0]), float(argv[1])
    select.select([0], [], [])
    write_all(1, HELLO)
    try:
        sock = connect(port, wait_seconds)
    except OSError as exc:
        sys.stderr.write(f"kernel port {port}: {exc}\n")
        return 1
    try:
        launcher_gone = pump(sock)
    finally:
        sock.close()
    if launcher_gone:
        end_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
