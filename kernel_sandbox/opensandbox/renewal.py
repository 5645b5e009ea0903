"""One renewal of a paused sandbox, run by the dormant process
(:mod:`kernel_sandbox.launch.dormant`) every ``renew_every`` seconds while the launcher rests: a
process of its own, so that the dormant one stays a few MiB and keeps its clients' connections
(an exec of the launcher would close them).

It renews the sandbox's expiration and reads its state with the launcher's own client (its TLS,
proxies and limits). Exit status 0: renewed, and still paused; :data:`HAND_BACK`: anything else
(gone, running again, an error), for the launcher to handle as it does awake.
"""

from __future__ import annotations

import asyncio
import sys

from ..launch.dormant import STATE_OPTION, read_state
from ..launch.request import settings_from_config
from .lifecycle import OpenSandboxClient, sandbox_state
from .settings import OpenSandboxSettings

HAND_BACK = 3
"""The exit status that asks the dormant process to exec the launcher again."""


async def renew(settings: OpenSandboxSettings, sandbox_id: str) -> int:
    """Renew ``sandbox_id`` and check it is still paused; the exit status."""
    async with OpenSandboxClient(
        settings.api_base, settings.api_key, limits=settings.limits
    ) as client:
        try:
            await client.renew(sandbox_id, settings.timeout)
            state = sandbox_state(await client.get(sandbox_id))
        except Exception as exc:  # noqa: BLE001 (any failure is the launcher's to handle)
            print(f"kernel-sandbox: renewing sandbox {sandbox_id}: {exc}", file=sys.stderr)
            return HAND_BACK
    return 0 if state == "Paused" else HAND_BACK


def argv() -> list[str]:
    """How the dormant process runs this module: this interpreter, with the launcher's own
    flags."""
    flags = sys.orig_argv[1 : sys.orig_argv.index("-m")] if "-m" in sys.orig_argv else []
    return [sys.executable, *flags, "-m", __name__]


def main() -> None:
    """``python -m kernel_sandbox.opensandbox.renewal --state-fd FD`` (run by the dormant
    process): the state names the launch request and the sandbox."""
    if len(sys.argv) != 3 or sys.argv[1] != STATE_OPTION or not sys.argv[2].isdigit():
        raise SystemExit(f"usage: python -m {__name__} {STATE_OPTION} FD (run by the launcher)")
    state = read_state(int(sys.argv[2]))
    request = state["request"]
    settings = settings_from_config(request["provisioner"], request["settings"])
    assert isinstance(settings, OpenSandboxSettings)
    raise SystemExit(asyncio.run(renew(settings, state["sandbox_id"])))


if __name__ == "__main__":
    main()
