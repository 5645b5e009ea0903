"""``mount_cwd`` under a Jupyter server mounts only a folder the server serves (no engine needed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.docker.provisioner import check_served_cwd


def server(root: Path, allow_hidden: bool = False) -> SimpleNamespace:
    """What the provisioner sees of jupyter_server: its MappingKernelManager (root_dir) under the ServerApp."""
    app = SimpleNamespace(contents_manager=SimpleNamespace(allow_hidden=allow_hidden))
    return SimpleNamespace(root_dir=str(root), parent=app)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for folder in ("root/notebooks", "root/.hidden", "outside"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "root" / "link-out").symlink_to(tmp_path / "outside")
    (tmp_path / "root" / ".link-in").symlink_to(tmp_path / "root" / "notebooks")
    return tmp_path


@pytest.mark.parametrize("cwd", ["root", "root/notebooks"])
def test_a_visible_folder_in_the_root_is_mounted(tree: Path, cwd: str) -> None:
    check_served_cwd("ro", str(tree / cwd), server(tree / "root"))


@pytest.mark.parametrize("cwd, says", [
    ("outside", "is outside the Jupyter server's root"),
    ("root/../outside", "is outside the Jupyter server's root"),
    ("root/link-out", "is outside the Jupyter server's root"),  # a symlink is followed
    ("root/.hidden", "is hidden"),
    ("root/.link-in", "is hidden"),  # hidden by its name, visible where it points
])
def test_a_folder_the_server_does_not_serve_is_refused_naming_the_option(tree: Path, cwd: str, says: str) -> None:
    with pytest.raises(ConfigError, match=rf"^mount_cwd='rw': .* {says}.* set mount_cwd to 'off'"):
        check_served_cwd("rw", str(tree / cwd), server(tree / "root"))


def test_a_hidden_folder_is_mounted_when_the_server_serves_hidden_files(tree: Path) -> None:
    check_served_cwd("ro", str(tree / "root" / ".hidden"), server(tree / "root", allow_hidden=True))


def test_without_a_server_the_callers_folder_is_mounted(tree: Path) -> None:
    """nbclient or a program passes its own cwd: there is no page choosing it."""
    check_served_cwd("ro", str(tree / "outside"), SimpleNamespace())
    check_served_cwd("ro", str(tree / "outside"), None)
