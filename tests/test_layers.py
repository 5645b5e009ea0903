"""The house's layers: the core imports no wing, no wing imports a face, no module imports itself
back, and none is over 600 lines.

Read from the source (``ast``), not by importing it, and every import counts: at module level,
inside functions (the lazy faces), under ``if TYPE_CHECKING:`` (a type a module names is a module
it depends on), and ``importlib.import_module("...")`` with a literal name. Importing ``a.b.c``
also runs ``a`` and ``a.b``: those count as well.

The layers: the **wings** (the backends, :data:`WINGS`) are found by the core through the
registry only; the **faces** (:data:`FACES`: the command line, the Jupyter server's extensions,
the MCP server, the integrations, the notebook runner) may import anything; every other module is
the **core**, which imports no wing and no face.
"""

from __future__ import annotations

import ast
import importlib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import kernel_sandbox
from kernel_sandbox import backends
from kernel_sandbox.errors import KernelLaunchError
from kernel_sandbox.execution.adapters import adapter

ROOT = Path(kernel_sandbox.__file__).parent
WINGS = ("kernel_sandbox.docker", "kernel_sandbox.opensandbox")
FACES = (
    "kernel_sandbox.cli",
    "kernel_sandbox.doctor",
    "kernel_sandbox.top",
    "kernel_sandbox.lab",
    "kernel_sandbox.lab_manager",
    "kernel_sandbox.server",
    "kernel_sandbox.statusbar",
    "kernel_sandbox.contents",
    "kernel_sandbox.mcpserver",
    "kernel_sandbox.notebooks",
    "kernel_sandbox.integrations",
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


def _in(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def _layer(name: str) -> str:
    return "wing" if _in(name, WINGS) else "face" if _in(name, FACES) else "core"


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)} & set(MODULES)


def _targets(node: ast.AST, package: str) -> list[str]:
    """The module names an AST node imports: an import statement, or a literal import_module()."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        return [module, *(f"{module}.{alias.name}" for alias in node.names)]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        if name == "import_module" and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def _imports(name: str) -> set[str]:
    """The package's modules ``name`` imports anywhere in its source (but its own packages)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        for target in _targets(node, package):
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
    """What importing ``name`` may run: its own packages and itself, and what they import."""
    return _with_parents(name) | _reachable(_with_parents(name))


def test_the_graph_is_read() -> None:
    """A check that finds nothing proves nothing: the graph has the arrows known to exist, of
    every form."""
    assert "kernel_sandbox.launch.front" in GRAPH["kernel_sandbox.launch.launcher"]  # module level
    assert "kernel_sandbox.provisioners.launched" in GRAPH["kernel_sandbox.docker.provisioner"]
    assert "kernel_sandbox.hostsecrets" in GRAPH["kernel_sandbox.settings"]  # in a function
    assert "kernel_sandbox.launch.request" in GRAPH["kernel_sandbox.docker.channels"]  # TYPE_CHECKING
    assert "kernel_sandbox.execution" in GRAPH["kernel_sandbox"]  # the package root's lazy face
    call = ast.parse('importlib.import_module("kernel_sandbox.docker")').body[0]
    assert _targets(call.value, "kernel_sandbox") == ["kernel_sandbox.docker"]  # type: ignore[attr-defined]
    assert {_layer(name) for name in MODULES} == {"core", "wing", "face"}


@pytest.mark.parametrize("core", sorted(name for name in MODULES if _layer(name) == "core"))
def test_the_core_imports_no_wing_and_no_face(core: str) -> None:
    above = sorted(name for name in _closure(core) if _layer(name) != "core")
    assert not above, (
        f"importing {core} may import {above}: the core asks kernel_sandbox.backends for a wing, "
        "and no face"
    )


@pytest.mark.parametrize("wing", sorted(name for name in MODULES if _layer(name) == "wing"))
def test_no_wing_imports_a_face_or_another_wing(wing: str) -> None:
    own = next(prefix for prefix in WINGS if _in(wing, (prefix,)))
    others = sorted(
        name for name in _closure(wing) if _layer(name) == "face" or (_layer(name) == "wing" and not _in(name, (own,)))
    )
    assert not others, f"importing {wing} may import {others}: a wing builds on the core only"


def test_no_module_imports_itself_back() -> None:
    circles = sorted(name for name in MODULES if name in _reachable({name}))
    assert not circles, f"import circles through {circles}"


MAX_LINES = 600
"""A module holds one idea: past this many lines it holds several (issue 38)."""


def test_no_module_is_over_the_line_limit() -> None:
    long = {str(path.relative_to(ROOT)): n for path in ROOT.rglob("*.py") if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along their ideas): {long}"


def test_every_wing_is_registered_and_resolves() -> None:
    registered = {point.name: point.value for point in entry_points(group=backends.GROUP)}
    assert registered == {"docker": "kernel_sandbox.docker:BACKEND", "opensandbox": "kernel_sandbox.opensandbox:BACKEND"}
    provisioners = {point.name: point.load() for point in entry_points(group="jupyter_client.kernel_provisioners")}
    for entry in backends.entries().values():
        assert entry.settings_model().title.startswith("the ")
        assert provisioners[entry.provisioner].settings_model is entry.settings_model()
        assert type(adapter(entry.name)).__module__.startswith(f"kernel_sandbox.{entry.name}.")
        importlib.import_module(entry.link.partition(":")[0])


def test_an_install_without_the_backends_entry_points_fails_closed_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata older than the code (an editable install not reinstalled) registers no wing."""
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [])
    backends.entries.cache_clear()
    try:
        with pytest.raises(KernelLaunchError, match=r"kernel_sandbox\.backends.*pip install -e \."):
            backends.provisioner_settings("kernel-sandbox-docker", {})
    finally:
        monkeypatch.undo()
        backends.entries.cache_clear()
    assert backends.by_provisioner("kernel-sandbox-docker") is backends.entries()["docker"]


def test_the_lab_extension_learns_a_backend_from_the_kernelspec_not_from_a_list_of_its_own(tmp_path: Path) -> None:
    """Backend identity has one home, the registry: `install` writes it into the kernelspec's metadata,
    where the lab extension reads which kernels' outputs it frames and which have the magics."""
    import json

    from kernel_sandbox.kernelspecs import IDENTITY_KEY, install, shipped_kernelspecs

    for name in shipped_kernelspecs():
        spec = json.loads((Path(install(name, prefix=str(tmp_path))) / "kernel.json").read_text())
        entry = backends.by_provisioner(spec["metadata"]["kernel_provisioner"]["provisioner_name"])
        assert entry is not None and spec["metadata"][IDENTITY_KEY] == {"backend": entry.name, "magics": entry.magics}
    assert backends.entries()["docker"].magics and not backends.entries()["opensandbox"].magics
    source = "".join(path.read_text() for path in (ROOT.parent / "labextension" / "src").glob("*.js"))
    named = [entry.provisioner for entry in backends.entries().values() if entry.provisioner in source]
    assert not named, f"the lab extension names provisioners itself: {named}"
    assert "metadata.kernel_sandbox" in source
