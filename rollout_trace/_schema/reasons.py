"""Why an event may not be written, in words: the reasons ``encoding`` gives.

A reason names the field, the value and what the field allows; a ``null`` in a
line is traced back to the NaN or infinity it was written for.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec
import msgspec.inspect as mi

__all__ = ["Found", "allowed", "nan_behind_null", "non_finite_in", "show"]

_ATOMS = frozenset({str, int, bool, type(None)})

# --- finding the NaN behind a null ------------------------------------------------

Found = tuple[str, Any]  # where, as "['loss'][1]" ("" for the value itself), and what


def nan_behind_null(orig: Any, back: Any, path: str = "") -> Found | None:
    """A non-finite float in ``orig`` that became a null in ``back``, its decoded line.

    Follows ``back``'s nulls into ``orig`` through dicts, lists, attributes and
    numpy's ``tolist()``; a null that was None (or anything but a NaN or an
    infinity) is fine.
    """
    if back is None:
        return non_finite_in(orig, path)
    orig = _as_plain(orig)
    if isinstance(back, dict):
        for key, item in back.items():
            child = _child(orig, key)
            found = None if child is _MISSING else nan_behind_null(child, item, f"{path}[{key!r}]")
            if found is not None:
                return found
    elif isinstance(back, list):
        if not isinstance(orig, (list, tuple)):  # a set: no order to follow
            return non_finite_in(orig, path)
        for i, (o, item) in enumerate(zip(orig, back, strict=False)):
            found = nan_behind_null(o, item, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(back, msgspec.Struct):
        for name in back.__struct_fields__:
            child = getattr(orig, name, None)
            found = nan_behind_null(child, getattr(back, name), f"{path}.{name}")
            if found is not None:
                return found
    return None


def non_finite_in(value: Any, path: str = "") -> Found | None:
    """The first NaN or infinity anywhere in ``value``, and where."""
    value = _as_plain(value)
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    items: Any
    if isinstance(value, dict):
        items = ((f"[{k!r}]", x) for k, x in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"[{i}]", x) for i, x in enumerate(value))
    elif isinstance(value, (set, frozenset)):
        items = (("[in a set]", x) for x in value)
    elif isinstance(value, msgspec.Struct):
        items = ((f".{n}", getattr(value, n)) for n in value.__struct_fields__)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    elif hasattr(type(value), "__attrs_attrs__"):  # msgspec encodes attrs classes too
        items = ((f".{a.name}", getattr(value, a.name)) for a in type(value).__attrs_attrs__)
    else:
        return None
    for step, item in items:
        found = non_finite_in(item, path + step)
        if found is not None:
            return found
    return None


_MISSING = object()


def _child(orig: Any, key: Any) -> Any:
    if isinstance(orig, dict):
        if key in orig:
            return orig[key]
        # An int key is written as a string; an Any field reads it back so.
        return next((v for k, v in orig.items() if str(k) == key), _MISSING)
    return getattr(orig, key, _MISSING) if isinstance(key, str) else _MISSING


def _as_plain(value: Any) -> Any:
    # numpy arrays and scalars (written through orjson) as Python values.
    if type(value) in _ATOMS or isinstance(value, (float, list, tuple, dict)):
        return value
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


# --- reasons ----------------------------------------------------------------------


def allowed(t: mi.Type) -> str:
    """``t`` in words for a reason: ``int``, ``list[str]``, ``one of 'a', 'b'``."""
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(map(repr, t.values))
    return _spell(t)


def _spell(t: mi.Type) -> str:
    base = _spell_base(t)
    if not isinstance(t, _CONSTRAINED):
        return base
    # As in `Annotated[int, Meta(ge=0)]`: the fields of the type that are not types.
    limits = [
        f"{name}={getattr(t, name)!r}"
        for name in t.__struct_fields__
        if not name.endswith("_type") and getattr(t, name) is not None
    ]
    return f"{base} with {', '.join(limits)}" if limits else base


_CONSTRAINED = (
    mi.IntType,
    mi.FloatType,
    mi.StrType,
    mi.ListType,
    mi.SetType,
    mi.FrozenSetType,
    mi.VarTupleType,
    mi.DictType,
)


def _spell_base(t: mi.Type) -> str:
    if isinstance(t, mi.UnionType):
        return " | ".join(_spell(sub) for sub in t.types)
    if isinstance(t, mi.LiteralType):
        return " | ".join(map(repr, t.values))
    if isinstance(t, mi.Metadata):
        return _spell(t.type)
    if isinstance(t, (mi.ListType, mi.SetType, mi.FrozenSetType)):
        name = {mi.ListType: "list", mi.SetType: "set", mi.FrozenSetType: "frozenset"}[type(t)]
        return f"{name}[{_spell(t.item_type)}]"
    if isinstance(t, mi.VarTupleType):
        return f"tuple[{_spell(t.item_type)}, ...]"
    if isinstance(t, mi.TupleType):
        return f"tuple[{', '.join(map(_spell, t.item_types))}]"
    if isinstance(t, mi.DictType):
        return f"dict[{_spell(t.key_type)}, {_spell(t.value_type)}]"
    cls = getattr(t, "cls", None)
    if isinstance(cls, type):
        return cls.__name__
    name = type(t).__name__.removesuffix("Type")
    return name if name in ("Any", "None") else name.lower()


def show(value: Any) -> str:
    """``str 'one'``: the type and a short repr of a bad value."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
