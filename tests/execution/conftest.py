"""Fixtures for the execution API tests: a shared Docker sandbox, container look-ups, host memory."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from kernel_sandbox.containers import LABEL, LABEL_OWNER_PID
from kernel_sandbox.execution import Sandbox


@pytest.fixture(scope="module")
def sandbox(docker_engine) -> Iterator[Sandbox]:
    """One Docker sandbox shared by a module's tests (for tests that do not depend on state).

    ``interrupt_grace`` is generous so that an interrupted call never loses the kernel merely
    because the machine is busy.
    """
    with Sandbox(timeout=60, interrupt_grace=30) as sb:
        yield sb


@pytest.fixture
def own_containers(docker_engine):
    """A function returning the ids of this process's kernel-sandbox containers."""

    def ids() -> set[str]:
        found = docker_engine.containers.list(all=True, filters={"label": f"{LABEL_OWNER_PID}={os.getpid()}"})
        return {container.id for container in found if container.labels.get(LABEL) == "true"}

    return ids


def container_of(docker_engine, sandbox: Sandbox):
    """The Docker container running ``sandbox``'s kernel."""
    container_id = sandbox._async._km.provisioner.container_id
    return docker_engine.containers.get(container_id)


def rss_bytes() -> int:
    """This process's resident set size now (not a lifetime peak like ru_maxrss)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Sample this process's RSS in a thread while the block runs; ``growth`` is peak minus start."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        return self.peak - self.start
