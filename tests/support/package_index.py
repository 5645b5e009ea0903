"""A package index on 127.0.0.1 for the egress tests: pip's simple-repository layout over wheels built here.

The index is named ``index.test``; the launchers' test resolver map (:mod:`support.launcher_hooks`)
sends that name to 127.0.0.1, and their loopback guard records any connection elsewhere.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import platform
import subprocess
import sysconfig
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from support.launcher_hooks import TEST_RESOLVER_ENV

INDEX_HOST = "index.test"
PRIVATE_HOST = "api.example.com"
"""A name the test's resolver answers with 10.0.0.1: listed, it must still be refused."""


def write_wheel(directory: Path, name: str, files: dict[str, bytes], tag: str = "py3-none-any") -> Path:
    """A wheel of ``name`` 0.1 holding ``files`` (stored, not compressed), for the platform ``tag``."""
    pure = "true" if tag.endswith("-none-any") else "false"
    files = {
        **files,
        f"{name}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n".encode(),
        f"{name}-0.1.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {pure}\nTag: {tag}\n".encode(),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}-0.1.dist-info/RECORD,,")
    wheel = directory / f"{name}-0.1-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{name}-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def build_wheel(directory: Path, name: str, value: int) -> Path:
    """A pure-Python wheel of package ``name`` whose module holds ``VALUE = value``."""
    return write_wheel(directory, name, {f"{name}/__init__.py": f"VALUE = {value}\n".encode()})


EXTENSION_C = """
#define Py_LIMITED_API 0x03080000
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, "a + b, in C"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
"""


def build_extension_wheel(directory: Path, name: str) -> Path:
    """A wheel of the compiled module ``name`` (``name.add(a, b)`` in C), built here with the host's
    C compiler: the stable ABI (``abi3``, Python 3.8 on) makes it load in the image's Python too."""
    source = directory / f"{name}.c"
    source.write_text(EXTENSION_C.replace("NAME", name))
    library = directory / f"{name}.abi3.so"
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", f"-I{include}", "-o", str(library), str(source)], check=True
    )
    return write_wheel(directory, name, {library.name: library.read_bytes()}, f"cp38-abi3-linux_{platform.machine()}")


def build_large_wheel(directory: Path, name: str, size: int) -> Path:
    """A wheel of package ``name`` carrying ``size`` bytes of random (incompressible) data in ``name/blob``."""
    return write_wheel(
        directory, name, {f"{name}/__init__.py": b"import os\nSIZE = os.path.getsize(os.path.join(os.path.dirname(__file__), 'blob'))\n",
                          f"{name}/blob": os.urandom(size)}
    )


@dataclass
class Index:
    """A running index: its port, URL, the resolver map file, and the requests it served."""

    port: int
    resolver_file: Path
    served: list[str]

    @property
    def url(self) -> str:
        return f"http://{INDEX_HOST}:{self.port}/simple"

    @property
    def entry(self) -> str:
        """The destination that allows the index, loopback included (the private-address spelling)."""
        return f"{INDEX_HOST}:{self.port}@127.0.0.1"

    @property
    def guard_fired(self) -> list[str]:
        guard = Path(str(self.resolver_file) + ".guard")
        return guard.read_text().split() if guard.exists() else []


@contextmanager
def serve_index(
    directory: Path, packages: dict[str, int], make: Iterable[Callable[[Path], Path]] = ()
) -> Iterator[Index]:
    """Serve wheels of ``packages`` (name → VALUE), and those ``make`` builds in the directory it is
    given, as a simple index on 127.0.0.1, with the resolver map set."""
    root = directory / "index"
    (root / "files").mkdir(parents=True)
    wheels = [build_wheel(root / "files", name, value) for name, value in packages.items()]
    wheels += [build(root / "files") for build in make]
    for wheel in wheels:
        name = wheel.name.split("-")[0]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        project = root / "simple" / name.replace("_", "-")
        project.mkdir(parents=True)
        (project / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a></body></html>'
        )
    served: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format, *args):
            served.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    resolver = directory / "resolver.json"
    resolver.write_text(json.dumps({INDEX_HOST: ["127.0.0.1"], PRIVATE_HOST: ["10.0.0.1"]}))
    resolver.chmod(0o600)
    old = os.environ.get(TEST_RESOLVER_ENV)
    os.environ[TEST_RESOLVER_ENV] = str(resolver)
    try:
        yield Index(server.server_address[1], resolver, served)
    finally:
        if old is None:
            os.environ.pop(TEST_RESOLVER_ENV, None)
        else:
            os.environ[TEST_RESOLVER_ENV] = old
        server.shutdown()
        server.server_close()
