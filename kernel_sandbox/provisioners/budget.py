"""The local kernel budget: how many Docker kernels, and how much of their memory limits, one
process runs.

Every Docker kernel that a provisioner of this process starts, and every standby kernel its pool
keeps, holds a :class:`Reservation` of the process-wide :data:`BUDGET` from its launch until its
launcher has ended: one kernel and its ``memory`` limit. A launch whose ``max_kernels`` or
``max_memory`` the reservations held now leave no room for waits (idle standbys of other
configurations are stopped to make room, they are only ahead of need) until a kernel ends, up to
its ``launch_timeout``; then it fails with :class:`~kernel_sandbox.errors.KernelBudgetExceeded`
naming the option. A standby never waits: when there is no room, it is not started. A kernel
that sleeps (``suspend_after``) still counts as a kernel, its memory as 0 until it wakes; the disk
its checkpoint takes counts against ``max_suspended_bytes``, which its launcher's checkpoint store
enforces for all the host user's kernels (:mod:`kernel_sandbox.launch.sleep`).

It is a budget of this process (a Jupyter server, a program), as Enterprise Gateway's
``max_kernels`` is of its server: several processes of one host each have their own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import KernelBudgetExceeded
from ..parsers import MiB

POLL = 0.05
"""Seconds between looks for room while a launch waits."""
EVICT_EVERY = 2.0
"""Seconds between stopping idle standbys to make room for a waiting launch (each takes a moment to
end)."""


@dataclass(frozen=True)
class Claim:
    """What one kernel takes from the budget, and the limits its settings set."""

    memory: int
    """Its ``memory`` limit in bytes (0: unlimited, which ``max_memory`` refuses)."""
    max_kernels: int | None
    max_memory: int | None


class Reservation:
    """One kernel's share of the budget; :meth:`release` gives it back (once)."""

    def __init__(self, budget: KernelBudget, claim: Claim) -> None:
        self.budget = budget
        self.claim = claim
        self._released = False
        self.asleep: Callable[[], bool] = lambda: False
        """True while the kernel sleeps (``suspend_after``): its memory then counts as 0."""

    @property
    def memory(self) -> int:
        """The memory the kernel counts for now: its limit, or 0 while it sleeps."""
        return 0 if self.asleep() else self.claim.memory

    def release(self) -> None:
        """Give the share back; later calls do nothing."""
        if not self._released:
            self._released = True
            self.budget._release(self)


def _size(size: int) -> str:
    return f"{size / 1024**3:.2f}g" if size >= 1024**3 else f"{size // MiB}m"


class KernelBudget:
    """The reservations of this process (see the module docstring); one per process:
    :data:`BUDGET`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[Reservation] = set()

    @property
    def kernels(self) -> int:
        """Kernels holding a reservation now (standbys included)."""
        with self._lock:
            return len(self._held)

    @property
    def memory(self) -> int:
        """The sum of their memory limits, in bytes (a sleeping kernel's counts 0)."""
        with self._lock:
            return sum(reservation.memory for reservation in self._held)

    def _refusal(self, claim: Claim) -> str | None:
        """Why ``claim`` does not fit now (naming the option), or None when it does. Call with the
        lock held."""
        kernels = len(self._held)
        memory = sum(reservation.memory for reservation in self._held)
        if claim.max_kernels is not None and kernels + 1 > claim.max_kernels:
            return (
                f"max_kernels={claim.max_kernels}: this process runs {kernels} Docker kernels "
                "(standbys included)"
            )
        if claim.max_memory is not None and memory + claim.memory > claim.max_memory:
            return (
                f"max_memory={_size(claim.max_memory)}: the Docker kernels of this process "
                f"(standbys included) hold {_size(memory)} of memory limits and this one asks for "
                f"{_size(claim.memory)}"
            )
        return None

    def try_acquire(self, claim: Claim) -> Reservation | None:
        """A reservation for ``claim`` when it fits now, else None (never waits)."""
        with self._lock:
            if self._refusal(claim) is not None:
                return None
            reservation = Reservation(self, claim)
            self._held.add(reservation)
            return reservation

    def hold(self, claim: Claim) -> Reservation:
        """A reservation for a kernel that runs already (one re-attached after a restart), room or
        not."""
        reservation = Reservation(self, claim)
        with self._lock:
            self._held.add(reservation)
        return reservation

    async def acquire(
        self, claim: Claim, wait: float, make_room: Callable[[], bool] | None = None
    ) -> Reservation:
        """A reservation for ``claim``, waiting up to ``wait`` seconds for room.

        ``make_room()`` is called now and then while there is none (it stops an idle standby and
        says whether it did). Raises :class:`KernelBudgetExceeded` naming the option when the wait
        is over.
        """
        started = time.monotonic()
        evicted_at = -EVICT_EVERY
        while True:
            reservation = self.try_acquire(claim)
            if reservation is not None:
                return reservation
            now = time.monotonic()
            if make_room is not None and now - evicted_at >= EVICT_EVERY and make_room():
                evicted_at = now
            if now - started >= wait:
                with self._lock:
                    why = self._refusal(claim)
                raise KernelBudgetExceeded(
                    f"{why or 'the kernel budget is full'}, and none ended within {wait:g} s "
                    "(launch_timeout). Shut a kernel down, or raise the limit (max_kernels, "
                    "max_memory) or the memory it counts"
                )
            await asyncio.sleep(POLL)

    def _release(self, reservation: Reservation) -> None:
        with self._lock:
            self._held.discard(reservation)


BUDGET = KernelBudget()
"""This process's kernel budget."""
