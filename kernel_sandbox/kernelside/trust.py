"""The kernel's trust in the egress proxy's CA, for every Python client in the kernel's process.

A kernel with secrets trusts a CA made for it alone (its certificate only; the key stays with
the launcher). :func:`write_bundle` writes the system's CAs and that certificate to a new read-only
file, which ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``PIP_CERT`` and ``NODE_EXTRA_CA_CERTS`` name
(:data:`TRUST_ENV`); :func:`follow_certifi` makes ``certifi.where()`` and ``certifi.contents()``
answer that file too while ``SSL_CERT_FILE`` names one of these bundles, so clients that read
certifi's bundle themselves (``verify=certifi.where()``, ``cafile=certifi.where()``) trust the
proxy's certificate for bound hosts. Nothing of certifi's own files changes, and nothing here
gives the kernel more than it has anyway: its own process may trust whatever it likes; the proxy
never sends a value to a host the secret is not bound to.

:func:`call_env` does the same for one tool call's secrets (``run_tool(secrets=...)``): their CA
arrives in the call's variables, its bundle is written for the call, and the call's trust variables
name it.
"""

import importlib.abc
import os
import ssl
import sys

CA_ENV = "KERNEL_SANDBOX_CA"
"""The variable the CA certificate (PEM) arrives in; removed from the environment on arrival."""
BUNDLE = "/tmp/kernel-sandbox-ca.pem"
"""The kernel's trust bundle when it has secrets from its start."""
TRUST_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS")
"""The variables that point the kernel's clients at the bundle."""
_CALLS = "/tmp/kernel-sandbox-ca-call-"


def write_bundle(path, ca_pem, base=None):
    """Write the CAs of the file ``base`` (default: the system's) and ``ca_pem`` to a new
    read-only file at ``path``."""
    trusted = ""
    try:
        with open(base or ssl.get_default_verify_paths().openssl_cafile) as handle:
            trusted = handle.read()
    except (OSError, TypeError):
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o444)
    with os.fdopen(fd, "w") as handle:
        handle.write(trusted.rstrip("\n") + "\n" + ca_pem)


def ours():
    """The bundle ``SSL_CERT_FILE`` names when it is one of the sandbox's, else None."""
    path = os.environ.get("SSL_CERT_FILE") or ""
    return path if path == BUNDLE or path.startswith(_CALLS) else None


def _patch(module):
    where, contents = module.where, module.contents

    def follow_where():
        return ours() or where()

    def follow_contents():
        path = ours()
        if path is None:
            return contents()
        with open(path, encoding="ascii") as handle:
            return handle.read()

    follow_where.__doc__, follow_contents.__doc__ = where.__doc__, contents.__doc__
    module.where, module.contents = follow_where, follow_contents


class _CertifiFinder(importlib.abc.MetaPathFinder):
    """Patches ``certifi`` as it is imported (wherever it is installed, later ``%pip`` included)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "certifi":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and not isinstance(spec.loader, type):
                exec_module = spec.loader.exec_module

                def patched(module, exec_module=exec_module):
                    exec_module(module)
                    _patch(module)

                spec.loader.exec_module = patched
                return spec
        return None


def follow_certifi():
    """Make certifi's bundle the sandbox's while ``SSL_CERT_FILE`` names it (once per process)."""
    if any(type(finder).__name__ == _CertifiFinder.__name__ for finder in sys.meta_path):
        return  # installed already, perhaps by an earlier copy of this module
    module = sys.modules.get("certifi")
    if module is not None:
        _patch(module)
    sys.meta_path.insert(0, _CertifiFinder())


def call_env(values):
    """One call's variables with its CA (under :data:`CA_ENV`) replaced by the trust variables
    naming a new bundle of the kernel's current trust (``SSL_CERT_FILE``'s, else the system's)
    and that CA (:func:`drop_call_bundle` removes it after the call)."""
    ca_pem = values.get(CA_ENV)
    if not ca_pem:
        return values
    values = {name: value for name, value in values.items() if name != CA_ENV}
    path = _CALLS + os.urandom(8).hex() + ".pem"
    write_bundle(path, ca_pem, os.environ.get("SSL_CERT_FILE"))
    follow_certifi()
    values.update(dict.fromkeys(TRUST_ENV, path))
    return values


def drop_call_bundle(values):
    """Remove the bundle :func:`call_env` wrote for the call whose variables are ``values``."""
    path = values.get("SSL_CERT_FILE") or ""
    if path.startswith(_CALLS):
        try:
            os.unlink(path)
        except OSError:
            pass
