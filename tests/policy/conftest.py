"""A real local ipykernel whose messages the policy tests run through the output policy."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ipykernel.kernelspec import get_kernel_dict
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager


@dataclass
class Run:
    """Every iopub message of one execution (up to idle) and its execute_reply."""

    iopub: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)

    def of(self, *msg_types: str) -> list[dict[str, Any]]:
        return [m for m in self.iopub if m["header"]["msg_type"] in msg_types]


class LocalKernel:
    """A local ipykernel (this interpreter) driven through jupyter_client's blocking client."""

    def __init__(self) -> None:
        # A kernelspec of its own for this interpreter, whatever python3 specs the machine has.
        self._specs = tempfile.TemporaryDirectory()
        spec_dir = Path(self._specs.name) / "policy-test-python"
        spec_dir.mkdir()
        (spec_dir / "kernel.json").write_text(json.dumps(get_kernel_dict()))
        specs = KernelSpecManager(kernel_dirs=[self._specs.name], ensure_native_kernel=False)
        self.manager = KernelManager(kernel_name="policy-test-python", kernel_spec_manager=specs)
        self.manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
        assert self.manager.kernel_spec.argv[0] == sys.executable, self.manager.kernel_spec.argv
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60) -> Run:
        msg_id = self.client.execute(code)
        run = Run()
        while True:
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            run.iopub.append(msg)
            if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        run.reply = self.client.get_shell_msg(timeout=timeout)
        assert run.reply["parent_header"]["msg_id"] == msg_id
        return run

    def request(self, send: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        msg_id = getattr(self.client, send)(*args, **kwargs)
        while True:
            reply = self.client.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self._specs.cleanup()


@pytest.fixture(scope="module")
def kernel() -> Iterator[LocalKernel]:
    k = LocalKernel()
    try:
        yield k
    finally:
        k.close()
