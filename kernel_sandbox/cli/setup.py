"""``kernel-sandbox lab``, ``setup``, ``image build``, ``install``, ``doctor``: getting a machine
ready for sandboxed kernels."""

from __future__ import annotations

import argparse
import sys

from ..docker.settings import ENGINES
from ..docker.settings import DEFAULT_IMAGE
from ..kernelspecs import DOCKER_SPEC, install, shipped_kernelspecs
from .arguments import doc, install_config, sandbox_arguments


def cmd_setup(args: argparse.Namespace) -> int:
    """Check the engine, build the kernel image if missing, install the kernelspec: only what is not
    done yet."""
    from ..lab import setup

    setup(image=args.image, prefix=args.prefix, user=args.user, install_engine=args.install_engine)
    print(f"Ready: pick Sandboxed Python ({DOCKER_SPEC}) in any Jupyter client.")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    """Set up as `setup` does, then start JupyterLab with Sandboxed Python as the default kernel."""
    from ..lab import lab

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
    config = install_config(args)
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
    from ..docker.image import build_image

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
    from ..doctor import run_checks

    failed = 0
    for check in run_checks(image=args.image):
        print(f"[{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
        if not check.ok:
            failed += 1
            print(f"       fix: {check.fix}")
    print("All checks passed." if not failed else f"{failed} problem(s) found.")
    return 1 if failed else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this module's commands to ``kernel-sandbox``'s parser."""
    lab = sub.add_parser(
        "lab",
        help=cmd_lab.__doc__,
        allow_abbrev=False,
        usage="kernel-sandbox lab [-h] [--locked-down] [--image IMAGE] [--prefix PREFIX | --user] "
        "[--install-engine] [JUPYTERLAB ARGUMENTS ...]",
        description=doc(cmd_lab)
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
        description=doc(cmd_setup)
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
        description=doc(cmd_image_build)
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
        description=doc(cmd_install)
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
    sandbox_arguments(inst)
    inst.set_defaults(func=cmd_install)

    doctor = sub.add_parser("doctor", help=cmd_doctor.__doc__, description=cmd_doctor.__doc__)
    doctor.add_argument("--image", default=DEFAULT_IMAGE, help="kernel image to look for")
    doctor.set_defaults(func=cmd_doctor)
