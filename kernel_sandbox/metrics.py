"""What a sandbox uses, read by the host: :class:`Usage`, sampled from the container's cgroup.

A :class:`CgroupProbe` finds a Docker container's cgroup once (through the init pid's
``/proc/PID/cgroup`` and the host's ``/proc/self/mountinfo``, cgroup v1 or v2; the path must name
the container's id, so a reused pid is never read for it) and then reads a few small files per
sample: no engine call, well under a millisecond. Each writable tmpfs is measured with
``statvfs`` through ``/proc/PID/root`` (the real tmpfs, as the host's kernel sees it). Nothing here
asks code in the sandbox: what the kernel's own code says about itself is never used.

Under gVisor (``runsc``) the cgroup holds the sandbox's host processes (its memory is the
sandbox's own; its pids are the runtime's threads) and the tmpfs lives inside the runtime, out of
the host's sight: ``tmpfs`` is empty there.

:func:`near_misses` names, from two samples, the limits that code hit meanwhile: the process
limit (a fork or thread refused at ``pids_limit``), a full tmpfs (and the option that sizes
it), the memory limit (reclaim at the limit, an OOM kill).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import MetricsUnavailable
from .settings import HOME_DIR, PACKAGES_DIR, WORK_DIR
from .parsers import MiB

__all__ = ["CgroupProbe", "MetricsUnavailable", "TmpfsUsage", "Usage", "near_misses"]

TMPFS_OPTIONS = {
    "/tmp": "tmp_size",
    HOME_DIR: "home_size",
    WORK_DIR: "work_size",
    PACKAGES_DIR: "packages_size",
}
"""The setting that sizes each tmpfs of a kernel's container."""
UNLIMITED_V1 = 2**62
"""cgroup v1 memory limits at or above this are 'no limit' (the kernel's page-rounded LONG_MAX)."""
FULL_FREE_BYTES = 64 * 1024
"""A tmpfs with less than this left is full (a write of any size fails there)."""
GiB = 1024 * MiB


@dataclass(frozen=True)
class TmpfsUsage:
    """One writable tmpfs: where it is mounted, bytes used, its size, the option that sets it."""

    mount: str
    used: int
    size: int
    option: str

    @property
    def full(self) -> bool:
        """True when (almost) nothing is left on it."""
        return self.size - self.used < FULL_FREE_BYTES

    def __str__(self) -> str:
        return f"{self.mount} {size_text(self.used)}/{size_text(self.size)}"


@dataclass(frozen=True, repr=False)
class Usage:
    """One sample of a sandbox's usage against its limits, read by the host (None: not known / no
    limit).

    ``memory`` is what ``docker stats`` shows (usage without inactive file cache), in bytes;
    ``cpu_percent`` is the share of one core used since the previous sample (the first sample:
    since the container started), ``cpu_limit`` the cores allowed; ``pids`` counts processes and
    threads. Counters since the start: ``oom_kills``, ``memory_failcnt`` (allocations that
    found the cgroup at its limit), ``pids_refused`` (forks and threads refused at the limit),
    ``throttled_periods`` and ``throttled_seconds`` (CPU quota exhausted).
    """

    memory: int | None = None
    memory_limit: int | None = None
    cpu_percent: float | None = None
    cpu_limit: float | None = None
    pids: int | None = None
    pids_limit: int | None = None
    tmpfs: tuple[TmpfsUsage, ...] = ()
    oom_kills: int = 0
    memory_failcnt: int = 0
    pids_refused: int = 0
    throttled_periods: int = 0
    throttled_seconds: float = 0.0
    cpu_seconds: float = 0.0
    source: str = ""
    """Where the numbers come from: ``cgroup v1``, ``cgroup v2`` or ``execd``."""
    sampled_at: float = field(default_factory=time.time)
    secrets: tuple[tuple[str, int], ...] = ()
    """The kernel's secrets and its tool calls' (names, never values), each with the requests that
    used it."""
    state: str = "running"
    """``running``, or ``suspended`` while the kernel sleeps (``suspend_after``: no container, its
    memory 0)."""
    saved: int | None = None
    """While suspended: the memory its container held when it went to sleep, in bytes."""
    kept_awake: str | None = None
    """Why a kernel with ``suspend_after`` did not go to sleep when it was due (an open socket, a
    widget, a checkpoint refused), as its launcher noted; None when nothing kept it awake."""

    @property
    def memory_percent(self) -> float | None:
        """Memory used as a percentage of the limit."""
        if self.memory is None or not self.memory_limit:
            return None
        return 100.0 * self.memory / self.memory_limit

    def __repr__(self) -> str:
        parts = [f"memory={memory_text(self)}", f"cpu={cpu_text(self)}", f"pids={pids_text(self)}"]
        if self.tmpfs:
            parts.append("tmpfs=[" + ", ".join(map(str, self.tmpfs)) + "]")
        for name in ("oom_kills", "pids_refused", "memory_failcnt", "throttled_periods"):
            if getattr(self, name):
                parts.append(f"{name}={getattr(self, name)}")
        if self.secrets:
            parts.append(f"secrets={secrets_text(self.secrets)}")
        if self.source:
            parts.append(f"source={self.source!r}")
        return f"Usage({', '.join(parts)})"


def secrets_text(secrets: tuple[tuple[str, int], ...]) -> str:
    """``NAME:USES`` for each secret, comma-separated."""
    return ",".join(f"{name}:{uses}" for name, uses in secrets)


def size_text(value: int | None) -> str:
    """Bytes in MiB (GiB from 10 GiB on), as people read them."""
    if value is None:
        return "-"
    if value >= 10 * GiB:
        return f"{value / GiB:.1f}GiB"
    return f"{value / MiB:.1f}MiB"


def memory_text(usage: Usage) -> str:
    """``used/limit (percent)``."""
    if usage.memory is None:
        return "-"
    if not usage.memory_limit:
        return size_text(usage.memory)
    return (
        f"{size_text(usage.memory)}/{size_text(usage.memory_limit)} ({usage.memory_percent:.0f}%)"
    )


def cpu_text(usage: Usage) -> str:
    """``percent/limit`` (the limit in percent of one core, as the percent is)."""
    if usage.cpu_percent is None:
        return "-"
    limit = f"/{usage.cpu_limit * 100:.0f}%" if usage.cpu_limit else ""
    return f"{usage.cpu_percent:.0f}%{limit}"


def pids_text(usage: Usage) -> str:
    """``pids/limit``."""
    if usage.pids is None:
        return "-"
    return f"{usage.pids}/{usage.pids_limit}" if usage.pids_limit else str(usage.pids)


# -- finding the cgroup -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    root: str
    point: str

    def host_path(self, cgroup_path: str) -> Path | None:
        """Where ``cgroup_path`` (as /proc/PID/cgroup names it) is under this mount, if inside
        it."""
        root = self.root.rstrip("/")
        if root and cgroup_path != root and not cgroup_path.startswith(root + "/"):
            return None
        return Path(self.point + cgroup_path[len(root) :])


def cgroup_mounts(mountinfo: str) -> tuple[dict[str, _Mount], _Mount | None]:
    """The v1 hierarchies by controller and the v2 (unified) mount, from a mountinfo text."""
    v1: dict[str, _Mount] = {}
    v2: _Mount | None = None
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount = _Mount(fields[3], fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            v2 = v2 or mount
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                v1.setdefault(option, mount)
    return v1, v2


def process_cgroups(text: str) -> tuple[dict[str, str], str | None]:
    """The v1 paths by controller and the v2 path, from a /proc/PID/cgroup text."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        for controller in parts[1].split(","):
            if controller:
                v1[controller] = parts[2]
    return v1, v2


def _read(path: Path) -> str:
    with open(path) as file:
        return file.read()


def _number(text: str) -> int | None:
    text = text.strip()
    return None if text in ("max", "") else int(text)


def _keyed(text: str) -> dict[str, int]:
    pairs = (line.split() for line in text.splitlines())
    return {
        pair[0]: int(pair[1]) for pair in pairs if len(pair) == 2 and pair[1].lstrip("-").isdigit()
    }


class CgroupProbe:
    """The cgroup (and tmpfs mounts) of one running container, found once and read per
    :meth:`read`."""

    def __init__(
        self,
        container_id: str,
        pid: int,
        dirs: Mapping[str, Path],
        version: int,
        tmpfs: Mapping[str, str],
        started: float,
        statfs: bool,
    ) -> None:
        self.container_id = container_id
        self.pid = pid
        self._dirs = dict(dirs)
        self.version = version
        self._tmpfs = dict(tmpfs)
        self._statfs = statfs
        self._last = (0.0, started)

    @classmethod
    def for_container(cls, attrs: Mapping[str, Any], proc: Path = Path("/proc")) -> CgroupProbe:
        """The probe of a container from the engine's inspect data (it must be running)."""
        container_id = attrs["Id"]
        state = attrs.get("State") or {}
        pid = state.get("Pid") or 0
        if not state.get("Running") or not pid:
            raise MetricsUnavailable(f"the container {container_id[:12]} is not running")
        try:
            own, unified = process_cgroups(_read(proc / str(pid) / "cgroup"))
            v1, v2 = cgroup_mounts(_read(proc / "self" / "mountinfo"))
        except OSError as exc:
            raise MetricsUnavailable(
                f"cannot read the cgroup of the container {container_id[:12]} ({exc}): "
                "the Docker engine runs on another machine, or in another pid namespace"
            ) from exc
        dirs: dict[str, Path] = {}
        version = 1
        if "memory" in own and "memory" in v1:
            for controller in ("memory", "cpu", "cpuacct", "pids"):
                if controller in own and controller in v1:
                    path = v1[controller].host_path(own[controller])
                    if path is not None:
                        dirs[controller] = path
        elif unified is not None and v2 is not None:
            version = 2
            path = v2.host_path(unified)
            if path is not None:
                dirs = dict.fromkeys(("memory", "cpu", "cpuacct", "pids"), path)
        if not dirs or any(container_id not in str(path) for path in dirs.values()):
            raise MetricsUnavailable(
                f"the cgroup of the container {container_id[:12]} was not found under "
                f"/sys/fs/cgroup (its init pid {pid} is in {own or unified!r})"
            )
        runtime = (attrs.get("HostConfig") or {}).get("Runtime") or "runc"
        mounts = {
            point: TMPFS_OPTIONS.get(point, "")
            for point in sorted((attrs.get("HostConfig") or {}).get("Tmpfs") or {})
        }
        return cls(
            container_id, pid, dirs, version, mounts, _started(state), statfs=runtime == "runc"
        )

    def _file(self, controller: str, name: str) -> str:
        return _read(self._dirs[controller] / name)

    def read(self) -> Usage:
        """One sample (raise :class:`MetricsUnavailable` once the container is gone)."""
        try:
            usage = self._read_v1() if self.version == 1 else self._read_v2()
        except (OSError, ValueError, KeyError) as exc:
            raise MetricsUnavailable(
                f"the container {self.container_id[:12]} is gone ({exc})"
            ) from exc
        return usage

    def _cpu_percent(self, cpu_seconds: float) -> float:
        before, then = self._last
        now = time.time()
        self._last = (cpu_seconds, now)
        return 100.0 * max(cpu_seconds - before, 0.0) / max(now - then, 1e-3)

    def _read_v1(self) -> Usage:
        stat = _keyed(self._file("memory", "memory.stat"))
        used = int(self._file("memory", "memory.usage_in_bytes"))
        limit = int(self._file("memory", "memory.limit_in_bytes"))
        oom = _keyed(self._file("memory", "memory.oom_control"))
        cpu_seconds = int(self._file("cpuacct", "cpuacct.usage")) / 1e9
        quota = int(self._file("cpu", "cpu.cfs_quota_us"))
        period = int(self._file("cpu", "cpu.cfs_period_us"))
        cpu = _keyed(self._file("cpu", "cpu.stat"))
        return self._usage(
            memory=max(used - stat.get("total_inactive_file", 0), 0),
            memory_limit=None if limit >= UNLIMITED_V1 else limit,
            cpu_seconds=cpu_seconds,
            cpu_limit=quota / period if quota > 0 and period > 0 else None,
            oom_kills=oom.get("oom_kill", 0),
            memory_failcnt=int(self._file("memory", "memory.failcnt")),
            throttled_periods=cpu.get("nr_throttled", 0),
            throttled_seconds=cpu.get("throttled_time", 0) / 1e9,
        )

    def _read_v2(self) -> Usage:
        stat = _keyed(self._file("memory", "memory.stat"))
        events = _keyed(self._file("memory", "memory.events"))
        cpu = _keyed(self._file("cpu", "cpu.stat"))
        quota, _, period = self._file("cpu", "cpu.max").partition(" ")
        return self._usage(
            memory=max(
                int(self._file("memory", "memory.current")) - stat.get("inactive_file", 0), 0
            ),
            memory_limit=_number(self._file("memory", "memory.max")),
            cpu_seconds=cpu.get("usage_usec", 0) / 1e6,
            cpu_limit=int(quota) / int(period)
            if quota.isdigit() and period.strip().isdigit()
            else None,
            oom_kills=events.get("oom_kill", 0),
            memory_failcnt=events.get("max", 0),
            throttled_periods=cpu.get("nr_throttled", 0),
            throttled_seconds=cpu.get("throttled_usec", 0) / 1e6,
        )

    def _usage(self, *, cpu_seconds: float, **values: Any) -> Usage:
        return Usage(
            cpu_percent=self._cpu_percent(cpu_seconds),
            cpu_seconds=cpu_seconds,
            pids=_number(self._file("pids", "pids.current")),
            pids_limit=_number(self._file("pids", "pids.max")),
            pids_refused=_keyed(self._file("pids", "pids.events")).get("max", 0),
            tmpfs=self._tmpfs_usage(),
            source=f"cgroup v{self.version}",
            **values,
        )

    def _tmpfs_usage(self) -> tuple[TmpfsUsage, ...]:
        """statvfs of each tmpfs through the init process's root, once its pid is still the
        container's."""
        if not self._statfs or not self._tmpfs:
            return ()
        root = f"/proc/{self.pid}/root"
        try:
            if self.container_id not in _read(Path(f"/proc/{self.pid}/cgroup")):
                return ()
            found = []
            for mount, option in self._tmpfs.items():
                stat = os.statvfs(root + mount)
                size = stat.f_blocks * stat.f_frsize
                found.append(TmpfsUsage(mount, size - stat.f_bfree * stat.f_frsize, size, option))
        except OSError:
            return ()  # not root, or the process is gone: no tmpfs figures rather than wrong ones
        return tuple(found)


def _started(state: Mapping[str, Any]) -> float:
    text = str(state.get("StartedAt") or "")
    try:
        return datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return time.time()


# -- jupyter-resource-usage's kernel usage panel ---------------------------------------------------


def usage_reply(usage: Usage | None) -> dict[str, Any]:
    """The content of a ``usage_reply`` (as ipykernel sends it) with the sandbox's figures.

    jupyter-resource-usage's panel shows ``kernel_cpu`` and ``kernel_memory``, and under "host"
    ``host_cpu_percent`` on ``cpu_count`` CPUs and ``host_virtual_memory``: here the sandbox's
    limits stand for the host (its memory limit as the total, else the machine's memory).
    ``kernel_sandbox`` carries the whole :class:`Usage`. Without figures the reply has only
    ``hostname``, and the panel says so; while the kernel sleeps, ``hostname`` says that.
    """
    content: dict[str, Any] = {"hostname": "sandbox", "kernel_sandbox": None}
    if usage is None:
        return content
    if usage.state == "suspended":  # the panel shows the host's name: it says the kernel sleeps
        saved = f", {usage.saved / 2**20:.0f} MiB saved" if usage.saved else ""
        content["hostname"] = f"sandbox (sleeping{saved})"
    content["kernel_sandbox"] = {
        name: getattr(usage, name) for name in usage.__dataclass_fields__ if name != "tmpfs"
    }
    content["kernel_sandbox"]["tmpfs"] = [vars(tmpfs) for tmpfs in usage.tmpfs]
    content["kernel_cpu"] = round(usage.cpu_percent or 0.0, 1)
    content["kernel_memory"] = usage.memory or 0
    cores = usage.cpu_limit or os.cpu_count() or 1
    content["cpu_count"] = round(cores, 2)
    content["host_cpu_percent"] = round((usage.cpu_percent or 0.0) / cores, 1) or None
    total = usage.memory_limit or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    used = usage.memory or 0
    content["host_virtual_memory"] = {
        "total": total,
        "available": max(total - used, 0),
        "free": max(total - used, 0),
        "used": used,
        "active": used,
        "inactive": 0,
        "percent": round(100.0 * used / total, 1),
    }
    return content


# -- what a run ran into --------------------------------------------------------------------------


NO_SPACE = "No space left on device"
"""strerror(ENOSPC): an error that says it names a tmpfs that is full even when it was full
before."""


def near_misses(before: Usage, after: Usage, error_text: str = "") -> list[str]:
    """The limits the sandbox hit between two samples, named with the option that sets it.

    A tmpfs is named when it became full meanwhile, or is full and ``error_text`` (the error
    being explained) says "no space": the error only chooses which true fact to tell.
    """
    notes = []
    if after.pids_refused > before.pids_refused:
        refused = after.pids_refused - before.pids_refused
        notes.append(
            f"process limit reached: {refused} fork(s) or thread(s) refused at "
            f"pids_limit={after.pids_limit} (EAGAIN); raise pids_limit"
        )
    was_full = (
        {tmpfs.mount for tmpfs in before.tmpfs if tmpfs.full}
        if NO_SPACE not in error_text
        else set()
    )
    for tmpfs in after.tmpfs:
        if tmpfs.full and tmpfs.mount not in was_full:
            option = f"; raise {tmpfs.option}" if tmpfs.option else ""
            notes.append(f"the tmpfs {tmpfs.mount} is full ({size_text(tmpfs.size)}{option})")
    if after.oom_kills > before.oom_kills:
        notes.append(
            "out of memory: a process was killed at the memory limit "
            f"({size_text(after.memory_limit)}); raise memory"
        )
    elif after.memory_failcnt > before.memory_failcnt and after.memory_limit and not notes:
        notes.append(
            f"memory limit reached ({size_text(after.memory_limit)}): allocations had to wait for "
            "reclaim; raise memory"
        )
    return notes
