"""pip in the kernel: its temporary directory, and the proxy's refusals.

Where the launcher set ``PIP_TARGET`` (Docker: a tmpfs of its own), ``%pip`` (wrapped by
:func:`wrap_pip_magic`) and the execution API's ``install()`` run pip with ``TMPDIR`` set to
:data:`PIP_TMP` inside it, on the filesystem pip installs into: a wheel is downloaded and unpacked
there and moved into place by renaming, so a large one needs no room in a small ``/tmp``. The
kernel's own temporary files stay in ``/tmp``.

pip keeps to its debug log why an index page could not be fetched, so a page the launcher's proxy
refused (``403`` with the reason and the option that allows it) would read as "no matching
distribution". pip also writes its log (``PIP_LOG``) to that directory; :func:`refusals` reads the
proxy's reasons back from it, for the cell or the ``install()`` result.
"""

import os
import re
import sys
import tempfile

PIP_TMP = ".pip-tmp"
"""pip's temporary directory, in ``PIP_TARGET`` (a name that is no module's)."""
REFUSED = re.compile(r"kernel-sandbox refused .*?(?= for url: |'\)|\"\)|$)", re.M)
"""A refusal of the launcher's proxy as pip logs it (an HTTP error, or a failed tunnel)."""
LOG_BYTES = 4 * 1024 * 1024
"""The end of pip's log that is searched."""


def pip_environ(environ):
    """``environ`` for one pip run: ``TMPDIR`` pointed at pip's own directory in ``PIP_TARGET``
    (made if missing) and ``PIP_LOG`` at a new file in it; without ``PIP_TARGET``, unchanged."""
    target = environ.get("PIP_TARGET")
    if not target:
        return dict(environ)
    path = os.path.join(target, PIP_TMP)
    os.makedirs(path, exist_ok=True)
    fd, log = tempfile.mkstemp(prefix="pip-", suffix=".log", dir=path)
    os.close(fd)
    return {**environ, "TMPDIR": path, "PIP_LOG": log}


def refusals(environ):
    """The proxy's refusals pip met in the run :func:`pip_environ` made ``environ`` for, each once;
    the log is removed."""
    log = environ.get("PIP_LOG")
    if not log or not environ.get("PIP_TARGET"):
        return []
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, os.path.getsize(log) - LOG_BYTES))
            text = handle.read().decode(errors="replace")
        os.unlink(log)
    except OSError:
        return []
    return list(dict.fromkeys(match.strip() for match in REFUSED.findall(text)))


def wrap_pip_magic(original):
    """IPython's ``%pip`` (``original``), run with :func:`pip_environ` and followed by the proxy's
    refusals on stderr."""

    def pip(line):
        saved = {name: os.environ.get(name) for name in ("TMPDIR", "PIP_LOG")}
        environ = pip_environ(os.environ)
        os.environ.update(environ)
        try:
            return original(line)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            for reason in refusals(environ):
                print(f"[kernel-sandbox] {reason}", file=sys.stderr)

    pip.__doc__ = original.__doc__
    return pip


def installed(environ):
    """The names of what pip installed into ``PIP_TARGET`` (none without it), sorted."""
    target = environ.get("PIP_TARGET")
    try:
        names = os.listdir(target) if target else []
    except OSError:
        return []
    return sorted(name for name in names if name != PIP_TMP and not name.endswith(".dist-info"))
