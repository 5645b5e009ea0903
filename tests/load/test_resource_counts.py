"""The resource watch itself: each kind of leak it must see, it sees (and others' resources it must not)."""

from __future__ import annotations

import fcntl
import gc
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from kernel_sandbox.docker.containers import remove_container
from kernel_sandbox.docker.settings import DEFAULT_IMAGE
from support.resource_counts import LABEL, LABEL_OWNER_PID, Bounds, ResourceWatch, growth, private_host_dirs


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s")
        time.sleep(0.01)


def test_process_numbers_and_private_paths_are_seen() -> None:
    with private_host_dirs() as dirs, ResourceWatch(private=dirs) as watch:
        gc.collect()  # an earlier test's garbage closing its sockets now would hide the fds leaked below
        before = watch.snapshot()
        leaked_fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (dirs[0] / "left-behind.json").write_text("{}")
        try:
            problems = growth(before, watch.snapshot(), Bounds(rss=2**40))
            assert [p.split(":")[0] for p in problems] == ["fds", "children", "paths"], problems
            assert "left-behind.json" in problems[2] and str(child.pid) in problems[1]
            with pytest.raises(AssertionError, match="not back where they started"):
                watch.settle(before, Bounds(fds=1, rss=2**40), timeout=0.5)
        finally:
            for fd in leaked_fds:
                os.close(fd)
            child.kill()
            child.wait()
            (dirs[0] / "left-behind.json").unlink()
        assert watch.settle(before, Bounds(rss=2**40), timeout=10)


def test_zombie_children_count_until_reaped() -> None:
    with ResourceWatch() as watch:
        before = watch.snapshot()
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        wait_for(lambda: any(c.startswith(f"{child.pid} ") and c.endswith(" <defunct>") for c in watch.snapshot().children),
                 "the exited child shows as a zombie")
        assert any("children" in p for p in growth(before, watch.snapshot(), Bounds(fds=99)))
        child.wait()
        watch.settle(before, Bounds(fds=2, rss=2**40), timeout=10)


def test_rss_growth_is_measured_now_not_at_the_peak() -> None:
    with ResourceWatch() as watch:
        before = watch.snapshot()
        ballast = bytearray(64 * 1024 * 1024)
        ballast[::4096] = b"x" * len(ballast[::4096])
        assert any(p.startswith("rss") for p in growth(before, watch.snapshot(), Bounds(fds=99, threads=99)))
        del ballast
        watch.settle(before, Bounds(fds=99, threads=99, rss=16 * 1024 * 1024), timeout=10)


@pytest.mark.docker
def test_engine_objects_of_this_process_are_seen_and_others_are_not(docker_engine) -> None:
    watch = ResourceWatch(docker_engine)
    before = watch.snapshot()
    tag = uuid.uuid4().hex[:8]
    labels = {LABEL: "true", "kernel-sandbox.kernel-id": f"watch-test-{tag}"}
    created = []
    try:
        for owner in (os.getpid(), 1):
            created.append(docker_engine.containers.create(
                DEFAULT_IMAGE, ["true"], name=f"ksbx-watch-{tag}-{owner}", network_mode="none",
                labels={**labels, LABEL_OWNER_PID: str(owner)},
            ))
        volume = docker_engine.volumes.create(f"kernel-sandbox-watch-{tag}", labels=labels)
        network = docker_engine.networks.create(f"kernel-sandbox-watch-{tag}", internal=True, labels=labels)
        problems = growth(before, watch.snapshot(), Bounds(fds=99, threads=99, rss=2**40))
        assert [p.split(":")[0] for p in problems] == ["containers", "networks", "volumes"], problems
        assert f"ksbx-watch-{tag}-{os.getpid()}" in problems[0] and f"ksbx-watch-{tag}-1 " not in problems[0]
        volume.remove()
        network.remove()
    finally:
        for container in created:
            remove_container(container)
    watch.settle(before, Bounds(fds=99, threads=99, rss=2**40), timeout=10)


def test_a_project_dir_locked_by_another_process_is_not_counted() -> None:
    """In the shared /tmp, a kernel dir whose lock another live process holds is that process's."""
    root = Path(f"/tmp/ksbx-{os.getuid()}")
    root.mkdir(mode=0o711, exist_ok=True)
    mine, theirs = root / f"watch-{uuid.uuid4().hex[:8]}", root / f"watch-{uuid.uuid4().hex[:8]}"
    before = ResourceWatch().snapshot()
    outsider = None
    try:
        for directory in (mine, theirs):
            directory.mkdir()
            (directory / "owner.lock").touch()
        # An outsider: a lock holder that is not a descendant of this process (its shell parent exits).
        hold = ("import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
                "print('locked', flush=True); time.sleep(60)")
        shell = subprocess.run(
            ["sh", "-c", f'"$0" -c "{hold}" "$1" > "$2" 2>&1 < /dev/null & echo $!', sys.executable,
             str(theirs / "owner.lock"), str(root / f"{theirs.name}.out")],
            capture_output=True, text=True, check=True,
        )
        outsider = int(shell.stdout)
        out = root / f"{theirs.name}.out"
        wait_for(lambda: out.read_text() == "locked\n", "the outsider holds its lock")
        out.unlink()
        with open(mine / "owner.lock") as own_lock:
            fcntl.flock(own_lock, fcntl.LOCK_EX)
            new = ResourceWatch().snapshot().paths - before.paths
        assert str(mine) in new and str(theirs) not in new, new
    finally:
        if outsider is not None:
            os.kill(outsider, 9)
        for directory in (mine, theirs):
            for entry in directory.glob("*"):
                entry.unlink()
            directory.rmdir()
