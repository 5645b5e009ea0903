"""The kernel's end of its egress proxy when the launcher cannot listen in the container itself.

The launcher runs ``python -I -S -c SOURCE PORT`` through one Docker exec stream. This relay
listens on 127.0.0.1:PORT in the container and carries every connection made to it over the
stream, as frames of :data:`HEADER` (connection id, kind, length) and a payload: first
``LISTENING`` (id 0: the port is open, the launcher may call the kernel ready), then ``OPEN`` (a
client connected), ``DATA``, ``EOF`` (no more bytes this way), ``CLOSE``, and ``PAUSE``/``RESUME``
(stop and go on reading that client: from the launcher; from the relay, stop and go on sending it
bytes for a client that does not read them). The launcher decides everything; the
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
OPEN, DATA, EOF, CLOSE, PAUSE, RESUME, LISTENING = range(1, 8)
CHUNK = 64 * 1024
PAUSE_AT = 4 * CHUNK
"""Bytes waiting for a client that make the relay ask the launcher to pause that connection (the
client does not read); it resumes it at :data:`RESUME_AT`, so one slow client never holds up the
others."""
RESUME_AT = CHUNK
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


class Relay:
    """The connections of one relay: their sockets, which are read, and what waits to be sent to
    each."""

    def __init__(self, listener):
        self.listener = listener
        self.clients = {}
        self.reading = set()
        self.outbox = {}
        """Bytes from the launcher not yet taken by each client, sent as the client reads."""
        self.ending = set()
        """Clients whose end (EOF from the launcher) follows their outbox."""
        self.held = set()
        """Clients the launcher was asked to pause (their outbox is over :data:`PAUSE_AT`)."""
        self.closing = set()
        """Clients the launcher closed whose outbox they have not taken yet: closed after it, as
        a socket's close sends what it holds."""
        self.serial = 0

    def drop(self, ident, tell=False):
        """Close client ``ident`` (and tell the launcher when it did not ask)."""
        for group in (self.reading, self.ending, self.held, self.closing):
            group.discard(ident)
        self.outbox.pop(ident, None)
        self.clients.pop(ident).close()
        if tell:
            send(CLOSE, ident)

    def flush(self, ident):
        """Send client ``ident`` what it takes of its outbox now; pause or resume the launcher."""
        box = self.outbox[ident]
        try:
            while box:
                del box[: self.clients[ident].send(box, _socket.MSG_DONTWAIT)]
        except BlockingIOError:
            pass
        except OSError:
            self.drop(ident, tell=True)
            return
        if not box and ident in self.closing:
            self.drop(ident)
            return
        if not box and ident in self.ending:
            self.ending.discard(ident)
            try:
                self.clients[ident].shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        if len(box) > PAUSE_AT and ident not in self.held:
            self.held.add(ident)
            send(PAUSE, ident)
        elif len(box) <= RESUME_AT and ident in self.held:
            self.held.discard(ident)
            send(RESUME, ident)

    def frame(self, kind, ident, payload):
        """Act on one frame from the launcher."""
        if ident not in self.clients:
            return
        if kind == DATA:
            self.outbox[ident] += payload
            self.flush(ident)
        elif kind == EOF:
            self.ending.add(ident)
            self.flush(ident)
        elif kind == CLOSE and self.outbox[ident]:
            self.closing.add(ident)
            self.reading.discard(ident)
        elif kind == CLOSE:
            self.drop(ident)
        elif kind == PAUSE:
            self.reading.discard(ident)
        elif kind == RESUME:
            self.reading.add(ident)

    def accept(self):
        """Take a client that connected, and tell the launcher (past :data:`MAX_CLIENTS`, close
        it)."""
        try:
            fd, _ = self.listener._accept()
        except OSError:
            return
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
        if len(self.clients) >= MAX_CLIENTS:
            sock.close()
            return
        self.serial += 1
        self.clients[self.serial] = sock
        self.outbox[self.serial] = bytearray()
        self.reading.add(self.serial)
        send(OPEN, self.serial)

    def watch(self):
        """A poll object for the launcher's stream, the listener and the clients to read or to
        write, and the client of each descriptor."""
        poller = select.poll()
        poller.register(0, select.POLLIN)
        poller.register(self.listener.fileno(), select.POLLIN)
        owners = {}
        for ident, sock in self.clients.items():
            events = (select.POLLIN if ident in self.reading else 0) | (
                select.POLLOUT if self.outbox[ident] else 0
            )
            if events:
                owners[sock.fileno()] = ident
                poller.register(sock.fileno(), events)
        return poller, owners

    def receive(self, ident):
        """Read what client ``ident`` sent and pass it on."""
        try:
            data = self.clients[ident].recv(CHUNK, _socket.MSG_DONTWAIT)
        except BlockingIOError:  # readiness of a descriptor number reused meanwhile
            return
        except OSError:
            self.drop(ident, tell=True)
            return
        if data:
            send(DATA, ident, data)
        else:
            self.reading.discard(ident)
            send(EOF, ident)


def serve(listener):
    """Relay until the launcher's stream ends."""
    relay = Relay(listener)
    pending = bytearray()
    while True:
        poller, owners = relay.watch()
        ready = dict(poller.poll())
        if 0 in ready:
            try:
                data = os.read(0, CHUNK)
            except OSError:
                data = b""
            if not data:
                return
            pending += data
            for kind, ident, payload in frames(pending):
                relay.frame(kind, ident, payload)
        if listener.fileno() in ready:
            relay.accept()
        for fd, events in ready.items():
            ident = owners.get(fd)
            if ident is None or relay.clients.get(ident) is None:
                continue  # the launcher closed it meanwhile
            if events & select.POLLOUT and relay.outbox[ident]:
                relay.flush(ident)
            if ident in relay.clients and ident in relay.reading and events & ~select.POLLOUT:
                relay.receive(ident)


def main(argv):
    """Listen on the port in ``argv[0]`` and relay over stdin and stdout."""
    try:
        listener = listen(int(argv[0]))
    except OSError as exc:
        sys.stderr.write(f"egress relay: cannot listen on port {argv[0]}: {exc}\n")
        return 1
    try:
        send(LISTENING, 0)
        serve(listener)
    except OSError:  # the launcher's end is gone (a write to it failed)
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
