"""``kernel-sandbox run``, ``exec``: a notebook or code run headless in a sandbox."""

from __future__ import annotations

import argparse
import sys

from ..controls import SafeWriter
from ..errors import ConfigError
from ..kernelspecs import DOCKER_SPEC
from .arguments import doc


def cmd_run(args: argparse.Namespace) -> int:
    """Execute a notebook in the sandbox and write the executed copy."""
    from pathlib import Path

    from ..notebooks import parse_parameter, run_notebook

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

    from ..notebooks import exec_code

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


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this module's commands to ``kernel-sandbox``'s parser."""
    run = sub.add_parser(
        "run",
        help=cmd_run.__doc__,
        description=doc(cmd_run)
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
        description=doc(cmd_exec)
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
