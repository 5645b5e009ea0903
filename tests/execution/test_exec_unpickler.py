"""The restricted unpickler refuses hand-crafted hostile pickles before anything runs."""

from __future__ import annotations

import collections
import datetime
import decimal
import pickle
from pathlib import Path

import pytest

from kernel_sandbox.execution import UnsafePayloadError
from kernel_sandbox.execution.unpickler import restricted_loads


class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y


def reduce_call(module: str, name: str, arg: str) -> bytes:
    """Protocol-0 pickle: GLOBAL module.name, then REDUCE with one string argument."""
    return f"c{module}\n{name}\n(S'{arg}'\ntR.".encode()


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("os", "system"),
        ("posix", "system"),
        ("nt", "system"),
        ("subprocess", "check_output"),
        ("builtins", "eval"),
        ("builtins", "exec"),
        ("builtins", "__import__"),
        ("builtins", "getattr"),
        ("importlib", "import_module"),
        ("shutil", "rmtree"),
    ],
)
def test_refuses_callables_that_run_code(module: str, name: str, tmp_path: Path) -> None:
    witness = tmp_path / "pwned"
    with pytest.raises(UnsafePayloadError, match=f"{module}.{name}"):
        restricted_loads(reduce_call(module, name, f"touch {witness}"))
    assert not witness.exists()


def test_refuses_os_system_hidden_inside_allowed_containers(tmp_path: Path) -> None:
    witness = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {witness}",))

    payload = pickle.dumps({"ok": [1, 2, (Evil(),)]}, protocol=4)
    with pytest.raises(UnsafePayloadError, match="system"):
        restricted_loads(payload)
    assert not witness.exists()


def test_refuses_unknown_classes_unless_allowed() -> None:
    payload = pickle.dumps(Point(1, 2), protocol=4)
    with pytest.raises(UnsafePayloadError, match="allowed_classes"):
        restricted_loads(payload)
    point = restricted_loads(payload, allowed=[Point])
    assert (point.x, point.y) == (1, 2)


def test_refuses_malformed_and_persistent_ids() -> None:
    with pytest.raises(UnsafePayloadError):
        restricted_loads(b"\x80\x04not a pickle")
    with pytest.raises(UnsafePayloadError, match="persistent"):
        restricted_loads(b"Px\n.")


def test_accepts_plain_values() -> None:
    value = {
        "when": datetime.datetime(2024, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
        "amount": decimal.Decimal("1.25"),
        "counts": collections.Counter("aab"),
        "order": collections.OrderedDict(a=1),
        "raw": b"\x00\x01",
        "set": {1, 2},
        "frozen": frozenset({3}),
        "nested": [(1, 2.5, None, True)],
        "span": datetime.timedelta(seconds=3),
    }
    assert restricted_loads(pickle.dumps(value, protocol=4)) == value
