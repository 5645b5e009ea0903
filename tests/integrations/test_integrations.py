"""The drop-in executors against the contracts of LiteLLM's skills executor and Letta's tool
execution sandbox, on real Docker kernels."""

from __future__ import annotations

import base64
import pathlib
from dataclasses import dataclass, field

import pytest

import kernel_sandbox.integrations as integrations
from kernel_sandbox.integrations import SkillsExecutor, ToolRunner


@pytest.fixture(scope="module")
def skills(docker_engine):
    with SkillsExecutor(timeout=8) as executor:  # the spinning cell below burns a core until then
        yield executor


@pytest.fixture(scope="module")
def tools(docker_engine):
    with ToolRunner(timeout=8, allowed_classes=[AgentState]) as runner:  # as the skills executor
        yield runner


@dataclass
class AgentState:
    memory: list[str] = field(default_factory=list)


def test_skills_contract_files_and_state(skills):
    result = skills.execute(
        "from helper import title\nopen('out.csv', 'w').write(title('a,b'))\nkept = 5",
        {"helper.py": b"def title(s):\n    return s.upper()\n"},
    )
    assert set(result) == {"success", "output", "error", "files"}
    assert result["success"], result["error"]
    (out,) = [f for f in result["files"] if f["name"] == "out.csv"]
    assert base64.b64decode(out["content_base64"]) == b"A,B"
    assert out["mime_type"] == "text/csv"
    again = skills.execute("print(kept * 2)", {})
    assert again["success"] and again["output"].strip() == "10"  # the kernel stays warm


def test_skills_failure_and_timeout_interrupts(skills):
    failed = skills.execute("raise ValueError('bad input')", {})
    assert not failed["success"] and "ValueError" in failed["error"]
    slow = skills.execute("while True: pass", {})
    assert not slow["success"] and "KeyboardInterrupt" in slow["error"]  # interrupted at 8 s
    assert skills.execute("print('alive')", {})["output"].strip() == "alive"


TOOL = '''
def remember(fact: str, agent_state) -> str:
    """Remember a fact."""
    print("remembering", fact)
    agent_state.memory.append(fact)
    return f"{len(agent_state.memory)} facts"
'''


def test_letta_contract_state_as_data(tools):
    result = tools.run(TOOL, "remember", {"fact": "sky is blue"}, AgentState())
    assert result.status == "success", result
    assert result.func_return == "1 facts"
    assert result.agent_state == AgentState(memory=["sky is blue"])
    assert result.stdout == ["remembering sky is blue\n"] and result.stderr == []
    second = tools.run(TOOL, "remember", {"fact": "grass"}, result.agent_state)
    assert second.agent_state.memory == ["sky is blue", "grass"]


def test_letta_errors_and_timeout(tools):
    broken = tools.run("def f():\n    raise KeyError('k')\n", "f", {})
    assert broken.status == "error" and broken.agent_state is None
    assert broken.func_return.startswith("Error executing function f: KeyError")
    slow = tools.run("def spin():\n    while True: pass\n", "spin", {})
    assert slow.status == "error" and "TimeoutError" in slow.func_return
    assert tools.run("def one():\n    return 1\n", "one", {}).func_return == 1


@pytest.mark.security("attack", "results")
def test_letta_state_never_unpickled_on_the_host(tools):
    """A tool that returns an object of a class nobody allowed gets an error, not a pickle."""
    source = "class Evil:\n    pass\n\ndef f():\n    return Evil()\n"
    result = tools.run(source, "f", {})
    assert result.status == "error"
    package = pathlib.Path(integrations.__file__).parent
    for path in package.glob("*.py"):
        assert "import pickle" not in path.read_text() and "loads(" not in path.read_text()
