"""The figures plugin: what it records from a run, and the table it renders, are what the run did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.security_figures import main, render

SUITE = '''
import pytest
from hypothesis import given, settings, strategies as st


@pytest.mark.security("attack", "channel")
@pytest.mark.parametrize("n", [1, 2, 3])
def test_blocked(n):
    """Three planted symlinks."""


@pytest.mark.security("fault", "sessions")
def test_not_survived():
    assert False


@pytest.mark.security("load", "sessions")
def test_load(record_property):
    record_property("cases", 5)
    record_property("before", {"fds": 3})


@pytest.mark.security("fuzz", "results")
@settings(max_examples=37, database=None)
@given(st.integers())
def test_fuzz(x):
    pass


@pytest.mark.security("attack", "policy")
def test_skipped():
    pytest.skip("no browser")


def test_not_counted():
    pass
'''


@pytest.fixture(autouse=True)
def ini(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in a subprocess of their own, rooted in pytester's directory, with the plugin importable."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))


def run(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    if not (pytester.path / "test_suite.py").exists():
        pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest_subprocess(f"--rootdir={pytester.path}", "-p", "support.security_figures",
                                         "--security-figures", str(out),
                                         "-p", "no:cacheprovider", *args)


def test_marked_tests_are_recorded_with_their_outcome_and_figures(pytester: pytest.Pytester, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run(pytester, out).assert_outcomes(passed=6, failed=1, skipped=1)
    tests = json.loads(out.read_text())["tests"]
    assert sorted(tests) == sorted(
        [f"test_suite.py::test_blocked[{n}]" for n in (1, 2, 3)]
        + [f"test_suite.py::test_{name}" for name in ("not_survived", "load", "fuzz", "skipped")]
    )
    assert tests["test_suite.py::test_blocked[2]"]["what"] == "Three planted symlinks."
    assert tests["test_suite.py::test_not_survived"]["outcome"] == "failed"
    assert tests["test_suite.py::test_load"]["properties"] == {"cases": 5, "before": {"fds": 3}}
    assert tests["test_suite.py::test_fuzz"]["properties"]["cases"] >= 37
    assert tests["test_suite.py::test_skipped"] | {"outcome": "skipped", "reason": "no browser"} == tests["test_suite.py::test_skipped"]
    table = render({"tests": tests})
    assert "| Kernel channel (host <-> kernel) | 3 / 3 | – | – | – | 0 | 0 |" in table
    assert "| Sessions and kernel lifecycle | – | 0 / 1 | 5 / 5 | – | 1 | 0 |" in table
    assert "`test_suite.py::test_not_survived` (fault, sessions)" in table
    assert "`test_suite.py::test_skipped`: no browser" in table


def test_m_security_selects_the_counted_tests_and_runs_merge_dropping_removed_tests(pytester: pytest.Pytester, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run(pytester, out, "-m", "security", "-k", "blocked or load").assert_outcomes(passed=4)
    run(pytester, out, "-k", "not_survived").assert_outcomes(failed=1)
    assert len(json.loads(out.read_text())["tests"]) == 5
    run(pytester, out, "test_suite.py::test_fuzz").assert_outcomes(passed=1)
    assert len(json.loads(out.read_text())["tests"]) == 6  # one more; a test run by its id keeps the others
    (pytester.path / "test_suite.py").write_text(SUITE.replace("def test_load(", "def test_renamed("))
    run(pytester, out, "-k", "not_survived").assert_outcomes(failed=1)
    assert "test_suite.py::test_load" not in json.loads(out.read_text())["tests"]  # gone from its file


def test_a_wrong_kind_or_layer_is_a_usage_error(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_bad='import pytest\n@pytest.mark.security("attack", "kernel")\ndef test_x(): pass\n')
    result = pytester.runpytest_subprocess("-p", "support.security_figures", "--security-figures", str(tmp_path / "f.json"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "layer one of" in "\n".join(result.errlines + result.outlines)


def test_the_renderer_replaces_only_its_block(tmp_path: Path, pytester: pytest.Pytester) -> None:
    out = tmp_path / "figures.json"
    run(pytester, out, "-k", "blocked")
    page = tmp_path / "SECURITY.md"
    page.write_text("# before\n<!-- security-figures:begin -->\nold\n<!-- security-figures:end -->\nafter\n")
    assert main(["--json", str(out), "--markdown", str(page), "--check"]) == 1
    assert main(["--json", str(out), "--markdown", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# before\n") and text.endswith("-->\nafter\n") and "old" not in text and "3 / 3" in text
    assert main(["--json", str(out), "--markdown", str(page), "--check"]) == 0
