"""A peer: a fresh interpreter per tool call, the way Letta's local sandbox runs tools (our own equivalent).

The tool's source and the base64 pickle of its state go into a script written to a temp file;
a new interpreter (this host's Python, as Letta runs it) executes it and writes the pickled
(result, state) between two markers on stdout. Both ``bench_execution.py`` and
``bench_peers.py`` time it. What comes back is read with an unpickler that refuses every class:
the state is plain data, and nothing is ever unpickled whole on the host.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import io
import os
import pickle
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = """import base64, pickle, sys
{tool_source}
state = pickle.loads(base64.b64decode({state!r}))
result = {tool_name}(state)
sys.stdout.write({start!r} + base64.b64encode(pickle.dumps((result, state))).decode() + {end!r})
"""
MARK_START, MARK_END = f"<<result-{uuid.uuid4().hex}>>", f"<<end-{uuid.uuid4().hex}>>"


class _PlainData(pickle.Unpickler):
    """Unpickles builtin containers and scalars only: nothing is imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}")


async def per_call_interpreter(tool: Callable[[dict], Any], state: dict) -> tuple[Any, dict]:
    """Call ``tool(state)`` in a new interpreter; return its result and the state it left."""
    script = SCRIPT.format(
        tool_source=inspect.getsource(tool), tool_name=tool.__name__,
        state=base64.b64encode(pickle.dumps(state)).decode(), start=MARK_START, end=MARK_END,
    )
    with tempfile.TemporaryDirectory(prefix="ks-bench-tool-") as tmp:
        path = Path(tmp, "tool.py")
        path.write_text(script)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(path), cwd=tmp, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the tool's interpreter failed: {err.decode(errors='replace')[-500:]}")
    text = out.decode()
    payload = text[text.index(MARK_START) + len(MARK_START) : text.index(MARK_END)]
    result, new_state = _PlainData(io.BytesIO(base64.b64decode(payload))).load()
    return result, new_state
