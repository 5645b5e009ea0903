"""Host memory as the tests measure it: a process's resident set size now, and its peak while a block runs.

Read from ``/proc/PID/status`` (``VmRSS``), sampled every few milliseconds in a thread, so the figures
are peaks the host really saw, never a lifetime maximum like ``ru_maxrss``.
"""

from __future__ import annotations

import threading

MiB = 1024 * 1024


def rss(pid: int | str = "self") -> int | None:
    """The resident memory of ``pid`` in bytes now, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssPeak:
    """Sample the RSS of ``pid`` (this process by default) while the block runs; ``growth`` is peak minus start."""

    def __init__(self, pid: int | str = "self", every: float = 0.002) -> None:
        self.pid, self.every = pid, every
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-peak", daemon=True)

    def _now(self) -> int:
        value = rss(self.pid)
        if value is None:
            raise ProcessLookupError(f"process {self.pid} is gone")
        return value

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            value = rss(self.pid)
            if value is None:
                return
            self.peak = max(self.peak, value)

    def __enter__(self) -> RssPeak:
        self.start = self.peak = self._now()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, self._now())

    @property
    def growth(self) -> int:
        return self.peak - self.start
