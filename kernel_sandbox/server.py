"""The Jupyter server's side of re-attach: sandboxed kernels and notebook sessions that outlive the
server.

In your own ``jupyter_server_config.py`` (``kernel-sandbox lab`` sets both)::

    c.ServerApp.kernel_manager_class = "kernel_sandbox.server.ReattachingKernelManager"
    c.ServerApp.session_manager_class = "kernel_sandbox.server.ReattachingSessionManager"

What is kept, and what a kept record must prove before it is used: :mod:`kernel_sandbox.reattach`.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from jupyter_server.services.sessions.sessionmanager import SessionManager
from tornado.ioloop import IOLoop
from traitlets import Bool, default

from .errors import KernelLaunchError
from .reattach import Record, records, session_database, take


class ReattachingSessionManager(SessionManager):
    """A SessionManager whose notebook sessions outlive the server (a database in the user's private
    root).

    Sessions whose kernel did not come back are pruned by jupyter_server itself when listed.
    """

    @default("database_filepath")
    def _private_database(self) -> str:
        runtime_dir = getattr(self.parent, "runtime_dir", "") or getattr(
            self.kernel_manager, "connection_dir", ""
        )
        return session_database(runtime_dir)


class ReattachingKernelManager(AsyncMappingKernelManager):
    """A server's kernel manager that re-attaches, at start, the sandboxed kernels its runtime
    directory had.

    Records of another runtime directory, held by another owner, or refused (see the module) are
    left alone; at the server's exit, sandboxed kernels are let go rather than shut down
    (``keep_kernels_on_exit``), so the next server finds them within ``orphan_timeout``.
    """

    keep_kernels_on_exit = Bool(
        True,
        config=True,
        help="Leave sandboxed kernels running at the server's exit, for the next server to "
        "re-attach within orphan_timeout.",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reattach_all()

    def reattach_all(self) -> list[str]:
        """Re-attach the live kernels recorded for this runtime directory (before the server
        serves); their ids."""
        here = os.path.realpath(self.connection_dir)
        found, refused = records(runtime_dir=here)
        for line in refused:
            self.log.warning("kernel-sandbox: not re-attaching a kernel: %s", line)
        done = []
        for record in found:
            if record.runtime_dir != here or record.kernel_id in self or record.attached:
                continue
            try:
                self._reattach(record)
            # the server starts anyway; the kernel ends at its orphan_timeout
            except Exception as exc:
                self.log.warning(
                    "kernel-sandbox: not re-attaching kernel %s: %s", record.kernel_id, exc
                )
                continue
            done.append(record.kernel_id)
        return done

    def _reattach(self, record: Record) -> None:
        km = self.kernel_manager_factory(
            connection_file=os.path.join(self.connection_dir, f"kernel-{record.kernel_id}.json"),
            parent=self,
            log=self.log,
            kernel_name=record.kernel_name,
            kernel_spec_manager=self.kernel_spec_manager,
        )
        try:
            km.kernel_spec  # noqa: B018 (a kernelspec that is gone is refused here)
        except Exception as exc:
            raise KernelLaunchError(
                f"its kernelspec {record.kernel_name!r} is not available ({exc})"
            ) from exc
        take(km, record)
        try:
            km.write_connection_file()
        except Exception:
            # let it go again: it ends at its orphan_timeout, or the next server takes it
            km.provisioner.detach()
            raise
        km.execution_state, km.reason, km.last_activity = "idle", "", self.last_kernel_activity
        self._kernels[record.kernel_id] = km
        self._kernel_connections[record.kernel_id] = 0
        IOLoop.current().add_callback(self._resume, record.kernel_id)
        self.log.info(
            "kernel-sandbox: re-attached kernel %s (%s)", record.kernel_id, record.kernel_name
        )

    async def _resume(self, kernel_id: str) -> None:
        """What a started kernel gets once the loop runs: its restarter, control socket and activity
        watch."""
        km = self._kernels.get(kernel_id)
        if km is None:
            return
        km.start_restarter()
        km._connect_control_socket()
        await self._finish_kernel_start(kernel_id)
        if not self._initialized_culler:
            self.initialize_culler()

    async def _async_shutdown_all(self, now: bool = False) -> None:
        """Let the sandboxed kernels go (see ``keep_kernels_on_exit``); shut down the others."""
        from .provisioners.launched import LaunchedProvisioner

        if self.keep_kernels_on_exit:
            for kernel_id, km in list(self._kernels.items()):
                provisioner = km.provisioner
                if (
                    isinstance(provisioner, LaunchedProvisioner)
                    and provisioner.private is not None
                    and km.has_kernel
                ):
                    km.stop_restarter()
                    km._close_control_socket()
                    provisioner.detach()
                    km.cleanup_connection_file()
                    self.stop_watching_activity(kernel_id)
                    self._kernels.pop(kernel_id)
                    self.log.info(
                        "kernel-sandbox: left kernel %s running for the next server", kernel_id
                    )
        await super()._async_shutdown_all(now=now)

    # async, as AsyncMultiKernelManager's own (which has the same ignore)
    shutdown_all = _async_shutdown_all  # type: ignore[assignment]
