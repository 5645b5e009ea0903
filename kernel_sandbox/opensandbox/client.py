"""Async clients for an OpenSandbox deployment: the lifecycle server and a sandbox's execd.

Capped HTTP is :mod:`.http`, the execd client :mod:`.execd`, the lifecycle client
:mod:`.lifecycle`; this module holds the conveniences built on them (:func:`keep_alive`,
:func:`run_once`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping
from typing import Any

import httpx

from ..errors import SandboxNotFound
from .events import ExecdRun
from .execd import EventCallback, LostCallback
from .http import _emit, log
from .lifecycle import OpenSandboxClient


async def keep_alive(
    client: OpenSandboxClient,
    sandbox_id: str,
    seconds: float,
    *,
    interval: float | None = None,
    on_lost: LostCallback | None = None,
) -> None:
    """Renew the sandbox's expiration every ``interval`` s (default ``seconds / 3``) until
    cancelled.

    Any error but cancellation is logged and survived. ``on_lost(reason)`` is called once when the
    sandbox can no longer be renewed: it is gone (404; the loop then ends), or every renewal has
    failed for longer than ``seconds``, so it has probably expired.
    """
    interval = interval or seconds / 3
    renewed_at = time.monotonic()
    reported = False
    while True:
        await asyncio.sleep(interval)
        try:
            await client.renew(sandbox_id, seconds)
        except asyncio.CancelledError:
            raise
        except SandboxNotFound:
            await _emit(on_lost, f"sandbox {sandbox_id} is gone (404): it expired or was deleted")
            return
        except Exception as exc:  # noqa: BLE001 (the loop must outlive any answer of the server)
            log.warning("renewing sandbox %s failed: %s: %s", sandbox_id, type(exc).__name__, exc)
            if not reported and time.monotonic() - renewed_at > seconds:
                reported = True
                await _emit(
                    on_lost,
                    f"sandbox {sandbox_id} could not be renewed for "
                    f"{time.monotonic() - renewed_at:.0f} s (its timeout is {seconds:g} s); it has "
                    f"probably expired. Last error: {exc}",
                )
        else:
            renewed_at, reported = time.monotonic(), False


async def run_once(
    code: str,
    *,
    api_base: str | None = None,
    api_key: str | None = None,
    http: httpx.AsyncClient | None = None,
    language: str = "python",
    on_event: EventCallback | None = None,
    client_options: Mapping[str, Any] | None = None,
    **create_options: Any,
) -> ExecdRun:
    """Create a sandbox, run ``code`` in it and delete it, also when the run raises.

    A failed delete never hides the outcome: after a run it is kept in the result's
    ``cleanup_error`` (and logged); after a failed run it is logged and the run's error is raised.
    ``client_options`` go to :class:`OpenSandboxClient` (polling, :class:`Limits`...).
    """
    async with OpenSandboxClient(
        api_base, api_key, http=http, **dict(client_options or {})
    ) as client:
        sandbox = await client.create(**create_options)
        try:
            result = await client.run_code(sandbox, code, language=language, on_event=on_event)
        except BaseException as exc:
            try:
                await asyncio.shield(client.delete(sandbox.id))
            except Exception as cleanup:  # noqa: BLE001
                log.error(
                    "deleting sandbox %s after a failed run failed too: %s", sandbox.id, cleanup
                )
                if sys.version_info >= (3, 11):  # add_note is new in 3.11
                    exc.add_note(f"deleting sandbox {sandbox.id} failed as well: {cleanup}")
            raise
        try:
            await asyncio.shield(client.delete(sandbox.id))
        except Exception as cleanup:  # noqa: BLE001
            log.error(
                "deleting sandbox %s failed; the run's result is kept: %s", sandbox.id, cleanup
            )
            result.cleanup_error = cleanup
        return result


def run_once_sync(code: str, **options: Any) -> ExecdRun:
    """Blocking wrapper around :func:`run_once` (not for use inside a running event loop)."""
    return asyncio.run(run_once(code, **options))
