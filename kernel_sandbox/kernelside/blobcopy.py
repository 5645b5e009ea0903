"""Copy one file out of or into the container for the launcher, over one Docker exec stream.

``python -I -S -c SOURCE read PATH`` writes the size of the regular file at ``PATH`` (8 bytes,
big-endian) and then its bytes to stdout. ``python -I -S -c SOURCE write PATH SIZE`` reads exactly
``SIZE`` bytes from stdin into a new file beside ``PATH`` (0600) and renames it to ``PATH``, so that
the file appears whole or not at all; then it writes ``ok``. Paths are opened with ``O_NOFOLLOW``:
a symlink planted there is refused. The exec runs as the kernel's own user in its own container,
so a kernel that names another path reaches only what it could read or write itself; the launcher
decides everything else (sizes, hashes, where the bytes go on the host).

Only built-in and standard modules are imported.
"""

import os
import stat
import struct
import sys

LENGTH = struct.Struct(">Q")
BLOCK = 1024 * 1024


def write_all(fd, data):
    """Write every byte of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read(path):
    """Send the size, then the bytes, of the regular file at ``path`` to stdout."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path!r} is not a regular file")
        write_all(1, LENGTH.pack(info.st_size))
        left = info.st_size
        while left > 0:
            block = os.read(fd, min(BLOCK, left))
            if not block:
                break  # the file shrank meanwhile: the launcher sees fewer bytes than stated
            write_all(1, block)
            left -= len(block)
    finally:
        os.close(fd)


def write(path, size):
    """Write ``size`` bytes of stdin to ``path``, whole or not at all."""
    part = f"{path}.part-{os.getpid()}"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        left = size
        while left > 0:
            block = os.read(0, min(BLOCK, left))
            if not block:
                raise OSError(f"the stream ended {left} bytes early")
            write_all(fd, block)
            left -= len(block)
        os.close(fd)
        fd = -1
        os.replace(part, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(part)
        raise
    write_all(1, b"ok")


def main(argv):
    """Run ``read PATH`` or ``write PATH SIZE``; exit 0 when done, 2 with a message when not."""
    try:
        if len(argv) == 2 and argv[0] == "read":
            read(argv[1])
        elif len(argv) == 3 and argv[0] == "write":
            write(argv[1], int(argv[2]))
        else:
            raise ValueError("usage: read PATH | write PATH SIZE")
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
