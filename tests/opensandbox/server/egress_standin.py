"""STAND-IN for OpenSandbox's egress sidecar: answers /healthz and /policy on port 18080.

It ENFORCES NOTHING. It exists only so that the published server, configured with an egress
image, accepts a sandbox with a ``networkPolicy`` (without one it answers 400). The real sidecar
(which filters DNS and traffic) cannot be pulled here. The policy it was started with comes from
the environment (``OPENSANDBOX_EGRESS_RULES``); /policy returns it, and accepts updates, each of
which it also records: ``GET /policy/history`` lists ``{"method", "body"}`` of every update in
order, so a test can see what the server forwarded (not what a real sidecar would enforce).
"""

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POLICY = {"raw": os.environ.get("OPENSANDBOX_EGRESS_RULES", "{}")}
HISTORY: list[dict[str, str]] = []


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, b"ok", "text/plain")
        elif self.path == "/policy/history":
            self._answer(200, json.dumps(HISTORY).encode())
        elif self.path.startswith("/policy"):
            self._answer(200, POLICY["raw"].encode())
        else:
            self._answer(404, b'{"message": "not found"}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.path.startswith("/policy"):
            POLICY["raw"] = self.rfile.read(min(length, 1 << 20)).decode(errors="replace")
            HISTORY.append({"method": self.command, "body": POLICY["raw"]})
            self._answer(200, POLICY["raw"].encode())
        else:
            self._answer(404, b'{"message": "not found"}')

    do_PUT = do_PATCH = do_POST

    def log_message(self, *args: object) -> None:
        pass


signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # PID 1 ignores SIGTERM without a handler
ThreadingHTTPServer(("0.0.0.0", 18080), Handler).serve_forever()
