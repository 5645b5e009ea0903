"""A sleeping kernel's blob moved through the kernel's own cells, for a backend with no file
channel into its sandbox (OpenSandbox: execd's relay, or a Jupyter server behind its proxy).

The sleep (:mod:`.sleep`) installs the kernel side (:func:`install_cell`: the modules of
:mod:`kernel_sandbox.kernelside.magics`, as the Docker boot installs them), then calls its
``sleep_*`` functions, each in a cell of its own whose answer is a text frame
(:mod:`kernel_sandbox.kernelside.textframe`) with a marker made for that call. The blob travels
in chunks of :data:`CHUNK`, each counted against what the kernel stated before it is kept.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from ..errors import CheckpointError
from ..kernelside import sources

CHUNK = 256 * 1024
"""Bytes of the blob per cell (its answer, base64 in a frame, is a third larger)."""
MODULES = ("workfiles", "checkpoint", "packages", "textframe", "magics")
Call = Callable[..., Awaitable[tuple[dict[str, Any], list[bytes]]]]
"""Run ``sleep_<name>(marker, *args)`` in the kernel; its answer's meta and buffers."""


def install_cell() -> str:
    """A cell that installs the modules the kernel has not yet, under their installed names, and
    leaves no name behind (its value is None)."""
    return (
        "(lambda sources: [exec(compile(text, '<' + name + '>', 'exec'), module.__dict__) "
        "for name, text in sources.items() if name not in __import__('sys').modules "
        "for module in [__import__('types').ModuleType(name)] "
        "if __import__('sys').modules.setdefault(name, module) is module] and None)"
        f"({sources(MODULES)!r})"
    )


class CellChannel:
    """A :class:`~.checkpoints.BlobChannel` through cells, for a kernel of the image ``image``
    (its name, which is also its id: the server tells no other); ``call`` runs a function of the
    kernel side (the sleep sets it). The blob's path is the kernel side's own."""

    def __init__(self, image: str) -> None:
        self._image = image
        self.call: Call | None = None

    async def image(self) -> tuple[str, str]:
        """The image's name, twice (id and name)."""
        return self._image, self._image

    async def pull(self, path: str, max_bytes: int, sink: Callable[[memoryview], None]) -> int:
        """Hand the blob's bytes to ``sink``, chunk by chunk; refused past ``max_bytes`` or past
        the size the kernel stated first."""
        assert self.call is not None
        offset, total = 0, -1
        while offset < total or total < 0:
            meta, parts = await self.call("sleep_read", offset, CHUNK)
            size = meta.get("size")
            if type(size) is not int or size < 0 or len(parts) != 1:
                raise CheckpointError("the kernel's answer for a chunk of the blob is malformed")
            if size > max_bytes:
                raise CheckpointError(
                    f"Refused the checkpoint: the blob in the kernel is {size} bytes, over the "
                    f"{max_bytes} stated; nothing was kept."
                )
            if total >= 0 and size != total:
                raise CheckpointError("Refused the checkpoint: the blob changed while pulled.")
            total, data = size, parts[0]
            if len(data) > CHUNK or offset + len(data) > total or (not data and offset < total):
                raise CheckpointError("Refused the checkpoint: a chunk of the blob is malformed.")
            sink(memoryview(data))
            offset += len(data)
        return total

    async def push(self, path: str, source: BinaryIO, size: int) -> None:
        """Write ``size`` bytes of ``source`` as the kernel side's blob, chunk by chunk."""
        assert self.call is not None
        offset = 0
        while offset < size or offset == 0:
            block = source.read(min(CHUNK, size - offset))
            if len(block) != min(CHUNK, size - offset):
                raise CheckpointError("the checkpoint file on the host is shorter than recorded")
            await self.call("sleep_write", offset, base64.b64encode(block).decode("ascii"))
            offset += len(block)
            if not size:
                return
