"""A pytest plugin: under CI (the ``CI`` environment variable set, as ``.ci/run`` does) a skipped test fails.

A missing Docker engine, browser or OpenSandbox server must fail CI, never pass it quietly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Turn a skip into a failure that names the skip's reason, when running under CI."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which must run every test: {reason}"
