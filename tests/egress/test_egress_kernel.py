"""Packages with the network off, for real: Docker kernels, the launcher's proxy, an index on 127.0.0.1.

The index is ``index.test`` (:mod:`support.package_index`): the launcher resolves it through the test's map
to 127.0.0.1, which the entries allow explicitly (``index.test:PORT@127.0.0.1``), and connects
through its loopback guard; every test checks that the guard never fired.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.manager import AsyncKernelManager

from support.kernel import PODMAN
from support.package_index import Index, serve_index
from kernel_sandbox.execution import Sandbox
from kernel_sandbox.kernelspecs import install as install_kernelspec
from kernel_sandbox.launch.egress import PROXY_PORT

pytestmark = pytest.mark.security("attack", "egress")

PACKAGES = {"egresspkg_a": 1, "egresspkg_b": 2, "egresspkg_c": 3, "egresspkg_d": 4, "egresspkg_e": 5}

FETCH = """
import urllib.request
try:
    urllib.request.urlopen({url!r} + '/egresspkg-a/', timeout=20)
    print('reached')
except Exception as exc:
    print('refused', getattr(exc, 'code', None), exc)
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    with serve_index(tmp_path_factory.mktemp("egress-index"), PACKAGES) as served:
        yield served
        assert served.guard_fired == [], "the launcher tried to connect outside 127.0.0.0/8"


@pytest.fixture(
    scope="module",
    params=[pytest.param("docker", marks=pytest.mark.docker), pytest.param(PODMAN, marks=pytest.mark.podman)],
)
def sandbox(request: pytest.FixtureRequest, index: Index) -> Iterator[Sandbox]:
    """A kernel with the network off whose package index is the test's, on Docker and on Podman."""
    request.getfixturevalue(f"{request.param}_engine")
    engine = {"engine": PODMAN} if request.param == PODMAN else {}
    with Sandbox(package_index=[index.url, index.entry], timeout=120, standby=0, **engine) as sb:
        yield sb


def reachable(sb: Sandbox, index: Index) -> str:
    return sb.run(FETCH.format(url=index.url)).stdout


def test_install_opens_the_index_for_the_call_and_closes_it(sandbox: Sandbox, index: Index) -> None:
    before = reachable(sandbox, index)
    assert before.startswith("refused 403") and "Sandbox.install()" in before
    result = sandbox.install(["egresspkg_a"])
    assert result.error is None, result.stderr
    assert sandbox.run("import egresspkg_a; egresspkg_a.VALUE").text == "1"
    assert any(path.endswith("egresspkg_a-0.1-py3-none-any.whl") for path in index.served)
    assert reachable(sandbox, index).startswith("refused 403")


def test_a_skill_gets_its_requirements_with_the_network_off(sandbox: Sandbox, index: Index) -> None:
    result = sandbox.run_skill("import egresspkg_b\nprint(egresspkg_b.VALUE)", requirements=["egresspkg_b"])
    assert result["success"] and result["output"].strip() == "2", result
    assert reachable(sandbox, index).startswith("refused 403")


def test_a_failing_install_closes_the_index_too(sandbox: Sandbox, index: Index) -> None:
    result = sandbox.install(["egresspkg-missing"])
    assert result.error is not None
    assert reachable(sandbox, index).startswith("refused 403")


HOLD = f"PROXY_PORT = {PROXY_PORT}\n" + """
import socket, threading
held = {{'state': 'trying'}}
def hold():
    import time
    while True:
        s = socket.create_connection(('127.0.0.1', PROXY_PORT))
        s.sendall(b'CONNECT index.test:{port} HTTP/1.1\\r\\n\\r\\n')
        answer = s.recv(200)
        if answer.startswith(b'HTTP/1.1 200'):
            held['state'] = 'open'
            try:
                held['state'] = 'cut' if s.recv(10) == b'' else 'data'
            except ConnectionError:
                held['state'] = 'cut'
            return
        s.close()
        time.sleep(0.02)
threading.Thread(target=hold, daemon=True).start()
"""


def test_a_tunnel_opened_during_an_install_is_cut_when_it_ends(sandbox: Sandbox, index: Index) -> None:
    sandbox.run(HOLD.format(port=index.port))
    assert sandbox.install(["egresspkg_c"]).error is None
    for _ in range(100):
        state = sandbox.run("held['state']").text.strip("'")
        if state != "open":
            break
        sandbox.run("import time; time.sleep(0.1)")
    assert state == "cut"


def test_pip_magic_with_nothing_allowed_fails_at_once_naming_the_option(sandbox: Sandbox, index: Index) -> None:
    """pip over HTTPS (as with PyPI) says why once, in the proxy's refusal, and gives up without retrying."""
    served = len(index.served)
    output = sandbox.run(f"%pip install --index-url https://index.test:{index.port}/simple egresspkg_e").stdout
    assert output.count("kernel-sandbox refused index.test") == 1 and "--allow-package-index" in output
    assert len(index.served) == served


async def test_pip_magic_in_a_notebook_kernel_whose_kernelspec_allows_the_index(
    docker_engine, jupyter_prefix: Path, index: Index
) -> None:
    install_kernelspec(
        "sandboxed-python", prefix=str(jupyter_prefix.parent.parent), install_as="sandboxed-python-egress",
        config={"network": [index.entry], "package_index": [index.url, index.entry], "standby": 0},
    )
    manager = AsyncKernelManager(kernel_name="sandboxed-python-egress")
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        outputs: list[str] = []

        def keep(msg: dict) -> None:
            if msg["msg_type"] == "stream":
                outputs.append(msg["content"]["text"])
            elif msg["msg_type"] == "execute_result":
                outputs.append(msg["content"]["data"]["text/plain"])

        await client.execute_interactive("%pip install egresspkg_d", output_hook=keep, timeout=120)
        assert "Successfully installed egresspkg_d-0.1" in "".join(outputs)
        outputs.clear()
        await client.execute_interactive("import egresspkg_d; egresspkg_d.VALUE", output_hook=keep, timeout=60)
        assert outputs == ["4"]
        outputs.clear()
        await client.execute_interactive(FETCH.format(url="http://elsewhere.test"), output_hook=keep, timeout=60)
        assert "".join(outputs).startswith("refused 403")
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)
        await asyncio.sleep(0)


def test_a_window_request_not_signed_with_the_client_key_opens_nothing(sandbox: Sandbox, index: Index) -> None:
    """Only the holder of the connection key can open the index: a forged request is dropped unanswered."""
    from jupyter_client.session import Session

    from kernel_sandbox.egress import WINDOW_REQUEST

    kc = sandbox._async._kc
    forger = Session(key=b"not-the-key", signature_scheme="hmac-sha256")
    forger.send(kc.control_channel.socket, forger.msg(WINDOW_REQUEST, {"open": 60}))
    assert reachable(sandbox, index).startswith("refused 403")


def test_the_exec_stream_relay_serves_the_same_proxy(docker_engine, index: Index, monkeypatch) -> None:
    """As any user but root on runc gets it: the proxy reached through a relay over an exec stream."""
    from support.launcher_hooks import EXEC_STREAMS_ENV

    monkeypatch.setenv(EXEC_STREAMS_ENV, "1")
    with Sandbox(package_index=[index.url, index.entry], network=["api.example.com"], timeout=120, standby=0) as sb:
        assert reachable(sb, index).startswith("refused 403")
        assert sb.install(["egresspkg_e"]).error is None
        assert sb.run("import egresspkg_e; egresspkg_e.VALUE").text == "5"
        assert reachable(sb, index).startswith("refused 403")
        refused = sb.run(FETCH.format(url="http://api.example.com")).stdout
        assert refused.startswith("refused 403") and "10.0.0.1" in refused  # listed, but resolves to a private address
