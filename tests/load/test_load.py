"""Load on the public API: many tool calls, many concurrent sessions, many kernel start/stop cycles.

Each test warms up first (one kernel started and stopped, or a few calls), counts this process's
resources (tests/support/resource_counts.py), runs the load and waits until the counts are back where they
started: processes, containers, networks, volumes and host paths exactly, open fds, threads and
resident memory within the bounds below. Sizes: tests/load/conftest.py (``--full-size`` for the
issue's numbers: 500 calls, 20 sessions, 200 cycles per path).

Every result must carry a value only its caller could produce (a fresh nonce, the session's own
secret and their digest), so a result delivered to the wrong caller or session fails the test.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from jupyter_client.manager import KernelManager
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from jupyter_core.paths import jupyter_runtime_dir

from kernel_sandbox.execution import AsyncSandbox, Sandbox
from support.resource_counts import MiB, Bounds, Counts, ResourceWatch

pytestmark = [pytest.mark.docker, pytest.mark.security("load", "sessions")]

CALL_TIMEOUT = 120.0
START_TIMEOUT = 240.0
SECRET_FILE = "/tmp/load-session-secret"

EXECUTOR_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Threads asyncio's default executor may keep idle (the provisioners call the engine through it)."""
SESSION_BOUNDS = Bounds(fds=2, threads=1, rss=16 * MiB)
"""Growth allowed while one session makes its calls (its kernel already running)."""
CYCLE_BOUNDS = Bounds(fds=2, threads=EXECUTOR_THREADS, rss=32 * MiB)
"""Growth allowed over a whole test, after its warm-up: idle executor threads and allocator slack.

A leak of one fd per kernel or session shows at either size; of one thread, where the load
exceeds the executor's size; of 160 KiB of memory per cycle, at the full size.
"""


def probe(nonce: str, i: int) -> dict:
    """The tool of the load tests: echo the caller's nonce with the session's secret and a digest."""
    import hashlib

    with open("/tmp/load-session-secret") as handle:
        secret = handle.read()
    print(nonce)
    digest = hashlib.sha256(f"{secret}:{nonce}:{i}".encode()).hexdigest()
    return {"nonce": nonce, "i": i, "session": secret, "digest": digest}


def expected(secret: str, nonce: str, i: int) -> dict[str, Any]:
    digest = hashlib.sha256(f"{secret}:{nonce}:{i}".encode()).hexdigest()
    return {"nonce": nonce, "i": i, "session": secret, "digest": digest}


def mismatch(result: Any, secret: str, nonce: str, i: int) -> str | None:
    """Why ``result`` is not the answer to this caller's call ``i`` (None when it is)."""
    if result.status != "success":
        return f"call {i}: {result.status}: {result.error}"
    if result.func_return != expected(secret, nonce, i):
        return f"call {i}: expected nonce {nonce} of session {secret[:8]}, got {result.func_return!r}"
    if result.stdout != nonce + "\n":
        return f"call {i}: stdout {result.stdout!r} is not this call's ({nonce!r})"
    return None


def figures(record_property: Any, size: Any, operations: int, before: Counts, after: Counts,
            bounds: Bounds) -> None:
    record_property("size", size.name)
    record_property("operations", operations)
    record_property("before", before.describe())
    record_property("after", after.describe())
    record_property("bounds", bounds.describe())


class Deadline:
    """A wall-clock budget for a loop, failing with what was done when it runs out."""

    def __init__(self, seconds: float, what: str) -> None:
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.what = what

    def check(self, done: int, total: int) -> None:
        if time.monotonic() > self.end:
            pytest.fail(f"{self.what}: only {done} of {total} done after {self.seconds:g} s (machine overloaded or a hang)")


def test_sequential_tool_calls_on_one_session(watch: ResourceWatch, load_size: Any, record_property: Any) -> None:
    """Hundreds of tool calls on one session, each answering its own caller, leave nothing behind."""
    n = load_size.sequential_calls
    sandbox_cycle(-1)
    before = watch.snapshot()
    deadline = Deadline(load_size.test_timeout - 30, "sequential tool calls")
    with Sandbox(timeout=CALL_TIMEOUT, start_timeout=START_TIMEOUT) as sb:
        secret = secrets.token_hex(16)
        assert sb.run(f"open({SECRET_FILE!r}, 'w').write({secret!r})").error is None
        for i in range(10):
            nonce = secrets.token_hex(8)
            assert (problem := mismatch(sb.run_tool(probe, {"nonce": nonce, "i": i}), secret, nonce, i)) is None, problem
        in_session = watch.snapshot()
        for i in range(n):
            deadline.check(i, n)
            nonce = secrets.token_hex(8)
            result = sb.run_tool(probe, {"nonce": nonce, "i": i})
            assert (problem := mismatch(result, secret, nonce, i)) is None, problem
        watch.settle(in_session, SESSION_BOUNDS, timeout=10)
    after = watch.settle(before, CYCLE_BOUNDS)
    figures(record_property, load_size, n, before, after, CYCLE_BOUNDS)


async def test_concurrent_sessions_keep_results_apart(watch: ResourceWatch, load_size: Any, record_property: Any) -> None:
    """Concurrent sessions with concurrent callers: every result reaches its own caller, nothing leaks."""
    async with AsyncSandbox(timeout=CALL_TIMEOUT, start_timeout=START_TIMEOUT) as warm:
        await warm.run(f"open({SECRET_FILE!r}, 'w').write('w')")
        await warm.run_tool(probe, {"nonce": "warm", "i": 0})
    before = watch.snapshot()
    sessions = [AsyncSandbox(timeout=CALL_TIMEOUT, start_timeout=START_TIMEOUT) for _ in range(load_size.sessions)]
    problems: list[str] = []
    calls = 0

    async def caller(sb: AsyncSandbox, secret: str, who: str) -> None:
        nonlocal calls
        for i in range(load_size.calls_per_caller):
            nonce = f"{who}-{secrets.token_hex(8)}"
            result = await sb.run_tool(probe, {"nonce": nonce, "i": i})
            calls += 1
            if (problem := mismatch(result, secret, nonce, i)) is not None:
                problems.append(f"{who} {problem}")

    async def session(index: int, sb: AsyncSandbox) -> None:
        secret = secrets.token_hex(16)
        execution = await sb.run(f"open({SECRET_FILE!r}, 'w').write({secret!r})")
        assert execution.error is None, execution.error
        await asyncio.gather(*(caller(sb, secret, f"s{index}c{c}") for c in range(load_size.callers_per_session)))

    try:
        await asyncio.wait_for(asyncio.gather(*(sb.start() for sb in sessions)), START_TIMEOUT)
        await asyncio.wait_for(asyncio.gather(*(session(i, sb) for i, sb in enumerate(sessions))),
                               load_size.test_timeout - START_TIMEOUT - 30)
    finally:
        await asyncio.gather(*(sb.close() for sb in sessions), return_exceptions=True)
    assert not problems, f"{len(problems)} of {calls} results wrong or crossed: {problems[:5]}"
    total = load_size.sessions * load_size.callers_per_session * load_size.calls_per_caller
    assert calls == total, f"only {calls} of {total} calls ran"
    after = await watch.settle_async(before, CYCLE_BOUNDS)
    figures(record_property, load_size, calls, before, after, CYCLE_BOUNDS)


def test_concurrent_threads_on_sync_sandboxes(watch: ResourceWatch, load_size: Any, record_property: Any) -> None:
    """The synchronous API from a thread pool: sessions and callers in threads, results kept apart."""
    sandbox_cycle(-1)
    before = watch.snapshot()
    problems: list[str] = []
    done = [0]
    lock = threading.Lock()

    def caller(sb: Sandbox, secret: str, who: str) -> None:
        for i in range(load_size.calls_per_caller):
            nonce = f"{who}-{secrets.token_hex(8)}"
            problem = mismatch(sb.run_tool(probe, {"nonce": nonce, "i": i}), secret, nonce, i)
            with lock:
                done[0] += 1
                if problem is not None:
                    problems.append(f"{who} {problem}")

    def session(index: int, pool: ThreadPoolExecutor) -> None:
        secret = secrets.token_hex(16)
        with Sandbox(timeout=CALL_TIMEOUT, start_timeout=START_TIMEOUT) as sb:
            assert sb.run(f"open({SECRET_FILE!r}, 'w').write({secret!r})").error is None
            callers = [pool.submit(caller, sb, secret, f"t{index}c{c}") for c in range(load_size.callers_per_session)]
            for future in callers:
                future.result(timeout=load_size.test_timeout)

    workers = load_size.sessions * (1 + load_size.callers_per_session)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="load") as pool:
        sessions = [pool.submit(session, i, pool) for i in range(load_size.sessions)]
        for future in sessions:
            future.result(timeout=load_size.test_timeout)
    assert not problems, f"{len(problems)} of {done[0]} results wrong or crossed: {problems[:5]}"
    total = load_size.sessions * load_size.callers_per_session * load_size.calls_per_caller
    assert done[0] == total, f"only {done[0]} of {total} calls ran"
    after = watch.settle(before, CYCLE_BOUNDS)
    figures(record_property, load_size, total, before, after, CYCLE_BOUNDS)


def sandbox_cycle(i: int) -> None:
    nonce = secrets.token_hex(8)
    with Sandbox(timeout=CALL_TIMEOUT, start_timeout=START_TIMEOUT) as sb:
        assert sb.run(f"open({SECRET_FILE!r}, 'w').write('c{i}')").error is None
        assert (problem := mismatch(sb.run_tool(probe, {"nonce": nonce, "i": i}), f"c{i}", nonce, i)) is None, problem


def test_start_stop_cycles_through_sandbox(watch: ResourceWatch, load_size: Any, record_property: Any) -> None:
    """Kernels started and stopped through Sandbox, one after another, leave nothing behind."""
    sandbox_cycle(-1)
    before = watch.snapshot()
    deadline = Deadline(load_size.test_timeout - 30, "Sandbox start/stop cycles")
    for i in range(load_size.cycles):
        deadline.check(i, load_size.cycles)
        sandbox_cycle(i)
    after = watch.settle(before, CYCLE_BOUNDS)
    figures(record_property, load_size, load_size.cycles, before, after, CYCLE_BOUNDS)


def kernel_manager_cycle(i: int) -> None:
    """Start the Sandboxed Python kernelspec with jupyter_client, run a cell, shut it down."""
    km = KernelManager(kernel_name="sandboxed-python")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=START_TIMEOUT)
        token = secrets.token_hex(8)
        seen: list[str] = []

        def output(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                seen.append(msg["content"]["text"])

        reply = kc.execute_interactive(f"print({token!r})", timeout=CALL_TIMEOUT, output_hook=output)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "".join(seen) == token + "\n", seen
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=i % 2 == 1)  # alternate a polite shutdown and an immediate one
    assert not km.has_kernel


def test_start_stop_cycles_through_kernel_manager(
    watch: ResourceWatch, load_size: Any, record_property: Any, jupyter_prefix: Any
) -> None:
    """Kernels of the Sandboxed Python kernelspec started and stopped by jupyter_client's KernelManager."""
    kernel_manager_cycle(-1)
    before = watch.snapshot()
    deadline = Deadline(load_size.test_timeout - 30, "KernelManager start/stop cycles")
    for i in range(load_size.cycles):
        deadline.check(i, load_size.cycles)
        kernel_manager_cycle(i)
    after = watch.settle(before, CYCLE_BOUNDS)
    figures(record_property, load_size, load_size.cycles, before, after, CYCLE_BOUNDS)


async def multi_kernel_cycle(mkm: AsyncMultiKernelManager, i: int) -> None:
    kernel_id = await mkm.start_kernel(kernel_name="sandboxed-python")
    kc = mkm.get_kernel(kernel_id).client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=START_TIMEOUT)
        reply = await kc.execute_interactive(f"{i} * 2", timeout=CALL_TIMEOUT)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        await mkm.shutdown_kernel(kernel_id, now=i % 2 == 1)
    assert kernel_id not in mkm.list_kernel_ids()


async def test_start_stop_cycles_through_multi_kernel_manager(
    watch: ResourceWatch, load_size: Any, record_property: Any, jupyter_prefix: Any
) -> None:
    """Kernels started and stopped the way a Jupyter server does (AsyncMultiKernelManager, runtime dir)."""
    mkm = AsyncMultiKernelManager(connection_dir=jupyter_runtime_dir())  # as jupyter_server sets it
    await multi_kernel_cycle(mkm, -1)
    before = watch.snapshot()
    deadline = Deadline(load_size.test_timeout - 30, "AsyncMultiKernelManager start/stop cycles")
    for i in range(load_size.cycles):
        deadline.check(i, load_size.cycles)
        await multi_kernel_cycle(mkm, i)
    after = await watch.settle_async(before, CYCLE_BOUNDS)
    figures(record_property, load_size, load_size.cycles, before, after, CYCLE_BOUNDS)
