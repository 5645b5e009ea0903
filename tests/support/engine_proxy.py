"""A proxy to the Docker engine's socket that a test can cut or stall, for one launcher or kernel manager
(pointed at it with DOCKER_HOST) while dockerd itself, shared with others, is never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time


class EngineProxy:
    """A Unix-socket proxy to the real engine socket, run in a thread: ``pass``, ``cut`` or ``stalled``."""

    def __init__(self, upstream: str = "/var/run/docker.sock") -> None:
        self.upstream = upstream
        self.dir = tempfile.mkdtemp(prefix="ksattack-proxy-")
        self.path = os.path.join(self.dir, "docker.sock")
        self.mode = "pass"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX)
        self._server.bind(self.path)
        self._server.listen(128)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.mode == "cut":
                client.close()
                continue
            try:
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            while self.mode == "stalled":
                time.sleep(0.05)
            if not data or self.mode == "cut":
                for sock in (source, sink):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            try:
                sink.sendall(data)
            except OSError:
                return

    def set(self, mode: str) -> None:
        self.mode = mode
        if mode == "cut":
            with self._lock:
                for sock in self._sockets:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def close(self) -> None:
        self.mode = "cut"
        self._server.close()
        self.set("cut")
        shutil.rmtree(self.dir, ignore_errors=True)
