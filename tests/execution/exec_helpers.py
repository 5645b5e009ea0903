"""Helpers for the execution API tests: container look-ups and host memory measured as RSS."""

from __future__ import annotations

import os
import threading

from kernel_sandbox.execution import Sandbox


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
