"""Which sandboxes are ours, whose they are, and removing the ones nobody will remove any more.

Every kernel sandbox carries, besides ``kernel-sandbox: "true"``, the kernel's id, the host its
launcher runs on and the launcher's pid (OpenSandbox metadata are Kubernetes labels, so the host
name is written in label form). :func:`collect_garbage` deletes the sandboxes of this host whose
launcher is dead (every one of this host with ``everything``); sandboxes of other hosts are never
touched. Without it an orphan still ends: its expiration is renewed only by a live launcher.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from ..provisioners.process import pid_alive
from .lifecycle import LABELS, OpenSandboxClient

LABEL_KERNEL_ID = "kernel-sandbox-kernel-id"
LABEL_OWNER_HOST = "kernel-sandbox-owner-host"
LABEL_LAUNCHER_PID = "kernel-sandbox-launcher-pid"
_NOT_IN_LABELS = re.compile(r"[^A-Za-z0-9_.-]+")


def host_label() -> str:
    """This host's name as a label value: up to 63 of ``A-Z a-z 0-9 - _ .``, alphanumeric at both
    ends."""
    name = _NOT_IN_LABELS.sub("-", socket.gethostname())[:63].strip("-_.")
    return name or "unnamed-host"


def owner_metadata(kernel_id: str) -> dict[str, str]:
    """The metadata that names a kernel's sandbox as ours, with its kernel, host and launcher."""
    return {
        LABEL_KERNEL_ID: kernel_id,
        LABEL_OWNER_HOST: host_label(),
        LABEL_LAUNCHER_PID: str(os.getpid()),
    }


def is_orphan(sandbox: dict[str, Any]) -> bool:
    """True when ``sandbox`` (as the server lists it) is of this host and its launcher is dead."""
    metadata = sandbox.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    pid = str(metadata.get(LABEL_LAUNCHER_PID, ""))
    return (
        metadata.get(LABEL_OWNER_HOST) == host_label() and pid.isdigit() and not pid_alive(int(pid))
    )


async def collect_garbage(client: OpenSandboxClient, *, everything: bool = False) -> list[str]:
    """Delete this host's kernel sandboxes whose launcher is dead (all of this host's with
    ``everything``).

    Returns the ids deleted (a sandbox already gone counts as deleted).
    """
    ours = await client.list_sandboxes(metadata={**LABELS, LABEL_OWNER_HOST: host_label()})
    deleted = []
    for sandbox in ours:
        sandbox_id = sandbox.get("id")
        if isinstance(sandbox_id, str) and (everything or is_orphan(sandbox)):
            await client.delete(sandbox_id)
            deleted.append(sandbox_id)
    return deleted
