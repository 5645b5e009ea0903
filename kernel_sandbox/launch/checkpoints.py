"""The launcher's store of a kernel's last checkpoint: the host side of ``%checkpoint`` and
``%restore`` (the kernel side: :mod:`kernel_sandbox.kernelside.magics`).

A request is an IOPub message of the kernel's, of type :data:`REQUEST`, which the front hands here
and never to a client (:attr:`Front.kernel_requests`). The store keeps one checkpoint per kernel on
the host, on disk (:func:`~kernel_sandbox.privdir.kept_checkpoint`: a 0600 file in a 0700
directory, in the format of :meth:`Checkpoint.save`, so :meth:`Checkpoint.load` reads it): the next
``%checkpoint`` replaces it, a restart of the kernel keeps it, and it goes with the kernel's private
directory when the kernel is shut down (or by ``kernel-sandbox gc``).

The store is the host's, so the host decides when it is written: a checkpoint is kept only for a
request whose parent is a cell the client signed with a line ``%checkpoint``
(:func:`~kernel_sandbox.kernelside.magics.checkpoint_lines`, seen by
:meth:`CheckpointStore.client_sent`), once per such line; the kernel's other checkpoint requests
are dropped. Before a byte is pulled the blob's file is made at its full size
(:func:`~kernel_sandbox.privdir.checkpoint_part`, locked by its writer), under the lock of the
whole store, after counting every checkpoint of this user's kernels, kept and partial, against
``max_checkpoint_bytes``. That file goes on every way out: a refusal, a cancel
(:meth:`CheckpointStore.close` when the launcher stops), the kernel's private directory removed,
and ``kernel-sandbox gc`` for a launcher killed mid-copy.

Everything in a request is untrusted. Each field is checked for type and size; the blob is pulled
only when the size the kernel states is within ``checkpoint_max_bytes``, is counted as it arrives
(refused past the stated size) and hashed by the host, and is never opened here; a checkpoint is
restored only into the image it was made in. One request is served at a time; one that comes
meanwhile (the magic waits for its answer, so a forged one) is dropped. The answer is a small JSON
file the launcher writes into the container at the path the request names, which the magic waits
for. The bytes move through the backend's :class:`BlobChannel`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import fcntl
import hashlib
import io
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeGuard

from ..checkpoint_file import header_bytes, read_header, reasons, strings
from ..errors import CheckpointError, FramingError, KernelSandboxError
from ..kernelside.magics import REQUEST, checkpoint_lines
from ..privdir import checkpoint_part, checkpoint_store, kept_checkpoint, stored_bytes
from .journal import note

OFFER = "checkpoint-offer.json"
"""Left in the private directory by a kernel that ran out of memory with ``checkpoint_on_oom``."""
MAX_PATH = 4096
ASKED = 16
"""Cells with ``%checkpoint`` the store remembers, the newest, until their requests come."""
_SHA256 = re.compile(r"[0-9a-f]{64}")

log = logging.getLogger("kernel_sandbox.launch")

__all__ = ["OFFER", "REQUEST", "BlobChannel", "CheckpointStore"]


class BlobChannel(Protocol):
    """How a backend moves a file out of and into its sandbox, as the kernel's own user."""

    async def pull(self, path: str, max_bytes: int, sink: Callable[[memoryview], None]) -> int:
        """Hand the bytes of the sandbox's file ``path`` to ``sink``; return the size the sandbox
        stated, after checking it is within ``max_bytes`` and that no more arrived
        (:class:`CheckpointError`)."""

    async def push(self, path: str, source: BinaryIO, size: int) -> None:
        """Write ``size`` bytes of ``source`` to the sandbox's file ``path``, whole or not at
        all."""

    async def image(self) -> tuple[str, str]:
        """The id of the image the kernel runs, and its name."""


class CheckpointStore:
    """The kept checkpoint of the kernel whose private directory is ``directory``: one of at most
    ``max_bytes``, among all this user's kernels' of at most ``max_total`` bytes together."""

    def __init__(
        self,
        directory: Path,
        channel: BlobChannel,
        max_bytes: int,
        max_total: int,
        backend: str,
        slot: str = "",
    ) -> None:
        self.slot = slot
        self.path = kept_checkpoint(directory, slot)
        self.part = checkpoint_part(directory, slot)
        self.offer_path = directory / OFFER
        self.channel = channel
        self.max_bytes = max_bytes
        self.max_total = max_total
        self.backend = backend
        self._serving = False
        self._asked: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.vet: Callable[[dict[str, Any]], None] | None = None
        """Called with a checkpoint's checked header before a byte is pulled; it refuses by raising
        :class:`CheckpointError` (a sleep that would lose names: :mod:`.sleep`)."""
        self.expected: str | None = None
        """The sha256 the kept checkpoint must have to be given back (None: any it records)."""
        self.slot_cap: tuple[int, str] | None = None
        """The most bytes the checkpoints of this store's slot may take, all this user's kernels'
        together, and the option that sets it (the sleeps': ``max_suspended_bytes``)."""

    def client_sent(self, parts: list[bytes]) -> None:
        """Note a cell the client signed that runs ``%checkpoint`` (:attr:`Front.client_shell`):
        the checkpoint requests the store serves for it, one per such line."""
        header = _json(parts[0])
        if not isinstance(header, dict) or header.get("msg_type") != "execute_request":
            return
        code = bytes(parts[3])  # a large one arrives as a memoryview
        content = _json(code) if b"%checkpoint" in code else None
        msg_id = header.get("msg_id")
        lines = checkpoint_lines(content.get("code")) if isinstance(content, dict) else 0
        if isinstance(msg_id, str) and lines:
            self._asked[msg_id] = lines
            while len(self._asked) > ASKED:
                self._asked.popitem(last=False)

    def handle(self, content: Any, parent: Any) -> None:
        """Serve one request of the kernel's, whose parent header is ``parent`` (in a task: the
        front goes on relaying)."""
        answer = content.get("answer") if isinstance(content, dict) else None
        if not _path(answer):
            note(log, logging.WARNING, "dropped a checkpoint request without a valid answer path")
            return
        if self._serving:
            # the magic waits for its answer, so only a forged request comes now: not one exec more
            note(log, logging.WARNING, "dropped a checkpoint request: one is still being served")
            return
        if content.get("action") == "checkpoint":
            msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
            if not isinstance(msg_id, str) or msg_id not in self._asked:
                # not an exec, not a byte on the host for a checkpoint nobody asked for
                note(
                    log,
                    logging.WARNING,
                    "dropped a checkpoint request from a cell without %checkpoint",
                )
                return
            self._asked[msg_id] -= 1
            if not self._asked[msg_id]:
                del self._asked[msg_id]
        self._serving = True
        task = asyncio.ensure_future(self._serve(content, answer))
        self._tasks.add(task)  # held until done (the loop keeps only weak references)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Give up the request being served (its partial file goes): the launcher stops."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _serve(self, content: dict[str, Any], answer: str) -> None:
        try:
            if content.get("action") == "checkpoint":
                reply = await self.keep(content)
            elif content.get("action") == "restore":
                reply = await self.give(content)
            else:
                reply = _error(f"unknown action {content.get('action')!r}")
        except (KernelSandboxError, OSError) as exc:
            reply = _error(str(exc))
        except Exception as exc:  # a request is answered, never fatal to the launcher
            log.exception("could not serve a checkpoint request")
            reply = _error(f"the launcher failed: {exc!r}")
        finally:
            self._serving = False  # before the answer: the magic may send its next request at once
        await self._answer(answer, reply)

    async def _answer(self, path: str, reply: dict[str, Any]) -> None:
        data = json.dumps(reply).encode()
        try:
            await self.channel.push(path, io.BytesIO(data), len(data))
        except (KernelSandboxError, OSError) as exc:
            log.warning("could not answer the kernel's checkpoint request: %s", exc)

    async def keep(self, content: dict[str, Any]) -> dict[str, Any]:
        """Pull the blob the kernel made (``content``: what it states of it, and its path) into
        the kept file, replacing the one kept before; refused with :class:`CheckpointError`."""
        header = _stated(content)
        if self.vet is not None:
            self.vet(header)
        if header["size"] > self.max_bytes:
            raise CheckpointError(
                f"Refused the checkpoint: it is {header['size']} bytes, over "
                f"checkpoint_max_bytes={self.max_bytes}; nothing was pulled (raise "
                "checkpoint_max_bytes in the kernelspec's config, or del big names first)."
            )
        image, image_name = await self.channel.image()
        header.update(
            image=image,
            image_name=image_name,
            backend=self.backend,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        )
        start = header_bytes(header)
        fd = self._reserve(len(start) + header["size"])  # no await: a cancel leaks no file
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(start)

                def sink(data: memoryview) -> None:
                    digest.update(data)
                    handle.write(data)

                stated = await self.channel.pull(content["blob"], header["size"], sink)
                if stated != header["size"] or digest.hexdigest() != header["sha256"]:
                    raise CheckpointError(
                        "Refused the checkpoint: the blob pulled is not the one the kernel stated "
                        "(its size or sha256 differs); the checkpoint kept before is unchanged."
                    )
                os.replace(self.part, self.path)  # while its lock is held: gc leaves it be
        finally:
            self.part.unlink(missing_ok=True)
        self.offer_path.unlink(missing_ok=True)
        return {"status": "ok", "size": header["size"], "sha256": header["sha256"]}

    def _reserve(self, size: int) -> int:
        """A new partial file of ``size`` bytes, locked, made when the store has room for it; its
        descriptor."""
        with checkpoint_store() as root:
            self.part.unlink(missing_ok=True)  # a dead launcher's, of this kernel
            used, files = stored_bytes(root)
            if used + size > self.max_total:
                raise CheckpointError(
                    f"Refused the checkpoint: it needs {size} bytes and the host's checkpoints "
                    f"hold {used} bytes in {files} file(s) in {root} (every kernel's, this one's "
                    f"kept checkpoint too until a new one replaces it), over "
                    f"max_checkpoint_bytes={self.max_total}; nothing was pulled (shut down kernels "
                    "whose checkpoints you no longer need, or raise max_checkpoint_bytes in the "
                    "kernelspec's config)."
                )
            if self.slot_cap is not None:
                cap, option = self.slot_cap
                used, files = stored_bytes(root, self.slot)
                if used + size > cap:
                    raise CheckpointError(
                        f"Refused the checkpoint: it needs {size} bytes, over {option}={cap} "
                        f"with the {used} bytes the checkpoints of this user's sleeping kernels "
                        f"hold ({files} file(s) in {root}); nothing was pulled (wake or shut "
                        f"down sleeping kernels, or raise {option} in the kernelspec's config)."
                    )
            fd = os.open(
                self.part,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.ftruncate(fd, size)  # counted at its full size by every other writer
            except BaseException:
                os.close(fd)
                self.part.unlink(missing_ok=True)
                raise
            return fd

    async def give(self, content: dict[str, Any]) -> dict[str, Any]:
        """Write the kept blob where the kernel asks (``content["blob"]``), if it was made in the
        image it runs; refused with :class:`CheckpointError`."""
        if not _path(content.get("blob")):
            raise CheckpointError("the restore request names no valid path for the blob")
        try:
            handle = open(self.path, "rb")
        except FileNotFoundError:
            raise CheckpointError(
                "No checkpoint is kept for this kernel: run %checkpoint first (a checkpoint "
                "outlives restarts of the kernel, not its shutdown)."
            ) from None
        with handle:
            header = read_header(handle, str(self.path), self.max_bytes, "checkpoint_max_bytes")
            if self.expected is not None and header.get("sha256") != self.expected:
                raise CheckpointError(
                    f"Refused the checkpoint kept at {self.path}: it is not the one the launcher "
                    "made (its recorded sha256 differs); it was changed on the host since."
                )
            image, image_name = await self.channel.image()
            if header.get("image") != image:
                raise CheckpointError(
                    f"Refused %restore: the checkpoint was made in image "
                    f"{header.get('image_name')!r} ({header.get('image')}) and this kernel runs "
                    f"{image_name!r} ({image}); a checkpoint restores only into the image it was "
                    "made in."
                )
            await self.channel.push(content["blob"], handle, header["size"])
        self.offer_path.unlink(missing_ok=True)
        return {"status": "ok", "sha256": header["sha256"], "created": header.get("created", "")}

    def kept(self) -> bool:
        """True when a checkpoint is kept for this kernel."""
        return self.path.is_file()

    def leave_offer(self, reason: str) -> None:
        """Leave word for the kernel started next (``checkpoint_on_oom``): it ended, and why."""
        if self.kept():
            self.offer_path.write_text(json.dumps({"reason": reason}))

    def take_offer(self) -> str | None:
        """The note for the first cell of a kernel whose predecessor left an offer, once."""
        try:
            data = json.loads(self.offer_path.read_text())
        except (OSError, ValueError):
            return None
        finally:
            self.offer_path.unlink(missing_ok=True)
        reason = data.get("reason") if isinstance(data, dict) else None
        return (
            f"The kernel before this one ended ({reason or 'out of memory'}) and was restarted; "
            "the checkpoint you made with %checkpoint is kept: run %restore to load it."
        )


def _json(raw: bytes) -> Any:
    with contextlib.suppress(ValueError, RecursionError):
        return json.loads(bytes(raw))
    return None


def _path(value: Any) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and value.startswith("/")
        and len(value) <= MAX_PATH
        and "\0" not in value
    )


def _error(text: str) -> dict[str, Any]:
    return {"status": "error", "evalue": text[:2000]}


def _stated(content: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's header from what the kernel states, checked for shape."""
    size, digest, files = content.get("size"), content.get("sha256"), content.get("files")
    if type(size) is not int or size < 0 or type(files) is not int or not isinstance(digest, str):
        raise CheckpointError("the checkpoint request states no size")
    if not _SHA256.fullmatch(digest) or not _path(content.get("blob")):
        raise CheckpointError("the checkpoint request states no sha256 or no valid path")
    try:
        return {
            "size": size,
            "sha256": digest,
            "saved": list(strings(content.get("saved"), "names saved")),
            "not_saved": reasons(content.get("not_saved"), "names not saved"),
            "files": files,
            "files_not_saved": reasons(content.get("files_not_saved"), "files not saved"),
        }
    except FramingError as exc:
        raise CheckpointError(f"the checkpoint request is malformed: {exc}") from None
