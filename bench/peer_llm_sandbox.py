"""Worker for the llm-sandbox peer: runs in the benchmark's own virtualenv (bench/.venv-peers), not the project's.

``bench_peers.LlmSandbox`` starts it and sends one JSON object per line on stdin; it answers one
JSON object per line on stdout, with the milliseconds it measured around llm-sandbox's own calls.
It never pulls: the image must exist locally (checked first), and the Docker client it hands to
llm-sandbox refuses to pull. Every container it creates carries the benchmark run's label and
``--network none``. Operations:

* ``init`` {image, label, tool_source, tool_name}: open the session used for the calls below.
* ``open``: time a fresh ``SandboxSession`` open (the peer's cold start); it is closed in the background.
* ``run`` {code}: time ``session.run(code)``.
* ``tool`` {state}: time a tool call that carries ``state`` both ways in the code and its stdout.
* ``exit``: close everything, report each close's duration.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from importlib.metadata import version

import docker
from llm_sandbox import SandboxSession

TOOL_CALL = """import json
{tool_source}
state = json.loads({state!r})
result = {tool_name}(state)
print(json.dumps({{"result": result, "state": state}}))
"""


class NoPull(Exception):
    """Raised instead of pulling an image: the benchmark never reaches a registry."""


def no_pull(*args: object, **kwargs: object) -> None:
    raise NoPull(f"the benchmark never pulls images (asked for {args} {kwargs})")


class Worker:
    def __init__(self) -> None:
        self.client = docker.from_env()
        self.client.images.pull = no_pull  # llm-sandbox pulls when an image is missing: never here
        self.session = None
        self.closers: list[threading.Thread] = []
        self.close_ms: list[float] = []

    def new_session(self) -> SandboxSession:
        return SandboxSession(
            backend="docker",
            client=self.client,
            image=self.image,
            lang="python",
            keep_template=True,
            skip_environment_setup=True,  # its setup upgrades pip from PyPI: no network here
            runtime_configs={"labels": self.labels, "network_mode": "none", "command": ["sleep", "infinity"]},
        )

    def close_later(self, session: SandboxSession) -> None:
        def close() -> None:
            started = time.perf_counter()
            session.close()
            self.close_ms.append((time.perf_counter() - started) * 1000)

        thread = threading.Thread(target=close)
        thread.start()
        self.closers.append(thread)

    def init(self, image: str, label: list[str], tool_source: str, tool_name: str) -> dict:
        self.client.images.get(image)  # ImageNotFound ends the worker with that reason
        self.image, self.labels = image, {label[0]: label[1]}
        self.tool_source, self.tool_name = tool_source, tool_name
        self.session = self.new_session()
        started = time.perf_counter()
        self.session.open()
        return {"open_ms": (time.perf_counter() - started) * 1000, "version": version("llm-sandbox")}

    def open(self) -> dict:
        session = self.new_session()
        started = time.perf_counter()
        session.open()
        elapsed = (time.perf_counter() - started) * 1000
        self.close_later(session)
        return {"ms": elapsed}

    def run(self, code: str) -> dict:
        started = time.perf_counter()
        output = self.session.run(code)
        elapsed = (time.perf_counter() - started) * 1000
        if output.exit_code != 0:
            raise RuntimeError(f"run failed with exit code {output.exit_code}: {output.stderr[-500:]}")
        return {"ms": elapsed}

    def tool(self, state: dict) -> dict:
        started = time.perf_counter()
        code = TOOL_CALL.format(tool_source=self.tool_source, tool_name=self.tool_name, state=json.dumps(state))
        output = self.session.run(code)
        answer = json.loads(output.stdout)
        elapsed = (time.perf_counter() - started) * 1000
        if answer["state"].get("calls") != state.get("calls", 0) + 1:
            raise RuntimeError(f"the tool's state did not come back: {output.stdout[:200]!r} {output.stderr[-500:]!r}")
        return {"ms": elapsed}

    def exit(self) -> dict:
        if self.session is not None:
            self.close_later(self.session)
        for thread in self.closers:
            thread.join()
        return {"close_ms": self.close_ms}


def main() -> None:
    worker = Worker()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            answer = getattr(worker, op)(**request)
        except Exception as exc:  # reported to the harness, which shows it in the table
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
        if op == "exit":
            break


if __name__ == "__main__":
    main()
