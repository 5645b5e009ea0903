"""The public API of the execution sessions (:class:`AsyncSandbox`): a kernel in a sandbox.

It is assembled from one part per idea: the session's lifecycle and running code
(:mod:`.session`), files (:mod:`.transfer`), packages (:mod:`.packages`), tools
(:mod:`.toolcalls`) and skills (:mod:`.skills`); here are what is left: pausing and sleeping,
usage against the limits, checkpoints and reset. How one call travels to the kernel and back,
with its deadline and retries, is :mod:`.exchange`.
"""

from __future__ import annotations

import asyncio
import dataclasses

from ..hostsecrets import read_uses
from ..errors import ConfigError, KernelLaunchError, MetricsUnavailable, SandboxError
from ..metrics import Usage, near_misses
from ..privdir import SUSPEND_REQUEST, WAKE_REQUEST, sleep_note
from ..results import ExecutionError, KernelDied
from .checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, Checkpoint, take
from .skills import SkillRuns
from .toolcalls import ToolCalls


class AsyncSandbox(SkillRuns, ToolCalls):
    """A kernel in a sandbox (``docker``, ``opensandbox`` or ``local``), used with ``async with``.

    Options: ``image``, ``memory`` ("512m"), ``cpus``, ``pids_limit``, ``network`` (off by default;
    True, or a list of destinations such as ``["api.example.com"]``), ``env``, ``mounts``
    ("HOST:CONTAINER[:ro|rw]"), ``timeout`` (seconds every call may take by default: 300;
    ``float("inf")`` for none), ``start_timeout``, ``max_output_bytes``, ``interrupt_grace``
    (seconds an interrupted call gets to stop before the kernel is restarted), ``allowed_classes``
    (classes whose instances tool results may hold), ``decode_limits`` (:class:`DecodeLimits` for
    tool results), ``unsafe_pickle`` (decode values the data format cannot carry from pickles: off,
    see the README), ``output_policy`` (``strict``, the default, or ``trusted``), ``restore`` (a
    :class:`Checkpoint` the new kernel loads at start: same image only), ``secrets`` (Docker: a
    mapping of variable name to :class:`Secret`, whose value the egress proxy adds to requests to
    its hosts while the kernel sees a placeholder); any other keyword goes to
    the backend's provisioner config. Docker and OpenSandbox options are checked here, before
    anything starts.
    """

    # -- pausing and sleeping ----------------------------------------------------------------

    async def pause(self) -> None:
        """Pause the sandbox (opensandbox backend): it keeps its memory and runs nothing until
        :meth:`resume`.

        Calls made while it is paused wait (their deadlines still count); the kernel is not dead.
        """
        self._deadline(None)
        await self._backend.pause(self._km.provisioner, True)

    async def resume(self) -> None:
        """Resume a paused sandbox and wait until it runs again."""
        self._deadline(None)
        await self._backend.pause(self._km.provisioner, False)

    async def suspend(self) -> None:
        """Put the kernel to sleep now (started with ``suspend_after``): on Docker its variables are
        checkpointed on the host and its container removed, on OpenSandbox the sandbox is paused
        (or, as ``suspend_by`` says, checkpointed as on Docker); the next call, or :meth:`wake`,
        wakes it with them.

        Raises :class:`SandboxError` saying why when it stays awake (names its checkpoint would
        leave behind without ``suspend_lossy``, a checkpoint over its cap...): it then runs on.
        """
        await self._sleep_request(SUSPEND_REQUEST)

    async def wake(self) -> None:
        """Wake a sleeping kernel now and wait until it runs with its variables again (nothing
        when it is awake); raises :class:`KernelLaunchError` naming the reason (and where its
        checkpoint is kept) when it cannot: the kernel has then ended, and the next call says
        so."""
        await self._sleep_request(WAKE_REQUEST)

    async def _sleep_request(self, msg_type: str) -> None:
        self._deadline(None)
        if getattr(self._km.provisioner.settings(), "suspend_after", None) is None:
            raise ConfigError(
                "suspend() and wake() need a kernel that may sleep: start the Sandbox with "
                "suspend_after (seconds of idleness before it sleeps by itself, e.g. 1800)"
            )
        assert self._lock is not None
        async with self._lock:
            reply = await self._launcher_request({}, msg_type, self.timeout)
        if reply.get("status") != "ok":
            why = reply.get("evalue") or "the launcher did not answer"
            if msg_type == WAKE_REQUEST:
                raise KernelLaunchError(f"The kernel could not wake: {why}")
            raise SandboxError(f"The kernel was not suspended: {why}")
        self._channel, self._installed = None, False  # the helper is opened again in the new kernel

    # -- usage -------------------------------------------------------------------------------

    async def metrics(self) -> Usage:
        """The sandbox's usage against its limits now, read by the host (never asked of the kernel).

        Raises :class:`MetricsUnavailable` where the host cannot read it (a remote engine, or a
        backend without such figures: ``opensandbox``, ``local``).
        """
        if self._km is None:
            raise MetricsUnavailable("the sandbox is not started")
        return await asyncio.to_thread(self._sample)

    def _sample(self) -> Usage:
        """One sample from the kernel's current container (found again after a restart)."""
        provisioner = self._km.provisioner if self._km is not None else None
        private = getattr(provisioner, "private", None)
        note = sleep_note(private.path) if private is not None else {}
        if note.get("state") == "suspended":
            saved = note.get("saved")
            return Usage(
                memory=0,
                source="launcher",
                state="suspended",
                saved=saved if isinstance(saved, int) and not isinstance(saved, bool) else None,
            )
        probe = self._probe
        if probe is None or probe.container_id != getattr(provisioner, "container_id", None):
            probe = self._probe = self._backend.probe(provisioner)
            self._checked = Usage()
        usage = probe.read()
        held = read_uses(getattr(private, "path", None))
        why = note.get("why") if note.get("state") == "awake" else None
        return dataclasses.replace(
            usage,
            secrets=held or usage.secrets,
            kept_awake=why[:500] if isinstance(why, str) else None,
        )

    async def _name_limits(self, error: ExecutionError | None) -> None:
        """Say in ``error`` which limits the kernel hit since they were last looked at, as the host
        reads them."""
        if error is not None and not isinstance(error, KernelDied):
            try:
                usage = await asyncio.to_thread(self._sample)
            except MetricsUnavailable:
                return
            checked, self._checked = self._checked, usage
            notes = near_misses(checked, usage, error.value)
            if notes:
                error.value = f"{error.value} [kernel-sandbox: {'; '.join(notes)}]"

    # -- checkpoints -----------------------------------------------------------------------

    async def checkpoint(
        self, *, max_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES, timeout: float | None = None
    ) -> Checkpoint:
        """The kernel's state as a :class:`Checkpoint`, for ``AsyncSandbox(restore=...)`` in a new
        kernel.

        The kernel pickles the names the user defined and packs the work directory's files; the host
        keeps the blob unopened. Names that cannot be pickled are in ``not_saved`` with why. A blob
        over ``max_bytes`` (1 GiB by default) is refused (:class:`CheckpointError`) before it is
        pulled.
        """
        return await take(self, max_bytes, timeout)

    async def reset(self) -> None:
        """Fresh interpreter and an empty work directory, for a pool's next user."""
        await self.restart()
        await self._simple("wipe", None)
