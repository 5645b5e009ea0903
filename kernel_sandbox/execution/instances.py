"""Instances in a result from a sandbox: which classes a caller allows (:func:`allowed_map`), and
rebuilding one as a new instance from its fields without running its code (:func:`rebuild`)."""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError, UnsafePayloadError
from ..kernelside.dataformat import class_name
from .limits import malformed


def allowed_map(classes: Iterable[type]) -> dict[str, type]:
    """``{"module:qualname": class}`` for the classes a caller allows.

    A class defined inside a function may reach the kernel without its qualified name (pickled
    by value, some metaclasses keep only ``__name__``), so ``module:name`` is accepted too, as
    long as no two allowed classes share it.
    """
    mapping: dict[str, type] = {}
    short: dict[str, set[type]] = {}
    for cls in classes:
        if not isinstance(cls, type):
            raise ConfigError(f"allowed_classes takes classes, not {cls!r}")
        mapping[class_name(cls)] = cls
        short.setdefault(f"{cls.__module__}:{cls.__name__}", set()).add(cls)
    for name, found in short.items():
        if len(found) == 1:
            mapping.setdefault(name, next(iter(found)))
    return mapping


def is_enum(cls: type) -> bool:
    """Whether ``cls`` is an enum class."""
    return isinstance(cls, enum.EnumMeta)


def _slot_descriptors(cls: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            descriptor = klass.__dict__.get(name)
            if isinstance(descriptor, types.MemberDescriptorType):
                found[name] = descriptor
    return found


_MISSING = object()


def _declared_fields(cls: type) -> dict[str, bool] | None:
    """``{field: has a class-level default}`` for a dataclass or attrs class; None for other
    classes.

    A field without a class-level default (none at all, or a ``default_factory``) must come with
    the data: an instance made without it would lack the attribute.
    """
    if dataclasses.is_dataclass(cls):
        return {
            f.name: _class_attribute(cls, f.name) is not _MISSING and not _is_slot(cls, f.name)
            for f in dataclasses.fields(cls)
        }
    attributes = cls.__dict__.get("__attrs_attrs__")
    if attributes is not None:
        return {a.name: False for a in attributes}
    return None


def _is_slot(cls: type, name: str) -> bool:
    return isinstance(_class_attribute(cls, name), types.MemberDescriptorType)


def _class_attribute(cls: type, name: str) -> Any:
    """``name`` as the class (or a base) defines it, read from the class dicts: nothing runs."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def _check_declared(cls: type, fields: dict[str, Any]) -> None:
    """Refuse, for a dataclass or attrs class, fields it does not declare and missing ones it
    needs."""
    declared = _declared_fields(cls)
    if declared is None:
        return
    unknown = sorted(set(fields) - set(declared))
    missing = sorted(
        name for name, has_default in declared.items() if name not in fields and not has_default
    )
    if unknown or missing:
        what = (
            f"fields it does not declare ({', '.join(n[:40] for n in unknown[:5])})"
            if unknown
            else f"no value for its fields {', '.join(missing[:5])}"
        )
        raise malformed(f"a {class_name(cls)} with {what}")


def rebuild(cls: type, fields: dict[str, Any]) -> Any:
    """A new ``cls`` instance holding ``fields``, made without running the class's own code.

    Pydantic models are validated by ``model_validate``. Everything else is created with
    ``object.__new__`` and filled by writing slots and the instance's ``__dict__`` directly;
    a field may not be named like a special attribute, nor shadow a method or other
    descriptor of the class (``is_admin`` cannot replace ``is_admin()``).
    """
    validate = getattr(cls, "model_validate", None)
    if callable(validate) and hasattr(cls, "__pydantic_fields__"):
        try:
            return validate(fields)
        except (ValueError, TypeError) as exc:
            raise malformed(f"{class_name(cls)} refused the data: {str(exc)[:500]}") from None
    if any(name.startswith("__") and name.endswith("__") for name in fields):
        raise malformed(f"a {class_name(cls)} with a field named like a special attribute")
    if is_enum(cls):
        raise malformed(f"a {class_name(cls)} built field by field is not one of its members")
    _check_declared(cls, fields)
    try:
        instance: object = object.__new__(cls)
    except TypeError:
        raise UnsafePayloadError(
            f"Cannot rebuild a {class_name(cls)} from data: it is not a plain class "
            "(a dataclass, attrs class, pydantic model or class with __dict__/__slots__)."
        ) from None
    slots = _slot_descriptors(cls)
    state = None
    for name, value in fields.items():
        descriptor = slots.get(name)
        if descriptor is not None:
            descriptor.__set__(instance, value)
            continue
        attribute = _class_attribute(cls, name)
        if attribute is not _MISSING and (
            callable(attribute) or hasattr(type(attribute), "__get__")
        ):
            raise malformed(
                f"a {class_name(cls)} field named {name[:80]!r} would shadow a method or descriptor"
            )
        if state is None:
            try:
                state = object.__getattribute__(instance, "__dict__")
            except AttributeError:
                raise malformed(f"a {class_name(cls)} has no field named {name[:80]!r}") from None
        state[name] = value
    return instance
