"""The ``kernel-sandbox`` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from . import __version__
from .docker.settings import ENGINES
from .docker.containers import DEFAULT_IMAGE, GcReport, gc
from .docker.connect import docker_client, engine_clients
from .controls import SafeWriter, escape_controls
from .egress import PYPI, package_index
from .errors import ConfigError, EngineUnavailable, KernelSandboxError
from .hostsecrets import Secret, parse_binding
from .kernelspecs import DOCKER_SPEC, install, shipped_kernelspecs


def _config_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _install_config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name in ("image", "memory", "cpus", "pids_limit", "mount_cwd"):
        if getattr(args, name) is not None:
            config[name] = getattr(args, name)
    if args.network is not None:
        config["network"] = args.network
    if args.mount:
        config["mounts"] = args.mount
    if args.env:
        config["env"] = dict(item.split("=", 1) for item in args.env)
    if args.secret:
        config["secrets"] = args.secret
    for item in args.set:
        key, _, value = item.partition("=")
        config[key] = _config_value(value)
    allowed = list(args.allow)
    if args.allow_package_index:
        allowed += [
            str(d)
            for d in package_index("package_index", config.get("package_index", PYPI)).destinations
        ]
    if allowed:
        if args.network is not None:
            raise ConfigError(
                "--network/--no-network and --allow/--allow-package-index both set the network: "
                "give one"
            )
        config["network"] = allowed
    return config


DESCRIPTION = """\
Run Jupyter kernels in disposable, locked-down Docker containers: the "Sandboxed Python"
kernelspec starts each kernel in a fresh container with no network, a non-root user and
resource limits, for JupyterLab, notebooks run headless, and programs.

Start here: `kernel-sandbox lab` checks the Docker engine, builds the kernel image, installs
the kernelspec and opens JupyterLab with Sandboxed Python as the default kernel.
`kernel-sandbox setup` does the same without JupyterLab, for other clients and programs."""


def cmd_setup(args: argparse.Namespace) -> int:
    """Check the engine, build the kernel image if missing, install the kernelspec: only what is not
    done yet."""
    from .lab import setup

    setup(image=args.image, prefix=args.prefix, user=args.user, install_engine=args.install_engine)
    print(f"Ready: pick Sandboxed Python ({DOCKER_SPEC}) in any Jupyter client.")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    """Set up as `setup` does, then start JupyterLab with Sandboxed Python as the default kernel."""
    from .lab import lab

    return lab(
        args.jupyterlab_args,
        locked_down=args.locked_down,
        image=args.image,
        prefix=args.prefix,
        user=args.user,
        install_engine=args.install_engine,
    )


def _add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--image",
        help="kernel image, built when missing (default: the installed kernelspec's, else "
        f"{DEFAULT_IMAGE})",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--prefix",
        help="install the kernelspec under this prefix (default: this Python's, sys.prefix)",
    )
    where.add_argument(
        "--user", action="store_true", help="install the kernelspec for the current user instead"
    )
    parser.add_argument(
        "--install-engine",
        action="store_true",
        help="as root on Debian/Ubuntu: install docker.io and start the engine when none is "
        "reachable",
    )


def cmd_install(args: argparse.Namespace) -> int:
    """Install kernelspecs into Jupyter's data directory."""
    names = list(shipped_kernelspecs()) if args.kernel == "all" else [args.kernel]
    if args.name and len(names) > 1:
        raise SystemExit("--name installs one kernelspec: pick it with --kernel")
    prefix = sys.prefix if args.sys_prefix else args.prefix
    config = _install_config(args)
    for name in names:
        path = install(
            name,
            user=args.user,
            prefix=prefix,
            install_as=args.name,
            display_name=args.display_name,
            config=config,
        )
        print(f"Installed kernelspec {args.name or name} in {path}")
    return 0


def cmd_image_build(args: argparse.Namespace) -> int:
    """Build the kernel image."""
    from .docker.image import build_image

    tag = build_image(
        tag=args.tag,
        base_image=args.base_image,
        rebuild_base=args.rebuild_base,
        engine=args.engine,
    )
    print(f"Built {tag}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the set-up and print the fix for each problem."""
    from .doctor import run_checks

    failed = 0
    for check in run_checks(image=args.image):
        print(f"[{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
        if not check.ok:
            failed += 1
            print(f"       fix: {check.fix}")
    print("All checks passed." if not failed else f"{failed} problem(s) found.")
    return 1 if failed else 0


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
    from .opensandbox.lifecycle import OpenSandboxClient
    from .opensandbox.gc import collect_garbage

    async with OpenSandboxClient(api_base) as client:
        return await collect_garbage(client, everything=everything)


def cmd_ps(args: argparse.Namespace) -> int:
    """List kernel containers and their usage, CPU over the last second (a standby kernel, started
    ahead of need, shows as standby; an orphan, how long it waits to be re-attached; a kernel with
    secrets, their names and how many requests used each)."""
    from .metrics import secrets_text
    from .top import COLUMNS, INSPECT_TIMEOUT, sampled_twice, usage_columns

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

    from .top import INSPECT_TIMEOUT, Recording, top

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

    from .controls import escape_controls
    from .privdir import SLEEP
    from .reattach import records

    found, _ = records()
    lines, notes = [], {}
    for record in found:
        try:
            state = json.loads((record.private / SLEEP).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(state, dict):
            continue
        if state.get("state") == "suspended":
            since = state.get("since")
            when = (
                time.strftime("%H:%M", time.localtime(since)) if isinstance(since, float) else "?"
            )
            size = state["bytes"] if isinstance(state.get("bytes"), int) else 0
            saved = state["saved"] if isinstance(state.get("saved"), int) else 0
            lines.append(
                f"-\tsuspended\tkernel {record.kernel_id}\t0\t-\t-\t-\t-\tasleep since {when}, "
                f"{saved / 2**20:.0f} MiB saved, checkpoint {size / 2**20:.1f} MiB on the host"
            )
        elif isinstance(state.get("why"), str):
            # the reason names the kernel's variables: shown escaped, never obeyed
            notes[record.kernel_id] = f"\tawake: {escape_controls(state['why'][:300])}"
    return lines, notes


def _orphans() -> dict[str, str]:
    """For each of this user's kernels whose owner is gone: how long its launcher still waits for a
    new one."""
    from .reattach import records

    found, _ = records()
    notes = {}
    for record in found:
        left = record.time_left()
        if record.orphaned is not None and not record.attached:
            notes[record.kernel_id] = "\torphan: re-attach " + (
                "any time" if left is None else f"within {left:.0f} s"
            )
    return notes


def cmd_run(args: argparse.Namespace) -> int:
    """Execute a notebook in the sandbox and write the executed copy."""
    from pathlib import Path

    from .notebooks import parse_parameter, run_notebook

    source = Path(args.notebook)
    if not source.is_file():
        raise ConfigError(f"No notebook at {source}")
    parameters = dict(parse_parameter(item) for item in args.parameter)
    output = source if args.inplace else args.output
    run = run_notebook(
        source,
        output,
        kernel_name=args.kernel,
        parameters=parameters,
        timeout=args.timeout,
        progress=not args.no_progress,
        standby=0,  # one kernel in this process: a standby would only be started to be removed
    )
    if run.error is not None:
        colour = sys.stderr.isatty()
        SafeWriter(sys.stderr, always=True, keep_colour=colour).write(run.report(colour=colour))
        print(
            f"kernel-sandbox: {source} failed; the executed notebook is in {run.output_path}",
            file=sys.stderr,
        )
        return 1
    print(f"Wrote {run.output_path}", file=sys.stderr)
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """Run Python code in a throwaway sandbox and print its output."""
    from pathlib import Path

    from .notebooks import exec_code

    if args.code == "-":
        code = sys.stdin.read()
    elif args.code.endswith(".py") and Path(args.code).is_file():
        code = Path(args.code).read_text()
    else:
        code = args.code
    result = exec_code(
        code, kernel_name=args.kernel, timeout=args.timeout, colour=sys.stderr.isatty(), standby=0
    )
    return 0 if result.error is None else 1


def _sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that shape a sandbox (image, limits, network, mounts, environment)."""
    parser.add_argument("--image", help="kernel image")
    parser.add_argument("--memory", help="memory limit, e.g. 1g")
    parser.add_argument("--cpus", type=float, help="CPU limit in cores")
    parser.add_argument("--pids-limit", type=int, help="process limit")
    net = parser.add_mutually_exclusive_group()
    net.add_argument(
        "--network", dest="network", action="store_true", default=None, help="turn networking on"
    )
    net.add_argument(
        "--no-network", dest="network", action="store_false", help="keep networking off"
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="HOST",
        help="let the kernel reach HOST[:PORT][@ADDRESSES] (or *.domain) through the launcher's "
        "filtering proxy; repeatable",
    )
    parser.add_argument(
        "--allow-package-index",
        action="store_true",
        help="let the kernel reach the package index (package_index: PyPI by default), e.g. for "
        "%%pip install",
    )
    parser.add_argument(
        "--mount", action="append", default=[], help="bind mount HOST:CONTAINER[:ro|rw]"
    )
    parser.add_argument(
        "--mount-cwd", choices=["off", "ro", "rw"], help="mount the notebook's folder"
    )
    parser.add_argument(
        "--env", action="append", default=[], help="environment variable NAME=VALUE"
    )
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME@HOST",
        help="NAME[=FILE]@HOST[,HOST...]: the kernel's NAME holds a placeholder that the egress "
        "proxy replaces, in requests to HOST only, with the value of NAME in the environment of "
        "the process that launches the kernel (the Jupyter server, or this command) or FILE's "
        "content; kernel.json never holds the value; repeatable",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="any provisioner option KEY=VALUE (JSON)"
    )


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve an MCP server whose tools run code in a sandboxed kernel, one per MCP session."""
    try:
        from . import mcpserver
    except ImportError as exc:
        raise ConfigError(
            f"kernel-sandbox mcp needs the MCP SDK ({exc}): pip install 'kernel-sandbox[mcp]'"
        ) from exc
    options: dict[str, Any] = {"backend": args.backend, **_install_config(args)}
    if "secrets" in options:  # the values come from this server's environment, as Secrets
        bindings = [parse_binding("--secret", entry) for entry in options.pop("secrets")]
        options["secrets"] = {
            b.name: Secret(b.value(os.environ), [str(h) for h in b.hosts], query=b.query)
            for b in bindings
        }
    if args.timeout is not None:
        options["timeout"] = args.timeout
    if args.max_output_bytes is not None:
        options["max_output_bytes"] = args.max_output_bytes
    if args.http is None:
        server = mcpserver.build_server(options, pool_size=args.pool_size)
        asyncio.run(server.run_stdio_async())
        return 0
    host, _, port = args.http.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--http takes HOST:PORT (e.g. 127.0.0.1:8765), not {args.http!r}")
    host = host.strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1") and not args.allow_remote:
        raise ConfigError(
            f"--http {args.http} would listen beyond this machine: give --allow-remote as well "
            "(and put TLS in front of it), or use 127.0.0.1"
        )
    token = os.environ.get(mcpserver.TOKEN_ENV) or mcpserver.new_token()
    if mcpserver.TOKEN_ENV not in os.environ:
        print(
            f"kernel-sandbox mcp: bearer token (set {mcpserver.TOKEN_ENV} to choose one): {token}",
            file=sys.stderr,
            flush=True,
        )
    print(f"kernel-sandbox mcp: serving http://{args.http}/mcp", file=sys.stderr, flush=True)
    server = mcpserver.build_server(options, pool_size=args.pool_size)
    asyncio.run(mcpserver.serve_http(server, host, int(port), token, args.allow_host))
    return 0


def _doc(command: Callable[[argparse.Namespace], int]) -> str:
    """A command's docstring, the start of its ``--help`` description (empty under ``python
    -OO``)."""
    return command.__doc__ or ""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kernel-sandbox``."""
    parser = argparse.ArgumentParser(
        prog="kernel-sandbox",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`kernel-sandbox COMMAND --help` shows a command's options.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    lab = sub.add_parser(
        "lab",
        help=cmd_lab.__doc__,
        allow_abbrev=False,
        usage="kernel-sandbox lab [-h] [--locked-down] [--image IMAGE] [--prefix PREFIX | --user] "
        "[--install-engine] [JUPYTERLAB ARGUMENTS ...]",
        description=_doc(cmd_lab)
        + (
            " JupyterLab listens on 127.0.0.1 with a token; the URL is printed once it is up. "
            "Arguments this command does not know go to JupyterLab (e.g. --port 9999 --no-browser "
            "--notebook-dir ~/work --allow-root). JupyterLab comes with the extra: pip install "
            "'kernel-sandbox[lab]'."
        ),
    )
    _add_setup_arguments(lab)
    lab.add_argument(
        "--locked-down",
        action="store_true",
        help="no terminals, only sandboxed kernelspecs (also through the REST API), no extension "
        "installs, no language servers: what a script in the page could do is smaller (README: "
        "Security model)",
    )
    lab.set_defaults(func=cmd_lab, jupyterlab_args=[])

    setup = sub.add_parser(
        "setup",
        help=cmd_setup.__doc__,
        allow_abbrev=False,
        description=_doc(cmd_setup)
        + " A second run changes nothing and takes seconds. Each step it cannot do"
        " fails with the command to run instead.",
    )
    _add_setup_arguments(setup)
    setup.set_defaults(func=cmd_setup)

    image = sub.add_parser(
        "image",
        help="Build the kernel image (`image build`).",
        description="Manage the kernel image.",
    )
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser(
        "build",
        help=cmd_image_build.__doc__,
        description=_doc(cmd_image_build)
        + (
            " Nothing in the build reaches a package index: the wheels are downloaded on the host "
            "first."
        ),
    )
    build.add_argument("--tag", default=DEFAULT_IMAGE, help=f"image tag (default {DEFAULT_IMAGE})")
    build.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="the engine whose store gets the image (the kernels' 'engine' option; default auto)",
    )
    build.add_argument(
        "--base-image", help="base image (default python:3.11-slim, else a debootstrap-made base)"
    )
    build.add_argument(
        "--rebuild-base", action="store_true", help="bootstrap the fallback base image again"
    )
    build.set_defaults(func=cmd_image_build)

    inst = sub.add_parser(
        "install",
        help=cmd_install.__doc__,
        description=_doc(cmd_install)
        + (
            " Options set the sandbox of every kernel started from that kernelspec; install one "
            "per configuration."
        ),
    )
    inst.add_argument(
        "--kernel",
        default=DOCKER_SPEC,
        choices=[*shipped_kernelspecs(), "all"],
        help=f"which kernelspec (default {DOCKER_SPEC})",
    )
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--prefix", help="install under this prefix (e.g. a virtualenv)")
    where.add_argument(
        "--sys-prefix", action="store_true", help="install into this Python's prefix"
    )
    inst.add_argument("--name", help="install under another kernelspec name")
    inst.add_argument("--display-name", help="name shown in the launcher")
    _sandbox_arguments(inst)
    inst.set_defaults(func=cmd_install)

    doctor = sub.add_parser("doctor", help=cmd_doctor.__doc__, description=cmd_doctor.__doc__)
    doctor.add_argument("--image", default=DEFAULT_IMAGE, help="kernel image to look for")
    doctor.set_defaults(func=cmd_doctor)

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
        description=_doc(cmd_top)
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

    run = sub.add_parser(
        "run",
        help=cmd_run.__doc__,
        description=_doc(cmd_run)
        + (
            " The output goes to NAME.out.ipynb next to the notebook unless -o or --inplace says "
            "otherwise; it is written even when a cell fails."
        ),
    )
    run.add_argument("notebook", help="the notebook to run (.ipynb)")
    out = run.add_mutually_exclusive_group()
    out.add_argument(
        "-o", "--output", help="where to write the executed notebook (default NAME.out.ipynb)"
    )
    out.add_argument(
        "--inplace", action="store_true", help="overwrite the notebook with the executed one"
    )
    run.add_argument(
        "-k",
        "--kernel",
        default=DOCKER_SPEC,
        help=f"kernelspec to run it on (default {DOCKER_SPEC})",
    )
    run.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a parameter (injected after the cell tagged 'parameters'; VALUE is a Python "
        "literal or a string)",
    )
    run.add_argument("--timeout", type=float, help="seconds each cell may run (default: no limit)")
    run.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    run.set_defaults(func=cmd_run)

    exe = sub.add_parser(
        "exec",
        help=cmd_exec.__doc__,
        description=_doc(cmd_exec)
        + (
            " Stdout goes to stdout; stderr and tracebacks to stderr; the exit code is 1 on an "
            "error."
        ),
    )
    exe.add_argument(
        "code",
        metavar="CODE|FILE.py|-",
        help="Python code, a .py file, or - to read standard input",
    )
    exe.add_argument(
        "-k",
        "--kernel",
        default=DOCKER_SPEC,
        help=f"kernelspec to run it on (default {DOCKER_SPEC})",
    )
    exe.add_argument("--timeout", type=float, help="interrupt the code after this many seconds")
    exe.set_defaults(func=cmd_exec)
    mcp = sub.add_parser(
        "mcp",
        help=cmd_mcp.__doc__,
        description=_doc(cmd_mcp)
        + (
            " Speaks MCP on stdin/stdout unless --http is given. Needs the MCP SDK: "
            "pip install 'kernel-sandbox[mcp]'."
        ),
    )
    mcp.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio, behind a bearer "
        "token (the environment's KERNEL_SANDBOX_MCP_TOKEN, else one printed on stderr)",
    )
    mcp.add_argument(
        "--allow-remote",
        action="store_true",
        help="let --http listen on an address other than loopback",
    )
    mcp.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="another Host header (and http:// Origin) --http accepts; repeatable",
    )
    mcp.add_argument(
        "--backend", default="docker", help="docker (the default), opensandbox or local"
    )
    mcp.add_argument(
        "--pool-size", type=int, default=1, help="kernels kept started for new sessions (1)"
    )
    mcp.add_argument(
        "--timeout", type=float, help="seconds any call may take at most (default 300)"
    )
    mcp.add_argument(
        "--max-output-bytes", type=int, help="output one run_code keeps (default 4 MiB)"
    )
    _sandbox_arguments(mcp)
    mcp.set_defaults(func=cmd_mcp)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kernel-sandbox``."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "lab":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:
        args.jupyterlab_args = unknown
    try:
        return int(args.func(args))
    except KernelSandboxError as exc:
        print(f"kernel-sandbox: {escape_controls(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
