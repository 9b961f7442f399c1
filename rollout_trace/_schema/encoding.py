"""Events to JSON lines, checked against their own class before they are written.

msgspec encodes what an event holds without looking at its field types
(``StepTrained(step="one", ...)`` is written as built), and writes NaN and
infinity as ``null``. A line its own class would refuse to read back, or a
``null`` that was a number, must not reach a trace, so every event is checked:

- a fast check per class, generated once from ``msgspec.inspect.type_info``:
  exact types (``type(v) is int``), finite floats, literal sets, and a walk of
  ``Any`` and ``dict`` values for non-finite floats. Passing it is enough to be
  valid; failing it proves nothing (a str subclass in a str field, a numpy
  array in an ``Any`` field fail it and are fine);
- for an event that fails it, the authoritative check: encode the one event,
  decode the line with a decoder of its class, and see whether a ``null`` in it
  stands for a NaN or an infinity. Only this calls an event invalid, with a
  reason that names the field, the value and what is allowed.
"""

from __future__ import annotations

import keyword
import math
import operator
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import msgspec.inspect as mi
import orjson

from .events import Event

__all__ = ["BatchEncoder", "encode_one"]

_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def _enc_hook(obj: Any) -> msgspec.Raw:
    # msgspec cannot encode numpy scalars and arrays; orjson can, natively.
    try:
        return msgspec.Raw(orjson.dumps(obj, option=_ORJSON_OPTIONS))
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise TypeError(f"cannot encode a {type(obj).__qualname__} value: {exc}") from exc


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode_one(obj: Any) -> bytes:
    """Encode one object with the tracer's rules (used to check ``meta`` early)."""
    return _encoder.encode(obj)


_Check = Callable[[Any], bool]
_CALL: Callable[[Any, Any], bool] = getattr(operator, "call", lambda f, x: f(x))  # 3.10


class BatchEncoder:
    """Encodes a batch of events into one bytes object of lines, leaving out invalid ones."""

    def __init__(self) -> None:
        self._encoder = msgspec.json.Encoder(enc_hook=_enc_hook)

    def encode(self, events: Sequence[Event]) -> tuple[bytes, list[tuple[Event, str]]]:
        """Return the JSON lines of the valid events, in order, each ending in ``\\n``,
        and every invalid event with a one-line reason."""
        if _all_pass(events):
            try:
                return self._encoder.encode_lines(events), []
            except Exception:  # a value the check let by that does not encode
                pass
        return self._encode_one_by_one(events)

    def _encode_one_by_one(self, events: Sequence[Event]) -> tuple[bytes, list[tuple[Event, str]]]:
        buf = bytearray()
        bad: list[tuple[Event, str]] = []
        encode_into = self._encoder.encode_into
        for ev in events:
            rules = _rules(type(ev))
            try:
                ok = rules.check(ev)
            except Exception:  # a value nested past the recursion limit
                ok = False
            if not ok:
                try:
                    reason = rules.diagnose(ev, self._encoder)
                except Exception as exc:  # never write what could not be checked
                    reason = f"{rules.prefix(ev)}: cannot be checked: {type(exc).__name__}: {exc}"
                if reason is not None:
                    bad.append((ev, reason))
                    continue
            mark = len(buf)
            try:
                encode_into(ev, buf, -1)
            except Exception as exc:
                del buf[mark:]
                bad.append((ev, rules.unencodable(ev, exc, self._encoder)))
                continue
            buf += b"\n"
        return bytes(buf), bad


# --- the checks, one per class ----------------------------------------------------

# Every class checked so far: its fast check, for the batch path.
_CHECKS: dict[type[Any], _Check] = {}
_RULES: dict[type[Any], _Rules] = {}


def _all_pass(events: Sequence[Event]) -> bool:
    """Whether every event passes its class's fast check."""
    # The whole batch in C but for the checks themselves. A class not seen
    # before has no check yet (calling None fails): build it, and try again.
    for attempt in range(2):
        try:
            return all(map(_CALL, map(_CHECKS.get, map(type, events)), events))
        except Exception:  # also a check that hit the recursion limit
            if attempt == 0:
                for cls in set(map(type, events)) - _CHECKS.keys():
                    _rules(cls)
    return False


def _rules(cls: type[Event]) -> _Rules:
    rules = _RULES.get(cls)
    if rules is None:
        rules = _RULES[cls] = _Rules(cls)
        _CHECKS[cls] = rules.check
    return rules


class _Rules:
    """What one event class allows, as a fast check and as a diagnosis."""

    def __init__(self, cls: type[Event]) -> None:
        self.cls = cls
        self.fields: tuple[mi.Field, ...] = ()
        self.check: _Check = _never
        self._decoder: msgspec.json.Decoder[Any] | None = None
        # Why no event of this class can be checked (and so written), if so.
        self._broken: str | None = None
        try:
            info = mi.type_info(cls)
            assert isinstance(info, mi.StructType)
            self._decoder = msgspec.json.Decoder(cls)
            self.check = _compile_check(cls, info.fields)
        except Exception as exc:  # an annotation that does not resolve, say
            self._broken = f"its class {cls.__qualname__} cannot be read back: {exc}"
            return
        self.fields = info.fields
        self._by_encode_name = {f.encode_name: f for f in info.fields}

    def prefix(self, ev: Event) -> str:
        return f"{self.cls.__struct_config__.tag} (seq {ev.seq})"

    def diagnose(self, ev: Event, encoder: msgspec.json.Encoder) -> str | None:
        """Why ``ev`` may not be written, or None when it may: the authoritative check."""
        if self._decoder is None:
            return f"{self.prefix(ev)}: {self._broken}"
        try:
            line = encoder.encode(ev)
        except Exception as exc:
            return self.unencodable(ev, exc, encoder)
        try:
            back = self._decoder.decode(line)
        except msgspec.ValidationError as exc:
            return self._refused(ev, exc)
        if b"null" in line:
            for f in self.fields:
                found = _nan_behind_null(getattr(ev, f.name), getattr(back, f.name))
                if found is not None:
                    return self._non_finite(ev, f, found)
        return None

    def unencodable(self, ev: Event, exc: Exception, encoder: msgspec.json.Encoder) -> str:
        for f in self.fields:
            value = getattr(ev, f.name)
            try:
                encoder.encode(value)
            except Exception as field_exc:
                return (
                    f"{self.prefix(ev)}: field {f.name!r} cannot be encoded as JSON, "
                    f"got {_show(value)}: {field_exc}"
                )
        return f"{self.prefix(ev)}: cannot be encoded as JSON: {exc}"

    def _refused(self, ev: Event, exc: msgspec.ValidationError) -> str:
        detail = str(exc)
        match = _AT_FIELD.search(detail)
        f = self._by_encode_name.get(match.group(1)) if match else None
        if match is None or f is None:
            return f"{self.prefix(ev)}: {detail}"
        value = getattr(ev, f.name)
        if "got `null`" in detail:
            found = _non_finite_in(value)
            if found is not None:
                return self._non_finite(ev, f, found)
        allowed = _allowed(f.type)
        reason = f"{self.prefix(ev)}: field {f.name!r} must be {allowed}, got {_show(value)}"
        if match.group(2):  # msgspec's words point inside the value: keep them
            reason += f" ({detail})"
        return reason

    def _non_finite(self, ev: Event, f: mi.Field, found: _Found) -> str:
        path, value = found
        if path:
            what = f"must hold finite numbers only, got {_show(value)} at {path}"
        else:
            what = f"must be a finite number, got {_show(value)}"
        return f"{self.prefix(ev)}: field {f.name!r} {what}: JSON cannot hold NaN or infinity"


# "... - at `$.group_ids[1]`": the field, and whether the path goes inside it.
_AT_FIELD = re.compile(r"at `\$\.([^.\[`]+)([^`]*)`")


def _compile_check(
    cls: type[Any], fields: tuple[mi.Field, ...], seen: frozenset[type[Any]] = frozenset()
) -> _Check:
    """A function that is True only for an event whose values all fit ``fields``.

    Generated as one function of straight-line tests: a loop over per-field
    closures would cost a call for each field of each event.
    """
    np_ints, np_floats = _numpy_scalars()
    namespace: dict[str, Any] = {
        "_deep_ok": _deep_ok,
        "_nums_ok": _nums_ok,
        "_isfinite": math.isfinite,
        "_BIG": _BIG,
        "_STR": _STR,
        "_INT": _INT,
        "_NP_INTS": np_ints,
        "_NP_FLOATS": np_floats,
    }
    body = []
    for f in fields:
        test = _test(f.type, "v", namespace, seen | {cls})
        if test is None or not f.name.isidentifier() or keyword.iskeyword(f.name):
            return _never
        body.append(f"    v = ev.{f.name}\n    if not ({test}):\n        return False\n")
    source = f"def check(ev):\n{''.join(body)}    return True\n"
    exec(compile(source, f"<rollout_trace check of {cls.__qualname__}>", "exec"), namespace)
    check: _Check = namespace["check"]
    return check


def _numpy_scalars() -> tuple[frozenset[type], frozenset[type]]:
    """numpy's int and float scalar types, if numpy is imported: orjson writes them
    as JSON numbers, so they fit int and float fields as Python's own do."""
    np = sys.modules.get("numpy")
    if np is None:
        return frozenset(), frozenset()
    ints = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    floats = ("float16", "float32", "float64")
    found = [frozenset(getattr(np, name) for name in names) for names in (ints, floats)]
    return found[0], found[1]


def _never(ev: Any) -> bool:
    # A class with a field type the fast check does not know: the long way always.
    return False


# An int this far from zero is a float field's value for certain; past about
# 2**1024 msgspec refuses it ("Number out of range").
_BIG = 1 << 1000
_STR = frozenset({str})
_INT = frozenset({int})
_ATOMS = frozenset({str, int, bool, type(None)})
# Field types whose values are valid exactly when their type is this one.
_EXACT: dict[type[mi.Type], type] = {
    mi.StrType: str,
    mi.IntType: int,
    mi.BoolType: bool,
    mi.NoneType: type(None),
}
_FLOAT_OR_INT = frozenset({float, int})  # a bool is no float: msgspec refuses `true`
_NUMS = _FLOAT_OR_INT | {bool}  # what Any holds as numbers


def _plain(t: mi.Type, *structural: str) -> bool:
    """Whether ``t`` carries no constraint (``Meta(ge=0)`` and the like)."""
    return all(getattr(t, name) is None for name in t.__struct_fields__ if name not in structural)


def _test(t: mi.Type, v: str, ns: dict[str, Any], seen: frozenset[type[Any]]) -> str | None:
    """A Python expression in ``v`` that is True only where ``v`` fits ``t``; None
    when the fast check does not cover ``t``."""
    if isinstance(t, mi.AnyType):
        return f"_deep_ok({v})"
    if isinstance(t, mi.NoneType):
        return f"{v} is None"
    if isinstance(t, mi.BoolType):
        return f"type({v}) is bool"
    if isinstance(t, mi.IntType) and _plain(t):
        return f"(type({v}) is int or type({v}) in _NP_INTS)"
    if isinstance(t, mi.FloatType) and _plain(t):
        # `x - x` is 0.0 for a finite float, NaN for NaN and for infinities.
        finite = f"type({v}) is float and {v} - {v} == 0.0"
        numpy = f"type({v}) in _NP_FLOATS and _isfinite({v})"
        return f"({finite} or type({v}) is int and -_BIG < {v} < _BIG or {numpy})"
    if isinstance(t, mi.StrType) and _plain(t):
        return f"type({v}) is str"
    if isinstance(t, mi.LiteralType):
        kinds = {type(x) for x in t.values} - {type(None)}
        if not kinds <= {str, int}:
            return None
        name = f"_lit{len(ns)}"
        ns[name] = frozenset(x for x in t.values if x is not None)
        test = " or ".join(f"type({v}) is {k.__name__}" for k in sorted(kinds, key=str))
        test = f"({test}) and {v} in {name}"
        return f"{v} is None or {test}" if None in t.values else test
    if isinstance(t, mi.UnionType):
        exact = [_EXACT.get(type(sub)) for sub in t.types if _plain(sub)]
        if None not in exact and len(exact) == len(t.types):  # int | str: one lookup
            name = f"_union{len(ns)}"
            ns[name] = frozenset(exact)
            return f"type({v}) in {name}"
        tests = [_test(sub, v, ns, seen) for sub in t.types]
        if None in tests:
            return None
        return " or ".join(f"({test})" for test in tests)
    if isinstance(t, mi.ListType) and _plain(t, "item_type"):
        item = t.item_type
        if isinstance(item, mi.StrType) and _plain(item):
            return f"type({v}) is list and set(map(type, {v})) <= _STR"
        if isinstance(item, mi.IntType) and _plain(item):
            return f"type({v}) is list and set(map(type, {v})) <= _INT"
        if isinstance(item, mi.AnyType):
            return f"type({v}) is list and _deep_ok({v})"
        if isinstance(item, mi.FloatType) and _plain(item):
            return f"type({v}) is list and _nums_ok({v})"
        each = _item_check(item, ns, seen)
        return None if each is None else f"type({v}) is list and all(map({each}, {v}))"
    if isinstance(t, mi.DictType) and _plain(t, "key_type", "value_type"):
        key = t.key_type
        if not (isinstance(key, mi.StrType) and _plain(key)):
            return None
        value = t.value_type
        keys = f"type({v}) is dict and set(map(type, {v})) <= _STR"
        if isinstance(value, mi.AnyType):  # _deep_ok checks the keys too
            return f"type({v}) is dict and _deep_ok({v})"
        if isinstance(value, mi.FloatType) and _plain(value):
            return f"{keys} and _nums_ok({v}.values())"
        each = _item_check(value, ns, seen)
        return None if each is None else f"{keys} and all(map({each}, {v}.values()))"
    if isinstance(t, mi.StructType) and t.cls not in seen:  # a struct nested in a field
        nested = _compile_check(t.cls, t.fields, seen)
        if nested is _never:
            return None
        name = f"_struct{len(ns)}"
        ns[name], ns[f"{name}_ok"] = t.cls, nested
        return f"type({v}) is {name} and {name}_ok({v})"
    return None


def _item_check(t: mi.Type, ns: dict[str, Any], seen: frozenset[type[Any]]) -> str | None:
    """The name of a one-argument check for ``t`` in ``ns``, for items of a container."""
    test = _test(t, "x", ns, seen)
    if test is None:
        return None
    name = f"_item{len(ns)}"
    exec(f"def {name}(x):\n    return {test}\n", ns)
    return name


def _nums_ok(values: Any) -> bool:
    """Whether ``values`` (a list or a dict's values) all fit a float field: ints
    and finite floats (False may still be fine)."""
    return set(map(type, values)) <= _FLOAT_OR_INT and _finite_sum(values)


def _finite_sum(numbers: Any) -> bool:
    # A NaN or an infinity anywhere makes the sum one. The sum of finite
    # values can overflow too, which only sends the event the long way.
    try:
        return math.isfinite(sum(numbers))
    except OverflowError:  # an int too large for a float
        return False


def _deep_ok(v: Any) -> bool:
    """Whether ``v`` is plain JSON data with finite floats only (False may still be fine)."""
    t = type(v)
    if t is float:
        return bool(v - v == 0.0)
    if t in _ATOMS:
        return True
    if t is dict:
        # One pass over the items: these dicts are small and mixed (metrics).
        for key, x in v.items():
            if type(key) is not str:
                return False
            tx = type(x)
            if tx is float:
                if x - x != 0.0:
                    return False
            elif tx not in _ATOMS and not _deep_ok(x):
                return False
        return True
    if t is list or t is tuple:
        # Lists are often long and of one kind: look at the kinds in C first.
        kinds = set(map(type, v))
        if kinds <= _ATOMS:
            return True
        if kinds <= _NUMS:
            return _finite_sum(v)
        return all(map(_deep_ok, v))
    return False


# --- finding the NaN behind a null ------------------------------------------------

_Found = tuple[str, Any]  # where, as "['loss'][1]" ("" for the value itself), and what


def _nan_behind_null(orig: Any, back: Any, path: str = "") -> _Found | None:
    """A non-finite float in ``orig`` that became a null in ``back``, its decoded line.

    Follows ``back``'s nulls into ``orig`` through dicts, lists, attributes and
    numpy's ``tolist()``; a null that was None (or anything but a NaN or an
    infinity) is fine.
    """
    if back is None:
        return _non_finite_in(orig, path)
    orig = _as_plain(orig)
    if isinstance(back, dict):
        for key, item in back.items():
            child = _child(orig, key)
            found = None if child is _MISSING else _nan_behind_null(child, item, f"{path}[{key!r}]")
            if found is not None:
                return found
    elif isinstance(back, list):
        if not isinstance(orig, (list, tuple)):  # a set: no order to follow
            return _non_finite_in(orig, path)
        for i, (o, item) in enumerate(zip(orig, back, strict=False)):
            found = _nan_behind_null(o, item, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(back, msgspec.Struct):
        for name in back.__struct_fields__:
            child = getattr(orig, name, None)
            found = _nan_behind_null(child, getattr(back, name), f"{path}.{name}")
            if found is not None:
                return found
    return None


def _non_finite_in(value: Any, path: str = "") -> _Found | None:
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
    else:
        return None
    for step, item in items:
        found = _non_finite_in(item, path + step)
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


def _allowed(t: mi.Type) -> str:
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


def _show(value: Any) -> str:
    """``str 'one'``: the type and a short repr of a bad value."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
