"""A contents manager that serves nothing outside its root directory, whatever symlinks are planted
in it.

jupyter_server's file contents manager checks a path's *name* against its root, then follows
symlinks: a kernel that can write in the served directory (``mount_cwd: rw``) can plant
``notes.txt -> ~/.ssh/id_ed25519`` and every page of the server reads (or overwrites) the target.
:class:`RootConfinedFileManager` resolves every path it hands out and refuses one that lands
outside the root, and it reads and writes through file descriptors it checked, so a link swapped
in between the check and the use is refused too. ``kernel-sandbox lab`` configures it; in your own
``jupyter_server_config.py``::

    c.ServerApp.contents_manager_class = "kernel_sandbox.contents.RootConfinedFileManager"
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from typing import IO, Any

from jupyter_server.files.handlers import FilesHandler
from jupyter_server.services.contents.filecheckpoints import AsyncFileCheckpoints
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web
from traitlets import default


class OutsideRoot(web.HTTPError, OSError):
    """A path that resolves outside the served root: a 404 for the handlers, an unlistable entry for
    a directory listing."""

    def __init__(self, path: str) -> None:
        web.HTTPError.__init__(
            self, 404, f"{path} resolves outside the root contents directory (a symlink)"
        )
        self.errno = errno.EACCES


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _fd_path(fd: int) -> str:
    """The path the kernel resolved when ``fd`` was opened (Linux: /proc/self/fd)."""
    return os.readlink(f"/proc/self/fd/{fd}")


class RootConfined:
    """What the contents manager and its checkpoints share: every path resolved, every open
    checked."""

    root_dir: str

    def _real_root(self) -> str:
        return os.path.realpath(self.root_dir)

    def _confined(self, os_path: str) -> str:
        """``os_path`` unless it (or what of it exists) resolves outside the root; OutsideRoot
        then."""
        if not _inside(os.path.realpath(os_path), self._real_root()):
            raise OutsideRoot(os.path.relpath(os_path, os.path.abspath(self.root_dir)))
        return os_path

    def _get_os_path(self, path: str) -> str:
        return self._confined(super()._get_os_path(path))  # type: ignore[misc]

    def _check_fd(self, fd: int, os_path: str) -> None:
        if not _inside(_fd_path(fd), self._real_root()):
            raise OutsideRoot(os.path.relpath(os_path, os.path.abspath(self.root_dir)))

    @contextlib.contextmanager
    def open(self, os_path: str, *args: Any, **kwargs: Any) -> Iterator[IO[Any]]:
        """Open ``os_path`` for reading (as FileManagerMixin.open), refusing a file that turned out
        to lie outside the root."""
        with self.perm_to_403(os_path), open(os_path, *args, **kwargs) as handle:  # type: ignore[attr-defined]
            self._check_fd(handle.fileno(), os_path)
            yield handle

    @contextlib.contextmanager
    def _directory(self, os_path: str) -> Iterator[int]:
        """A descriptor of ``os_path``'s directory, checked to be inside the root."""
        parent = os.path.dirname(os_path) or "."
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._check_fd(fd, parent)
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def atomic_writing(
        self, os_path: str, text: bool = True, encoding: str = "utf-8", **kwargs: Any
    ) -> Iterator[IO[Any]]:
        """Write a new file next to ``os_path`` and rename it over ``os_path``: a symlink there is
        replaced, never followed.

        A link that resolves inside the root is written at its target, as jupyter_server does.
        """
        kwargs.pop("log", None)
        os_path = os.path.realpath(self._confined(os_path))
        name = os.path.basename(os_path)
        temporary = f".~{name}.{os.getpid()}.tmp"
        with self.perm_to_403(os_path), self._directory(os_path) as directory:  # type: ignore[attr-defined]
            try:
                existing = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            fd = os.open(
                temporary,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                0o666,
                dir_fd=directory,
            )
            try:
                # keep its mode and, where we may, its owner
                if existing is not None and stat.S_ISREG(existing.st_mode):
                    os.fchmod(fd, stat.S_IMODE(existing.st_mode))
                    with contextlib.suppress(PermissionError):
                        os.fchown(fd, existing.st_uid, existing.st_gid)
                if text:
                    kwargs.setdefault("newline", "\n")
                    handle = open(fd, "w", encoding=encoding, **kwargs)
                else:
                    handle = open(fd, "wb", **kwargs)
                with handle:
                    yield handle
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)  # when open() did not take it
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=directory)
                raise

    async def _copy(self, src: str, dest: str) -> None:
        """Copy ``src`` to ``dest``, both inside the root (a checkpoint, a copied file)."""
        with (
            self.open(self._confined(src), "rb") as source,
            self.atomic_writing(self._confined(dest), text=False) as target,
        ):
            shutil.copyfileobj(source, target)


class RootConfinedCheckpoints(RootConfined, AsyncFileCheckpoints):
    """File checkpoints (``.ipynb_checkpoints``) kept inside the root: a planted checkpoint folder
    link is refused."""

    def checkpoint_path(self, checkpoint_id: str, path: str) -> str:
        """The checkpoint's file, refused when it (or its folder) resolves outside the root."""
        return self._confined(super().checkpoint_path(checkpoint_id, path))


# (ignored: jupyter_server's own bases disagree on resolve_path, one sync and one async)
class RootConfinedFileManager(RootConfined, AsyncLargeFileManager):  # type: ignore[misc]
    """JupyterLab's default contents manager, refusing every path that resolves outside its root
    directory.

    Through /api/contents (read, save, rename, copy, checkpoints), /files/ and downloads (served
    through this manager: :class:`~jupyter_server.files.handlers.FilesHandler`), /view and nbconvert
    (which read through /files/ or this manager). A symlink that stays inside the root works.
    """

    @default("checkpoints_class")
    def _confined_checkpoints(self) -> type:
        return RootConfinedCheckpoints

    @default("files_handler_class")
    def _files_through_manager(self) -> type:
        return FilesHandler

    async def _copy_dir(
        self, from_path: str, to_path_original: str, to_name: str, to_path: str
    ) -> dict[str, Any]:
        """Copy a folder keeping the symlinks in it as symlinks (jupyter_server copies their targets
        in)."""
        try:
            source = self._get_os_path(from_path.strip("/"))
            shutil.copytree(
                source, f"{self._get_os_path(to_path_original.strip('/'))}/{to_name}", symlinks=True
            )
        except OSError as exc:
            raise web.HTTPError(
                400, f"Can't copy '{from_path}' into '{to_path}': {exc.strerror or exc}"
            ) from exc
        return await self.get(to_path, content=False)

    async def _save_large_file(self, os_path: str, content: str, format: str) -> None:
        """Append a chunk of an upload through a descriptor that does not follow a symlink."""
        if format not in {"text", "base64"}:
            raise web.HTTPError(400, "Must specify format of file contents as 'text' or 'base64'")
        try:
            data = (
                content.encode("utf8")
                if format == "text"
                else base64.b64decode(content.encode("ascii"))
            )
        except (UnicodeError, ValueError) as exc:
            raise web.HTTPError(400, f"Encoding error saving {os_path}: {exc}") from exc
        with self.perm_to_403(os_path), self._directory(os_path) as directory:
            fd = os.open(
                os.path.basename(os_path),
                os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW,
                dir_fd=directory,
            )
            with open(fd, "ab") as handle:
                handle.write(data)
