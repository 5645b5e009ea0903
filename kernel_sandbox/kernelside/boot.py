"""Start the kernel inside the container: write its connection file, then run the kernel command.

The container's command is ``python -c SOURCE KERNEL_CMD...``. The kernel's own key (not the
client's) arrives in the environment as ``KERNEL_SANDBOX_KEY`` and is removed from it before the
kernel runs. The kernel binds its five ports on the container's own loopback (:data:`PORTS`),
which nothing but the launcher's exec streams can reach: the container has no other network.

A ``python -m MODULE ...`` command runs in this same interpreter, with ipykernel's warning about
TCP without encryption filtered out (the traffic never leaves the container's loopback); any
other command is executed as it is.

Such a ``python -m`` kernel also gets the magics ``%checkpoint`` and ``%restore``
(:mod:`.magics`): their modules' sources arrive in ``KERNEL_SANDBOX_MODULES`` (a JSON object of
module name to source, removed from the environment too), are installed under those names, and the
magics are loaded as an IPython extension. A kernel with secrets trusts the egress proxy's CA
(:mod:`.trust`), whose certificate arrives in ``KERNEL_SANDBOX_CA``.
"""

import json
import logging
import os
import runpy
import sys
import types

PORTS = {
    "shell_port": 10001,
    "iopub_port": 10002,
    "stdin_port": 10003,
    "control_port": 10004,
    "hb_port": 10005,
}
"""Below the ephemeral port ranges of Linux (32768-60999) and of gVisor (16000-65535), so a
connection attempt can never take a kernel's port (gVisor hands its ports out in turn: the
connectors' retries while the kernel started once walked onto 20002, its old iopub port)."""
KEY_ENV = "KERNEL_SANDBOX_KEY"
MODULES_ENV = "KERNEL_SANDBOX_MODULES"
EXTENSION = "_kernel_sandbox_magics"
BOOT_MODULE = "_kernel_sandbox_boot"
SIGNATURE_SCHEME = "hmac-sha256"
CONNECTION_FILE = "/tmp/kernel-sandbox-connection.json"
TRUST_MODULE = "_kernel_sandbox_trust"
"""The installed :mod:`.trust`: the egress proxy's CA in the kernel's trust, when it has secrets."""
LOOPBACK_WARNING = "Kernel is running over TCP without encryption"
PYTHON_NAMES = ("python", "python3")


def connection_info(key):
    """The kernel's connection info: its five ports on 127.0.0.1, signed with ``key``."""
    return dict(PORTS, transport="tcp", ip="127.0.0.1", key=key, signature_scheme=SIGNATURE_SCHEME)


def write_connection_file(path, info):
    """Write ``info`` as JSON to a new file at ``path`` that only this user may read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(info, handle)


def trust_ca():
    """Put the egress proxy's CA (its certificate in the environment, removed from it) in the
    kernel's trust (:mod:`.trust`), when the kernel has secrets."""
    trust = sys.modules.get(TRUST_MODULE)
    ca_pem = os.environ.pop(trust.CA_ENV, "") if trust is not None else ""
    if ca_pem:
        trust.write_bundle(trust.BUNDLE, ca_pem)
        trust.follow_certifi()


def kernel_argv(cmd, connection_file):
    """``cmd`` with ``{connection_file}`` replaced by the file's path."""
    return [part.replace("{connection_file}", connection_file) for part in cmd]


class DropLoopbackWarning(logging.Filter):
    """Drop ipykernel's warning about TCP without encryption: here TCP is the container's
    loopback."""

    def filter(self, record):
        return not record.getMessage().startswith(LOOPBACK_WARNING)


def install_modules(sources):
    """Install each ``{name: source}`` module (in order) under its name; return the names."""
    for name, text in sources.items():
        module = types.ModuleType(name)
        module.__file__ = "<" + name + ">"
        sys.modules[name] = module
        exec(compile(text, module.__file__, "exec"), module.__dict__)
    return list(sources)


def hide_from_debugger():
    """Leave this code's frames (``python -c``: file ``<string>``), below every kernel frame, out
    of the debugger's call stack.

    ipykernel's debugger hides the frames of the files of every module loaded when the kernel
    starts (``filter_internal_frames``); this puts ``<string>`` among them, as the installed
    modules' ``<name>`` files are.
    """
    module = types.ModuleType(BOOT_MODULE)
    module.__file__ = "<string>"
    sys.modules[BOOT_MODULE] = module


def run(argv, modules=()):
    """Run ``argv``: a ``python -m MODULE`` command in this interpreter (with the magics'
    extension when its module is in ``modules``), anything else by exec."""
    if len(argv) >= 3 and os.path.basename(argv[0]) in PYTHON_NAMES and argv[1] == "-m":
        logging.getLogger("IPKernelApp").addFilter(DropLoopbackWarning())
        hide_from_debugger()
        sys.argv = [argv[2], *argv[3:]]
        if EXTENSION in modules:
            sys.argv.append(f"--InteractiveShellApp.extra_extensions={EXTENSION}")
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return
    os.execvp(argv[0], argv)


def make_package_dir(path):
    """Create the directory ``%pip install`` puts packages in (``PIP_TARGET``, on ``PYTHONPATH``),
    so that what pip installs there imports at once: a directory missing at start is never looked in
    again."""
    if path:
        os.makedirs(path, exist_ok=True)
        sys.path_importer_cache.pop(path, None)


def main(cmd):
    """Write the connection file from the environment and run the kernel command ``cmd``."""
    key = os.environ.pop(KEY_ENV, "")
    sources = json.loads(os.environ.pop(MODULES_ENV, "") or "{}")
    if not key or not cmd:
        sys.stderr.write(
            f"kernel-sandbox boot: no {KEY_ENV} in the environment or no kernel command\n"
        )
        return 2
    write_connection_file(CONNECTION_FILE, connection_info(key))
    installed = install_modules(sources)
    trust_ca()
    make_package_dir(os.environ.get("PIP_TARGET"))
    run(kernel_argv(cmd, CONNECTION_FILE), installed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
