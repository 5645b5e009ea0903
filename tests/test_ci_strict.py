"""Under CI a skipped test fails (tests/support/ci_strict.py); elsewhere it stays a skip."""

from __future__ import annotations

import pytest

SKIPPING = """
import pytest

def test_needs_something_missing():
    pytest.skip("no Docker engine")

@pytest.mark.skipif(True, reason="needs root")
def test_marked():
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
"""


def test_a_skip_fails_under_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest("-p", "support.ci_strict", "-ra")
    result.assert_outcomes(failed=1, errors=1, xfailed=1)  # a skip in setup (skipif) becomes an error
    result.stdout.fnmatch_lines(["*skipped under CI, which must run every test:*no Docker engine*"])


def test_a_skip_stays_a_skip_outside_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest("-p", "support.ci_strict")
    result.assert_outcomes(skipped=2, xfailed=1)
