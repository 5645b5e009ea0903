"""Ours beside the floor and the peers, measured side by side in one run (issue 13).

Run: ``python bench/bench_peers.py [--quick]`` (``bench/run.py`` runs it with everything else and
writes the report). Three measures, each timed in interleaved rounds so that drift in the
machine's load falls on every row alike:

* cold start to the first ``kernel_info`` reply: a local ipykernel (the floor); a plain
  ``docker run`` of ipykernel in the same image with a connection file (a peer); our provisioner
  path (jupyter_client's KernelManager with the Sandboxed Python kernelspec); our launcher path
  (the kernelspec's argv started as a provisioner-unaware client does); the warm standby; and
  llm-sandbox opening a ``SandboxSession`` on the same image (a peer; ready to run, no kernel).
* execute round trip of ``1`` (reply and idle): local, provisioner path, launcher path, plain
  ``docker run``; and llm-sandbox's ``run("1")`` (a new process per run via ``docker exec``).
* tool calls carrying 1 KB and 1 MB of state both ways: ours (``AsyncSandbox.run_tool``) vs a bare
  ``run("1")`` on the same kernel, vs a fresh interpreter per call with a pickled state and markers
  (the way Letta's local sandbox runs tools), vs llm-sandbox with the state in the code and stdout.

Containers this module starts outside our own code (the ``docker run`` peer, llm-sandbox's)
carry the label ``kernel-sandbox-bench=<run id>`` and are removed by :func:`remove_leftovers`.
Nothing here asserts on time; a row that cannot be measured says why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import queue
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import write_connection_file

from bench_execution import agent_tool
from bench_relay import execute
from peer_per_call import per_call_interpreter
from report import Measure, Row, unavailable
from kernel_sandbox.docker.settings import DEFAULT_IMAGE
from kernel_sandbox.execution import AsyncSandbox
from kernel_sandbox.execution.adapters import kernel_spec
from kernel_sandbox.execution.backend import kernel_manager
from kernel_sandbox.kernelspecs import DOCKER_SPEC, install, started_client

HERE = Path(__file__).resolve().parent
PEER_VENV = HERE / ".venv-peers"
PEER_REQUIREMENT = "llm-sandbox[docker]==0.3.46"
LABEL = "kernel-sandbox-bench"
RUN_ID = uuid.uuid4().hex[:12]
KERNEL_UID = 1000  # the image's user "sandbox"
STANDBY_READY_SECONDS = 180.0
ONE_KB, ONE_MB = {"blob": "s" * 1024}, {"blob": "s" * 1024 * 1024}

MEASURES = [
    Measure("cold_start", "Cold start to the first kernel_info reply", "ms",
            "From nothing to the first `kernel_info_reply` on the shell channel (same client code for every "
            "row; the shutdown that follows is not timed)."),
    Measure("execute", "Execute round trip of `1`", "ms",
            "`execute_request` of `1` until both its reply and its idle status arrived, on a started kernel."),
    Measure("tool_1kb", "Tool call with 1 KB of state (both ways)", "ms",
            "A Python function called with a 1 KB dict that it changes and returns; ours against a bare "
            "`run(\"1\")` on the same kernel."),
    Measure("tool_1mb", "Tool call with 1 MB of state (both ways)", "ms",
            "The same with 1 MB of state; ours against a fresh interpreter per call."),
]


# -- timing ------------------------------------------------------------------------------------

async def interleaved(rounds: int, actions: dict[str, Callable[[], Awaitable[float]]], warmup: bool = True) -> dict[str, list[float] | str]:
    """Milliseconds of each action per round, the actions taking turns within every round.

    Each action times itself (so set-up and tear-down around what is measured stay out) and
    returns milliseconds. An action that fails is dropped from later rounds; its entry becomes
    the reason, as text.
    """
    results: dict[str, list[float] | str] = {name: [] for name in actions}

    async def attempt(name: str) -> float | None:
        try:
            return await actions[name]()
        except Exception as exc:  # the table says what failed; the other rows go on
            results[name] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc(file=sys.stderr)
            return None

    if warmup:
        for name in actions:
            await attempt(name)
    for _ in range(rounds):
        for name in actions:
            if isinstance(results[name], list):
                ms = await attempt(name)
                if ms is not None:
                    results[name].append(ms)  # type: ignore[union-attr]
    return results


def row(measure: str, what: str, kind: str, samples: list[float] | str, note: str = "", **goals: Any) -> Row:
    """A row holding the median of ``samples``; ``samples`` as text is the reason it is not available."""
    if isinstance(samples, str) or not samples:
        return unavailable(measure, what, kind, samples or "no sample", **goals)
    extra = {"min": min(samples), "max": max(samples)}
    if len(samples) >= 4:
        extra["p90"] = statistics.quantiles(samples, n=10)[-1]
    return Row(measure, what, kind, statistics.median(samples), n=len(samples), note=note, extra=extra, **goals)


async def first_kernel_info(kc: AsyncKernelClient, alive: Callable[[], Awaitable[bool]], timeout: float = 120) -> None:
    """Wait for the first ``kernel_info_reply``, asking again every half second as jupyter_client does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kc.kernel_info()
        try:
            while True:
                reply = await kc.get_shell_msg(timeout=0.5)
                if reply["msg_type"] == "kernel_info_reply":
                    return
        except queue.Empty:  # not up yet
            if not await alive():
                raise RuntimeError("the kernel ended before answering kernel_info") from None
    raise TimeoutError(f"no kernel_info reply within {timeout} s")


# -- our provisioner path and the local floor --------------------------------------------------

def standby_supported() -> bool:
    """Whether the Docker provisioner has the ``standby`` option of issue 13 item 1."""
    from kernel_sandbox.docker.provisioner import DockerProvisioner

    return "standby" in DockerProvisioner.class_trait_names(config=True)


def provisioner_options(standby: int) -> dict[str, Any]:
    """Provisioner config for the Sandboxed Python kernelspec with ``standby`` kernels kept ready."""
    return {"standby": standby} if standby_supported() else {}


async def manager_cold_start(backend: str, options: dict[str, Any]) -> float:
    """Milliseconds from ``start_kernel`` to the first kernel_info reply; the kernel is then shut down."""
    km = kernel_manager(kernel_spec(backend, options))
    started = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await first_kernel_info(kc, km.is_alive)
        return (time.perf_counter() - started) * 1000
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def standby_ready() -> None:
    """Wait (untimed) until this process's pool holds a ready standby of the ``standby=1`` configuration.

    The first launch of a configuration fills its pool: when there is none, one untimed start does it.
    """
    from kernel_sandbox.provisioners.standby import POOL

    if not any(not s.stopped for s in POOL.standbys()):
        await manager_cold_start("docker", provisioner_options(1))
    deadline = time.monotonic() + STANDBY_READY_SECONDS
    while not any(s.started.done() and s.started.result() and s.alive() for s in POOL.standbys()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no standby was ready within {STANDBY_READY_SECONDS:g} s: {POOL.standbys()}")
        await asyncio.sleep(0.05)


async def standby_cold_start(session_name: str | None = None) -> float:
    """The provisioner path with ``standby=1``: once a standby is ready (not timed), time its adoption.

    With ``session_name`` the launch carries ``JPY_SESSION_NAME`` as JupyterLab's does for a notebook,
    so the adoption includes giving the kernel that name (one silent execute).
    """
    from kernel_sandbox.privdir import ADOPTED

    await standby_ready()
    km = kernel_manager(kernel_spec("docker", provisioner_options(1)))
    env = {**os.environ, "JPY_SESSION_NAME": session_name} if session_name else None
    started = time.perf_counter()
    await km.start_kernel(**({"env": env} if env else {}))
    kc = km.client()
    kc.start_channels()
    try:
        await first_kernel_info(kc, km.is_alive)
        elapsed = (time.perf_counter() - started) * 1000
        if not (km.provisioner.private / ADOPTED).exists():
            raise RuntimeError("the launch started cold although a standby was ready")
        return elapsed
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def standby_done() -> None:
    """Stop this process's standbys and wait for their containers (the rest of the run gets the machine)."""
    from kernel_sandbox.provisioners.standby import POOL

    await asyncio.to_thread(POOL.clear, 60)


# -- peer: a plain `docker run` of ipykernel ---------------------------------------------------

class PlainDockerRun:
    """A peer: ``docker run`` of ipykernel in the kernel image with a connection file.

    As a user without kernel-sandbox would do it with no network: ``--network none``, the
    connection file and ipykernel's IPC sockets in a directory bind-mounted from the host.
    The container carries this run's benchmark label and is removed on :meth:`stop`.
    """

    def __init__(self, image: str = DEFAULT_IMAGE) -> None:
        self.image = image
        self.dir = tempfile.mkdtemp(prefix="ks-bench-docker-run-")
        os.chown(self.dir, KERNEL_UID, KERNEL_UID)
        key = secrets.token_hex(16)
        ports = {name: i for i, name in enumerate(("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"), 1)}
        self.info = {**ports, "transport": "ipc", "ip": f"{self.dir}/k", "key": key, "signature_scheme": "hmac-sha256"}
        inside = {**self.info, "ip": "/conn/k"}
        Path(self.dir, "kernel.json").write_text(json.dumps(inside))
        os.chown(Path(self.dir, "kernel.json"), KERNEL_UID, KERNEL_UID)
        self.container: str | None = None
        self.kc: AsyncKernelClient | None = None

    async def start(self) -> float:
        """Run the container and return milliseconds to the first kernel_info reply."""
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            "docker", "run", "-d", "--rm", "--network", "none", "--label", f"{LABEL}={RUN_ID}",
            "-v", f"{self.dir}:/conn", self.image, "python", "-m", "ipykernel_launcher", "-f", "/conn/kernel.json",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"docker run failed: {err.decode(errors='replace').strip()}")
        self.container = out.decode().strip()
        self.kc = AsyncKernelClient()
        self.kc.load_connection_info(self.info)
        self.kc.start_channels(hb=False)
        await first_kernel_info(self.kc, self.alive)
        return (time.perf_counter() - started) * 1000

    async def alive(self) -> bool:
        proc = await asyncio.create_subprocess_exec(
            "docker", "inspect", "-f", "{{.State.Running}}", self.container or "", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        out, _ = await proc.communicate()
        return out.strip() == b"true"

    async def stop(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.container:
            proc = await asyncio.create_subprocess_exec("docker", "rm", "-f", self.container, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


async def docker_run_cold_start() -> float:
    peer = PlainDockerRun()
    try:
        return await peer.start()
    finally:
        await peer.stop()


def remove_leftovers() -> int:
    """Remove the containers this benchmark run labelled (and only those) and its kernelspec copies; return how many containers."""
    while Launcher.prefixes:
        shutil.rmtree(Launcher.prefixes.pop(), ignore_errors=True)
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL}={RUN_ID}"], capture_output=True, text=True, check=False
    ).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)
    return len(ids)


# -- our launcher path: the kernelspec's argv, as a provisioner-unaware client starts it ---------

class Launcher:
    """The Sandboxed Python kernelspec's argv started as VS Code or PyCharm do.

    ``write_connection_file`` on 127.0.0.1 and a subprocess of the installed kernelspec's argv,
    with jupyter_client's placeholders filled in; no provisioner involved.
    """

    prefixes: list[str] = []  # installed kernelspecs, removed by remove_leftovers()

    def __init__(self, spec_dir: str, argv: list[str]) -> None:
        self.spec_dir, self.argv = spec_dir, argv
        self.dir = ""
        self.proc: asyncio.subprocess.Process | None = None
        self.kc: AsyncKernelClient | None = None

    @staticmethod
    def find() -> tuple[Launcher | None, str]:
        """A launcher for the installed kernelspec, or None and why not."""
        prefix = tempfile.mkdtemp(prefix="ks-bench-spec-")
        spec_dir = install(DOCKER_SPEC, prefix=prefix)
        Launcher.prefixes.append(prefix)
        argv = json.loads(Path(spec_dir, "kernel.json").read_text())["argv"]
        if not any("kernel_sandbox.launch" in arg for arg in argv):
            return None, (
                f"the Sandboxed Python kernelspec's argv is `{' '.join(argv)}` in this checkout (the launcher is not "
                "on main yet); started by a provisioner-unaware client it runs an unsandboxed local kernel"
            )
        return Launcher(spec_dir, argv), ""

    def command(self, connection_file: str) -> list[str]:
        names = {"connection_file": connection_file, "resource_dir": self.spec_dir, "prefix": sys.prefix}
        cmd = [arg.format_map(_Keep(names)) for arg in self.argv]
        if cmd[0] in {"python", f"python{sys.version_info[0]}", "python%i.%i" % sys.version_info[:2]}:
            cmd[0] = sys.executable
        return cmd

    async def start(self) -> float:
        """Start the argv and return milliseconds to the first kernel_info reply."""
        started = time.perf_counter()
        self.dir = tempfile.mkdtemp(prefix="ks-bench-launcher-")
        fname, info = write_connection_file(
            os.path.join(self.dir, f"kernel-{uuid.uuid4()}.json"), ip="127.0.0.1", key=uuid.uuid4().hex.encode()
        )
        stderr = Path(self.dir, "stderr.txt")
        with stderr.open("wb") as sink:
            self.proc = await asyncio.create_subprocess_exec(*self.command(fname), stdout=subprocess.DEVNULL, stderr=sink)
        self.kc = AsyncKernelClient()
        self.kc.load_connection_file(fname)
        self.kc.start_channels(hb=False)
        try:
            await first_kernel_info(self.kc, self.alive)
        except RuntimeError:
            tail = stderr.read_text(errors="replace")[-500:].strip()
            raise RuntimeError(f"the launcher exited with status {self.proc.returncode}: {tail}") from None
        return (time.perf_counter() - started) * 1000

    async def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self) -> None:
        if self.kc is not None:
            self.kc.shutdown()
            self.kc.stop_channels()
        if self.proc is not None and self.proc.returncode is None:
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    self.proc.send_signal(sig)
                try:
                    await asyncio.wait_for(self.proc.wait(), 15)
                    break
                except asyncio.TimeoutError:
                    continue
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class _Keep(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


async def launcher_cold_start(found: Launcher) -> float:
    launcher = Launcher(found.spec_dir, found.argv)
    try:
        return await launcher.start()
    finally:
        await launcher.stop()


# -- peer: a fresh interpreter per tool call (Letta's local sandbox) ---------------------------

async def per_call_tool(state: dict) -> float:
    """Milliseconds of one tool call through a fresh interpreter (:mod:`peer_per_call`), result checked."""
    started = time.perf_counter()
    result, new_state = await per_call_interpreter(agent_tool, state)
    elapsed = (time.perf_counter() - started) * 1000
    if result != len(state["blob"]) or new_state.get("calls") != state.get("calls", 0) + 1:
        raise RuntimeError("the per-call interpreter returned the wrong result")
    return elapsed


# -- peer: llm-sandbox's SandboxSession on the same image ---------------------------------------

class LlmSandbox:
    """llm-sandbox (a peer users choose today), driven in its own virtualenv by ``peer_llm_sandbox.py``."""

    def __init__(self, image: str = DEFAULT_IMAGE) -> None:
        self.image = image
        self.proc: asyncio.subprocess.Process | None = None
        self.version = ""
        self.close_ms: list[float] = []

    @staticmethod
    def ensure_venv() -> str:
        """Create bench/.venv-peers with llm-sandbox if needed; return why it is not usable, or ""."""
        python = PEER_VENV / "bin" / "python"
        check = [str(python), "-c", "import llm_sandbox, docker"]
        if python.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
            return ""
        try:
            subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True, capture_output=True, timeout=120)
            subprocess.run([str(python), "-m", "pip", "install", "-q", PEER_REQUIREMENT], check=True, capture_output=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            return f"could not install {PEER_REQUIREMENT} into {PEER_VENV}: {exc} {detail.decode(errors='replace')[-300:]}"
        return ""

    async def call(self, op: str, **params: Any) -> dict:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps({"op": op, **params}) + "\n").encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 300)
        if not line:
            raise RuntimeError("the llm-sandbox worker ended")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    async def start(self) -> tuple[str, float | None]:
        """Start the worker and its session; return ("", open ms) or (why not available, None)."""
        why = await asyncio.to_thread(self.ensure_venv)
        if why:
            return why, None
        self.proc = await asyncio.create_subprocess_exec(
            str(PEER_VENV / "bin" / "python"), str(HERE / "peer_llm_sandbox.py"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, limit=2**24,
        )
        try:
            answer = await self.call(
                "init", image=self.image, label=[LABEL, RUN_ID],
                tool_source=inspect.getsource(agent_tool), tool_name=agent_tool.__name__,
            )
        except Exception as exc:
            await self.stop()
            return f"llm-sandbox could not open a session on {self.image}: {exc}", None
        self.version = answer["version"]
        return "", answer["open_ms"]

    async def open(self) -> float:
        return (await self.call("open"))["ms"]

    async def run(self, code: str) -> float:
        return (await self.call("run", code=code))["ms"]

    async def tool(self, state: dict) -> float:
        return (await self.call("tool", state=state))["ms"]

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                self.close_ms = (await self.call("exit"))["close_ms"]
            except Exception:  # the worker is gone; remove_leftovers() removes its containers
                pass
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except asyncio.TimeoutError:
                self.proc.kill()
        self.proc = None


# -- the three measures -------------------------------------------------------------------------

async def measure(cold_rounds: int, exec_rounds: int, tool_rounds: int) -> list[Row]:
    """Measure cold start, execute and tool calls side by side and return the rows."""
    rows: list[Row] = []
    launcher, launcher_why = Launcher.find()
    llm = LlmSandbox()
    llm_why, _ = await llm.start()
    llm_label = f"llm-sandbox {llm.version} SandboxSession (peer)" if llm.version else "llm-sandbox SandboxSession (peer)"
    llm_note = "same image, root, --network none, skip_environment_setup (its setup upgrades pip from PyPI)"
    try:
        rows += await cold_start_rows(cold_rounds, launcher, launcher_why, llm, llm_why, llm_label, llm_note)

        # execute round trip
        rows += await execute_rows(exec_rounds, launcher, launcher_why, llm, llm_why, llm_label)

        # tool calls
        async with AsyncSandbox() as sb:
            async def timed(coro_fn: Callable[[], Awaitable[Any]]) -> float:
                started = time.perf_counter()
                await coro_fn()
                return (time.perf_counter() - started) * 1000

            actions = {
                "bare": lambda: timed(lambda: sb.run("1")),
                "ours kb": lambda: timed(lambda: sb.run_tool(agent_tool, agent_state=ONE_KB)),
                "ours mb": lambda: timed(lambda: sb.run_tool(agent_tool, agent_state=ONE_MB)),
                "letta kb": lambda: per_call_tool(ONE_KB),
                "letta mb": lambda: per_call_tool(ONE_MB),
            }
            if not llm_why:
                actions["llm kb"] = lambda: llm.tool(ONE_KB)
                actions["llm mb"] = lambda: llm.tool(ONE_MB)
            tools = await interleaved(tool_rounds, actions)
        letta = "fresh interpreter per call, pickled state + markers (peer: Letta's local sandbox)"
        letta_note = "this host's Python, as Letta runs it; our own equivalent of its script"
        llm_tool_note = "state as JSON in the code, back on stdout; a new process per call via docker exec"
        bare = "bare `run(\"1\")`, same kernel (reference)"
        for size, m in (("kb", "tool_1kb"), ("mb", "tool_1mb")):
            ours_goal = ({"goal_ratio": 1.0, "goal": "≤ 1.0× a bare execute", "reference": bare} if size == "kb"
                         else {"goal_max": 20.0, "goal": "p50 ≤ 20 ms (and ≥ 5× faster than the per-call interpreter: see below)",
                               "reference": bare})
            rows += [
                row(m, bare, "ours", tools["bare"], "AsyncSandbox.run on the Docker kernel"),
                row(m, "AsyncSandbox.run_tool (ours)", "ours", tools[f"ours {size}"], **ours_goal),
                row(m, letta, "peer", tools[f"letta {size}"], letta_note, reference="AsyncSandbox.run_tool (ours)"),
            ]
            rows.append(row(m, llm_label, "peer", tools[f"llm {size}"], llm_tool_note, reference="AsyncSandbox.run_tool (ours)")
                        if not llm_why else unavailable(m, llm_label, "peer", llm_why))
        speedup = _speedup(tools["letta mb"], tools["ours mb"])
        rows.append(Row("tool_1mb", "speed-up of ours over the per-call interpreter", "ours", speedup, stat="ratio of p50s",
                        goal_min=5.0, goal="≥ 5×", note="per-call interpreter p50 ÷ run_tool p50", chart=False))
    finally:
        await llm.stop()
    if llm.close_ms:
        rows.append(Row("cold_start", f"{llm_label}: close", "peer", statistics.median(llm.close_ms), n=len(llm.close_ms),
                        note="informational: SandboxSession.close (stop + remove), not a start", chart=False))
    return rows


def _speedup(peer: list[float] | str, ours: list[float] | str) -> float | None:
    if isinstance(peer, str) or isinstance(ours, str) or not peer or not ours:
        return None
    return statistics.median(peer) / statistics.median(ours)


async def cold_start_rows(rounds: int, launcher: Launcher | None, launcher_why: str, llm: LlmSandbox | None = None,
                          llm_why: str = "", llm_label: str = "", llm_note: str = "") -> list[Row]:
    """Cold starts of every path and the warm standby, interleaved (llm-sandbox's session open when ``llm``)."""
    standby = standby_supported()
    actions: dict[str, Callable[[], Awaitable[float]]] = {
        "local": lambda: manager_cold_start("local", {"env": {}}),
        "docker run": docker_run_cold_start,
        "provisioner": lambda: manager_cold_start("docker", provisioner_options(0)),
    }
    if launcher:
        actions["launcher"] = lambda: launcher_cold_start(launcher)
    if standby:
        actions["standby"] = standby_cold_start
        actions["standby named"] = lambda: standby_cold_start("/home/me/notebooks/analysis.ipynb")
    if llm is not None and not llm_why:
        actions["llm-sandbox"] = llm.open
    try:
        cold = await interleaved(rounds, actions)
    finally:
        if standby:
            await standby_done()
    m = "cold_start"
    floor = "local ipykernel (floor)"
    rows = [
        row(m, floor, "floor", cold["local"], "this host's interpreter and site-packages"),
        row(m, "plain `docker run` of ipykernel (peer)", "peer", cold["docker run"], "--network none, connection file and IPC sockets in a bind mount",
            reference=floor),
        row(m, "provisioner path (KernelManager + Sandboxed Python)", "ours", cold["provisioner"],
            "standby=0" if standby else "", reference=floor),
    ]
    rows.append(row(m, "launcher path (kernelspec argv, no provisioner)", "ours", cold["launcher"], reference=floor)
                if launcher else unavailable(m, "launcher path (kernelspec argv, no provisioner)", "ours", launcher_why))
    goal = {"goal_ratio": 0.25, "goal": "≤ 0.25× local ipykernel", "reference": floor}
    what, named = "warm standby (provisioner, standby=1)", "warm standby, session named (as JupyterLab starts a notebook's kernel)"
    if standby:
        rows.append(row(m, what, "ours", cold["standby"], "a ready standby adopted (waiting for the refill is not timed)", **goal))
        rows.append(row(m, named, "ours", cold["standby named"],
                        "JPY_SESSION_NAME passed: the adoption adds one silent execute that names the kernel", **goal))
    else:
        rows.append(unavailable(m, what, "ours", "the Docker provisioner has no `standby` option (issue 13 item 1)", **goal))
    rows.append(unavailable(m, "warm standby through the launcher path", "ours",
                            "a provisioner-unaware client runs the kernelspec's argv itself, one new launcher per kernel: no "
                            "process of that client keeps standbys, so this path starts cold", chart=False))
    if llm is not None:
        rows.append(row(m, llm_label, "peer", cold["llm-sandbox"], f"session open, no kernel; {llm_note}", reference=floor)
                    if not llm_why else unavailable(m, llm_label, "peer", llm_why))
    return rows


async def execute_rows(rounds: int, launcher: Launcher | None, launcher_why: str, llm: LlmSandbox, llm_why: str, llm_label: str) -> list[Row]:
    """Execute round trips of ``1`` on started kernels of every path, interleaved."""
    local_km = kernel_manager(kernel_spec("local", {"env": {}}))
    docker_km = kernel_manager(kernel_spec("docker", provisioner_options(0)))
    peer = PlainDockerRun()
    own_launcher = Launcher(launcher.spec_dir, launcher.argv) if launcher else None
    clients: dict[str, AsyncKernelClient] = {}
    async with contextlib.AsyncExitStack() as stack:
        for name, km in (("local", local_km), ("provisioner", docker_km)):
            clients[name] = await stack.enter_async_context(started_client(km))
        stack.push_async_callback(peer.stop)
        await peer.start()
        clients["docker run"] = peer.kc  # type: ignore[assignment]
        if own_launcher:
            stack.push_async_callback(own_launcher.stop)
            await own_launcher.start()
            clients["launcher"] = own_launcher.kc  # type: ignore[assignment]
        for name in ("docker run", "launcher"):
            if name in clients:
                await clients[name].wait_for_ready(timeout=120)

        async def timed_execute(kc: AsyncKernelClient) -> float:
            started = time.perf_counter()
            await execute(kc, "1")
            return (time.perf_counter() - started) * 1000

        actions: dict[str, Callable[[], Awaitable[float]]] = {
            name: (lambda kc=kc: timed_execute(kc)) for name, kc in clients.items()
        }
        if not llm_why:
            actions["llm-sandbox"] = lambda: llm.run("1")
        results = await interleaved(rounds, actions)
    m, floor = "execute", "local ipykernel (floor)"
    launcher_goal = {"reference": "provisioner path", "goal_ratio": 1.1, "goal": "≤ 1.1× provisioner path"}
    rows = [
        row(m, floor, "floor", results["local"]),
        row(m, "provisioner path", "ours", results["provisioner"], reference=floor, goal_ratio=1.05, goal="≤ 1.05× local"),
        row(m, "launcher path", "ours", results["launcher"], **launcher_goal)
        if own_launcher else unavailable(m, "launcher path", "ours", launcher_why, **launcher_goal),
        row(m, "plain `docker run` of ipykernel (peer)", "peer", results["docker run"], reference=floor),
    ]
    rows.append(row(m, llm_label, "peer", results["llm-sandbox"], "SandboxSession.run: a new process per run", reference=floor)
                if not llm_why else unavailable(m, llm_label, "peer", llm_why))
    return rows


async def main(quick: bool) -> list[Row]:
    """Run the three measures (few rounds with ``quick``) and print the rows."""
    from report import judge, markdown

    try:
        rows = await measure(*((2, 20, 5) if quick else (10, 200, 50)))
    finally:
        remove_leftovers()
    print(markdown(MEASURES, judge(rows)))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke run")
    warnings.simplefilter("ignore")
    asyncio.run(main(parser.parse_args().quick))
