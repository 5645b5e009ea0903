"""A pytest plugin: how ``-n 2 --dist loadfile`` hands the test files to its workers.

* The files of :data:`ONE_SERVER` form one unit, so that one OpenSandbox server runs at a time.
* The longest unit goes first. pytest-xdist hands out the files with the most tests first, which
  leaves the files of one long browser test for the end: one worker then ran its last minute alone.
  The seconds each file took are in :data:`FILE_SECONDS`; a file not listed counts
  :data:`UNLISTED_SECONDS`. A stale entry costs time at the end of a run, never a test.
* Each run under xdist writes the seconds its files took (setup, call and teardown, summed) to
  :data:`MEASURED`; copy it over :data:`FILE_SECONDS` after a run on CI's kind of machine.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

ONE_SERVER = ("tests/opensandbox/", "tests/policy/test_policy_jupyterlab.py")
"""The test files that use the published OpenSandbox server: under ``-n 2 --dist loadfile`` all run
in one worker (:func:`pytest_xdist_make_scheduler`), so that one server runs at a time (a test of
another file that uses it is refused at collection). At its start the server removes the egress
sidecars of sandboxes it does not know and schedules the expiry of every sandbox on the engine:
two servers on one engine delete each other's sandboxes."""
FILE_SECONDS = Path(__file__).parents[1] / "file-seconds.json"
MEASURED = Path(__file__).parents[2] / "test-artifacts" / "file-seconds.json"
UNLISTED_SECONDS = 5.0

_seconds: collections.Counter[str] = collections.Counter()


def _listed() -> dict[str, float]:
    try:
        return {str(path): float(seconds) for path, seconds in json.loads(FILE_SECONDS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the files of :data:`ONE_SERVER` as one unit and the longest unit first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    listed = _listed()

    def seconds(work_unit: dict[str, bool]) -> float:
        files = {nodeid.split("::")[0] for nodeid in work_unit}
        return sum(listed.get(path, UNLISTED_SECONDS) for path in files)

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return ONE_SERVER[0] if path.startswith(ONE_SERVER) else path

        def _assign_work_unit(self, node: Any) -> None:
            longest = max(self.workqueue, key=lambda scope: seconds(self.workqueue[scope]))
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.hookimpl(trylast=True)  # after tests/conftest.py has marked the tiers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test that uses the OpenSandbox server from a file outside :data:`ONE_SERVER`."""
    for item in items:
        server = item.get_closest_marker("opensandbox") or item.get_closest_marker("opensandbox_server")
        if server and not item.nodeid.startswith(ONE_SERVER):
            raise pytest.UsageError(f"{item.nodeid} uses the OpenSandbox server: add its file to ONE_SERVER")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count the seconds of each phase of each test, by file."""
    _seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under xdist, the controller writes the seconds by file to :data:`MEASURED`."""
    if getattr(session.config.option, "numprocesses", None) and not hasattr(session.config, "workerinput"):
        MEASURED.parent.mkdir(exist_ok=True)
        ordered = dict(sorted(_seconds.items()))
        MEASURED.write_text(json.dumps({path: round(value, 1) for path, value in ordered.items()}, indent=1) + "\n")
