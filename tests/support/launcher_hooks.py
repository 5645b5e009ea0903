"""The test run's hooks into every launcher, from outside the product (which reads none).

A ``.pth`` file in the environment's site-packages, written when the tests start
(:func:`installed`), makes each Python process that starts with ``KERNEL_SANDBOX_TEST_RESOLVER``
in its environment run this file, even under ``python -I`` as the kernelspecs start the launcher.
As the modules load, it changes them:

* the egress proxy's resolver and connector (:mod:`kernel_sandbox.launch.egress_outbound`): names
  resolve from the JSON map ``{"name": ["address", ...]}`` in the file the variable names, and
  connections go to 127.0.0.0/8 only (:func:`guarded`); an attempt elsewhere is refused and
  written to ``PATH.guard``, which the session fixture checks;
* with ``KERNEL_SANDBOX_TEST_EXEC_STREAMS`` set too, the Docker link's choice of the direct path
  (:func:`kernel_sandbox.docker.netns.may_enter_netns`): never, so tests running as root take the
  exec streams every other user takes.
* with ``KERNEL_SANDBOX_TEST_REOPEN_MAX_DELAY`` set too, the longest wait before the Docker link
  reopens a kernel stream that ended (:data:`kernel_sandbox.docker.channels.REOPEN_MAX_DELAY`):
  the test of a kernel that keeps killing its streams then sees the ten losses in seconds.

Nothing else is imported here, so the file also runs where the tests' packages are not on the path.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.abc
import importlib.machinery
import ipaddress
import json
import logging
import os
import socket
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # never at run time: importing the module here would load it unhooked
    from kernel_sandbox.launch.egress_outbound import Connector

TEST_RESOLVER_ENV = "KERNEL_SANDBOX_TEST_RESOLVER"
EXEC_STREAMS_ENV = "KERNEL_SANDBOX_TEST_EXEC_STREAMS"
REOPEN_MAX_DELAY_ENV = "KERNEL_SANDBOX_TEST_REOPEN_MAX_DELAY"
OUTBOUND = "kernel_sandbox.launch.egress_outbound"
NETNS = "kernel_sandbox.docker.netns"
CHANNELS = "kernel_sandbox.docker.channels"
RUN_NAME = "kernel_sandbox_test_hooks"
PTH = "kernel_sandbox_test_hooks.pth"


class GuardError(OSError):
    """A connection to an address outside 127.0.0.0/8 was attempted while the guard was on."""


def guarded(connect: Connector, fired: Callable[[str], None]) -> Connector:
    """``connect``, refusing (and reporting through ``fired``) any address outside 127.0.0.0/8."""

    async def connect_loopback(
        address: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if ipaddress.ip_address(address) not in ipaddress.ip_network("127.0.0.0/8"):
            fired(f"{address}:{port}")
            raise GuardError(f"the test guard refused {address}:{port}")
        return await connect(address, port)

    return connect_loopback


def never_enter_netns(module: ModuleType) -> None:
    """Make the Docker link take the exec streams, as a user other than root does."""
    module.may_enter_netns = lambda settings, info: False  # type: ignore[attr-defined]


def guard(module: ModuleType, path: str) -> None:
    """Point ``module``'s resolver at the map in ``path`` and its connector at loopback only."""
    info = os.stat(path)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(
            f"{TEST_RESOLVER_ENV}={path}: must be this user's file, writable by no one else"
        )

    async def resolve(host: str, port: int) -> list[str]:
        with open(path) as handle:
            table = json.load(handle)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the test's resolver map")
        return [str(address) for address in table[host]]

    def fired(where: str) -> None:
        logging.getLogger("kernel_sandbox.launch").error(
            "egress guard: a connection to %s was attempted", where
        )
        with open(path + ".guard", "a") as handle:
            handle.write(where + "\n")

    module.system_resolve = resolve  # type: ignore[attr-defined]
    module.open_outbound = guarded(module.open_outbound, fired)  # type: ignore[attr-defined]


class _HookOnLoad(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`hooks` as usual and hooks each before anyone imports a name
    from it."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def hooks(environ: dict[str, str] | os._Environ[str]) -> dict[str, Callable[[ModuleType], None]]:
    """The hooks ``environ`` asks for, by module name."""
    resolver = environ[TEST_RESOLVER_ENV]
    found: dict[str, Callable[[ModuleType], None]] = {
        OUTBOUND: lambda module: guard(module, resolver)
    }
    if environ.get(EXEC_STREAMS_ENV):
        found[NETNS] = never_enter_netns
    if environ.get(REOPEN_MAX_DELAY_ENV):
        seconds = float(environ[REOPEN_MAX_DELAY_ENV])
        found[CHANNELS] = lambda module: setattr(module, "REOPEN_MAX_DELAY", seconds)
    return found


@contextlib.contextmanager
def installed(resolver: Path) -> Iterator[None]:
    """The ``.pth`` hook in this environment's site-packages, and ``resolver`` in the environment
    for the duration.

    The ``.pth`` stays after the run: it does nothing where the variable is not set, and another
    run from the same environment may still need it (so it is replaced whole, never removed)."""
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH
    line = (
        f"import os; os.environ.get({TEST_RESOLVER_ENV!r}) and "
        f"__import__('runpy').run_path({str(Path(__file__).resolve())!r}, run_name={RUN_NAME!r})\n"
    )
    if not pth.exists() or pth.read_text() != line:
        fresh = pth.with_name(f".{PTH}.{os.getpid()}")
        fresh.write_text(line)
        fresh.replace(pth)
    old = os.environ.get(TEST_RESOLVER_ENV)
    os.environ[TEST_RESOLVER_ENV] = str(resolver)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(TEST_RESOLVER_ENV, None)
        else:
            os.environ[TEST_RESOLVER_ENV] = old


if __name__ == RUN_NAME:
    sys.meta_path.insert(0, _HookOnLoad(hooks(os.environ)))
