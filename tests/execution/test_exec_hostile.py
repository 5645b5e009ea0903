"""Hostile tools on a real Docker kernel: forged answers, decode bombs, floods, broken kernels.

A tool controls its kernel: it can find the request's marker, send messages on the channel and
replace the kernel-side encoder so that the helper's one genuine answer carries any bytes the
tool likes. None of that may run code on the host, change a host class, grow the host's memory
without bound, report success for a tool that did not return, or leave the session unusable.
"""

from __future__ import annotations

import collections
import fractions
from collections.abc import Iterator
from typing import Any

import pytest

from support.host_memory import RssPeak
from kernel_sandbox.execution import (
    DecodeLimits,
    FramingError,
    ResultLimitError,
    Sandbox,
    UnsafePayloadError,
)
from kernel_sandbox.kernelside.dataformat import class_name

MiB = 1024 * 1024


class AgentState:
    """The caller's agent state: an attacker would like ``is_admin()`` to say True."""

    def __init__(self) -> None:
        self.name = "ada"

    def is_admin(self) -> bool:
        return False


WATCHED = [AgentState, fractions.Fraction, collections.Counter, collections.OrderedDict, dict, list, object]


def ok(sb: Sandbox) -> None:
    """The session still works: a plain tool call and a plain run."""
    assert sb.run_tool(lambda: 40 + 2).func_return == 42
    assert sb.run("6 * 7").text == "42"


@pytest.fixture
def fresh(docker_engine) -> Iterator[Sandbox]:
    """A sandbox of its own, for tests that break or kill their kernel."""
    with Sandbox(timeout=60, interrupt_grace=5) as sb:
        yield sb


def answering_with(doc: bytes) -> Any:
    """A tool that makes the helper's genuine (single) answer carry ``doc``."""

    def tool() -> str:
        import sys

        fmt = sys.modules["_kernel_sandbox_dataformat"]
        real = fmt.encode

        def forged(body: Any, **kwargs: Any) -> tuple[bytes, list[bytes]]:
            fmt.encode = real
            return doc, []

        fmt.encode = forged
        return "innocent"

    return tool


def test_forged_documents_cannot_change_host_classes(sandbox: Sandbox) -> None:
    before = {cls: dict(vars(cls)) for cls in WATCHED}
    state = class_name(AgentState)
    attacks = [
        b'{"r":{"$":"obj","c":"%s","v":{"name":"x","is_admin":true}}}' % state.encode(),
        b'{"r":{"$":"obj","c":"%s","v":{"__class__":"x","__dict__":{"is_admin":1}}}}' % state.encode(),
        b'{"r":{"$":"obj","c":"fractions:Fraction","v":{"_numerator":2,"__class__":1}}}',
        b'{"r":{"$":"obj","c":"collections:Counter","v":{"most_common":"x"}}}',
        b'{"r":{"$":"pickle","v":"gASVIAAAAAAAAACMCGJ1aWx0aW5zlIwEZXZhbJSTlIwBMZSFlFKULg=="}}',
    ]
    for doc in attacks:
        with pytest.raises(UnsafePayloadError):
            sandbox.run_tool(answering_with(doc), allowed_classes=[AgentState, fractions.Fraction])
    with pytest.raises(UnsafePayloadError):  # a count that is not a number
        sandbox.run_tool(answering_with(b'{"r":{"$":"counter","v":[["most_common","x"]]}}'))
    counter = sandbox.run_tool(answering_with(b'{"r":{"$":"counter","v":[["most_common",3]]}}')).func_return
    assert counter == collections.Counter({"most_common": 3})
    assert {cls: dict(vars(cls)) for cls in WATCHED} == before
    assert AgentState().is_admin() is False
    assert fractions.Fraction(1) != fractions.Fraction(2)
    assert collections.Counter("aab").most_common(1) == [("a", 2)]
    ok(sandbox)


BOMBS = {
    "deep nesting": (b"[" * 300_000 + b"]" * 300_000, "max_depth"),
    "a huge integer": (b'{"r":' + b"9" * 2_000_000 + b"}", "max_int_digits"),
    "a million empty lists": (b'{"r":[' + b"[]," * 2_000_000 + b"[]]}", "max_items"),
    "a Decimal exponent": (b'{"r":{"$":"decimal","v":"1E+999999999"}}', "max_exponent"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_decode_bombs_from_a_tool_are_refused_with_bounded_memory(sandbox: Sandbox, name: str) -> None:
    doc, limit = BOMBS[name]
    with RssPeak() as rss:
        with pytest.raises(ResultLimitError, match=limit) as info:
            sandbox.run_tool(answering_with(doc))
    assert info.value.limit == limit
    assert rss.growth < 32 * len(doc) + 64 * MiB, f"host RSS grew by {rss.growth / MiB:.0f} MiB"
    ok(sandbox)


def test_collisions_in_a_set_are_refused(sandbox: Sandbox) -> None:
    items = ",".join(str(k * (2**61 - 1)) for k in range(1, 50_000))
    with pytest.raises(UnsafePayloadError, match="share one hash"):
        sandbox.run_tool(answering_with(b'{"r":{"$":"set","v":[%s]}}' % items.encode()))


def test_a_result_over_the_size_limit_is_refused_before_it_is_pulled(docker_engine) -> None:
    with Sandbox(decode_limits=DecodeLimits(max_bytes=8 * MiB)) as sb, RssPeak() as rss:
        with pytest.raises(ResultLimitError, match="max_bytes=8388608"):
            sb.run_tool(lambda: b"x" * (200 * MiB))
        assert len(sb.run_tool(lambda: b"y" * (6 * MiB)).func_return) == 6 * MiB
    assert rss.growth < 100 * MiB


def test_floods_during_a_call_are_capped_as_they_arrive(sandbox: Sandbox) -> None:
    def flood() -> str:
        import sys

        from IPython.display import display

        chunk = "d" * 1_000_000
        for _ in range(300):
            display({"text/plain": chunk}, raw=True)
            print(chunk)
            print(chunk, file=sys.stderr)
        return "done"

    with RssPeak() as rss:
        result = sandbox.run_tool(flood, timeout=300)
    assert (result.status, result.func_return) == ("success", "done")
    assert result.truncated_bytes > 800_000_000
    assert "[output truncated:" in result.stdout
    assert len(result.stdout) + len(result.stderr) < 5 * MiB
    assert rss.growth < 200 * MiB, f"host RSS grew by {rss.growth / MiB:.0f} MiB during a 900 MB flood"
    ok(sandbox)


def test_a_flood_of_messages_on_the_channel_is_dropped_and_a_flood_of_answers_refused(sandbox: Sandbox) -> None:
    def chatter(forge: bool) -> str:
        import sys

        frame = sys._getframe()
        while "request" not in frame.f_locals:
            frame = frame.f_back
        marker = frame.f_locals["request"]["marker"] if forge else "not-the-marker"
        channel = sys.modules["_kernel_sandbox_state"].channel
        blob = b"c" * 4_000_000
        for _ in range(100):
            channel.send({"marker": marker, "lengths": [len(blob)]}, buffers=[blob])
        return "done"

    with RssPeak() as rss:
        assert sandbox.run_tool(chatter, {"forge": False}, timeout=300).func_return == "done"
        with pytest.raises(FramingError, match="tampered"):
            sandbox.run_tool(chatter, {"forge": True}, timeout=300)
    assert rss.growth < 200 * MiB, f"host RSS grew by {rss.growth / MiB:.0f} MiB"
    ok(sandbox)


def test_a_forged_answer_then_a_hang_is_never_a_success(fresh: Sandbox) -> None:
    with pytest.raises(FramingError, match="tampered"):
        fresh.run_tool(_forge_and_swallow("nothing", "hang"), timeout=3)
    ok(fresh)


def test_a_forged_answer_then_death_is_reported_and_the_kernel_restarted(fresh: Sandbox) -> None:
    result = fresh.run_tool(_forge_and_swallow("nothing", "die"))
    assert (result.status, result.error.name, result.state_lost) == ("error", "KernelDied", True)
    assert result.func_return is None
    ok(fresh)


def test_a_tool_that_ignores_interrupts_ends_within_its_timeout(fresh: Sandbox) -> None:
    def stubborn() -> None:
        import signal
        import time

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            time.sleep(0.05)

    result = fresh.run_tool(stubborn, timeout=2)
    assert (result.status, result.error.name, result.state_lost) == ("error", "TimeoutError", True)
    assert "restarted" in result.error.value
    ok(fresh)


def _vandal(target: str) -> Any:
    def tool() -> str:
        import sys

        import comm
        from IPython import get_ipython

        shell = get_ipython()
        if target == "stdout":
            sys.stdout = sys.stderr = None
            print("lost")
        elif target == "comm manager":
            shell.kernel.comm_manager = None
            comm.get_comm_manager = lambda: None
        elif target == "comm handlers":
            shell.kernel.shell_handlers.clear()
        elif target == "channel":
            for channel in list(comm.get_comm_manager().comms.values()):
                channel.close()
        elif target == "display hooks":
            shell.displayhook = shell.display_pub = sys.displayhook = None
        elif target == "events":
            shell.events.register("pre_execute", lambda: 1 / 0)
        return "vandalised"

    return tool


VANDALISM = ["stdout", "comm manager", "comm handlers", "channel", "display hooks", "events"]


@pytest.mark.parametrize("target", VANDALISM)
def test_a_session_survives_what_a_tool_breaks(fresh: Sandbox, target: str) -> None:
    result = fresh.run_tool(_vandal(target), timeout=20)
    assert result.status == "success" and result.func_return == "vandalised"
    for _ in range(3):
        ok(fresh)


SILENCED = {"comm manager", "display hooks"}
"""Breakages after which the kernel never answers a request: the call's timeout is the only way out
(asserted below), so theirs is short; the others' calls keep 20 s for the paths that notice sooner."""


@pytest.mark.parametrize("target", VANDALISM)
def test_a_session_survives_what_a_cell_breaks(fresh: Sandbox, target: str) -> None:
    """Broken by run() (no tool guard): the next tool call recovers, restarting the kernel if it must."""
    ok(fresh)
    fresh.run("import cloudpickle\n_vandal = cloudpickle.loads(%r)\n_vandal()" % (
        __import__("cloudpickle").dumps(_vandal(target)),), timeout=20)
    result = fresh.run_tool(lambda: "after", timeout=5 if target in SILENCED else 20)
    if target in SILENCED:
        assert result.error is not None and result.error.name == "TimeoutError" and result.state_lost, result.error
    assert result.status == "success" or result.state_lost, result.error
    for _ in range(3):
        assert fresh.run_tool(lambda: "again", timeout=20).func_return == "again"
    assert fresh.run("1 + 1").text == "2"


def _forge_and_swallow(swallow: str, then: str) -> Any:
    """A tool that sends a forged answer, breaks one link of the path the real answer takes, then fails or hangs."""

    def tool() -> str:
        import os
        import sys
        import time

        from IPython import get_ipython

        frame = sys._getframe()
        while "request" not in frame.f_locals:
            frame = frame.f_back
        helper = sys.modules["_kernel_sandbox_toolhost"]
        meta, buffers = helper.answer(frame.f_locals["request"]["marker"], {"r": "forged"})
        channel = helper._state.channel
        channel.send(meta, buffers=buffers)
        mute = lambda *args, **kwargs: None  # noqa: E731
        if swallow == "the channel":
            channel.send = mute
        elif swallow == "the comm class":
            type(channel).send = type(channel).publish_msg = mute
        elif swallow == "the helper's state":
            helper._state.channel = type("Mute", (), {"send": mute})()
        elif swallow == "the session":
            session = get_ipython().kernel.session
            type(session).send = mute
            session.send = mute
        elif swallow == "the session's key":
            get_ipython().kernel.session.key = b"wrong"
        elif swallow == "the helper's answer function":  # past what the helper puts back
            real = helper.answer
            helper.answer = lambda marker, body, allow_pickle=False: real("not-the-marker", body)
        if then == "raise":
            raise RuntimeError("the tool failed")
        if then == "die":
            sys.stdout.flush()
            os._exit(0)
        while True:
            time.sleep(0.05)

    return tool


SWALLOW = ["the channel", "the comm class", "the helper's state", "the session", "the session's key"]


@pytest.mark.parametrize("swallow", SWALLOW)
def test_a_forged_answer_is_caught_however_the_tool_swallows_the_real_one(sandbox: Sandbox, swallow: str) -> None:
    """The real answer takes a path the helper puts back first, so the host sees two answers: never a success."""
    for then in ("raise", "hang"):
        with pytest.raises(FramingError, match="tampered"):
            sandbox.run_tool(_forge_and_swallow(swallow, then), timeout=3)
        ok(sandbox)


def test_an_answer_from_a_call_that_then_timed_out_is_an_error(fresh: Sandbox) -> None:
    """Past what the helper can put back (the tool rewrote the helper itself), the timeout is still the host's to see."""

    result = fresh.run_tool(_forge_and_swallow("the helper's answer function", "hang"), timeout=3)
    assert (result.status, result.error.name, result.func_return) == ("error", "TimeoutError", None)


def test_patched_comm_classes_are_put_back_before_the_next_call(sandbox: Sandbox) -> None:
    """A cell (no tool guard) that breaks CommManager.get_comm and Comm.send once made every later call fail."""
    sandbox.run(
        "from comm.base_comm import BaseComm, CommManager\n"
        "CommManager.get_comm = lambda self, comm_id: None\n"
        "BaseComm.send = lambda self, *args, **kwargs: None"
    )
    for _ in range(2):
        result = sandbox.run_tool(lambda: "answered", timeout=20)
        assert (result.status, result.func_return, result.state_lost) == ("success", "answered", False), result.error


def test_a_helper_that_cannot_answer_restarts_the_kernel_on_the_next_call(fresh: Sandbox) -> None:
    """Broken past repair (its own handler replaced): the call says NoAnswer, and the next one gets a fresh kernel."""
    fresh.run(
        "kept = 1\nimport sys\nhelper = sys.modules['_kernel_sandbox_toolhost']\n"
        "helper._on_msg = helper._state.channel._msg_callback = lambda msg: None"
    )
    first = fresh.run_tool(lambda: 1, timeout=90)
    assert (first.status, first.error.name) == ("error", "NoAnswer")
    assert "restarted before the next call" in first.error.value
    second = fresh.run_tool(lambda: 2, timeout=90)
    assert (second.status, second.func_return, second.state_lost) == ("success", 2, True), second.error
    assert fresh.run("'kept' in globals()").text == "False"
    ok(fresh)


def test_a_string_of_escapes_from_a_plain_tool_costs_the_host_little(sandbox: Sandbox) -> None:
    """Dict keys stay in the document: 8 M backslashes are 16 MiB of escapes (once about 70 times that on the host)."""
    with RssPeak() as rss:
        result = sandbox.run_tool(lambda: {"\\" * (8 * 1024 * 1024): 1}, timeout=120)
    assert result.status == "success" and [len(key) for key in result.func_return] == [8 * MiB]
    assert rss.growth < 160 * MiB, f"host RSS grew by {rss.growth / MiB:.0f} MiB"
