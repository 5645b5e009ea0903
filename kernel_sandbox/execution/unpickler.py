"""The restricted unpickler behind ``unsafe_pickle=True`` (off by default).

Results normally come back in the data-only format of :mod:`.decode`, and the host never runs
pickle opcodes from a sandbox. A caller who trusts the sandbox's output may opt into pickled
values for what that format cannot carry; they are decoded here, with only plain types and the
caller's allowed classes resolvable. That is weaker than data-only decoding (an allowed class's
own code runs, and allowed names can still be combined to change objects), hence the name.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import io
import pickle
import uuid
from collections.abc import Iterable
from typing import Any

from ..errors import UnsafePayloadError

SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", obj.__name__): obj
    for obj in (
        dict,
        list,
        tuple,
        set,
        frozenset,
        bytearray,
        bytes,
        str,
        int,
        float,
        complex,
        bool,
        range,
        slice,
    )
}
SAFE_GLOBALS.update(
    {
        (cls.__module__, cls.__qualname__): cls
        for cls in (
            datetime.date,
            datetime.time,
            datetime.datetime,
            datetime.timedelta,
            datetime.timezone,
            decimal.Decimal,
            fractions.Fraction,
            uuid.UUID,
            collections.OrderedDict,
            collections.defaultdict,
            collections.deque,
            collections.Counter,
        )
    }
)
SAFE_GLOBALS[("uuid", "SafeUUID")] = uuid.SafeUUID

DANGEROUS_MODULES = frozenset(
    {
        "os",
        "posix",
        "nt",
        "subprocess",
        "sys",
        "importlib",
        "shutil",
        "socket",
        "ctypes",
        "pty",
        "runpy",
        "code",
        "codeop",
        "pickle",
        "_pickle",
        "marshal",
        "types",
        "functools",
        "operator",
        "io",
        "_io",
        "builtins",
        "__builtin__",
        "signal",
        "multiprocessing",
        "webbrowser",
        "pdb",
        "timeit",
        "cloudpickle",
        "asyncio",
        "threading",
        "platform",
    }
)


class RestrictedUnpickler(pickle.Unpickler):
    """Resolve only allow-listed globals: plain containers and value types, plus ``allowed``.

    Everything else (``os.system``, ``builtins.eval``, ``subprocess.Popen``, ``importlib``...)
    raises :class:`UnsafePayloadError` before anything is called.
    """

    def __init__(self, file: io.BytesIO, allowed: Iterable[type] = ()) -> None:
        super().__init__(file)
        self._allowed = dict(SAFE_GLOBALS)
        self._allowed.update({(cls.__module__, cls.__qualname__): cls for cls in allowed})

    def find_class(self, module: str, name: str) -> Any:
        """Return the allow-listed global ``module.name`` or refuse the payload."""
        found = self._allowed.get((module, name))
        if found is not None:
            return found
        if module.split(".")[0] in DANGEROUS_MODULES:
            raise UnsafePayloadError(
                f"Refused a pickled result that reaches for {module}.{name}: it could run code "
                "on the host. Nothing was executed."
            )
        raise UnsafePayloadError(
            f"Refused a pickled result that needs {module}.{name}, which is not on the "
            "allow-list. If it is your own type, pass it in allowed_classes. Nothing was executed."
        )

    def persistent_load(self, pid: Any) -> Any:
        """Persistent ids are never accepted."""
        raise UnsafePayloadError("Refused a pickled result that uses persistent ids.")


def restricted_loads(data: bytes, allowed: Iterable[type] = ()) -> Any:
    """Unpickle ``data`` with :class:`RestrictedUnpickler`; malformed data is a payload error
    too."""
    try:
        return RestrictedUnpickler(io.BytesIO(data), allowed).load()
    except UnsafePayloadError:
        raise
    except Exception as exc:
        raise UnsafePayloadError(f"Refused a malformed pickled result: {exc!r}") from exc
