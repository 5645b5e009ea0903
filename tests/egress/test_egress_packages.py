"""The packages people install, for real: a compiled extension and a 30 MB wheel, from the index on 127.0.0.1,
through ``%pip`` in a notebook kernel and ``install()``, on runc and gVisor; and an index the proxy refuses,
named in the cell with the option that allows it.

The extension is built here (:func:`support.package_index.build_extension_wheel`, the stable ABI, so the host's compiler
serves the image's Python). Packages land in the one tmpfs mounted ``exec`` (``packages_size``); an attacker's
copy of the same library anywhere else writable must still fail to load.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.manager import AsyncKernelManager

from support.package_index import Index, build_extension_wheel, build_large_wheel, serve_index
from support.kernel import RUNTIMES, run_cell, runtime_option
from kernel_sandbox.errors import ConfigError
from kernel_sandbox.execution import Sandbox
from kernel_sandbox.kernelside import packages
from kernel_sandbox.kernelspecs import install as install_kernelspec
from kernel_sandbox.settings import PACKAGES_DIR

BIG = 30 * 2**20
SMALL_TMP = "16m"
"""/tmp's size in these kernels: smaller than the wheel, so pip must unpack where it installs."""
LOAD_ELSEWHERE = """
import importlib.util, shutil, cext
for place in ('/tmp', '/dev/shm', '/home/sandbox', '/home/sandbox/work'):
    copy = shutil.copy(cext.__file__, place + '/copied.abi3.so')
    spec = importlib.util.spec_from_file_location('copied', copy)
    try:
        importlib.util.module_from_spec(spec)
        print(place, 'loaded')
    except ImportError as exc:
        print(place, 'refused', exc)
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    builds = [lambda path: build_extension_wheel(path, "cext"), lambda path: build_large_wheel(path, "bigpkg", BIG)]
    with serve_index(tmp_path_factory.mktemp("packages-index"), {"plainpkg": 7}, builds) as served:
        yield served
        assert served.guard_fired == [], "the launcher tried to connect outside 127.0.0.0/8"


@pytest.mark.security("attack", "container")
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_install_brings_a_compiled_extension_and_a_30mb_wheel(docker_engine, index: Index, runtime: str) -> None:
    """A compiled library copied from the packages' directory to any other writable place fails to load."""
    with Sandbox(
        package_index=[index.url, index.entry], tmp_size=SMALL_TMP, timeout=180, standby=0, **runtime_option(runtime)
    ) as sb:
        skill = sb.run_skill("import cext\nprint(cext.add(2, 3))", requirements=["cext"])
        assert skill["success"] and skill["output"] == "5\n", skill
        result = sb.install(["bigpkg"])
        assert result.error is None, result.stderr
        assert sb.run("import cext; cext.add(2, 40)").text == "42"
        assert sb.run("import bigpkg; bigpkg.SIZE").text == str(BIG)
        assert sb.run("import cext; cext.__file__").text.startswith(f"'{PACKAGES_DIR}/")
        # the attacker's side: the same library copied anywhere else writable does not load
        lines = sb.run(LOAD_ELSEWHERE).stdout.splitlines()
        assert len(lines) == 4 and all(" refused " in line for line in lines), lines


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_pip_magic_in_a_notebook_kernel_installs_a_compiled_extension_and_a_30mb_wheel(
    docker_engine, jupyter_prefix: Path, index: Index, runtime: str
) -> None:
    name = f"sandboxed-python-packages-{runtime}"
    config = {"network": [index.entry], "package_index": [index.url, index.entry], "tmp_size": SMALL_TMP, "standby": 0}
    install_kernelspec(
        "sandboxed-python", prefix=str(jupyter_prefix.parent.parent), install_as=name,
        config={**config, **runtime_option(runtime)},
    )
    manager = AsyncKernelManager(kernel_name=name)
    await manager.start_kernel()
    try:
        out, reply = await run_cell(manager, "%pip install cext bigpkg", timeout=180)
        assert reply["status"] == "ok" and "Successfully installed bigpkg-0.1 cext-0.1" in out, out
        out, reply = await run_cell(manager, "import cext, bigpkg\nprint(cext.add(40, 2), bigpkg.SIZE)")
        assert out == f"42 {BIG}\n", (out, reply)
    finally:
        await manager.shutdown_kernel(now=True)


@pytest.mark.security("attack", "egress")
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_index_resolving_to_loopback_is_refused_in_the_cell_naming_the_entry_that_allows_it(
    docker_engine, index: Index, runtime: str
) -> None:
    """The index is listed by name only: its name resolves to 127.0.0.1, which a name may not lead to
    unless the entry names the address. pip keeps that to its debug log; the cell and install() say it."""
    served = len(index.served)
    allow = f"'index.test:{index.port}@127.0.0.1'"
    with Sandbox(
        network=[f"index.test:{index.port}"], package_index=[index.url], timeout=120, standby=0,
        **runtime_option(runtime),
    ) as sb:
        ran = sb.run("%pip install plainpkg")
        said = ran.stdout + ran.stderr
        assert f"[kernel-sandbox] kernel-sandbox refused index.test:{index.port}: it resolves to 127.0.0.1" in said
        assert allow in said and "'package_index'" in said, said
        assert "Retrying" not in said  # refused once, not retried
        result = sb.install(["plainpkg"])
        assert result.error is not None and allow in result.error.value, result
        assert "'package_index'" in result.error.value
        skill = sb.run_skill("print('ran')", requirements=["plainpkg"])
        assert not skill["success"] and allow in skill["error"] and "ran" not in skill["output"], skill
    assert len(index.served) == served


def test_the_refusals_are_read_back_from_pip_log_once_each(tmp_path: Path) -> None:
    """Both ways pip meets the proxy's refusal: an index page's HTTP error, a tunnel that failed (HTTPS)."""
    reason = "kernel-sandbox refused pypi.corp:443: it resolves to 10.1.2.3, which is a private or reserved address"
    environ = packages.pip_environ({"PIP_TARGET": str(tmp_path)})
    Path(environ["PIP_LOG"]).write_text(
        f"2026-12-04T15:33:58,277 Could not fetch URL http://x/simple/a/: 403 Client Error: {reason} for url: "
        "http://x/simple/a/ - skipping\n"
        "2026-12-04T15:33:58,300 Retrying (Retry(total=0)) after connection broken by 'ProxyError('Unable to "
        f"connect to proxy', OSError('Tunnel connection failed: 403 {reason}'))': /simple/a/\n"
    )
    assert environ["TMPDIR"] == str(tmp_path / packages.PIP_TMP)
    assert packages.refusals(environ) == [reason]
    assert not Path(environ["PIP_LOG"]).exists()
    assert packages.pip_environ({"PATH": "/bin"}) == {"PATH": "/bin"}  # no directory named: pip as it is


@pytest.mark.security("fault", "options")
def test_an_index_url_on_loopback_is_refused_before_any_kernel_starts() -> None:
    """Inside the sandbox, 127.0.0.1 is the sandbox itself: pip would retry its own loopback and say nothing."""
    for url in ("http://127.0.0.1:3141/simple", "http://localhost:3141/simple", "https://[::1]/simple"):
        with pytest.raises(ConfigError, match="package_index: .* names a loopback address.*'@'"):
            Sandbox(package_index=[url])
