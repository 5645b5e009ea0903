"""Browser memory for 200 small HTML outputs: drawn in the page (a local kernel's) vs in kernel-sandbox-frame's frames.

Run: ``python bench/bench_frames.py [--outputs N]``. JupyterLab (with the frame extension, as the tests start it)
serves two notebooks of ``N`` cells, each cell with one small saved HTML output: in the first the outputs carry no
mark and the notebook's kernel is a plain local one, so JupyterLab draws them in the page (the floor); in the second
each output carries the policy's mark (``metadata.kernel_sandbox.framed``), so each output area gets its frame
(ours), exactly as a sandboxed kernel's outputs do. Each notebook opens in a fresh headless Chromium, is scrolled
to its end and back (JupyterLab renders the cells in view), and the memory of all Chromium processes (the sum of
their unique set sizes) is read once it settles. Nothing asserts on memory: the goal (at most 3x the floor) is
judged in the report.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
import psutil
from ipykernel.kernelspec import get_kernel_dict

from report import Measure, Row, judge, markdown

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.lab import chromium, jupyterlab, wait_for_kernel  # noqa: E402

OUTPUTS = 200
MIB = 1024 * 1024
MEASURES = [
    Measure("frames_memory", "Browser memory with many small HTML outputs open (200; 50 in a quick run)", "MiB",
            "Sum of the unique set sizes of all Chromium processes once the notebook has rendered (scrolled to its "
            "end and back): a local kernel's outputs drawn in the page (floor) vs the same outputs framed, one frame "
            "per output area (ours). bench_frames.py."),
]


def _notebook(path: Path, outputs: int, marked: bool) -> None:
    """A notebook on the local kernel with ``outputs`` cells, each with one small saved HTML output."""
    metadata = {"kernel_sandbox": {"framed": True}} if marked else {}
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "bench-local", "display_name": "bench local", "language": "python"}})
    notebook.cells = [
        nbformat.v4.new_code_cell(f"HTML('<b>{i}</b>')", execution_count=i + 1, outputs=[
            nbformat.v4.new_output("display_data", data={"text/html": f"<b>output {i}</b> <i>small</i>", "text/plain": str(i)},
                                   metadata=metadata)])
        for i in range(outputs)
    ]
    nbformat.write(notebook, str(path))


def _chromium_uss() -> int:
    """The unique set sizes of this process's Chromium descendants, summed."""
    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name().lower():
                total += child.memory_full_info().uss
        except psutil.Error:
            continue
    return total


def _settled_memory(page: Any) -> int:
    """Chromium's memory once two readings a second apart differ by less than 2 MiB (at most 20 s)."""
    last = _chromium_uss()
    for _ in range(20):
        page.wait_for_timeout(1000)
        now = _chromium_uss()
        if abs(now - last) < 2 * MIB:
            return now
        last = now
    return last


def _open(lab: Any, name: str, frames: int) -> tuple[int, int]:
    """Open notebook ``name`` in a fresh Chromium, wait for its outputs (``frames`` frames); return Chromium's memory
    and how many output frames the page holds (JupyterLab may leave the cells out of view unrendered)."""
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(120_000)
        page.goto(f"{lab.url}/lab/workspaces/{name}/tree/{name}.ipynb?reset&token={lab.token}")
        panel = page.locator(".jp-NotebookPanel:visible")
        wait_for_kernel(page, panel)
        panel.locator(".jp-Cell").first.click()
        for key in ("ControlOrMeta+End", "ControlOrMeta+Home"):
            page.keyboard.press("Escape")
            page.keyboard.press(key)
            page.wait_for_timeout(2000)
        if frames:
            page.wait_for_function("n => document.querySelectorAll('iframe.kernel-sandbox-frame').length >= n", arg=min(frames, 10))
        return _settled_memory(page), page.evaluate("document.querySelectorAll('iframe.kernel-sandbox-frame').length")


def rows(outputs: int = OUTPUTS) -> list[Row]:
    """Chromium's memory with ``outputs`` small outputs drawn in the page, and framed."""
    base = Path(tempfile.mkdtemp(prefix="bench-frames-"))
    spec = base / "prefix" / "share" / "jupyter" / "kernels" / "bench-local"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({**get_kernel_dict(), "display_name": "bench local"}))
    with jupyterlab(base, base / "prefix" / "share" / "jupyter", "bench-frames.log") as lab:
        _notebook(lab.root_dir / "page.ipynb", outputs, marked=False)
        _notebook(lab.root_dir / "framed.ipynb", outputs, marked=True)
        floor, _ = _open(lab, "page", 0)
        ours, frames = _open(lab, "framed", outputs)
    measure = "frames_memory"
    return judge([
        Row(measure, f"{outputs} outputs drawn in the page (local kernel)", "floor", floor / MIB, stat="settled", n=1),
        Row(measure, f"{outputs} outputs, one frame per output area", "ours", ours / MIB, stat="settled", n=1,
            reference=f"{outputs} outputs drawn in the page (local kernel)", goal_ratio=3.0, goal="≤ 3× the floor",
            note=f"{frames} frames in the page once scrolled"),
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=OUTPUTS)
    args = parser.parse_args()
    started = time.monotonic()
    print(markdown(MEASURES, rows(args.outputs)))
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
