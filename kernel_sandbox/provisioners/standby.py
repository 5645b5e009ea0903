"""Standby kernels: launchers started ahead of need in this process, each handed whole to one
launch.

A provisioner whose settings ask for ``standby = N`` keeps N launchers of its exact configuration
started and idle in the process that runs it (the Jupyter server, a program using nbclient or the
execution API). The next :meth:`~.launched.LaunchedProvisioner.pre_launch` of that configuration
takes one out of the pool (:meth:`StandbyPool.take`) and adopts it: the provisioner returns the
standby's connection info, which jupyter_client takes as the truth (``_reconcile_connection_info``
rewrites the client's connection file with it), and the pool starts a replacement in a thread
:data:`REFILL_DELAY` later.

What makes a standby safe to hand out:

* It is keyed by everything its kernel is made of (:class:`Recipe`): the backend, the full
  effective settings, the image's id, the mounts, the kernel's environment and the launcher's.
  A launch whose configuration differs in any of them starts cold. A rebuilt image has a new
  id: standbys of the old one are stopped and the pool refills with the new one.
* It is used once. Nothing runs in it before it is adopted; once taken out of the pool it never
  comes back (a restart starts a fresh container; shutdown removes it).
* The pool holds each standby's owner lock (``privdir.OWNER_LOCK``) exactly as a provisioner
  does, and passes the held lock to the provisioner that adopts it. So when this process dies,
  the launcher removes its idle container after ``orphan_timeout``; when it exits cleanly,
  :meth:`StandbyPool.close` (registered with :mod:`atexit`) stops every standby and waits (up to
  :data:`CLOSE_WAIT`) until their containers are gone.
* A standby that cannot be started never breaks a launch: the launch starts cold, and the
  reason is logged once per configuration. What a standby's launcher left when it ended badly
  (a container it could not remove: the engine went away meanwhile) is removed by the pool,
  retried for up to :data:`LEFTOVER_RETRY` seconds; after that ``kernel-sandbox gc`` removes it.

The pool keeps standbys for at most :data:`MAX_CONFIGURATIONS` configurations, the most recently
launched ones. It is this process's own: another process, and so another host account, can never
adopt one (its channels and key live in a 0700 directory of this user).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import hashlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.connect import KernelConnectionInfo, write_connection_file
from jupyter_client.session import new_id_bytes

from ..errors import KernelSandboxError
from ..privdir import EXIT, LAUNCHER_STATE, OWNER_LOCK, PrivateDir
from .budget import BUDGET, Claim, Reservation
from .process import launcher_command, read_status, start_launcher, write_launcher_config

MAX_CONFIGURATIONS = 4
"""Configurations the pool keeps standbys for; the least recently launched one's are stopped
first."""
CLOSE_WAIT = 30.0
"""Seconds the process waits at exit for its standbys' containers to be removed (then their
launchers finish alone)."""
STOP_WAIT = 60.0
"""Seconds a stopped standby's launcher has to end before the pool lets it finish alone (in the
background)."""
REFILL_DELAY = 1.0
"""Seconds a refill waits before it starts, so that the kernel just launched answers its first
messages without competing with the next standby's start for the CPU and the engine. A launch that
needs the standby meanwhile starts it at once."""
LEFTOVER_RETRY = 300.0
"""Seconds the pool retries removing what a standby's launcher left (then ``kernel-sandbox gc``
does)."""
STANDBY_ID_PREFIX = "standby-"
"""The kernel id a standby's launcher gets (its container's ``kernel-sandbox.kernel-id`` label)."""
CONNECTION_FILE = "connection.json"
PER_LAUNCH_ENV = ("JPY_SESSION_NAME", "JPY_PARENT_PID")
"""Variables that differ from one launch to the next: never part of a standby's identity. The
kernel's ``JPY_SESSION_NAME`` is given to an adopted kernel by the provisioner."""

log = logging.getLogger("kernel_sandbox.standby")


@dataclass(frozen=True)
class Recipe:
    """Everything a standby of one configuration is made of, and how many to keep."""

    backend: str
    settings: dict[str, Any]
    """The effective settings (``to_config()``), handed to the launcher as they are."""
    image: str
    """What the settings' image name stands for now (Docker: the image id)."""
    context: Any
    """What else the kernel is made of that the settings do not say (Docker: the resolved
    mounts)."""
    kernel_env: dict[str, str]
    """The variables passed into the kernel (the launch's, per-launch ones left out)."""
    launcher_env: dict[str, str]
    """The launcher process's environment (engine address, log level...)."""
    cwd: str | None
    count: int
    log: Any = field(default=log, compare=False, repr=False)
    cleanup: Callable[[dict[str, Any]], bool] | None = field(
        default=None, compare=False, repr=False
    )
    """Removes what an ended launcher left (given its ``launcher.json`` state); False: not now
    (engine away)."""
    claim: Claim | None = field(default=None, compare=False, repr=False)
    """What a standby of it takes from the process's kernel budget (:mod:`.budget`); None: not
    counted."""

    @property
    def family(self) -> str:
        """The configuration without the image: standbys of an older image of it are stale."""
        described = [self.backend, self.settings, self.context, self.kernel_env, self.launcher_env]
        return hashlib.sha256(
            json.dumps(described, sort_keys=True, default=str).encode()
        ).hexdigest()

    @classmethod
    def make(
        cls, *, kernel_env: Mapping[str, str], launcher_env: Mapping[str, str], **fields: Any
    ) -> Recipe:
        """A recipe with the per-launch variables (:data:`PER_LAUNCH_ENV`) left out of both
        environments."""

        def steady(env: Mapping[str, str]) -> dict[str, str]:
            return {name: value for name, value in env.items() if name not in PER_LAUNCH_ENV}

        return cls(kernel_env=steady(kernel_env), launcher_env=steady(launcher_env), **fields)


class Standby:
    """One launcher started ahead of need; the pool owns it until a provisioner adopts it."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.kernel_id = STANDBY_ID_PREFIX + uuid.uuid4().hex
        self.private: PrivateDir | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.connection_info: KernelConnectionInfo = {}
        self.error: str | None = None
        self.started: concurrent.futures.Future[bool] = concurrent.futures.Future()
        """True once the kernel answers; False when it could not start (``error`` says why)."""
        self.begin = threading.Event()
        """Set when the launcher should start now rather than after :data:`REFILL_DELAY`."""
        self._lock = threading.Lock()
        self._stopped = False
        self._reservation: Reservation | None = None

    def __repr__(self) -> str:
        state = (
            "starting"
            if not self.started.done()
            else "ready"
            if self.started.result()
            else "failed"
        )
        pid = self.process.pid if self.process else None
        return f"<Standby {self.kernel_id} {state} launcher pid {pid}>"

    def start(self) -> None:
        """Start the launcher and block until its kernel answers, or set :attr:`error`; never
        raises.

        After an error the pool retires it (:meth:`StandbyPool.retire`).
        """
        recipe = self.recipe
        try:
            if recipe.claim is not None:
                self._reservation = BUDGET.try_acquire(recipe.claim)
                if self._reservation is None:
                    raise RuntimeError(
                        "no room in the kernel budget (max_kernels, max_memory) for a standby"
                    )
            private = self.private = PrivateDir.create()
            private.hold(OWNER_LOCK)
            connection_file, info = write_connection_file(
                str(private / CONNECTION_FILE),
                transport="ipc",
                ip=str(private / "k"),
                key=new_id_bytes(),
            )
            info.pop("kernel_name", None)
            # as get_connection_info() gives it (bytes), though jupyter_client's TypedDict says str
            self.connection_info = {**info, "key": info["key"].encode()}  # type: ignore[typeddict-item]
            config = write_launcher_config(
                private,
                recipe.backend,
                recipe.settings,
                self.kernel_id,
                recipe.kernel_env,
                recipe.cwd,
            )
            read_end, write_end = os.pipe()
            cmd = launcher_command(connection_file, config, write_end)
            with self._lock:
                if self._stopped:
                    os.close(read_end)
                    os.close(write_end)
                    raise RuntimeError("the pool was closed")
                self.process = start_launcher(
                    cmd, write_end, cwd=str(private.path), env=dict(recipe.launcher_env)
                )
            if read_status(read_end) and self.process.poll() is None:
                return
            code = self.process.wait()
            recorded = private.read_json(EXIT)
            reason = recorded.get("reason") if isinstance(recorded, dict) else None
            self.error = str(reason or f"the launcher exited with code {code}")
        # costs a cold start, nothing more
        except (OSError, RuntimeError, KernelSandboxError) as exc:
            self.error = str(exc)

    def take_reservation(self) -> Reservation | None:
        """Hand this standby's share of the kernel budget to the provisioner that adopts it."""
        reservation, self._reservation = self._reservation, None
        return reservation

    def _let_go(self) -> None:
        """Give this standby's share of the kernel budget back (its launcher has ended, or is let
        go)."""
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            reservation.release()

    @property
    def stopped(self) -> bool:
        """True once :meth:`terminate` was called (the pool let go of it)."""
        return self._stopped

    def alive(self) -> bool:
        """True while its launcher runs (it ends when its kernel does)."""
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """Ask the launcher to stop (SIGTERM: it removes the container); a starting one stops
        starting."""
        with self._lock:
            self._stopped = True
            process = self.process
        self.begin.set()
        if process is not None and process.poll() is None:
            try:
                process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def release(self, wait: float, retry: float | None = None) -> None:
        """:meth:`discard` the standby once its launcher has ended within ``wait`` seconds, else let
        go of it.

        Let go: the owner lock is released, so the launcher removes its directory itself when done.
        ``retry``: how long :meth:`discard` retries (default: what is left of ``wait``).
        """
        deadline = time.monotonic() + wait
        if self.process is not None:
            try:
                self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                self._let_go()
                if self.private is not None:
                    self.private.release(OWNER_LOCK)
                return
        self._let_go()
        self.discard(max(deadline - time.monotonic(), 0) if retry is None else retry)

    def discard(self, retry: float = LEFTOVER_RETRY) -> None:
        """Forget a standby whose launcher has ended: remove what it left and its directory.

        Removing the leftover is retried for ``retry`` seconds (the engine may be back by then).
        """
        if self.private is None:
            return
        state = self.private.read_json(LAUNCHER_STATE)
        cleanup = self.recipe.cleanup
        if isinstance(state, dict) and state and cleanup is not None:
            deadline, pause = time.monotonic() + retry, 0.5
            while not cleanup(state):
                if time.monotonic() + pause > deadline:
                    self.recipe.log.warning(
                        "kernel-sandbox: could not remove what standby %s left (%s); "
                        "`kernel-sandbox gc` removes it",
                        self.kernel_id,
                        state,
                    )
                    break
                time.sleep(pause)
                pause = min(pause * 2, 8.0)
        self.private.remove()


class StandbyPool:
    """Standbys by configuration (see the module docstring); one per process: :data:`POOL`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: OrderedDict[str, list[Standby]] = OrderedDict()
        self._logged: set[tuple[str, str]] = set()
        self._closed = False
        self._retiring: set[threading.Thread] = set()

    def __repr__(self) -> str:
        with self._lock:
            counts = [len(standbys) for standbys in self._families.values()]
        return f"<StandbyPool {len(counts)} configuration(s), {sum(counts)} standby(s)>"

    def standbys(self) -> list[Standby]:
        """Every standby the pool holds now (starting, ready or stopping)."""
        with self._lock:
            return [standby for standbys in self._families.values() for standby in standbys]

    async def take(self, recipe: Recipe) -> Standby | None:
        """A ready standby of exactly ``recipe``'s configuration, taken out of the pool, or None.

        One that is still starting is waited for (it is ahead of a cold start); one that failed
        or whose kernel ended meanwhile is dropped and the next is tried.
        """
        while True:
            with self._lock:
                standbys = self._families.get(recipe.family, [])
                standby = next((s for s in standbys if s.recipe.image == recipe.image), None)
                if standby is None:
                    return None
                standbys.remove(standby)
            standby.begin.set()
            try:
                ready = await asyncio.shield(asyncio.wrap_future(standby.started))
            except asyncio.CancelledError:
                self.retire(standby)
                raise
            if ready and standby.alive():
                recipe.log.debug("kernel-sandbox: adopting standby %s", standby.kernel_id)
                return standby
            self.retire(standby)

    def refill(self, recipe: Recipe) -> None:
        """Start standbys in the background until ``recipe.count`` are kept for its configuration.

        Standbys of an older image of the same configuration, and those of configurations
        beyond :data:`MAX_CONFIGURATIONS`, are stopped.
        """
        with self._lock:
            if self._closed:
                return
            standbys = self._families.pop(recipe.family, [])
            kept: list[Standby] = []
            self._families[recipe.family] = kept
            stale: list[Standby] = []
            for standby in standbys:
                fine = standby.recipe.image == recipe.image and (
                    not standby.started.done() or standby.alive()
                )
                (kept if fine and len(kept) < recipe.count else stale).append(standby)
            while len(self._families) > MAX_CONFIGURATIONS:
                stale.extend(self._families.popitem(last=False)[1])
            new = [Standby(recipe) for _ in range(recipe.count - len(kept))]
            kept.extend(new)
        for standby in stale:
            self.retire(standby)
        for standby in new:
            threading.Thread(
                target=self._start, args=(standby,), name="kernel-sandbox-standby", daemon=True
            ).start()

    def evict_one(self) -> bool:
        """Stop one ready, idle standby (of the least recently launched configuration) to make room
        in the kernel budget for a launch that matches none; True when one was stopped."""
        with self._lock:
            for standbys in self._families.values():
                standby = next((s for s in standbys if s.started.done() and s.alive()), None)
                if standby is not None:
                    standbys.remove(standby)
                    break
            else:
                return False
        standby.recipe.log.info(
            "kernel-sandbox: stopping standby %s to make room in the kernel budget",
            standby.kernel_id,
        )
        self.retire(standby)
        return True

    def _start(self, standby: Standby) -> None:
        standby.started.set_running_or_notify_cancel()
        try:
            standby.begin.wait(REFILL_DELAY)
            standby.start()
        except BaseException as exc:
            standby.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._started(standby)  # before the clean-up: a launch waiting for it starts cold now
            if standby.error is not None:
                self.retire(standby)

    def _started(self, standby: Standby) -> None:
        if standby.error is not None and not standby.stopped:
            with self._lock:
                standbys = self._families.get(standby.recipe.family, [])
                if standby in standbys:
                    standbys.remove(standby)
                first = (standby.recipe.family, standby.error) not in self._logged
                self._logged.add((standby.recipe.family, standby.error))
            if first:
                standby.recipe.log.warning(
                    "kernel-sandbox: a standby kernel could not be started (%s); kernels of this "
                    "configuration start cold meanwhile",
                    standby.error,
                )
        standby.started.set_result(standby.error is None)

    def retire(self, standby: Standby) -> None:
        """Stop a standby that left the pool (its launcher removes the container) and forget it in a
        thread.

        Never blocks (it is called on the event loop): the thread waits up to :data:`STOP_WAIT` for
        the launcher, then removes what it left; :meth:`clear` waits for these threads too.
        """
        standby.terminate()
        thread = threading.Thread(
            target=self._release, args=(standby,), name="kernel-sandbox-standby-stop", daemon=True
        )
        with self._lock:
            self._retiring.add(thread)
        try:
            thread.start()
        except RuntimeError:  # no new threads at interpreter exit: the launcher finishes alone
            with self._lock:
                self._retiring.discard(thread)
            standby.release(0)

    def _release(self, standby: Standby) -> None:
        try:
            standby.release(STOP_WAIT, LEFTOVER_RETRY)
        finally:
            with self._lock:
                self._retiring.discard(threading.current_thread())

    def clear(self, wait: float = 0.0) -> None:
        """Stop every standby, waiting up to ``wait`` seconds in all for their containers to go (and
        for those of standbys stopped earlier).

        The pool refills on the next launch (unless closed).
        """
        with self._lock:
            standbys = [standby for standbys in self._families.values() for standby in standbys]
            self._families.clear()
        for standby in standbys:
            standby.terminate()
        deadline = time.monotonic() + wait
        for standby in standbys:
            standby.release(max(deadline - time.monotonic(), 0))
        with self._lock:
            retiring = list(self._retiring)
        for thread in retiring:  # standbys stopped earlier, still being removed
            if thread.ident is not None:  # started
                thread.join(max(deadline - time.monotonic(), 0))

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Stop every standby, start no more, and wait for their containers to go (at interpreter
        exit)."""
        with self._lock:
            self._closed = True
        try:
            self.clear(wait)
        except KeyboardInterrupt:  # a second Ctrl-C: the launchers, told to stop, finish alone
            pass


POOL = StandbyPool()
"""This process's standbys."""
atexit.register(POOL.close)
