"""``kernel-sandbox ps`` usage columns and ``kernel-sandbox top``: every kernel container's usage,
read by the host.

``top`` redraws a table in place (curses) every ``--interval`` seconds until ``q`` or Ctrl-C;
``--plot FILE`` records one kernel's memory and CPU meanwhile and writes them as a PNG on the way
out.
"""

from __future__ import annotations

import curses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions

from .docker.containers import LABEL_PRIVATE_DIR, OURS, kernel_of
from .errors import ConfigError, MetricsUnavailable
from .hostsecrets import read_uses
from .metrics import (
    GiB,
    MiB,
    CgroupProbe,
    Usage,
    cpu_text,
    memory_text,
    pids_text,
    size_text,
)

COLUMNS = ("NAME", "STATUS", "KERNEL", "MEMORY", "CPU", "PIDS", "TMPFS", "OOM")
WIDTHS = (0, 7, 8, 13, 8, 7, 11, 3)
"""Each of ``top``'s column widths; NAME (0) takes what the screen leaves (80 columns: 15)."""
NAME_PREFIX = "kernel-sandbox-"
"""Every kernel container's name starts so: ``top`` leaves it out (``ps`` shows whole names)."""
MIN_NAME = 8
RATE_WINDOW = 1.0
"""Seconds between ``ps``'s two samples: its CPU is the rate between them, as ``docker stats``'s."""


def tmpfs_text(usage: Usage) -> str:
    """Each tmpfs's use in percent, named by its option (``tmp:3% home:0% work:0%``)."""
    return (
        " ".join(
            f"{t.option.removesuffix('_size') or t.mount}:{100 * t.used // max(t.size, 1)}%"
            for t in sorted(usage.tmpfs, key=lambda t: t.mount)
        )
        or "-"
    )


def usage_columns(usage: Usage | None) -> list[str]:
    """The MEMORY, CPU, PIDS, TMPFS and OOM columns of one kernel ("-" where unknown)."""
    if usage is None:
        return ["-"] * 5
    return [
        memory_text(usage),
        cpu_text(usage),
        pids_text(usage),
        tmpfs_text(usage),
        str(usage.oom_kills),
    ]


@dataclass
class Row:
    """One kernel container and its usage now (None when the host cannot read it)."""

    name: str
    status: str
    kernel: str | None
    """The kernel's id; None for a standby not taken yet."""
    container_id: str
    usage: Usage | None
    secrets: tuple[tuple[str, int], ...] = ()
    """The kernel's secrets and their use counts (its launcher's record; never values)."""

    def cells(self) -> list[str]:
        """The row's text for ``top``, one item per :data:`COLUMNS`, short enough for
        :data:`WIDTHS`."""
        usage = self.usage
        return [
            self.name.removeprefix(NAME_PREFIX),
            self.status,
            self.kernel[:8] if self.kernel else "standby",
            *(["-"] * 5 if usage is None else _short_usage(usage)),
        ]


def _short_size(value: int) -> str:
    """Bytes in whole MiB (``97M``), from 1000 MiB on in GiB (``1.5G``)."""
    return f"{value / GiB:.1f}G" if value >= 1000 * MiB else f"{value / MiB:.0f}M"


def _short_usage(usage: Usage) -> list[str]:
    """MEMORY, CPU, PIDS, TMPFS and OOM as ``top`` shows them: ``97M/256M 38%``, ``85%/100%``,
    ``12/64``, ``h0 p0 w0 t3`` (each tmpfs's use in percent, by its option's initial), ``0``."""
    memory = "-" if usage.memory is None else _short_size(usage.memory)
    if usage.memory is not None and usage.memory_limit:
        memory += f"/{_short_size(usage.memory_limit)} {usage.memory_percent:.0f}%"
    tmpfs = " ".join(
        f"{(t.option or t.mount.strip('/'))[:1]}{100 * t.used // max(t.size, 1)}"
        for t in sorted(usage.tmpfs, key=lambda t: t.mount)
    )
    return [memory, cpu_text(usage), pids_text(usage), tmpfs or "-", str(usage.oom_kills)]


@dataclass
class Sampler:
    """Kernel containers and their usage; probes are kept between samples, so CPU % is per interval.

    The containers are listed in one engine call; each running one is inspected once, when first
    seen (a container whose inspect fails or hangs shows no figures, and is asked again next time).
    """

    client: Any
    probes: dict[str, CgroupProbe] = field(default_factory=dict)

    def rows(self) -> list[Row]:
        """Every kernel container now, with its usage."""
        rows = []
        for summary in self.client.api.containers(all=True, filters={"label": OURS}):
            container_id, labels = summary["Id"], summary.get("Labels") or {}
            kernel_id = kernel_of(labels)
            usage = self._usage_of(container_id) if summary.get("State") == "running" else None
            name = (summary.get("Names") or ["/?"])[0].lstrip("/")
            held = read_uses(labels.get(LABEL_PRIVATE_DIR))
            rows.append(Row(name, summary.get("State", "?"), kernel_id, container_id, usage, held))
        self.probes = {
            row.container_id: self.probes[row.container_id]
            for row in rows
            if row.container_id in self.probes
        }
        return rows

    def _usage_of(self, container_id: str) -> Usage | None:
        if container_id not in self.probes:
            try:
                attrs = self.client.api.inspect_container(container_id)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                return None
            return self.usage(attrs)
        return self.usage({"Id": container_id})

    def usage(self, attrs: Mapping[str, Any]) -> Usage | None:
        """The usage of the container with inspect data ``attrs``; None when not running or out of
        reach."""
        container_id = attrs["Id"]
        try:
            probe = self.probes.get(container_id) or CgroupProbe.for_container(attrs)
            self.probes[container_id] = probe
            return probe.read()
        except MetricsUnavailable:
            self.probes.pop(container_id, None)
            return None


def table(rows: list[Row], width: int = 80) -> list[str]:
    """The rows as aligned text lines under a header, each shorter than ``width`` (a screen's last
    column stays empty): the NAME column gets what the others leave, at least :data:`MIN_NAME`."""
    others = sum(WIDTHS[1:]) + len(WIDTHS) - 1
    names = [row.cells()[0] for row in rows]
    widths = (max(MIN_NAME, min(width - 1 - others, max(map(len, names), default=4))), *WIDTHS[1:])

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return " ".join(cell[:size].ljust(size) for cell, size in zip(cells, widths)).rstrip()

    return [line(COLUMNS), *(line(row.cells()) for row in rows)]


def sampled_twice(client: Any, window: float = RATE_WINDOW) -> list[Row]:
    """Every kernel container with its usage, its CPU the rate over ``window`` seconds (the first
    reading of a cgroup gives only the average since the container started)."""
    sampler = Sampler(client)
    if any(row.usage is not None for row in sampler.rows()):
        time.sleep(window)
    return sampler.rows()


@dataclass
class Recording:
    """One kernel's memory and CPU over time, for ``--plot``."""

    kernel: str | None
    times: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    limit: int | None = None
    name: str = ""

    def add(self, rows: list[Row]) -> None:
        """Take the followed kernel's sample from ``rows`` (the first running kernel when none was
        named)."""
        for row in rows:
            if row.usage is None or (
                self.kernel
                and not ((row.kernel or "").startswith(self.kernel) or row.name == self.kernel)
            ):
                continue
            if not self.name:
                self.name = row.name
            if row.name != self.name:
                continue
            self.times.append(row.usage.sampled_at)
            self.memory.append((row.usage.memory or 0) / 2**20)
            self.cpu.append(row.usage.cpu_percent or 0.0)
            self.limit = row.usage.memory_limit
            return

    def write(self, path: Path) -> None:
        """Write the PNG: memory (MiB, with the limit) above CPU (% of one core)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        if not self.times:
            raise ConfigError(
                f"--plot {path}: no running kernel{f' {self.kernel!r}' if self.kernel else ''} was "
                "seen"
            )
        start = self.times[0]
        seconds = [t - start for t in self.times]
        figure, (memory, cpu) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
        memory.plot(seconds, self.memory, label="memory")
        if self.limit:
            memory.axhline(
                self.limit / 2**20,
                color="red",
                linestyle="--",
                label=f"limit {size_text(self.limit)}",
            )
        memory.set_ylabel("MiB")
        memory.legend(loc="upper left")
        cpu.plot(seconds, self.cpu, color="green")
        cpu.set_ylabel("CPU % of one core")
        cpu.set_xlabel("seconds")
        figure.suptitle(f"kernel-sandbox: {self.name}")
        figure.savefig(path, dpi=100)
        plt.close(figure)


INSPECT_TIMEOUT = 10
"""Seconds ``top`` waits for one engine call (a hung container's inspect must not freeze the
screen)."""


def top(
    client: Any, interval: float, duration: float | None = None, recording: Recording | None = None
) -> None:
    """Redraw the kernels' usage in place every ``interval`` s until q, Ctrl-C or ``duration`` s."""
    sampler = Sampler(client)
    curses.wrapper(lambda screen: _loop(screen, sampler, interval, duration, recording))


def _loop(
    screen: Any,
    sampler: Sampler,
    interval: float,
    duration: float | None,
    recording: Recording | None,
) -> None:
    curses.curs_set(0)
    screen.timeout(int(interval * 1000))
    ends = None if duration is None else time.monotonic() + duration
    rows: list[Row] = []
    while ends is None or time.monotonic() < ends:
        problem = ""
        try:
            rows = sampler.rows()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            problem = (
                f"the Docker engine did not answer ({type(exc).__name__}); showing the last figures"
            )
        if recording is not None and not problem:
            recording.add(rows)
        _draw(screen, rows, problem)
        try:
            key = screen.getch()
        except KeyboardInterrupt:
            return
        if key in (ord("q"), ord("Q"), 3):
            return


def _draw(screen: Any, rows: list[Row], problem: str = "") -> None:
    height, width = screen.getmaxyx()
    header = f"kernel-sandbox top  {time.strftime('%H:%M:%S')}  {len(rows)} kernel(s)  (q quits)"
    screen.erase()
    for y, text in enumerate([header, problem, *table(rows, width)][: height - 1]):
        screen.addnstr(y, 0, text, width - 1, curses.A_BOLD if y in (0, 2) else curses.A_NORMAL)
    screen.refresh()
