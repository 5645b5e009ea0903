"""The launcher's own cells in a kernel (a sleep's checkpoint and restore, :mod:`.sleep`).

None of their messages reaches a client: the front's watcher hands them here
(:meth:`OwnCells.take`), which keeps their reply and what they printed. A cell stores no history
and is not silent (execd's relay sends no output for a silent cell). A call of the sleep's kernel
side (:meth:`OwnCells.call`) answers with a text frame
(:mod:`kernel_sandbox.kernelside.textframe`) of a marker made for it, taken from what the cell
printed, whatever else it printed (a thread of the user's may write meanwhile); its content stays
untrusted.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import CheckpointError
from ..kernelside import textframe
from ..kernelside.boot import EXTENSION
from .cellblobs import CHUNK, install_cell
from .front import KernelLink
from .messages import dumps, msg_type_of, parse_part
from .wire import new_header

OWN_TIMEOUT = 600.0
"""Seconds the launcher waits for its own cell (saving or loading a large state takes a while)."""
OWN_OUTPUT = 4 * CHUNK
"""Characters of output taken from one own cell (a chunk's answer fits)."""


class OwnCells:
    """The launcher's own cells, one at a time, in the kernel of the link ``link()`` returns."""

    def __init__(self, link: Callable[[], KernelLink | None]) -> None:
        self._link = link
        self._ids: collections.deque[bytes] = collections.deque(maxlen=4)
        """The msg_ids of the latest own cells (their late messages are dropped too)."""
        self._reply: asyncio.Future[Any] | None = None
        self._out: list[str] = []
        self._session = uuid.uuid4().hex

    def take(self, channel: str, parts: list[bytes]) -> bool:
        """Take a kernel message if it is an own cell's (True: no client sees it)."""
        if not any(own in parts[1] for own in self._ids):
            return False
        kind = msg_type_of(parts[0])
        reply = self._reply
        if channel == "iopub" and kind == "stream" and reply is not None:
            held = sum(map(len, self._out))
            if held < OWN_OUTPUT and len(parts[3]) < 2 * OWN_OUTPUT:
                content = parse_part(bytes(parts[3]))
                text = content.get("text") if isinstance(content, dict) else None
                if isinstance(text, str) and content.get("name") == "stdout":
                    self._out.append(text[: OWN_OUTPUT - held])
        elif channel == "shell" and kind == "execute_reply" and reply is not None:
            if not reply.done():
                reply.set_result(parse_part(bytes(parts[3])))
        return True

    async def run(self, code: str) -> dict[str, Any]:
        """Run ``code``; its execute_reply content."""
        link = self._link()
        if link is None:
            raise CheckpointError("the kernel's container is gone")
        header = new_header("execute_request", self._session, "kernel-sandbox")
        content = {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        self._ids.append(header["msg_id"].encode())
        self._reply = asyncio.get_running_loop().create_future()
        self._out = []
        link.send("shell", [], [dumps(header), b"{}", b"{}", dumps(content)])
        try:
            reply = await asyncio.wait_for(asyncio.shield(self._reply), OWN_TIMEOUT)
        finally:
            self._reply = None
        return reply if isinstance(reply, dict) else {}

    async def call(self, function: str, *args: Any) -> tuple[dict[str, Any], list[bytes]]:
        """Run ``function(marker, *args)`` of the sleep's kernel side (literal arguments); its
        answer's meta and buffers (:class:`CheckpointError` if it failed or gave none)."""
        marker = secrets.token_hex(16)
        arguments = ", ".join(repr(arg) for arg in (marker, *args))
        reply = await self.run(f"__import__({EXTENSION!r}).{function}({arguments})")
        if reply.get("status") != "ok":
            raise CheckpointError(str(reply.get("evalue") or f"{function} failed"))
        try:
            answer = textframe.parse("".join(self._out), marker, anywhere=True)
        except ValueError as exc:
            raise CheckpointError(f"the kernel's answer to {function} is invalid: {exc}") from None
        if answer is None:
            raise CheckpointError(f"the kernel gave no answer to {function}")
        return answer

    async def install(self) -> None:
        """Install the sleep's kernel side in a kernel not booted with it."""
        reply = await self.run(install_cell())
        if reply.get("status") != "ok":
            raise CheckpointError(
                f"the kernel could not take the sleep's code: {reply.get('evalue') or reply}"
            )
