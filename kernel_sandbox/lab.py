"""From a fresh machine to a sandboxed JupyterLab: ``kernel-sandbox setup`` and ``kernel-sandbox
lab``.

:func:`setup` makes sure of each thing a sandboxed kernel needs (the engine, the image, the
kernelspec, the JupyterLab extension that frames its outputs) and does only what is missing;
:func:`lab` then starts JupyterLab with Sandboxed Python as its default kernel.
:class:`SandboxedKernelSpecManager` is the kernelspec manager of a locked-down server
(``kernel-sandbox lab --locked-down``, or ``jupyter_server_config.py`` for a server you run
yourself).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.provisioning import KernelProvisionerFactory
from jupyter_core.paths import is_hidden, jupyter_config_path, jupyter_data_dir, jupyter_path
from traitlets import default

from .docker.settings import DEFAULT_IMAGE
from .docker.connect import has_image
from .docker.connect import engine_fix
from .doctor import Check, image_fix
from .errors import EngineUnavailable, SetupError
from .kernelspecs import DOCKER_SPEC, install, is_sandboxed

LAB_INSTALL_FIX = "pip install 'kernel-sandbox[lab]'"

Progress = Callable[[str], None]


@dataclass
class SetupResult:
    """What :func:`setup` found and did, one :class:`~kernel_sandbox.doctor.Check` per step."""

    checks: list[Check]
    kernelspec_dir: Path
    image: str


def setup(
    *,
    image: str | None = None,
    prefix: str | None = None,
    user: bool = False,
    install_engine: bool = False,
    progress: Progress = print,
) -> SetupResult:
    """Make sure the engine runs, the kernel image exists, and the Sandboxed Python kernelspec and
    kernel-sandbox-frame are installed.

    Each step that is already done is left alone, so a second call changes nothing. The
    kernelspec goes into ``prefix`` (default ``sys.prefix``), or the user's data directory with
    ``user``; the settings of one installed before are kept. ``image`` defaults to the installed
    kernelspec's image, else ``DEFAULT_IMAGE``. A step that cannot be done raises
    :class:`SetupError` naming the command to run instead.
    """
    prefix = None if user else os.path.abspath(prefix or sys.prefix)
    target = _kernels_dir(prefix) / DOCKER_SPEC
    config = _installed_config(target)
    image = image or config.get("image") or DEFAULT_IMAGE
    if image == DEFAULT_IMAGE:
        config.pop("image", None)
    else:
        config["image"] = image
    checks: list[Check] = []

    def done(check: Check) -> None:
        checks.append(check)
        progress(str(check))

    done(_engine_step(install_engine, progress))
    done(_image_step(image, progress))
    done(_kernelspec_step(target, config, prefix))
    done(_labextension_step(prefix))
    return SetupResult(checks, target, image)


def _fail(check: Check) -> SetupError:
    return SetupError(f"{check.name}: {check.detail}\n  fix: {check.fix}")


def _engine_step(install_engine: bool, progress: Progress) -> Check:
    from .docker.engine import ensure_engine

    try:
        client = ensure_engine(install_engine, lambda text: progress(f"       {text}"))
    except EngineUnavailable as exc:
        raise _fail(Check("docker engine", False, str(exc), engine_fix(exc))) from exc
    return Check(
        "docker engine", True, f"reachable, version {client.version().get('Version', '?')}"
    )


def _image_step(image: str, progress: Progress) -> Check:
    from .docker.connect import docker_client
    from .errors import ImageBuildError
    from .docker.image import build_image

    if has_image(docker_client(), image):
        return Check("kernel image", True, f"{image} is present")
    progress(f"[..] kernel image: {image} is missing; building it (a few minutes the first time)")
    started = time.monotonic()
    try:
        build_image(tag=image, progress=lambda text: progress(f"       {text}"))
    except ImageBuildError as exc:
        # building again is the fix only when the build itself broke off
        raise _fail(Check("kernel image", False, exc.reason, exc.fix or image_fix(image))) from exc
    return Check("kernel image", True, f"{image} built in {time.monotonic() - started:.0f} s")


def _kernels_dir(prefix: str | None) -> Path:
    """Where ``install`` puts kernelspecs: under ``prefix``, or the user's data directory when it is
    None."""
    if prefix is None:
        return Path(KernelSpecManager().user_kernel_dir)
    return Path(prefix) / "share" / "jupyter" / "kernels"


def _tree(path: Path) -> dict[str, bytes]:
    if not path.is_dir():
        return {}
    return {
        str(item.relative_to(path)): item.read_bytes()
        for item in sorted(path.rglob("*"))
        if item.is_file()
    }


def _kernelspec_step(target: Path, config: dict[str, Any], prefix: str | None) -> Check:
    """Install the Sandboxed Python kernelspec at ``target`` unless what is there is what we would
    write."""
    with tempfile.TemporaryDirectory(prefix="kernel-sandbox-spec-") as tmp:
        staged = Path(install(DOCKER_SPEC, prefix=tmp, config=config)).resolve()
        wanted = _tree(staged)
        # the argv names the kernelspec's own directory: the staged copy's, where the target names
        # its own
        wanted["kernel.json"] = wanted["kernel.json"].replace(
            str(staged).encode(), str(target.resolve()).encode()
        )
        if wanted == _tree(target):
            return Check(
                "kernelspec", True, f"{DOCKER_SPEC} is up to date in {target}{_shadowed(target)}"
            )
    try:
        path = Path(install(DOCKER_SPEC, user=prefix is None, prefix=prefix, config=config))
    except OSError as exc:
        raise _fail(
            Check(
                "kernelspec",
                False,
                f"cannot write {target} ({exc.strerror or exc})",
                "use a virtual environment you own (`python -m venv ~/ks && ~/ks/bin/pip install "
                "'kernel-sandbox[lab]'`), or pass --user",
            )
        ) from exc
    return Check("kernelspec", True, f"{DOCKER_SPEC} installed in {path}{_shadowed(path)}")


def _labextension_step(prefix: str | None) -> Check:
    """Put kernel-sandbox-frame where JupyterLab looks (``prefix``'s, else the user's,
    labextensions) unless it is there."""
    name = "kernel-sandbox-frame"
    data = Path(prefix) / "share" / "jupyter" if prefix is not None else Path(jupyter_data_dir())
    target = data / "labextensions" / name
    source = LABEXTENSIONS / name
    if _tree(source) == _tree(target):
        return Check("lab extension", True, f"{name} is up to date in {target}")
    try:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
    except OSError as exc:
        raise _fail(
            Check(
                "lab extension",
                False,
                f"cannot write {target} ({exc.strerror or exc})",
                "use a virtual environment you own, or pass --user (`kernel-sandbox lab` loads it "
                "from the package anyway)",
            )
        ) from exc
    return Check(
        "lab extension",
        True,
        f"{name} (outputs of sandboxed kernels in opaque-origin frames) installed in {target}",
    )


def _shadowed(path: Path) -> str:
    """A note when Jupyter, as configured here, finds another kernelspec of that name before
    ``path``."""
    found = KernelSpecManager().find_kernel_specs().get(path.name)
    if found is None or Path(found).resolve() == path.resolve():
        return ""
    return (
        f"; note: Jupyter finds another {path.name} first, in {found}: it is the one that runs "
        f"(refresh it with `kernel-sandbox install`, or remove it)"
    )


def _installed_config(spec_dir: Path) -> dict[str, Any]:
    try:
        spec = json.loads((spec_dir / "kernel.json").read_text())
        return dict(spec["metadata"]["kernel_provisioner"]["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


class SandboxedKernelSpecManager(KernelSpecManager):
    """Offers and starts only kernel-sandbox kernelspecs, as they were when the server started.

    The kernelspecs are read once, at start. Any other name, including the built-in ``python3``, is
    unknown: it is neither listed nor started, also not through ``POST /api/kernels`` or
    ``/api/sessions`` (jupyter_client's own ``allowed_kernelspecs`` only filters the list). A
    kernelspec the server's contents API could rewrite (inside its root directory and not hidden) is
    refused, so no page can change how a kernel is sandboxed, for this server or the next.
    """

    @default("ensure_native_kernel")
    def _no_native_kernel(self) -> bool:
        return False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.refused: dict[str, str] = {}
        self._specs: dict[str, KernelSpec] = {}
        root = getattr(self.parent, "root_dir", "")
        provisioners = KernelProvisionerFactory.instance(parent=self.parent)
        for name, resource_dir in super().find_kernel_specs().items():
            try:
                spec = self.kernel_spec_class.from_resource_dir(resource_dir)
            except (OSError, ValueError) as exc:
                self.refused[name] = f"unreadable ({exc})"
                continue
            if not is_sandboxed(spec):
                continue
            if not provisioners.is_provisioner_available(spec):
                self.refused[name] = "its provisioner is not installed"
            elif root and _writable_through_contents(resource_dir, root):
                self.refused[name] = (
                    f"it lies in {resource_dir}, inside the server's root directory {root}, where "
                    "pages could rewrite it; install it elsewhere or serve another directory "
                    "(--notebook-dir)"
                )
            else:
                self._specs[name] = spec
        for name, reason in self.refused.items():
            self.log.warning("kernelspec %s is not offered: %s", name, reason)

    def find_kernel_specs(self) -> dict[str, str]:
        """The sandboxed kernelspecs found at start, by name."""
        return {name: spec.resource_dir for name, spec in self._specs.items()}

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        """A copy of the sandboxed kernelspec ``kernel_name`` as read at start; NoSuchKernel for any
        other."""
        spec = self._specs.get(kernel_name.lower())
        if spec is None:
            raise NoSuchKernel(kernel_name)
        return self.kernel_spec_class(
            resource_dir=spec.resource_dir, **copy.deepcopy(spec.to_dict())
        )

    def get_all_specs(self) -> dict[str, Any]:
        """The sandboxed kernelspecs as read at start, in ``KernelSpecManager.get_all_specs``'s
        form."""
        return {
            name: {"resource_dir": spec.resource_dir, "spec": spec.to_dict()}
            for name, spec in self._specs.items()
        }


def default_kernel_for_new_notebooks(
    model: dict[str, Any], path: str, contents_manager: Any, **kwargs: Any
) -> None:
    """A contents pre-save hook: a new, empty notebook gets the server's default kernel in its
    metadata.

    JupyterLab's *File → New → Notebook* creates the file through the contents API and then
    starts the kernel its metadata names; with none named it asks, preselecting the first kernel
    in alphabetical order rather than the server's default. Register it with
    ``contents_manager.register_pre_save_hook`` (``kernel-sandbox lab`` does) or
    ``c.ContentsManager.pre_save_hook = "kernel_sandbox.lab.default_kernel_for_new_notebooks"``.
    """
    content = model.get("content")
    if model.get("type") != "notebook" or not isinstance(content, dict) or content.get("cells"):
        return
    metadata = content.setdefault("metadata", {})
    if "kernelspec" in metadata:
        return
    server = contents_manager.parent
    name = server.kernel_manager.default_kernel_name
    try:
        spec = server.kernel_spec_manager.get_kernel_spec(name)
    except NoSuchKernel:
        return
    metadata["kernelspec"] = {
        "name": name,
        "display_name": spec.display_name,
        "language": spec.language,
    }


def exposed_paths(root: str) -> list[str]:
    """The server's Python environment and Jupyter data and config directories the contents API
    could change.

    That is, those inside ``root`` and not hidden: a page that can write there can change the
    server's code, its extensions (script in every page), its configuration or its kernelspecs.
    """
    candidates = [sys.prefix, *jupyter_path(), *jupyter_config_path()]
    return sorted(
        {
            path
            for path in candidates
            if os.path.exists(path) and _writable_through_contents(path, root)
        }
    )


def _writable_through_contents(path: str, root: str) -> bool:
    real_path, real_root = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real_path, real_root]) != real_root:
        return False
    return not is_hidden(real_path, real_root)


LOCKED_DOWN: dict[str, Any] = {
    "ServerApp.terminals_enabled": False,
    "ServerApp.kernel_spec_manager_class": f"{__name__}.SandboxedKernelSpecManager",
    "ServerApp.allow_external_kernels": False,
    "ServerApp.disable_check_xsrf": False,
    "ServerApp.allow_origin": "",
    "ServerApp.allow_origin_pat": "",
    "ContentsManager.allow_hidden": False,
    # no page enables, disables or installs an extension (kernel-sandbox-frame stays on)
    "LabApp.extension_manager": "kernel-sandbox-locked",
    "LabApp.lock_all_plugins": True,
    "ServerApp.jpserver_extensions": {"jupyter_lsp": False},
}
"""The settings of ``kernel-sandbox lab --locked-down``, checked on the running server before it
serves."""


REATTACH = {
    "ServerApp.kernel_manager_class": (
        "kernel_sandbox.server.ReattachingKernelManager",
        ("--ServerApp.kernel_manager_class",),
    ),
    "ServerApp.session_manager_class": (
        "kernel_sandbox.server.ReattachingSessionManager",
        ("--ServerApp.session_manager_class",),
    ),
}
"""Sandboxed kernels and notebook sessions that outlive the server
(:mod:`kernel_sandbox.server`)."""


DEFAULTS = {
    "ServerApp.ip": ("127.0.0.1", ("--ip", "--ServerApp.ip", "--NotebookApp.ip")),
    "IdentityProvider.token": (
        None,
        ("--IdentityProvider.token", "--ServerApp.token", "--NotebookApp.token"),
    ),
    "MappingKernelManager.default_kernel_name": (
        DOCKER_SPEC,
        ("--MappingKernelManager.default_kernel_name",),
    ),
    **REATTACH,
}
"""What ``kernel-sandbox lab`` sets unless its command line already does (name: value, the options
that set it). A token of ``None`` is made fresh for every start."""


LABEXTENSIONS = Path(__file__).parent / "labextensions"
"""Where the prebuilt JupyterLab extension kernel-sandbox-frame lies in the package (the wheel also
puts it in share/jupyter/labextensions, where plain ``jupyter lab`` finds it)."""

CONTENTS_MANAGER = (
    "kernel_sandbox.contents.RootConfinedFileManager",
    ("--ServerApp.contents_manager_class",),
)
"""The contents manager ``kernel-sandbox lab`` sets unless its command line names another, and the
options that do."""


def confinement_arguments(extra: Sequence[str]) -> list[str]:
    """The frame extension on JupyterLab's labextensions path and, unless ``extra`` names one, the
    root-confined contents manager.

    Sandboxed kernels' outputs then render in opaque-origin frames (kernel-sandbox-frame), and no
    symlink planted in the served folder makes the server hand out a file outside it.
    """
    arguments = [f"--LabApp.extra_labextensions_path={LABEXTENSIONS}"]
    manager, options = CONTENTS_MANAGER
    if not _sets(extra, options):
        arguments.append(f"--ServerApp.contents_manager_class={manager}")
    return arguments


STATUS_BAR = "kernel_sandbox.statusbar"
"""The server extension that counts the sandboxed kernels' containers in JupyterLab's status-bar
memory (:mod:`kernel_sandbox.statusbar`)."""


def status_bar_arguments(extra: Sequence[str]) -> list[str]:
    """The status-bar extension, enabled when jupyter-resource-usage (whose figure it corrects) is
    installed, unless ``extra`` enables or disables it."""
    option = f"--ServerApp.jpserver_extensions={STATUS_BAR}"
    if importlib.util.find_spec("jupyter_resource_usage") is None or _sets(extra, (option,)):
        return []
    return [f"{option}=True"]


def lab_arguments(extra: Sequence[str], locked_down: bool) -> list[str]:
    """JupyterLab's command line: our defaults (unless ``extra`` sets them), ``extra``, then the
    locked-down settings.

    Raises SetupError when ``extra`` sets something ``--locked-down`` decides.
    """
    arguments = []
    for name, (value, options) in DEFAULTS.items():
        if not _sets(extra, options):
            arguments.append(f"--{name}={secrets.token_hex(24) if value is None else value}")
    arguments += confinement_arguments(extra)
    arguments += status_bar_arguments(extra)
    arguments += extra
    if locked_down:
        for name, value in LOCKED_DOWN.items():
            if _sets(extra, (f"--{name}",)):
                raise SetupError(
                    f"--locked-down decides {name}; leave --{name} out of the arguments"
                )
            items = (
                [f"{key}={item}" for key, item in value.items()]
                if isinstance(value, dict)
                else [value]
            )
            arguments += [f"--{name}={item}" for item in items]
    return arguments


def _sets(arguments: Sequence[str], options: Sequence[str]) -> bool:
    return any(
        arg == option or arg.startswith(option + "=") for arg in arguments for option in options
    )


def lab(extra: Sequence[str], *, locked_down: bool = False, **setup_options: Any) -> int:
    """Set up as :func:`setup` does, then run JupyterLab in this process, print its URL, and serve
    until stopped.

    ``extra`` are JupyterLab's own arguments. The data directory of the kernelspec :func:`setup`
    installed goes first on ``JUPYTER_PATH``, so that kernelspec is the one the server runs,
    whatever else is installed under its name.
    """
    try:
        from jupyterlab.labapp import LabApp
    except ImportError as exc:
        raise SetupError(
            f"JupyterLab is not installed in {sys.prefix}.\n  fix: {LAB_INSTALL_FIX}"
        ) from exc
    arguments = lab_arguments(extra, locked_down)
    if locked_down:
        from .lab_manager import register

        register()
    result = setup(**setup_options)
    data_dir = str(result.kernelspec_dir.parents[1])
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        filter(None, [data_dir, os.environ.get("JUPYTER_PATH")])
    )
    server = LabApp.initialize_server(argv=arguments)
    if os.geteuid() == 0 and not server.allow_root:
        raise SetupError(
            "JupyterLab does not run as root without --allow-root. The kernels still run as an "
            "unprivileged user in their containers, but the server, and whatever a page does "
            "through it, would act as root.\n  fix: run `kernel-sandbox lab` as a user in the "
            "docker group, or add --allow-root"
        )
    differing = _not_locked_down(server) if locked_down else []
    if differing:
        raise SetupError(
            f"--locked-down could not take effect: the server has {', '.join(differing)} (set by a "
            "Jupyter config file, perhaps for a subclass such as FileContentsManager).\n  fix: "
            "remove those settings"
        )
    exposed = exposed_paths(server.root_dir) if locked_down else []
    if exposed:
        raise SetupError(
            f"--locked-down will not serve {server.root_dir}: it contains {', '.join(exposed)}, "
            "the server's own Python environment or Jupyter directories, which pages could change "
            "through the contents API.\n  fix: serve a directory without them (--notebook-dir), "
            "or keep the environment in a hidden folder (.venv)"
        )
    server.contents_manager.register_pre_save_hook(default_kernel_for_new_notebooks)
    server.io_loop.add_callback(_announce, server, locked_down)
    server.start()
    return 0


def _not_locked_down(server: Any) -> list[str]:
    """The LOCKED_DOWN settings the running server does not have, as ``name=value`` of what it has
    instead."""
    from jupyterlab.labapp import LabApp

    owners = {
        "ServerApp": server,
        "ContentsManager": server.contents_manager,
        "LabApp": server.extension_manager.extension_points[LabApp.name].app,
    }
    differing = []
    for name, wanted in LOCKED_DOWN.items():
        owner, trait = name.split(".")
        actual = getattr(owners[owner], trait)
        if name == "ServerApp.kernel_spec_manager_class":
            actual, wanted = type(server.kernel_spec_manager), SandboxedKernelSpecManager
        elif name == "ServerApp.jpserver_extensions":
            actual = {
                key: bool(server.extension_manager.linked_extensions.get(key)) for key in wanted
            }
        if actual != wanted:
            differing.append(f"{name}={actual!r}")
    return differing


def _announce(server: Any, locked_down: bool) -> None:
    token = server.identity_provider.token
    host = "127.0.0.1" if server.ip in ("", "0.0.0.0", "::", "localhost") else server.ip
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{server.port}{server.base_url}lab" + (f"?token={token}" if token else "")
    specs = server.kernel_spec_manager.find_kernel_specs()
    lines = [
        "",
        f"JupyterLab is running, with {server.kernel_manager.default_kernel_name} as the default "
        "kernel:",
        f"    {url}",
    ]
    if locked_down:
        lines.append(
            f"Locked down: no terminals; kernels offered: {', '.join(sorted(specs)) or 'none'}."
        )
        for name, reason in getattr(server.kernel_spec_manager, "refused", {}).items():
            lines.append(f"    not offered: {name}: {reason}")
    if not token:
        lines.append(
            "Warning: the server has no token; anyone who can reach the port can run code through "
            "it."
        )
    lines.append("Stop it with Control-C.")
    print("\n".join(lines), flush=True)
