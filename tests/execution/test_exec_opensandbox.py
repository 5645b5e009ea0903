"""The execution API on the opensandbox backend, through the fake lifecycle server and execd
(a real local ipykernel behind execd's wire format) that the OpenSandbox tests provide."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_sandbox.execution import NetworkDisabledError, Sandbox

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensandbox"))
from opensandbox_fakes import FakeOpenSandbox  # noqa: E402


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(ping_interval=0.3).start()
    server.lifecycle.polls_until_running = 1
    yield server
    server.stop()


def test_session_tools_files_and_timeout(fake: FakeOpenSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    options = {"api_base": fake.api_base, "api_key": fake.lifecycle.api_key, "poll_interval": 0.05}
    with Sandbox("opensandbox", memory="1g", cpus=1, state_check_interval=0.0, **options) as sb:
        assert sb.run("print('hi'); 6 * 7").text == "42"
        assert sb.upload({"in/a.txt": b"data"}) == ["in/a.txt"]
        assert sb.download("in/a.txt") == b"data"

        def tool(x: int, agent_state: dict) -> int:
            agent_state["seen"] = x
            return x * 2

        result = sb.run_tool(tool, {"x": 21}, {"seen": None})
        assert (result.func_return, result.agent_state) == (42, {"seen": 21})
        timed_out = sb.run("import time\ntime.sleep(30)", timeout=1)
        assert timed_out.error is not None and timed_out.error.name == "TimeoutError"
        assert sb.run("1 + 2").text == "3"
        with pytest.raises(NetworkDisabledError):
            sb.install("requests")
        body = fake.lifecycle.live()[-1].body
        assert body["resourceLimits"] == {"memory": "1Gi", "cpu": "1"}
        assert "networkPolicy" in body
    assert not fake.lifecycle.live()
