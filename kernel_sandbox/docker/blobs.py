"""A kernel container's files, moved for the launcher's checkpoint store
(:class:`kernel_sandbox.launch.checkpoints.BlobChannel`): one Docker exec of
:mod:`kernel_sandbox.kernelside.blobcopy` per file, as the kernel's own user."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import docker.errors

from ..errors import CheckpointError
from ..kernelside import source
from ..kernelside.blobcopy import BLOCK, LENGTH
from .exec_stream import run_once

IDLE_TIMEOUT = 60.0
"""Seconds a copy may go without a byte moving before it is given up."""


class ContainerFiles:
    """Files of the container ``container_id`` whose image option is ``image_name``."""

    def __init__(self, client: Any, container_id: str, image_name: str) -> None:
        self.client, self.container_id, self.image_name = client, container_id, image_name

    async def image(self) -> tuple[str, str]:
        """The id of the container's image, as the engine reports it, and the image option."""
        found = await asyncio.to_thread(self.client.api.inspect_container, self.container_id)
        return str(found["Image"]), self.image_name

    async def pull(self, path: str, max_bytes: int, sink: Callable[[memoryview], None]) -> int:
        """Hand the bytes of the container's file ``path`` to ``sink``; refused past
        ``max_bytes``."""
        head, counts = bytearray(), {"stated": -1, "got": 0}

        def stdout(data: memoryview) -> None:
            if counts["stated"] < 0:
                need = LENGTH.size - len(head)
                head.extend(data[:need])
                data = data[need:]
                if len(head) < LENGTH.size:
                    return
                (counts["stated"],) = LENGTH.unpack(head)
                if counts["stated"] > max_bytes:
                    raise CheckpointError(
                        f"Refused the checkpoint: the file in the container is "
                        f"{counts['stated']} bytes, not the {max_bytes} stated; nothing was kept."
                    )
            if counts["got"] + len(data) > counts["stated"]:
                raise CheckpointError(
                    "Refused the checkpoint: the container sent more bytes than it stated."
                )
            counts["got"] += len(data)
            sink(data)

        code, errors = await self._run(["read", path], iter(()), stdout)
        if code != 0 or counts["got"] != counts["stated"]:
            raise CheckpointError(
                f"Could not read the checkpoint in the container ({errors or 'it ended early'})."
            )
        return counts["stated"]

    async def push(self, path: str, data: BinaryIO, size: int) -> None:
        """Write ``size`` bytes of ``data`` to the container's file ``path``, whole or not at
        all."""

        def blocks() -> Iterator[bytes]:
            left = size
            while left > 0:
                block = data.read(min(BLOCK, left))
                if not block:
                    raise CheckpointError(
                        "the checkpoint file on the host is shorter than recorded"
                    )
                yield block
                left -= len(block)

        answer = bytearray()
        code, errors = await self._run(
            ["write", path, str(size)], blocks(), lambda view: answer.extend(view[:16])
        )
        if code != 0 or bytes(answer) != b"ok":
            raise CheckpointError(f"Could not write into the container ({errors or 'no answer'}).")

    async def _run(
        self, args: list[str], stdin: Iterator[bytes], stdout: Callable[[memoryview], None]
    ) -> tuple[int, str]:
        cmd = ["python", "-I", "-S", "-c", source("blobcopy"), *args]
        try:
            return await asyncio.to_thread(
                run_once, self.client, self.container_id, cmd, stdin, stdout, IDLE_TIMEOUT
            )
        except (docker.errors.APIError, OSError) as exc:  # TimeoutError is an OSError
            raise CheckpointError(f"Could not move the checkpoint: {exc}") from exc
