"""``kernel-sandbox gc``, ``ps``, ``top``: this host's kernels, listed, watched, cleaned up."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from ..docker.connect import docker_client, engine_clients
from ..docker.containers import GcReport, gc
from ..controls import escape_controls
from ..errors import ConfigError, EngineUnavailable
from .arguments import doc


def cmd_gc(args: argparse.Namespace) -> int:
    """Remove containers, OpenSandbox sandboxes, private directories and partial checkpoints left
    by dead kernels."""
    api_base = args.api_base or os.environ.get("OPEN_SANDBOX_API_BASE")
    try:
        reports = [gc(client, everything=args.all) for client in engine_clients()]
    except EngineUnavailable as exc:
        if not api_base:
            raise
        print(f"no containers checked: {exc}")
    else:
        report = GcReport(
            [name for each in reports for name in each.containers],
            [path for each in reports for path in each.private_dirs],
            [path for each in reports for path in each.checkpoint_parts],
        )
        for name in report.containers:
            print(f"removed container {name}")
        for path in report.private_dirs:
            print(f"removed private directory {path}")
        for path in report.checkpoint_parts:
            print(f"removed partial checkpoint {path}")
        print(
            f"{len(report.containers)} container(s), {len(report.private_dirs)} private "
            f"directory(ies), {len(report.checkpoint_parts)} partial checkpoint(s) removed"
        )
    if api_base:
        deleted = asyncio.run(_gc_sandboxes(api_base, args.all))
        for sandbox_id in deleted:
            print(f"removed sandbox {sandbox_id}")
        print(f"{len(deleted)} OpenSandbox sandbox(es) of this host removed at {api_base}")
    return 0


async def _gc_sandboxes(api_base: str, everything: bool) -> list[str]:
    from ..opensandbox.lifecycle import OpenSandboxClient
    from ..opensandbox.gc import collect_garbage

    async with OpenSandboxClient(api_base) as client:
        return await collect_garbage(client, everything=everything)


def cmd_ps(args: argparse.Namespace) -> int:
    """List kernel containers and their usage, CPU over the last second (a standby kernel, started
    ahead of need, shows as standby; an orphan, how long it waits to be re-attached; a kernel with
    secrets, their names and how many requests used each)."""
    from ..metrics import secrets_text
    from ..top import COLUMNS, INSPECT_TIMEOUT, sampled_twice, usage_columns

    waiting = _orphans()
    asleep, awake = _sleeps()
    print("\t".join((*COLUMNS, "NOTE")))
    for line in asleep:
        print(line)
    # one listing per sample: a container that hangs its inspect shows no usage
    rows = [row for client in engine_clients(INSPECT_TIMEOUT) for row in sampled_twice(client)]
    for row in rows:
        usage = "\t".join(usage_columns(row.usage))  # memory, CPU, pids, tmpfs, OOM kills
        note = waiting.get(row.kernel or "", "") + awake.get(row.kernel or "", "")
        kind = f"kernel {row.kernel}" if row.kernel else "standby"
        held = f"\tsecrets {secrets_text(row.secrets)}" if row.secrets else ""
        print(f"{row.name}\t{row.status}\t{kind}\t{usage}{note}{held}")
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    """Show every kernel container's memory, CPU, pids and tmpfs use, refreshed in place (q
    quits)."""
    from pathlib import Path

    from ..top import INSPECT_TIMEOUT, Recording, top

    if args.interval <= 0:
        raise ConfigError(f"--interval must be a positive number of seconds, not {args.interval}")
    if not sys.stdout.isatty():
        raise ConfigError(
            "kernel-sandbox top draws on a terminal; use `kernel-sandbox ps` for one listing"
        )
    recording = Recording(args.kernel) if args.plot else None
    top(docker_client(INSPECT_TIMEOUT), args.interval, args.duration, recording)
    if recording is not None:
        recording.write(Path(args.plot))
        print(f"Wrote {args.plot}")
    return 0


def _sleeps() -> tuple[list[str], dict[str, str]]:
    """The ``ps`` line of each of this user's kernels that sleeps (``suspend_after``: it has no
    container), and for each kept awake the note that says why."""
    import time

    from ..privdir import sleep_note
    from ..reattach import records

    found, _ = records()
    lines, notes = [], {}
    for record in found:
        state = sleep_note(record.private)
        if state.get("state") == "suspended":
            since = state.get("since")
            when = (
                time.strftime("%H:%M", time.localtime(since)) if isinstance(since, float) else "?"
            )
            size = state["bytes"] if isinstance(state.get("bytes"), int) else 0
            saved = state["saved"] if isinstance(state.get("saved"), int) else 0
            paused = state.get("paused")  # an OpenSandbox sandbox paused, not checkpointed
            held = (
                f"sandbox {escape_controls(paused[:100])} paused"
                if isinstance(paused, str)
                else f"{saved / 2**20:.0f} MiB saved, checkpoint {size / 2**20:.1f} MiB on the host"
            )
            lines.append(
                f"-\tsuspended\tkernel {record.kernel_id}\t0\t-\t-\t-\t-\tasleep since {when}, "
                f"{held}"
            )
        elif isinstance(state.get("why"), str):
            # the reason names the kernel's variables: shown escaped, never obeyed
            notes[record.kernel_id] = f"\tawake: {escape_controls(state['why'][:300])}"
    return lines, notes


def _orphans() -> dict[str, str]:
    """For each of this user's kernels whose owner is gone: how long its launcher still waits for a
    new one."""
    from ..reattach import records

    found, _ = records()
    notes = {}
    for record in found:
        left = record.time_left()
        if record.orphaned is not None and not record.attached:
            notes[record.kernel_id] = "\torphan: re-attach " + (
                "any time" if left is None else f"within {left:.0f} s"
            )
    return notes


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this module's commands to ``kernel-sandbox``'s parser."""
    collect = sub.add_parser("gc", help=cmd_gc.__doc__, description=cmd_gc.__doc__)
    collect.add_argument(
        "--all",
        action="store_true",
        help="remove every kernel container and this host's sandboxes, live ones too",
    )
    collect.add_argument(
        "--api-base",
        metavar="URL",
        help="also remove this host's OpenSandbox sandboxes whose launcher is dead, at this "
        "lifecycle API (default $OPEN_SANDBOX_API_BASE; the key is $OPEN_SANDBOX_API_KEY)",
    )
    collect.set_defaults(func=cmd_gc)

    ps = sub.add_parser("ps", help=cmd_ps.__doc__, description=cmd_ps.__doc__)
    ps.set_defaults(func=cmd_ps)

    watch = sub.add_parser(
        "top",
        help=cmd_top.__doc__,
        description=doc(cmd_top)
        + (
            " The figures are read by the host from each container's cgroup: memory (without "
            "inactive file cache) against the memory limit, CPU in percent of one core against "
            "the cpus limit, processes and threads against pids_limit, each tmpfs's use, and OOM "
            "kills so far."
        ),
    )
    watch.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default 1)"
    )
    watch.add_argument("--duration", type=float, help="stop by itself after this many seconds")
    watch.add_argument(
        "--plot",
        metavar="FILE",
        help="record one kernel's memory and CPU; write them as a PNG at the end",
    )
    watch.add_argument(
        "--kernel",
        help="the kernel --plot follows: a kernel id prefix or a container name "
        "(default: the first running one)",
    )
    watch.set_defaults(func=cmd_top)
