"""Skills and the warm pool on real Docker kernels."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import tracemalloc

import pytest

from kernel_sandbox.errors import ConfigError, SandboxError
from kernel_sandbox.execution import AsyncSandboxPool, Sandbox, SandboxPool
from kernel_sandbox.execution.channel import CHUNK

SKILL_MODULE = b"def greet(name):\n    return f'hello {name}'\n"


def test_skill_returns_created_files_and_figures(sandbox: Sandbox) -> None:
    code = (
        "from helper import greet\n"
        "print(greet('skill'))\n"
        "import os\nos.makedirs('out', exist_ok=True)\n"
        "open('out/report.csv', 'w').write('a,b\\n1,2\\n')\n"
        "open('data.txt', 'a').write('more')\n"
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n"
    )
    result = sandbox.run_skill(code, {"helper.py": SKILL_MODULE, "data.txt": b"given", "unused.txt": b"x"})
    assert result["success"], result["error"]
    assert result["output"] == "hello skill\n"
    by_path = {entry["path"]: entry for entry in result["files"]}
    assert set(by_path) == {"out/report.csv", "data.txt", "figure_1.png"}
    report = by_path["out/report.csv"]
    assert report["name"] == "report.csv" and report["mime_type"] == "text/csv"
    assert base64.b64decode(report["content_base64"]) == b"a,b\n1,2\n"
    assert base64.b64decode(by_path["data.txt"]["content_base64"]) == b"givenmore"
    assert by_path["figure_1.png"]["mime_type"] == "image/png"
    assert base64.b64decode(by_path["figure_1.png"]["content_base64"]).startswith(b"\x89PNG")


@pytest.mark.security("load", "results")
def test_a_skills_files_are_held_once_within_max_files_bytes(sandbox: Sandbox) -> None:
    """``max_files_bytes`` counts the base64 text the answer holds, and the program's peak
    (tracemalloc, every thread) is that text plus a few chunks: each file is encoded as it arrives
    into a temporary file and read back whole (round four measured 2.3x the cap)."""
    cap = 32 * 1024 * 1024
    make = (
        "import os, hashlib\nfor i in range(3):\n"
        "    open(f'out{i}.bin', 'wb').write(os.urandom(8 * 1024 * 1024 - i))\n"
        "print(*(hashlib.sha256(open(f'out{i}.bin', 'rb').read()).hexdigest() for i in range(3)))\n"
    )
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = sandbox.run_skill(make, max_files_bytes=cap)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert result["success"], result["error"]
    held = sum(len(entry["content_base64"]) for entry in result["files"])
    assert 32 * 1024 * 1024 - 16 <= held <= cap  # 4/3 of 24 MiB: base64 exactly fills the cap
    digests = [hashlib.sha256(base64.b64decode(entry["content_base64"])).hexdigest() for entry in result["files"]]
    assert " ".join(digests) + "\n" == result["output"]
    assert peak < cap + 2 * CHUNK, peak / 2**20  # measured: the text plus under 1 MiB
    del result
    sandbox.run("import os\nfor i in range(3): os.unlink(f'out{i}.bin')")
    # one byte more than fits in the base64 room is refused, naming the option
    too_big = sandbox.run_skill("open('one.bin', 'wb').write(bytes(3001))", max_files_bytes=4000)
    assert not too_big["success"] and "max_files_bytes=4000 of base64" in too_big["error"], too_big["error"]
    fits = sandbox.run_skill("open('two.bin', 'wb').write(bytes(3000))", max_files_bytes=4000)
    assert fits["success"] and [len(f["content_base64"]) for f in fits["files"]] == [4000]
    sandbox.run("os.unlink('one.bin'); os.unlink('two.bin')")


def test_failing_skill_reports_the_error(sandbox: Sandbox) -> None:
    result = sandbox.run_skill("import sys\nprint('partial')\nraise RuntimeError('skill broke')", {})
    assert not result["success"]
    assert result["output"] == "partial\n"
    assert "skill broke" in result["error"]


def test_skill_requirements_that_cannot_be_installed_fail_clearly(sandbox: Sandbox) -> None:
    """The index is opened for the install, but the test resolver knows no PyPI: pip fails, and says so."""
    result = sandbox.run_skill("print(1)", {}, requirements="requests\n")
    assert not result["success"] and "No matching distribution found for requests" in result["error"]


async def test_pool_gives_20_concurrent_callers_clean_kernels(docker_engine, own_containers) -> None:
    before = own_containers()
    seen_ids: set[str] = set()
    async with AsyncSandboxPool(4) as pool:

        async def user(index: int) -> str:
            async with pool.acquire() as sb:
                seen_ids.add(sb._km.kernel_id)
                execution = await sb.run(
                    "import os\n"
                    "leak = (globals().get('secret'), sorted(os.listdir('.')))\n"
                    f"secret = {index}\nopen('mine-{index}', 'w').write('x')\n"
                    "leak"
                )
                return execution.text

        leaks = await asyncio.gather(*(user(index) for index in range(20)))
        assert leaks == ["(None, [])"] * 20
        assert len(seen_ids) == 20
    assert own_containers() == before


async def test_a_pool_closed_while_its_kernels_start_cuts_the_starts_short(docker_engine, own_containers) -> None:
    """close() does not wait for kernels to come up only to stop them (an MCP server whose client
    left has 2 s): their starts are cancelled, and leave nothing."""
    before = own_containers()
    pool = AsyncSandboxPool(2)

    async def take() -> None:
        async with pool.acquire():
            pass

    waiting = asyncio.create_task(take())
    await asyncio.sleep(0.3)  # the launchers are on their way
    starting = list(pool._starting)
    assert len(starting) == 2
    await pool.close()
    with pytest.raises(SandboxError, match="closed"):
        await waiting
    assert all(start.cancelled() for start in starting)
    assert own_containers() == before


def test_sync_pool_with_max_uses_restarts_and_empties(docker_engine, own_containers) -> None:
    before = own_containers()
    with SandboxPool(1, max_uses=2, idle_timeout=600) as pool:
        with pool.acquire() as sb:
            sb.run("secret = 1")
            sb.upload({"left.txt": b"x"})
        with pool.acquire() as sb:
            assert sb.run("'secret' in globals()").text == "False"
            assert sb.list_files() == []
    assert own_containers() == before


async def test_idle_kernels_are_renewed(docker_engine, own_containers) -> None:
    before = own_containers()
    async with AsyncSandboxPool(1, idle_timeout=0.5) as pool:
        waiting = pool._ready[0].sandbox._km.kernel_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not pool._ready or pool._ready[0].sandbox._km.kernel_id == waiting:
            assert loop.time() < deadline, "the idle kernel was not renewed within 60 s"
            await asyncio.sleep(0.1)
        async with pool.acquire() as sb:
            assert sb._km.kernel_id != waiting
            assert (await sb.run("1")).text == "1"
    assert own_containers() == before


def test_a_pool_takes_its_backends_defaults_and_refuses_an_unknown_backend_when_made() -> None:
    """Docker's standby is off in a pool (the pool keeps its own ready kernels) unless given."""
    assert AsyncSandboxPool(2)._options["standby"] == 0
    assert AsyncSandboxPool(2, standby=1)._options["standby"] == 1
    assert "standby" not in AsyncSandboxPool(2, backend="local")._options
    with pytest.raises(ConfigError, match="Unknown backend 'nope'; choose one of docker, opensandbox, local"):
        AsyncSandboxPool(2, backend="nope")
    with pytest.raises(ConfigError, match="size=0: must be a whole number from 1"):
        AsyncSandboxPool(0)
