"""Cost of the strict output policy per kernel→client message, on real messages of a local ipykernel.

For each kind of message: the policy alone (``filter_message`` on the parsed parts), and what the
relay pays because of it (the front's ``filter_parts``: parsing the header, parent header,
metadata and content, and serializing again the parts the policy changed). Plus 50 MB of stdout
in 8 KB ``stream`` messages.
Nothing asserts on time; medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from jupyter_client.manager import KernelManager

from kernel_sandbox.launch.messages import filter_parts
from kernel_sandbox.policy.output import OutputPolicy
from report import Row

CELLS = {
    "stream line": "print('step 42 of 100: loss=0.1234')",
    "pandas table (20x6)": "import pandas as pd, numpy as np\npd.DataFrame(np.arange(120).reshape(20, 6) * 1.5)",
    "matplotlib png": "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot(range(50)); plt.show()",
    "markdown": "from IPython.display import Markdown\nMarkdown('# Title\\nSome **bold** text, `a < b`, a [link](https://jupyter.org).')",
    "html with a handler": "from IPython.display import HTML\nHTML('<b>hi</b><img src=x onerror=alert(1)>')",
    "javascript": "from IPython.display import Javascript\nJavascript('alert(1)')",
    "tqdm (widgets)": "from tqdm.notebook import tqdm\nfor i in tqdm(range(5)): pass",
    "error": "1/0",
}


Parts = list[bytes]


def _parts(header: dict[str, Any], content: dict[str, Any]) -> Parts:
    """A message's header, parent header, metadata and content as the kernel serialized them."""
    return [json.dumps(header, default=str).encode(), b'{"msg_id": "p", "msg_type": "execute_request"}', b"{}", json.dumps(content).encode()]


def capture() -> dict[str, list[tuple[str, Parts]]]:
    """(msg_type, parts) of every iopub message each cell produced, status included."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    out = {}
    try:
        for name, code in CELLS.items():
            msg_id = kc.execute(code)
            messages = []
            while True:
                msg = kc.get_iopub_msg(timeout=60)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                messages.append((msg["header"]["msg_type"], _parts(msg["header"], msg["content"])))
                if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
            out[name] = messages
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return out


def relay_cost(policy: OutputPolicy, msg_type: str, parts: Parts) -> None:
    """What the relay does per message because of the policy."""
    if policy.inspects(msg_type):
        filter_parts(policy, "iopub", msg_type, parts)


def median_us(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(rounds: int) -> dict[str, Any]:
    """Per cell: (iopub messages, µs per message for the policy alone, with JSON); plus the stdout figures."""
    captured = capture()
    cells = {}
    for name, messages in captured.items():
        parsed = [(t, [json.loads(part) for part in parts]) for t, parts in messages]

        def policy_only() -> None:
            policy = OutputPolicy()  # a fresh one: widget comms are opened again each round
            for t, parts in parsed:
                if policy.inspects(t):
                    policy.filter_message("iopub", *parts)

        def with_json() -> None:
            policy = OutputPolicy()
            for t, raw in messages:
                relay_cost(policy, t, raw)

        n = len(messages)
        cells[name] = (n, median_us(policy_only, rounds) / n, median_us(with_json, rounds) / n)

    policy = OutputPolicy()
    header = {"msg_id": "m", "msg_type": "stream", "username": "u", "session": "s", "date": "2026-01-01T00:00:00Z", "version": "5.3"}
    chunk = _parts(header, {"name": "stdout", "text": ("epoch 12 batch 345 loss 0.98765 acc 0.54321\n" * 190)[:8192]})
    count = 50 * 1024 * 1024 // 8192
    start = time.perf_counter()
    for _ in range(count):
        relay_cost(policy, "stream", chunk)
    elapsed = time.perf_counter() - start
    linked = _parts(header, {"name": "stdout", "text": ("see https://example.org/a/b " * 300)[:8192]})
    linked_us = median_us(lambda: relay_cost(policy, "stream", linked), rounds * 10)
    return {"cells": cells, "stdout_count": count, "stdout_seconds": elapsed, "linked_us": linked_us, "rounds": rounds}


def rows(found: dict[str, Any]) -> list[Row]:
    """The policy measure as report rows (for bench/run.py): µs per message, JSON parse/serialize included."""
    out = [
        Row("policy", f"{name} ({n} iopub messages)", "ours", with_json, n=found["rounds"], stat="p50 per message",
            note=f"policy alone {alone:.1f} µs")
        for name, (n, alone, with_json) in found["cells"].items()
    ]
    per = found["stdout_seconds"] / found["stdout_count"] * 1e6
    out.append(Row("policy", "8 KB stream message, plain text (50 MB of stdout)", "ours", per, stat="mean per message",
                   n=found["stdout_count"], note=f"{50 / found['stdout_seconds']:.0f} MB/s"))
    out.append(Row("policy", "8 KB stream message with links (parsed and scanned)", "ours", found["linked_us"],
                   n=found["rounds"] * 10))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    found = measure(args.rounds)
    print("| messages of one cell | iopub messages | policy alone, µs per message | with JSON parse/serialize, µs per message |")
    print("|---|---:|---:|---:|")
    for name, (n, alone, with_json) in found["cells"].items():
        print(f"| {name} | {n} | {alone:.1f} | {with_json:.1f} |")
    count, elapsed = found["stdout_count"], found["stdout_seconds"]
    print(f"\n50 MB of stdout in {count} stream messages of 8 KB: {elapsed * 1e3:.1f} ms in the policy "
          f"({elapsed / count * 1e6:.2f} µs per message, {50 / elapsed:.0f} MB/s)")
    print(f"an 8 KB stream message with links in it (parsed and scanned): {found['linked_us']:.1f} µs")


if __name__ == "__main__":
    main()
