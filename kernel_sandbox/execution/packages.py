"""Installing packages in a session's kernel, through the backend's window on the package index."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from ..errors import NetworkDisabledError
from ..results import Execution, ExecutionError
from .exchange import REPLY_GRACE
from .session import MAX_WINDOW, SandboxSession

PIP_OUTPUT_TAIL = 64 * 1024
PIP_RETRIES = ("--retries", "5")
"""pip's own default, given explicitly: a kernel with the network off has ``PIP_RETRIES=1``."""


class PackageInstalls(SandboxSession):
    """``install``: pip inside the sandbox, the index opened for the call alone."""

    async def install(
        self,
        requirements: str | Iterable[str],
        *,
        pip_args: Iterable[str] = (),
        timeout: float | None = None,
    ) -> Execution:
        """pip-install ``requirements`` (names, or requirements.txt text) inside the sandbox.

        Packages go to a directory under the sandbox's home that is put on ``sys.path`` (Docker: a
        tmpfs of ``packages_size`` where compiled extensions load). The outcome is returned: pip's
        output in stdout/stderr, ``error`` set when pip failed, naming what the launcher's proxy
        refused and the option that allows it. With the
        network off (or a list) the backend opens the ``package_index`` for this call alone (Docker:
        in the launcher's proxy; OpenSandbox: in the sandbox's egress policy, by the host) and
        closes it when pip ends, also on error, timeout or cancel; when it cannot,
        :class:`NetworkDisabledError` says why, without running pip.
        """
        self._check_package_index()
        text = requirements if isinstance(requirements, str) else "\n".join(requirements)
        seconds, deadline = self._deadline(timeout)
        # a network-off kernel's pip does not retry; this one may
        pip_args = [*PIP_RETRIES, *pip_args]
        request = {
            "op": "install",
            "requirements": text,
            "pip_args": pip_args,
            "tail": PIP_OUTPUT_TAIL,
        }
        assert self._lock is not None
        async with self._lock, self._package_index(seconds):
            body = await self._op(request, (), seconds, deadline)
        refused = [str(reason) for reason in body.get("refused", ())]
        stderr = body["stderr"] + "".join(f"[kernel-sandbox] {reason}\n" for reason in refused)
        execution = Execution(stdout=body["stdout"], stderr=stderr)
        if body["returncode"] != 0:
            why = f"pip exited with code {body['returncode']}"
            execution.error = ExecutionError(
                "InstallError", "; ".join([why, *refused]), execution.stderr
            )
        return execution

    def _check_package_index(self) -> None:
        """Refuse at once an install that cannot reach any index: network off on a backend without
        windows."""
        if self.network is False and self._backend.sandboxed and not self._backend.package_window:
            raise NetworkDisabledError(
                f"Cannot install packages: this sandbox's network is off and the {self.backend} "
                "backend cannot open the package index for one call. Create it with the index in "
                "its network list (e.g. Sandbox(network=['pypi.org', 'files.pythonhosted.org'])) "
                "or network=True."
            )

    def _package_index(self, seconds: float) -> contextlib.AbstractAsyncContextManager[None]:
        """The backend's window on the package index for one call of at most ``seconds`` (plus a
        grace)."""
        if self.network is True or not self._backend.sandboxed:
            return contextlib.nullcontext()
        window = min(seconds + REPLY_GRACE, MAX_WINDOW)
        return self._backend.index_window(self._km.provisioner, self._launcher_request, window)
