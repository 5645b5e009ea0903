"""The house's layers: the core imports no backend, and no module imports itself back.

Read from the source (``ast``), not by importing it: an import is counted when it runs at
import time, that is at module level (inside ``if``/``try``/``with`` and class bodies too), but
not inside a function (the lazy faces, such as the package root's) and not under
``if TYPE_CHECKING:``. Importing ``a.b.c`` also runs ``a`` and ``a.b``: those count as well.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import kernel_sandbox
from kernel_sandbox import backends
from kernel_sandbox.errors import KernelLaunchError

ROOT = Path(kernel_sandbox.__file__).parent
WINGS = ("kernel_sandbox.docker", "kernel_sandbox.opensandbox")
CORE = (
    "kernel_sandbox.launch",
    "kernel_sandbox.provisioners",
    "kernel_sandbox.execution",
    "kernel_sandbox.kernelside",
    "kernel_sandbox.backends",
    "kernel_sandbox.errors",
    "kernel_sandbox.policy",
    "kernel_sandbox.results",
    "kernel_sandbox.settings",
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ["kernel_sandbox", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _import_time(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that run when the module is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            ):
                yield from _import_time(node.orelse)
            else:
                yield from _import_time(node.body)
                yield from _import_time(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(handler.body for handler in node.handlers), node.orelse, node.finalbody):
                yield from _import_time(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _import_time(node.body)


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)} & set(MODULES)


def _imports(name: str) -> set[str]:
    """The package's modules that importing ``name`` runs directly (but its own packages)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _import_time(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        for target in targets:
            if target in MODULES:
                found |= _with_parents(target)
    return found - _with_parents(name)


GRAPH = {name: _imports(name) for name in MODULES}


def _reachable(start: set[str]) -> set[str]:
    """Every module the modules ``start`` import, directly or not."""
    seen, todo = set(), list(start)
    while todo:
        for imported in GRAPH[todo.pop()] - seen:
            seen.add(imported)
            todo.append(imported)
    return seen


def _closure(name: str) -> set[str]:
    """What importing ``name`` runs: its own packages and itself, and what they import."""
    return _with_parents(name) | _reachable(_with_parents(name))


def _in(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def test_the_graph_is_read() -> None:
    """A check that finds nothing proves nothing: the graph has the arrows known to exist."""
    assert "kernel_sandbox.launch.front" in GRAPH["kernel_sandbox.launch"]
    assert "kernel_sandbox.provisioners.launched" in GRAPH["kernel_sandbox.docker.provisioner"]
    assert "kernel_sandbox.execution.backend" in GRAPH["kernel_sandbox.opensandbox.execution"]
    assert "kernel_sandbox.docker.settings" not in GRAPH["kernel_sandbox.launch.egress"]  # TYPE_CHECKING only


@pytest.mark.parametrize("core", sorted(name for name in MODULES if _in(name, CORE)))
def test_the_core_imports_no_backend(core: str) -> None:
    wings = sorted(name for name in _closure(core) if _in(name, WINGS))
    assert not wings, f"importing {core} imports the backends' {wings}: ask kernel_sandbox.backends instead"


def test_no_module_imports_itself_back() -> None:
    circles = sorted(name for name in MODULES if name in _reachable({name}))
    assert not circles, f"import circles through {circles}"


def test_every_wing_is_registered_and_resolves() -> None:
    registered = {point.name: point.value for point in entry_points(group=backends.GROUP)}
    assert registered == {"docker": "kernel_sandbox.docker:BACKEND", "opensandbox": "kernel_sandbox.opensandbox:BACKEND"}
    provisioners = {point.name: point.load() for point in entry_points(group="jupyter_client.kernel_provisioners")}
    for entry in backends.entries().values():
        assert entry.settings_model().title.startswith("the ")
        assert provisioners[entry.provisioner].settings_model is entry.settings_model()
        assert type(backends.adapter(entry.name)).__module__.startswith(f"kernel_sandbox.{entry.name}.")
        importlib.import_module(entry.link.partition(":")[0])


def test_an_install_without_the_backends_entry_points_fails_closed_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata older than the code (an editable install not reinstalled) registers no wing."""
    monkeypatch.setattr(backends, "entry_points", lambda group: [])
    backends.entries.cache_clear()
    try:
        with pytest.raises(KernelLaunchError, match=r"kernel_sandbox\.backends.*pip install -e \."):
            backends.provisioner_settings("kernel-sandbox-docker", {})
    finally:
        monkeypatch.undo()
        backends.entries.cache_clear()
    assert backends.by_provisioner("kernel-sandbox-docker") is backends.entries()["docker"]
