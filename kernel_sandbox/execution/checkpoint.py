"""Checkpoints of a kernel's state, opaque to the host (the kernel side:
:mod:`..kernelside.checkpoint`).

The kernel pickles its namespace and packs its work directory into one blob; the host pulls the
blob through the helper's file channel, one chunk at a time, after checking the size the kernel
states against ``max_bytes`` and counting every byte that arrives, hashes it as it arrives, and
keeps it as bytes it never opens: nothing here imports or calls a deserialiser (a test scans this
module for that). A fresh kernel of the same image receives the blob the same way and loads it.
What the host knows of a checkpoint besides its bytes (the names saved, those not saved and why)
is the kernel's report, which comes back as data only (:mod:`.decode`) and is checked for shape.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..checkpoint_file import header_bytes, read_header, reasons, strings
from ..errors import (
    CallTimeoutError,
    CheckpointError,
    ConfigError,
    FramingError,
    PathError,
    SandboxError,
)

from .files import Gathered

if TYPE_CHECKING:
    from .backend import Backend

DEFAULT_MAX_CHECKPOINT_BYTES = 1024**3
"""The largest checkpoint :meth:`~kernel_sandbox.execution.sandbox.AsyncSandbox.checkpoint` pulls
(and :meth:`Checkpoint.load` reads) unless told."""
ANSWER_ROOM = 64 * 1024
"""Room left in a chunk for the rest of its answer, so that one chunk is one message (none is pulled
in two)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, repr=False)
class Checkpoint:
    """A kernel's state as an opaque blob: the user's names (pickled in the sandbox) and the work
    directory's files.

    ``data`` is never opened on the host. ``image`` is the id of the image it was made in (a
    checkpoint restores into that image only); ``saved`` the names in it; ``not_saved`` the
    names that could not be pickled, each with why; ``files_not_saved`` likewise for the work
    directory (other mounts, symlinks, FIFOs).
    """

    data: bytes
    sha256: str
    image: str
    image_name: str
    backend: str
    saved: tuple[str, ...]
    not_saved: dict[str, str] = field(default_factory=dict)
    files: int = 0
    files_not_saved: dict[str, str] = field(default_factory=dict)
    created: str = ""

    def __hash__(self) -> int:
        return hash((self.sha256, self.image))

    @property
    def size(self) -> int:
        """Bytes of the blob."""
        return len(self.data)

    def __repr__(self) -> str:
        names = ", ".join(self.saved[:8]) + (
            f", ... ({len(self.saved) - 8} more)" if len(self.saved) > 8 else ""
        )
        parts = [
            f"size={self.size}",
            f"sha256={self.sha256[:12]}...",
            f"image={self.image_name!r} ({self.image[:19]})",
            f"saved=[{names}]",
            f"files={self.files}",
        ]
        if self.not_saved:
            parts.append(
                "not_saved={"
                + ", ".join(f"{n}: {why[:60]}" for n, why in list(self.not_saved.items())[:8])
                + "}"
            )
        if self.files_not_saved:
            parts.append(f"files_not_saved={sorted(self.files_not_saved)[:8]}")
        return f"Checkpoint({', '.join(parts)})"

    def _header(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "sha256": self.sha256,
            "image": self.image,
            "image_name": self.image_name,
            "backend": self.backend,
            "saved": list(self.saved),
            "not_saved": self.not_saved,
            "files": self.files,
            "files_not_saved": self.files_not_saved,
            "created": self.created,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the checkpoint to a new file at ``path`` (0600): a JSON header, then the blob as it
        is."""
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
        )
        with os.fdopen(fd, "wb") as handle:
            handle.write(header_bytes(self._header()))
            handle.write(self.data)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
    ) -> Checkpoint:
        """Read a checkpoint :meth:`save` wrote; the blob is read as bytes, refused over
        ``max_bytes`` or when its sha256 is not the recorded one (:class:`CheckpointError`)."""
        _check_cap(max_bytes)
        with open(path, "rb") as handle:
            header = read_header(
                handle, os.fspath(path), max_bytes, "Checkpoint.load(max_bytes=...)"
            )
            data = handle.read(header["size"] + 1)
        if len(data) != header["size"]:
            raise CheckpointError(
                f"{os.fspath(path)!r}: the blob is not the size its header records"
            )
        return _from_header(header, data)

    def verify(self) -> None:
        """Raise :class:`CheckpointError` unless the blob's sha256 is the recorded one (a tampered
        checkpoint)."""
        if hashlib.sha256(self.data).hexdigest() != self.sha256:
            raise CheckpointError(
                "Refused the checkpoint: the sha256 of its blob is not the one recorded when it "
                "was made (it was changed or damaged since)."
            )


def _check_cap(max_bytes: Any) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ConfigError(f"max_bytes must be a number of bytes, not {max_bytes!r}")


def _from_header(header: dict[str, Any], data: bytes) -> Checkpoint:
    try:
        fields = {
            name: header[name] for name in ("sha256", "image", "image_name", "backend", "created")
        }
        if not all(isinstance(v, str) for v in fields.values()) or type(header["files"]) is not int:
            raise FramingError("a field has the wrong type")
        checkpoint = Checkpoint(
            data,
            saved=strings(header["saved"], "names saved"),
            not_saved=reasons(header["not_saved"], "names not saved"),
            files=header["files"],
            files_not_saved=reasons(header["files_not_saved"], "files not saved"),
            **fields,
        )
    except (KeyError, FramingError) as exc:
        raise CheckpointError(f"The checkpoint's header is malformed ({exc}).") from None
    checkpoint.verify()
    return checkpoint


class Session(Protocol):
    """What a checkpoint needs of the session it is taken from or restored into (an
    :class:`~kernel_sandbox.execution.sandbox.AsyncSandbox`, which calls :func:`take` and
    :func:`restore_into` on itself): its backend, kernel manager and lock, and the helper's
    operations with their deadlines and chunk size."""

    backend: str
    _backend: Backend
    _km: Any
    _lock: Any

    def _deadline(self, timeout: float | None) -> tuple[float, float]: ...

    async def _op(
        self, request: dict[str, Any], buffers: Sequence[Any], seconds: float, deadline: float
    ) -> Any: ...

    def _chunk(self) -> int: ...


async def take(sandbox: Session, max_bytes: int, timeout: float | None) -> Checkpoint:
    """Checkpoint ``sandbox``'s kernel (see
    :meth:`~kernel_sandbox.execution.sandbox.AsyncSandbox.checkpoint`)."""
    _check_cap(max_bytes)
    seconds, deadline = sandbox._deadline(timeout)
    image, image_name = await sandbox._backend.image(sandbox._km.provisioner)
    assert sandbox._lock is not None
    async with sandbox._lock:
        try:
            report = await sandbox._op(
                {"op": "checkpoint", "action": "save"}, (), seconds, deadline
            )
            size, digest = _stated(report)
            if size > max_bytes:
                raise CheckpointError(
                    f"Refused the checkpoint: the kernel states it is {size} bytes, over "
                    f"max_bytes={max_bytes} (checkpoint(max_bytes=...)); nothing was pulled."
                )
            data, pulled = await _pull(sandbox, size, max_bytes, seconds, deadline)
        finally:
            with contextlib.suppress(SandboxError):
                await sandbox._op({"op": "checkpoint", "action": "drop"}, (), seconds, deadline)
    if pulled != digest:
        raise FramingError(
            "The checkpoint changed in the sandbox while it was being pulled (its sha256 differs)."
        )
    return Checkpoint(
        data,
        digest,
        image,
        image_name,
        sandbox.backend,
        strings(report.get("saved"), "names saved"),
        reasons(report.get("not_saved"), "names not saved"),
        report.get("files") if type(report.get("files")) is int else 0,
        reasons(report.get("files_not_saved"), "files not saved"),
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def _stated(report: Any) -> tuple[int, str]:
    """The size and sha256 the kernel states for its blob."""
    if not isinstance(report, dict):
        raise FramingError("The checkpoint's report is not a mapping.")
    size, digest = report.get("size"), report.get("sha256")
    if (
        type(size) is not int
        or size < 0
        or not isinstance(digest, str)
        or not _SHA256.fullmatch(digest)
    ):
        raise FramingError("The checkpoint's report states no size or sha256.")
    return size, digest


async def _pull(
    sandbox: Session, size: int, max_bytes: int, seconds: float, deadline: float
) -> tuple[bytes, str]:
    """The blob, chunk by chunk into one buffer (the peak is its size once), and its sha256, hashed
    as it arrives; refused before a byte over ``max_bytes`` or ``size`` is kept."""
    gathered, sha = Gathered(), hashlib.sha256()
    gathered.reserve(size)
    offset, chunk = 0, sandbox._chunk() - ANSWER_ROOM
    while offset < size:
        asked = min(chunk, size - offset)
        request = {"op": "checkpoint", "action": "read", "offset": offset, "size": asked}
        answer = await sandbox._op(request, (), seconds, deadline)
        data = answer[1] if isinstance(answer, list) and len(answer) == 2 else None
        if not isinstance(data, bytes) or len(data) > asked or offset + len(data) > max_bytes:
            raise CheckpointError(
                f"Refused the checkpoint: the kernel sent more than it stated ({size} bytes, under "
                f"max_bytes={max_bytes}); nothing past the stated size was kept."
            )
        if answer[0] != size or len(data) != asked:
            raise FramingError("The checkpoint changed in the sandbox while it was being pulled.")
        gathered.write(data)
        sha.update(data)
        offset += len(data)
    return gathered.value(), sha.hexdigest()


async def restore_into(sandbox: Session, checkpoint: Checkpoint) -> None:
    """Load ``checkpoint`` into ``sandbox``'s fresh kernel, if it was made in the image the kernel
    runs."""
    image, image_name = await sandbox._backend.image(sandbox._km.provisioner)
    if image != checkpoint.image:
        raise ConfigError(
            f"Refused restore=: the checkpoint was made in image {checkpoint.image_name!r} "
            f"({checkpoint.image}, {checkpoint.backend} backend) and this sandbox runs "
            f"{image_name!r} ({image}); a checkpoint restores only into the image it was made in: "
            f"start the sandbox with image={checkpoint.image_name!r} (that image, unchanged) on "
            "the same backend."
        )
    checkpoint.verify()
    seconds, deadline = sandbox._deadline(None)
    assert sandbox._lock is not None
    async with sandbox._lock:
        try:
            chunk, data = sandbox._chunk(), memoryview(checkpoint.data)
            for offset in range(0, max(checkpoint.size, 1), chunk):
                request = {"op": "checkpoint", "action": "write", "offset": offset}
                await sandbox._op(request, [data[offset : offset + chunk]], seconds, deadline)
            request = {"op": "checkpoint", "action": "load", "sha256": checkpoint.sha256}
            await sandbox._op(request, (), seconds, deadline)
        except (CallTimeoutError, PathError):
            raise
        except SandboxError as exc:
            raise CheckpointError(f"The checkpoint could not be restored: {exc}") from exc
