"""Events to JSON lines, checked against their own class before they are written.

msgspec encodes what an event holds without looking at its field types
(``StepTrained(step="one", ...)`` is written as built), and writes NaN and
infinity as ``null``. A line its own class would refuse to read back, or a
``null`` that was a number, must not reach a trace, so every event is checked:

- a fast check per class, generated once from ``msgspec.inspect.type_info``:
  exact types (``type(v) is int``), finite floats, literal sets, and a walk of
  ``Any`` and ``dict`` values for non-finite floats. Passing it is enough to be
  valid; failing it proves nothing (a str subclass in a str field, a numpy
  array in an ``Any`` field fail it and are fine). It leaves out what the
  tracer stamps itself (``run_id``, ``seq``, and ``time`` from ``time.time``;
  a ``time`` from the user's clock must be a finite number > 0, as every
  reader requires), and walks a whole run of events of its class in one call,
  numbering them on the way for the sync writer: on the writer's hot path a
  call per event, or a second pass over the batch, costs about as much as the
  tests themselves;
- for an event that fails it, the authoritative check: encode the one event,
  decode the line with a decoder of its class, and see whether a ``null`` in it
  stands for a NaN or an infinity. Only this calls an event invalid, with a
  reason that names the field, the value and what is allowed.
"""

from __future__ import annotations

import copy
import keyword
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import msgspec
import msgspec.inspect as mi
import orjson

from .events import Event
from .reasons import Found, allowed, nan_behind_null, non_finite_in, show

__all__ = ["BatchEncoder", "encode_one", "field_of", "refusal"]

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
# A check of a run of events of one class: the first event, the rest of the
# batch's iterator, and the seq of the first (None: they are numbered
# already). Returns the seq of the next event and False at an event that
# fails, the first event of another class (the next run's first), or True at
# the batch's end.
_RunCheck = Callable[[Any, Iterator[Any], Any], tuple[Any, Any]]


class BatchEncoder:
    """Encodes a batch of events into one bytes object of lines, leaving out invalid ones."""

    def __init__(self, *, own_time: bool = False) -> None:
        """``own_time``: every event's ``time`` comes from ``time.time()``, stamped
        by the tracer (a finite float > 0), so the checks leave it out too;
        without it an event whose ``time`` is not a finite number > 0 is invalid."""
        self._encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
        self._own_time = own_time

    def encode(
        self, events: Sequence[Event], first_seq: int | None = None
    ) -> tuple[bytes, list[tuple[Event, str]]]:
        """Return the JSON lines of the valid events, in order, each ending in ``\\n``,
        and every invalid event with a one-line reason.

        ``run_id`` and ``seq`` are the caller's to stamp and are not checked
        (``_STAMPED``); every other field is. With ``first_seq``, the events
        are numbered from it here, in the same pass as their check.
        """
        if _all_pass(events, first_seq, self._own_time):
            try:
                return self._encoder.encode_lines(events), []
            except Exception:  # a value the check let by that does not encode
                pass
        elif first_seq is not None:  # the check stopped short of the end
            for seq, ev in enumerate(events, first_seq):
                ev.seq = seq
        return self._encode_one_by_one(events)

    @staticmethod
    def prepare(classes: Iterable[type[Event]]) -> None:
        """Build the checks of ``classes`` now: a class's first batch pays for it
        otherwise (a millisecond or more, for ``trace_closed`` in a close)."""
        for cls in classes:
            _rules(cls)

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


def refusal(ev: Event) -> str | None:
    """Why the writer would count ``ev`` invalid for its own fields, or None.

    The envelope is left out: ``ev`` is not stamped yet (strict mode asks at
    ``emit``), and the tracer stamps it with values of the right types. The
    fast check first; only an event that fails it is encoded and read back.
    """
    rules = _rules(type(ev))
    try:
        passed = rules.run_own_time(ev, iter(()), None)[0] is True
    except Exception:  # a value nested past the recursion limit
        passed = False
    if passed:
        return None
    probe = copy.copy(ev)
    try:
        # A stamped envelope, as the writer would see it: only the event's own fields count.
        probe.time, probe.run_id, probe.seq = 1.0, "", -1
    except AttributeError:  # a frozen class: emit raises for it itself
        return None
    # An encoder of its own: emit may be called from any thread at once.
    bad = BatchEncoder(own_time=True)._encode_one_by_one([probe])[1]
    return bad[0][1] if bad else None


# "step_trained (seq 7): field 'step' must be ...": the field a reason names, if any.
_FIELD_OF = re.compile(r"^[^:]*: field '([^']*)'")


def field_of(reason: str) -> str | None:
    """The field a reason of this module names (None: the event as a whole)."""
    match = _FIELD_OF.match(reason)
    return match.group(1) if match else None


# --- the checks, one per class ----------------------------------------------------

# Every class checked so far: what it allows.
_RULES: dict[type[Any], _Rules] = {}
# The envelope fields the tracer stamps itself (with these types): no event
# can carry anything else there, so the checks leave them out. ``time`` comes
# from a clock, which may be the user's: checked, unless it is ``time.time``.
_STAMPED: dict[str, type[mi.Type]] = {"run_id": mi.StrType, "seq": mi.IntType}
_OWN_TIME: dict[str, type[mi.Type]] = {**_STAMPED, "time": mi.FloatType}


def _all_pass(events: Sequence[Event], seq: int | None = None, own_time: bool = False) -> bool:
    """Whether every event passes its class's fast check; with ``seq``, each
    is numbered on the way, from ``seq`` on.

    Each class's check walks the batch itself from where the last one stopped,
    up to the first event of another class, which it hands back: a batch of
    one class costs one call, not one per event, and one pass over the batch.
    """
    it = iter(events)
    stop: Any = next(it, True)
    try:
        while stop is not True:
            if stop is False:
                return False
            rules = _RULES.get(type(stop)) or _rules(type(stop))
            stop, seq = (rules.run_own_time if own_time else rules.run)(stop, it, seq)
    except Exception:  # a check that hit the recursion limit, say
        return False
    return True


def _rules(cls: type[Event]) -> _Rules:
    rules = _RULES.get(cls)
    if rules is None:
        rules = _RULES[cls] = _Rules(cls)
    return rules


class _Rules:
    """What one event class allows, as a fast check and as a diagnosis."""

    def __init__(self, cls: type[Event]) -> None:
        self.cls = cls
        self.fields: tuple[mi.Field, ...] = ()
        # Whether the class has the envelope's ``time`` (a plain float field).
        self._time = False
        self.check: _Check = _never
        self.run: _RunCheck = _never_run
        self.run_own_time: _RunCheck = _never_run
        self._decoder: msgspec.json.Decoder[Any] | None = None
        # Why no event of this class can be checked (and so written), if so.
        self._broken: str | None = None
        try:
            info = mi.type_info(cls)
            assert isinstance(info, mi.StructType)
            self._decoder = msgspec.json.Decoder(cls)
            self.check, self.run, self.run_own_time = _compile_checks(cls, info.fields)
        except Exception as exc:  # an annotation that does not resolve, say
            self._broken = f"its class {cls.__qualname__} cannot be read back: {exc}"
            return
        self.fields = info.fields
        self._by_encode_name = {f.encode_name: f for f in info.fields}
        self._time = any(f.name == "time" and _stamped(f, _OWN_TIME) for f in info.fields)

    def prefix(self, ev: Event) -> str:
        tag = self.cls.__struct_config__.tag
        # An event not numbered yet (strict mode checks it at emit) has no seq to name.
        return f"{tag} (seq {ev.seq})" if ev.seq >= 0 else f"{tag}"

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
        # A time that read back is a finite float (a NaN or an infinity is a
        # null, refused above); a reader also wants it > 0 (`envelope_problem`).
        if self._time and not back.time > 0.0:
            return (
                f"{self.prefix(ev)}: field 'time' must be a finite number > 0 (Unix "
                f"seconds from the tracer's clock), got {show(ev.time)}"
            )
        if b"null" in line:
            for f in self.fields:
                found = nan_behind_null(getattr(ev, f.name), getattr(back, f.name))
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
                    f"got {show(value)}: {field_exc}"
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
            found = non_finite_in(value)
            if found is not None:
                return self._non_finite(ev, f, found)
        allows = allowed(f.type)
        reason = f"{self.prefix(ev)}: field {f.name!r} must be {allows}, got {show(value)}"
        if match.group(2):  # msgspec's words point inside the value: keep them
            reason += f" ({detail})"
        return reason

    def _non_finite(self, ev: Event, f: mi.Field, found: Found) -> str:
        path, value = found
        if path:
            what = f"must hold finite numbers only, got {show(value)} at {path}"
        else:
            what = f"must be a finite number, got {show(value)}"
        return f"{self.prefix(ev)}: field {f.name!r} {what}: JSON cannot hold NaN or infinity"


# "... - at `$.group_ids[1]`": the field, and whether the path goes inside it.
_AT_FIELD = re.compile(r"at `\$\.([^.\[`]+)([^`]*)`")


def _compile_checks(
    cls: type[Any], fields: tuple[mi.Field, ...], seen: frozenset[type[Any]] = frozenset()
) -> tuple[_Check, _RunCheck, _RunCheck]:
    """A check that is True only for a struct whose values all fit ``fields``;
    the same check of a run of them (see ``_all_pass``); and that run again
    for events whose ``time`` came from ``time.time()``.

    Generated as straight-line tests: a loop over per-field closures would
    cost a call for each field of each event. An event's fields the tracer
    stamps itself are left out (``_STAMPED``; ``seen`` is empty for an event).
    """
    np_ints, np_floats = _numpy_scalars()
    namespace: dict[str, Any] = {
        "_deep_ok": _deep_ok,
        "_nums_ok": _nums_ok,
        "_isfinite": math.isfinite,
        "_BIG": _BIG,
        "_INF": math.inf,
        "_STR": _STR,
        "_INT": _INT,
        "_NP_INTS": np_ints,
        "_NP_FLOATS": np_floats,
        "_cls": cls,
        "_NONE": type(None),
    }
    every, own = [], []  # the tests of the fields: all, and but the time
    for f in fields:
        if not seen and _stamped(f, _STAMPED):
            continue
        if not f.name.isidentifier() or keyword.iskeyword(f.name):
            return _never, _never_run, _never_run
        if not seen and f.name == "time" and _stamped(f, _OWN_TIME):
            test: str | None = _time_test("ev.time")
        else:
            test = _test(f.type, f"ev.{f.name}", namespace, seen | {cls})
        if test is None:
            return _never, _never_run, _never_run
        every.append(f"({test})")
        if seen or not _stamped(f, _OWN_TIME):
            own.append(f"({test})")
    ok = " and ".join(every) or "True"
    # The run checks see every name they use as a local (a default of a
    # keyword-only argument): a global or builtin lookup per use costs a
    # tenth of a field's test.
    names = sorted({*_BUILTINS_USED, *(k for k in namespace if not k.startswith("__"))})
    binds = ", ".join(f"{n}={n}" for n in names)
    source = (
        f"def check(ev):\n    return bool({ok})\n"
        + _run_source("run", ok, binds)
        + _run_source("run_own_time", " and ".join(own) or "True", binds)
    )
    exec(compile(source, f"<rollout_trace check of {cls.__qualname__}>", "exec"), namespace)
    return namespace["check"], namespace["run"], namespace["run_own_time"]


# The builtins the tests of ``_test`` call.
_BUILTINS_USED = ("all", "bool", "dict", "float", "int", "list", "map", "set", "str", "type")


def _run_source(name: str, ok: str, binds: str) -> str:
    """A run check (``_RunCheck``) named ``name`` whose test of ``ev`` is ``ok``:
    numbering the events on the way (from ``seq``), or not (``seq`` None);
    ``binds`` makes the names it uses locals."""
    return (
        f"def {name}(ev, it, seq, *, {binds}):\n"
        f"    if seq is None:\n"
        f"        if not ({ok}):\n            return False, None\n"
        f"        for ev in it:\n"
        f"            if type(ev) is not _cls:\n                return ev, None\n"
        f"            if not ({ok}):\n                return False, None\n"
        f"        return True, None\n"
        f"    ev.seq = seq\n"
        f"    if not ({ok}):\n        return False, seq\n"
        f"    for ev in it:\n"
        f"        seq += 1\n"
        f"        if type(ev) is not _cls:\n            return ev, seq\n"
        f"        ev.seq = seq\n"
        f"        if not ({ok}):\n            return False, seq\n"
        f"    return True, seq + 1\n"
    )


def _time_test(v: str) -> str:
    """The test of an event's ``time`` from the user's clock: a finite number
    > 0, as every reader requires of a line (``envelope_problem``)."""
    return (
        f"(type({v}) is float and 0.0 < {v} < _INF or type({v}) is int and 0 < {v} < _BIG"
        f" or type({v}) in _NP_FLOATS and 0.0 < {v} < _INF)"
    )


def _stamped(f: mi.Field, skip: dict[str, type[mi.Type]]) -> bool:
    kind = skip.get(f.name)
    return kind is not None and isinstance(f.type, kind) and _plain(f.type)


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


def _never_run(ev: Any, it: Iterator[Any], seq: Any) -> tuple[bool, Any]:
    return False, seq


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
# How the checks name them (None: a name of its own).
_EXACT_NAMES: dict[type, str] = {str: "str", int: "int", bool: "bool", type(None): "_NONE"}
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
        found = [_EXACT.get(type(sub)) for sub in t.types if _plain(sub)]
        exact = [k for k in found if k is not None]
        if len(exact) == len(t.types):
            if len(exact) <= 3:  # int | str: a comparison or two (a set lookup costs more)
                return " or ".join(f"type({v}) is {_EXACT_NAMES[k]}" for k in exact)
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
        nested = _compile_checks(t.cls, t.fields, seen)[0]
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
