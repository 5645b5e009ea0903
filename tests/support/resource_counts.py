"""Count what this test process holds on the host and in the Docker engine, to show nothing leaks.

Any test can use it::

    watch = ResourceWatch(docker_client_or_None)
    with watch:                       # samples this process's descendants while it runs
        before = watch.snapshot()
        ...                           # the load
        after = watch.settle(before, Bounds(fds=8, threads=4, rss=64 * MiB))

``settle`` waits (up to a deadline) until every count is back within its bound of ``before`` and
fails with a message naming what is still over. Counts of things that must come back exactly
(processes, containers, networks, volumes, host paths) are sets: an entry present after and not
before is a leak, whatever its count. Numbers that a warm process keeps (file descriptors,
threads, resident memory) get a bound; the caller warms up first (one kernel started and stopped)
so that pools, executors and caches already exist in ``before``.

What is counted, and where from:

* ``fds``, ``threads``, ``rss``: ``/proc/self/fd``, ``/proc/self/task``, ``VmRSS`` of
  ``/proc/self/status`` (the current resident size, not the peak that ``ru_maxrss`` reports).
* ``children``: every descendant process of this one, zombies included (``/proc/*/stat``).
* ``containers``: containers labelled ``kernel-sandbox`` whose ``kernel-sandbox.owner-pid`` is this
  process or one of its descendants seen while the watch ran (a launcher process may own them).
* ``networks``, ``volumes``: those labelled ``kernel-sandbox`` or named ``kernel-sandbox*``, and
  dangling (unused) volumes, which a container removed without its anonymous volumes leaves.
* ``paths``: what the project creates on the host: ``ksbx-*`` and ``kernel-sandbox*`` entries (and
  their children) in ``/tmp``, the temp directory, ``$XDG_RUNTIME_DIR`` and Jupyter's runtime
  directory, the connection files ``kernel-*.json`` there, and everything in the ``private``
  directories given to the watch (see :func:`private_host_dirs`, which the load tests use so that
  other programs' files never count). With private directories, the shared ones are searched only
  for the roots that ignore TMPDIR (:data:`FIXED_PREFIXES`). In the shared directories an entry
  that belongs to another process is left out: one named in a label of another owner's container,
  or holding a file that a live process outside this one's tree has locked (``/proc/locks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernel_sandbox.docker import provisioner as docker_provisioner
from kernel_sandbox.provisioners.standby import CLOSE_WAIT, POOL

MiB = 1024 * 1024
LABEL = "kernel-sandbox"
LABEL_OWNER_PID = "kernel-sandbox.owner-pid"
PROJECT_PREFIXES = ("ksbx-", "kernel-sandbox")
FIXED_PREFIXES = ("ksbx-",)
"""Roots the project makes in /tmp whatever TMPDIR says (the Docker provisioner's socket root)."""
SAMPLE_INTERVAL = 0.2


@dataclass(frozen=True)
class Bounds:
    """How far the warm-process numbers may end above ``before``: fds, threads, rss (bytes)."""

    fds: int = 0
    threads: int = 0
    rss: int = 0

    def describe(self) -> dict[str, Any]:
        """The bounds for a report (rss in MiB)."""
        return {"fds": self.fds, "threads": self.threads, "rss_mib": round(self.rss / MiB, 1)}


@dataclass(frozen=True)
class Counts:
    """One snapshot of what the process holds."""

    fds: int
    threads: int
    rss: int
    children: frozenset[str] = field(default_factory=frozenset)
    containers: frozenset[str] = field(default_factory=frozenset)
    networks: frozenset[str] = field(default_factory=frozenset)
    volumes: frozenset[str] = field(default_factory=frozenset)
    paths: frozenset[str] = field(default_factory=frozenset)

    def describe(self) -> dict[str, Any]:
        """Numbers for a report: the sets as their sizes, rss in MiB."""
        out: dict[str, Any] = {}
        for name, value in asdict(self).items():
            out[name] = len(value) if isinstance(value, (set, frozenset)) else value
        out["rss_mib"] = round(out.pop("rss") / MiB, 1)
        return out


def growth(before: Counts, after: Counts, bounds: Bounds) -> list[str]:
    """What ``after`` holds beyond ``before`` and ``bounds``; empty when it is back where it started."""
    problems = []
    for name in ("fds", "threads", "rss"):
        grew = getattr(after, name) - getattr(before, name)
        if grew > getattr(bounds, name):
            unit = f" ({grew / MiB:.1f} MiB)" if name == "rss" else ""
            problems.append(f"{name}: {getattr(before, name)} -> {getattr(after, name)}, "
                            f"+{grew}{unit} over the bound of +{getattr(bounds, name)}")
    for name in ("children", "containers", "networks", "volumes", "paths"):
        new = sorted(getattr(after, name) - getattr(before, name))
        if new:
            problems.append(f"{name}: {len(new)} new: {new[:10]}{' ...' if len(new) > 10 else ''}")
    return problems


def _read_stat(pid: str) -> tuple[int, str, str] | None:
    """(ppid, comm, state) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, tail = raw.rpartition(")")
    fields = tail.split()
    return int(fields[1]), head.partition("(")[2], fields[0]


def descendants(root: int | None = None) -> dict[int, str]:
    """``{pid: command}`` of every descendant of ``root`` (default: this process).

    A zombie (exited, not yet reaped) is ``"command <defunct>"``, so it shows as a new entry.
    """
    root = os.getpid() if root is None else root
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _read_stat(entry)) is not None:
            ppid, comm, state = stat
            children.setdefault(ppid, []).append((int(entry), f"{comm} <defunct>" if state == "Z" else comm))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, what in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = what
                todo.append(pid)
    return found


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _lock_holders() -> dict[tuple[int, int], int]:
    """``{(device, inode): pid}`` of the file locks in ``/proc/locks`` held by a process."""
    holders = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 6 and fields[4].lstrip("-").isdigit() and int(fields[4]) > 0:
                major, minor, inode = fields[5].split(":")
                holders[(os.makedev(int(major, 16), int(minor, 16)), int(inode))] = int(fields[4])
    return holders


def _shared_places() -> list[Path]:
    """Directories shared with other programs, where only the project's names count."""
    from jupyter_core.paths import jupyter_runtime_dir

    places = [Path("/tmp"), Path(tempfile.gettempdir()), Path(jupyter_runtime_dir())]
    if os.environ.get("XDG_RUNTIME_DIR"):
        places.append(Path(os.environ["XDG_RUNTIME_DIR"]))
    return list(dict.fromkeys(places))


def _entries(directory: Path, everything: bool, prefixes: tuple[str, ...] = PROJECT_PREFIXES) -> Iterator[Path]:
    """Project entries of ``directory`` (all of them when ``everything``) and their children."""
    try:
        listing = list(directory.iterdir())
    except OSError:
        return
    for entry in listing:
        name = entry.name
        connection_file = name.startswith("kernel-") and name.endswith(".json")
        if everything or connection_file or name.startswith(prefixes):
            yield entry
            if entry.is_dir() and not entry.is_symlink():
                with contextlib.suppress(OSError):
                    yield from entry.iterdir()


class ResourceWatch:
    """Snapshots of this process's resources; a context manager that samples its descendants.

    ``engine`` is a ``docker.DockerClient`` (None: engine counts are left empty). ``private``
    directories belong to the test alone: every entry in them counts.
    """

    def __init__(self, engine: Any = None, private: Iterable[Path] = ()) -> None:
        self.engine = engine
        self.private = [Path(p) for p in private]
        self.owner_pids: set[int] = {os.getpid()}
        self._stop = threading.Event()
        self._busy = threading.Lock()  # the sampler's /proc reads open fds: never while counting
        self._sampler: threading.Thread | None = None

    def __enter__(self) -> ResourceWatch:
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, name="resource-watch", daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
            self._sampler = None

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL):
            with self._busy:
                self.owner_pids.update(descendants())

    def snapshot(self) -> Counts:
        """Count everything now (after a garbage collection).

        The process's own numbers are read first, and the watch's connections to the engine are
        closed after each snapshot, so the watch never counts itself (but for its sampler thread,
        which is there in every snapshot). The Docker provisioner's shared engine client is dropped
        first: it keeps idle keep-alive connections to the engine, as many as its requests ran at
        once (up to ten per URL), a cache bounded by design like the standby pool.
        """
        docker_provisioner._engine.cache_clear()  # its pools close when collected
        gc.collect()
        with self._busy:
            fds, threads, rss = len(os.listdir("/proc/self/fd")) - 1, len(os.listdir("/proc/self/task")), _rss()
        kids = descendants()
        self.owner_pids.update(kids)
        containers, networks, volumes, foreign = self._engine_counts()
        paths = set()
        for directory in self.private:
            paths.update(str(p) for p in _entries(directory, everything=True))
        prefixes = FIXED_PREFIXES if self.private else PROJECT_PREFIXES
        shared = {str(p) for directory in _shared_places() for p in _entries(directory, False, prefixes)}
        locks = _lock_holders()
        paths.update(p for p in shared if not self._foreign(p, foreign, locks))
        return Counts(
            fds=fds,
            threads=threads,
            rss=rss,
            children=frozenset(f"{pid} {what}" for pid, what in kids.items()),
            containers=containers,
            networks=networks,
            volumes=volumes,
            paths=frozenset(paths),
        )

    def _foreign(self, path: str, labelled: set[str], locks: dict[tuple[int, int], int]) -> bool:
        """True when ``path`` belongs to another process: named by its container, or locked by it."""
        if any(path == f or path.startswith(f + "/") for f in labelled):
            return True
        candidates = [Path(path)]
        with contextlib.suppress(OSError):
            if candidates[0].is_dir() and not candidates[0].is_symlink():
                candidates += list(candidates[0].iterdir())
        for candidate in candidates:
            try:
                st = candidate.stat(follow_symlinks=False)
            except OSError:
                continue
            pid = locks.get((st.st_dev, st.st_ino))
            if pid is not None and pid not in self.owner_pids and Path(f"/proc/{pid}").exists():
                return True
        return False

    def _engine_counts(self) -> tuple[frozenset[str], frozenset[str], frozenset[str], set[str]]:
        if self.engine is None:
            return frozenset(), frozenset(), frozenset(), set()
        mine, foreign = set(), set()
        for container in self.engine.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True):
            owner = container.labels.get(LABEL_OWNER_PID, "")
            if owner.isdigit() and int(owner) in self.owner_pids:
                mine.add(f"{container.name} ({container.status})")
            else:
                foreign.update(v for v in container.labels.values() if v.startswith("/"))
        networks = {n.name for n in self.engine.networks.list(filters={"label": LABEL})}
        networks.update(n.name for n in self.engine.networks.list() if n.name.startswith(LABEL))
        volumes = {v.name for v in self.engine.volumes.list(filters={"label": LABEL})}
        volumes.update(v.name for v in self.engine.volumes.list(filters={"dangling": True}))
        self.engine.api.close()
        return frozenset(mine), frozenset(networks), frozenset(volumes), foreign

    def settle(self, before: Counts, bounds: Bounds, timeout: float = 60.0) -> Counts:
        """Wait until the counts are back within ``bounds`` of ``before``; fail naming what is not.

        The standby pool's idle kernels (``standby`` defaults to 1: at most one per configuration,
        what a Jupyter server keeps warm) are stopped first, as at the process's exit: they are
        bounded by design, and what is checked is that nothing else remains.
        """
        POOL.clear(CLOSE_WAIT)
        deadline = time.monotonic() + timeout
        while (after := self._check(before, bounds, deadline, timeout)) is None:
            time.sleep(0.5)
        return after

    async def settle_async(self, before: Counts, bounds: Bounds, timeout: float = 60.0) -> Counts:
        """:meth:`settle` for a test on an event loop (the loop keeps running while it waits)."""
        await asyncio.to_thread(POOL.clear, CLOSE_WAIT)
        deadline = time.monotonic() + timeout
        while (after := self._check(before, bounds, deadline, timeout)) is None:
            await asyncio.sleep(0.5)
        return after

    def _check(self, before: Counts, bounds: Bounds, deadline: float, timeout: float) -> Counts | None:
        after = self.snapshot()
        problems = growth(before, after, bounds)
        if not problems:
            return after
        if time.monotonic() > deadline:
            raise AssertionError(
                f"resources not back where they started {timeout:g} s after the load:\n  " + "\n  ".join(problems)
            )
        return None


@contextlib.contextmanager
def private_host_dirs(root: str | os.PathLike[str] | None = None) -> Iterator[list[Path]]:
    """Point TMPDIR, ``tempfile``, XDG_RUNTIME_DIR and JUPYTER_RUNTIME_DIR at new private directories.

    Yields the three directories (give them to :class:`ResourceWatch` as ``private``); restores the
    environment afterwards and removes them. The paths are short (Unix socket paths are limited).
    """
    base = Path(tempfile.mkdtemp(prefix="rw-", dir=root or "/tmp"))
    dirs = [base / "tmp", base / "run", base / "jrt"]
    names = ("TMPDIR", "XDG_RUNTIME_DIR", "JUPYTER_RUNTIME_DIR")
    saved = {name: os.environ.get(name) for name in names}
    saved_tempdir = tempfile.tempdir
    for directory, name in zip(dirs, names):
        directory.mkdir(mode=0o700)
        os.environ[name] = str(directory)
    tempfile.tempdir = str(dirs[0])
    try:
        yield dirs
    finally:
        tempfile.tempdir = saved_tempdir
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(base, ignore_errors=True)
