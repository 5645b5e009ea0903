"""Run notebooks and code in the sandbox: the engine behind ``kernel-sandbox run`` and ``exec``.

Notebooks run through nbclient on a sandboxed kernel (``sandboxed-python`` by default). When
that kernelspec is not installed, the spec shipped with kernel-sandbox is used directly, so
``kernel-sandbox run`` works before ``kernel-sandbox install``.
"""

from __future__ import annotations

import ast
import asyncio
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from .controls import SafeWriter
from .errors import ConfigError
from .kernelspecs import DOCKER_SPEC, kernel_manager, started_client
from .results import Execution, ExecutionError, OutputFold, TimedOut

PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (IPython colours its tracebacks)."""
    return _ANSI.sub("", text)


# --------------------------------------------------------------------------- parameters


def parse_parameter(text: str) -> tuple[str, Any]:
    """Parse ``name=value``; the value is a Python literal when it parses as one, else a string."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise ConfigError(
            f"Parameter {text!r} must look like NAME=VALUE with NAME a Python identifier"
        )
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = raw
    return name, value


def inject_parameters(nb: nbformat.NotebookNode, parameters: Mapping[str, Any]) -> None:
    """Insert a cell assigning ``parameters``, the way papermill does.

    The new cell (tagged ``injected-parameters``) goes right after the cell tagged
    ``parameters``, or first when there is none; an earlier injected cell is replaced.
    """
    if not parameters:
        return
    lines = ["# Parameters"] + [f"{name} = {value!r}" for name, value in parameters.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines) + "\n", metadata={"tags": [INJECTED_TAG]})
    cells = [c for c in nb.cells if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    tagged = [
        i for i, c in enumerate(cells) if PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])
    ]
    where = tagged[0] + 1 if tagged else 0
    cells.insert(where, cell)
    nb.cells = cells


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """Read the notebook at ``path`` (ConfigError naming the file when it is not a notebook)."""
    try:
        return nbformat.read(str(path), as_version=4)
    # nbformat's errors for a file that is not a notebook
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{path} is not a Jupyter notebook: {exc}") from exc


def tagged_source(notebook: str | Path | nbformat.NotebookNode, tag: str) -> str:
    """The source of the code cells tagged ``tag``, joined: ship a tool or skill prototyped in a
    notebook."""
    nb = notebook if isinstance(notebook, nbformat.NotebookNode) else read_notebook(notebook)
    parts = [
        c.source
        for c in nb.cells
        if c.cell_type == "code" and tag in c.get("metadata", {}).get("tags", [])
    ]
    if not parts:
        raise ConfigError(f"No code cell is tagged {tag!r}")
    return "\n\n".join(parts) + "\n"


# --------------------------------------------------------------------------- progress


class Progress:
    """A progress bar over code cells on stderr (tqdm when installed, else a plain line)."""

    def __init__(
        self, total: int, label: str, stream: IO[str] | None = None, enabled: bool = True
    ) -> None:
        self.total, self.done, self.label = total, 0, label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._tqdm = None
        self._tty = False
        if enabled:
            try:
                from tqdm import tqdm  # optional

                self._tqdm = tqdm(total=total, desc=label, unit="cell", file=self.stream)
            except ImportError:
                self._tty = self.stream.isatty()
                self._draw()

    def _draw(self, final: bool = False) -> None:
        width = 30
        filled = width * self.done // max(self.total, 1)
        line = (
            f"{self.label}: [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} cells"
        )
        if self._tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        elif final or self.done == 0:
            self.stream.write(line + "\n")
        self.stream.flush()

    def step(self) -> None:
        if not self.enabled:
            return
        self.done += 1
        if self._tqdm is not None:
            self._tqdm.update(1)
        elif self._tty:
            self._draw()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self._draw(final=True)


# --------------------------------------------------------------------------- notebooks


@dataclass
class NotebookRun:
    """The outcome of :func:`run_notebook`."""

    notebook: nbformat.NotebookNode = field(repr=False)
    output_path: Path | None
    error: ExecutionError | None = None
    """Why the notebook stopped, if it did."""
    failed_cell: int = -1
    """The index of the cell that failed (-1 when no cell's output holds the error)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def report(self, colour: bool = False) -> str:
        """The failing cell's source and its traceback, as shown by ``kernel-sandbox run``."""
        if self.error is None:
            return ""
        source = self.notebook.cells[self.failed_cell].source if self.failed_cell >= 0 else ""
        tb = self.error.traceback or str(self.error)
        text = (
            f"Cell {self.failed_cell} failed:\n"
            + "-" * 60
            + f"\n{source}\n"
            + "-" * 60
            + f"\n{tb}\n"
        )
        return text if colour else strip_ansi(text)


def default_output_path(path: Path) -> Path:
    """``analysis.ipynb`` → ``analysis.out.ipynb`` next to it."""
    return path.with_name(
        path.name[: -len(".ipynb")] + ".out.ipynb"
        if path.name.endswith(".ipynb")
        else path.name + ".out.ipynb"
    )


def _failure(
    nb: nbformat.NotebookNode, exc: BaseException, cell_index: int | None
) -> tuple[int, ExecutionError]:
    """The failed cell's index and its error: ``cell_index`` is the last cell nbclient reported an
    error for (earlier ones were allowed: tagged ``raises-exception``); -1 and an error made of
    ``exc`` when that cell's output holds none (a timeout, a dead kernel)."""
    if cell_index is not None:
        for output in nb.cells[cell_index].get("outputs", []):
            if output.get("output_type") == "error":
                return cell_index, ExecutionError(
                    output.ename, output.evalue, "\n".join(output.traceback)
                )
    if isinstance(exc, CellTimeoutError | DeadKernelError):
        return -1, ExecutionError(type(exc).__name__, str(exc), str(exc))
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    return -1, ExecutionError(ename, evalue, strip_ansi(str(exc)))


async def async_run_notebook(
    path: str | Path,
    output: str | Path | None = None,
    *,
    kernel_name: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    startup_timeout: float = 120,
    progress: bool = True,
    cwd: str | Path | None = None,
    standby: int | None = None,
) -> NotebookRun:
    """Execute a notebook on a sandboxed kernel and write the executed copy.

    ``output`` defaults to ``NAME.out.ipynb`` next to the input (pass the input path to update it
    in place). ``kernel_name`` defaults to ``sandboxed-python``, not the kernel named in the
    notebook's metadata, so that a notebook made with a local kernel still runs in the sandbox.
    The executed notebook is written even when a cell fails, with the error in that cell; a cell
    tagged ``raises-exception`` may fail and the run goes on (as nbclient and nbval allow).
    ``standby`` overrides the provisioner's option (``kernel-sandbox run`` passes 0).
    """
    path = Path(path)
    nb = read_notebook(path)
    name = kernel_name or DOCKER_SPEC
    inject_parameters(nb, dict(parameters or {}))
    for cell in nb.cells:  # no stale outputs below a failing cell
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    total = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.strip())
    bar = Progress(total, path.name, enabled=progress)

    def on_cell_executed(cell: Any, **_: Any) -> None:
        if cell.source.strip():
            bar.step()

    erred: list[int] = []  # cells whose error nbclient saw, allowed or not

    def on_cell_error(cell_index: int, **_: Any) -> None:
        erred.append(cell_index)

    km = kernel_manager(name, standby=standby)
    client = NotebookClient(
        nb,
        km=km,
        kernel_name=name,
        timeout=timeout,
        startup_timeout=int(startup_timeout),
        resources={"metadata": {"path": str(Path(cwd or path.parent).resolve())}},
        on_cell_executed=on_cell_executed,
        on_cell_error=on_cell_error,
    )
    failed_cell, error = -1, None
    try:
        await client.async_execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        failed_cell, error = _failure(nb, exc, erred[-1] if erred else None)
    finally:
        bar.close()
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
    spec = km.kernel_spec
    assert spec is not None  # the kernel started from it
    nb.metadata["kernelspec"] = {
        "name": name,
        "display_name": spec.display_name,
        "language": spec.language,
    }
    out = Path(output) if output is not None else default_output_path(path)
    nbformat.write(nb, str(out))
    return NotebookRun(nb, out, error, failed_cell)


def run_notebook(path: str | Path, output: str | Path | None = None, **kwargs: Any) -> NotebookRun:
    """Synchronous :func:`async_run_notebook`."""
    return asyncio.run(async_run_notebook(path, output, **kwargs))


# --------------------------------------------------------------------------- exec


def _text_of(data: Mapping[str, Any]) -> str | None:
    if "text/plain" in data:
        return str(data["text/plain"])
    for mime in data:
        if mime.startswith("image/"):
            return f"<{mime} output not shown>"
    return None


async def async_exec_code(
    code: str,
    *,
    kernel_name: str | None = None,
    timeout: float | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    colour: bool = False,
    startup_timeout: float = 120,
    standby: int | None = None,
) -> Execution:
    """Run ``code`` in a throwaway sandboxed kernel, streaming its output as it comes.

    Stdout and results (their ``text/plain``) go to ``stdout``; stderr and the traceback of an
    error go to ``stderr``. A stream that is a terminal gets the text with its control
    characters escaped (:class:`~kernel_sandbox.controls.SafeWriter`: the kernel cannot clear
    the screen or write the clipboard); a file or pipe gets it unchanged, as ``Execution`` does.
    The returned ``Execution`` is folded as the execution API's is (``text`` is the last
    expression's value). On ``timeout`` the kernel is interrupted and the result's error is a
    ``TimeoutError`` (:class:`~kernel_sandbox.results.TimedOut`). The kernel (and its container)
    is shut down in every case. ``standby`` overrides the provisioner's option (``kernel-sandbox
    exec`` passes 0).
    """
    out_stream = SafeWriter(stdout or sys.stdout)
    err_stream = SafeWriter(stderr or sys.stderr, keep_colour=colour)
    fold = OutputFold()

    def hook(msg: dict[str, Any]) -> None:
        content = msg["content"]
        kept = fold.message(msg["msg_type"], content) if isinstance(content, dict) else None
        if kept is None:
            return
        what, value = kept
        if what == "result":
            text = _text_of(value)
            if text is not None:
                out_stream.write(text + "\n")
        elif what == "error":
            tb = value.traceback or str(value)
            err_stream.write((tb if colour else strip_ansi(tb)) + "\n")
        else:
            (err_stream if what == "stderr" else out_stream).write(value)

    km = kernel_manager(kernel_name or DOCKER_SPEC, standby=standby)
    async with started_client(km, timeout=startup_timeout) as kc:
        try:
            await kc.execute_interactive(code, timeout=timeout, output_hook=hook, allow_stdin=False)
        except TimeoutError:
            await km.interrupt_kernel()
            message = f"the code did not finish within {timeout:g} s and was interrupted"
            fold.error(TimedOut(message))
            err_stream.write(f"kernel-sandbox: {message}\n")
    fold.finish()
    return fold.execution


def exec_code(code: str, **kwargs: Any) -> Execution:
    """Synchronous :func:`async_exec_code`."""
    return asyncio.run(async_exec_code(code, **kwargs))
