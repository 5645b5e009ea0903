"""Sizes of the load tests (reduced by default, full with ``--full-size``) and their resource watch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import pytest

from support.resource_counts import ResourceWatch, private_host_dirs
from support.security_figures import full_size


@dataclass(frozen=True)
class LoadSize:
    """How much each load test does."""

    name: str
    sequential_calls: int
    sessions: int
    callers_per_session: int
    calls_per_caller: int
    cycles: int
    test_timeout: float

    def describe(self) -> dict[str, object]:
        """The size for the test's figures."""
        return asdict(self)


REDUCED = LoadSize("reduced", sequential_calls=200, sessions=6, callers_per_session=3, calls_per_caller=5,
                   cycles=10, test_timeout=300)
FULL = LoadSize("full", sequential_calls=500, sessions=20, callers_per_session=3, calls_per_caller=10,
                cycles=200, test_timeout=3 * 3600)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give the full-size load tests a longer pytest-timeout than the suite's default."""
    if full_size(config):
        for item in items:
            if "tests/load/" in item.nodeid:
                item.add_marker(pytest.mark.timeout(FULL.test_timeout))


@pytest.fixture(scope="session")
def load_size(pytestconfig: pytest.Config) -> LoadSize:
    """The size of this run: :data:`FULL` with ``--full-size``, else :data:`REDUCED`."""
    return FULL if full_size(pytestconfig) else REDUCED


@pytest.fixture
def watch(docker_engine) -> Iterator[ResourceWatch]:
    """A resource watch over this process, with TMPDIR and the runtime dirs private to the test."""
    with private_host_dirs() as dirs, ResourceWatch(docker_engine, private=dirs) as resource_watch:
        yield resource_watch
