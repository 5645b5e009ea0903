"""The ``kernel-sandbox`` command: its parser and entry point, one module per family of commands."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..controls import escape_controls
from ..errors import KernelSandboxError
from . import kernels, mcp, running, setup

DESCRIPTION = """\
Run Jupyter kernels in disposable, locked-down Docker containers: the "Sandboxed Python"
kernelspec starts each kernel in a fresh container with no network, a non-root user and
resource limits, for JupyterLab, notebooks run headless, and programs.

Start here: `kernel-sandbox lab` checks the Docker engine, builds the kernel image, installs
the kernelspec and opens JupyterLab with Sandboxed Python as the default kernel.
`kernel-sandbox setup` does the same without JupyterLab, for other clients and programs."""


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

    for family in (setup, kernels, running, mcp):
        family.add_commands(sub)
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
