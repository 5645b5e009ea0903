"""Symlinks planted in the served folder (as a kernel with ``mount_cwd: rw`` can) against RootConfinedFileManager.

The server's routes are attacked in a real JupyterLab by tests/attacks/test_frame_browser.py; here
the manager itself, for the links a kernel swaps in between the manager's check of a path and its
use (a race the kernel can run in a loop): every read, write, copy, checkpoint and upload chunk.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from tornado.web import HTTPError

from kernel_sandbox.contents import RootConfinedFileManager

SECRET = "host-secret"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[RootConfinedFileManager, Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (root / "inside.txt").write_text("inside")
    (root / "leak.txt").symlink_to(outside / "secret.txt")
    (root / "leakdir").symlink_to(outside)
    (root / "fine.txt").symlink_to("inside.txt")
    return RootConfinedFileManager(root_dir=str(root)), root, outside


@pytest.mark.security("attack", "lab")
async def test_links_out_of_the_root_are_refused_and_left_out_of_listings(tree) -> None:
    cm, root, _ = tree
    for path in ("leak.txt", "leakdir", "leakdir/secret.txt"):
        with pytest.raises(HTTPError) as refused:
            await cm.get(path)
        assert refused.value.status_code == 404 and "resolves outside the root" in refused.value.log_message
    names = {item["name"] for item in (await cm.get(""))["content"]}
    assert names == {"inside.txt", "fine.txt"}
    assert (await cm.get("fine.txt"))["content"] == "inside"
    with pytest.raises(HTTPError):
        await cm.save({"type": "file", "format": "text", "content": "overwritten"}, "leak.txt")
    with pytest.raises(HTTPError):
        await cm.copy("leakdir/secret.txt", "")
    with pytest.raises(HTTPError):
        await cm.rename("leak.txt", "renamed.txt")
    assert (root / "leak.txt").is_symlink()
    (root / "inside.txt").chmod(0o640)
    await cm.save({"type": "file", "format": "text", "content": "saved"}, "inside.txt")
    assert (root / "inside.txt").read_text() == "saved" and (root / "inside.txt").stat().st_mode & 0o777 == 0o640
    await cm.save({"type": "file", "format": "text", "content": "through the link"}, "fine.txt")
    assert (root / "fine.txt").is_symlink() and (root / "inside.txt").read_text() == "through the link"


@pytest.mark.security("attack", "lab")
async def test_a_link_swapped_in_after_the_check_is_neither_read_nor_written_through(tree, monkeypatch) -> None:
    cm, root, outside = tree
    link = str(root / "leak.txt")  # what _get_os_path returned before the kernel swapped the file for a link
    # refused (404 when the check of the name sees the link, 403 when the check of the opened file does)
    with pytest.raises(HTTPError):
        await cm._read_file(link, "text")
    with pytest.raises(HTTPError):
        await cm._read_notebook(link)
    with pytest.raises(HTTPError):
        with cm.atomic_writing(link) as handle:
            handle.write("saved")
    with monkeypatch.context() as patched:  # as if the kernel swapped the link in after atomic_writing resolved the path
        patched.setattr(os.path, "realpath", lambda path: path)
        with cm.atomic_writing(link) as handle:
            handle.write("saved")
    assert (outside / "secret.txt").read_text() == SECRET
    assert not (root / "leak.txt").is_symlink() and (root / "leak.txt").read_text() == "saved"  # the link was replaced
    with pytest.raises(HTTPError):  # a folder of the path swapped for a link
        with cm.atomic_writing(str(root / "leakdir" / "new.txt")) as handle:
            handle.write("x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    (root / "upload.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(OSError) as looped:  # the second chunk of an upload appends, never through a link
        await cm._save_large_file(str(root / "upload.txt"), "appended", "text")
    assert looped.value.errno == errno.ELOOP and (outside / "secret.txt").read_text() == SECRET


@pytest.mark.security("attack", "lab")
async def test_checkpoints_and_folder_copies_stay_inside_the_root(tree) -> None:
    cm, root, outside = tree
    (root / ".ipynb_checkpoints").symlink_to(outside)
    with pytest.raises(HTTPError):
        await cm.create_checkpoint("inside.txt")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    (root / ".ipynb_checkpoints").unlink()
    checkpoint = await cm.create_checkpoint("inside.txt")
    (root / "inside.txt").write_text("changed")
    await cm.restore_checkpoint(checkpoint["id"], "inside.txt")
    assert (root / "inside.txt").read_text() == "inside"
    (root / "folder").mkdir()
    (root / "folder" / "leak.txt").symlink_to(outside / "secret.txt")
    await cm.copy("folder", "")
    copied = root / "folder-Copy1" / "leak.txt"
    assert copied.is_symlink()  # jupyter_server would copy the host file in
    with pytest.raises(HTTPError):
        await cm.get("folder-Copy1/leak.txt")
