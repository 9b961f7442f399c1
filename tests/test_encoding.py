"""The writer's checks: an event its own class would not read back is never written."""

from __future__ import annotations

import math
import sys
import types
from typing import Any, ClassVar, TypeVar

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from samples import ROLLOUT_SAMPLES

import rollout_trace as rt
from rollout_trace._schema import encoding
from rollout_trace._schema.decoding import decode_line
from rollout_trace._schema.encoding import BatchEncoder

NAN, INF = float("nan"), float("inf")
E = TypeVar("E", bound=rt.Event)


class Scored(rt.Event, tag="test_enc_scored"):
    """A user event with the field types the checks treat apart."""

    score: float = 0.0
    best: float | None = None
    values: dict[str, Any] = msgspec.field(default_factory=dict)
    extra: Any = None
    series: list[float] = msgspec.field(default_factory=list)
    urgent: ClassVar[bool] = True  # a class variable: not a field


def _at(seq: int, ev: E) -> E:
    """A copy of ``ev`` with the envelope a tracer would stamp."""
    return msgspec.structs.replace(ev, seq=seq, time=1.7e9, run_id="r" * 32)


def _dispatched(**fields: Any) -> rt.AttemptDispatched:
    base: dict[str, Any] = {
        "group_id": "g1",
        "prompt_id": 42,
        "generation_index": 0,
        "attempt": 0,
        "weight_version": 3,
    }
    return rt.AttemptDispatched(**{**base, **fields})


INVALID: list[tuple[rt.Event, str]] = [
    # A str in an int field.
    (
        rt.StepTrained(step="one", group_ids=[]),  # type: ignore[arg-type]
        "step_trained (seq 7): field 'step' must be int, got str 'one'",
    ),
    # A bool is not an int: msgspec reads `true` back only as a bool.
    (
        rt.StepTrained(step=True, group_ids=[]),
        "step_trained (seq 7): field 'step' must be int, got bool True",
    ),
    # A value outside a Literal.
    (
        rt.AttemptAbandoned(
            group_id="g",
            prompt_id=1,
            generation_index=0,
            attempt=0,
            reason="bogus",  # type: ignore[arg-type]
        ),
        "attempt_abandoned (seq 7): field 'reason' must be one of 'cancelled', 'dropped', "
        "'failed', 'restart', 'whole_group', got str 'bogus'",
    ),
    # A str in a float field.
    (
        rt.SnapshotPublished(step=1, path="/s", captured_at="x"),  # type: ignore[arg-type]
        "snapshot_published (seq 7): field 'captured_at' must be float, got str 'x'",
    ),
    # A float in an `int | str` field.
    (
        _dispatched(prompt_id=1.5),
        "attempt_dispatched (seq 7): field 'prompt_id' must be int | str, got float 1.5",
    ),
    # A str in an `int | None` field.
    (
        rt.GroupReserved(group_id="g", prompt_id=1, size=2, weight_version=0, target_step="3"),  # type: ignore[arg-type]
        "group_reserved (seq 7): field 'target_step' must be int | None, got str '3'",
    ),
    # A bad item in a list[str] field: msgspec's words say which.
    (
        rt.StepTrained(step=1, group_ids=["g1", 2]),  # type: ignore[list-item]
        "step_trained (seq 7): field 'group_ids' must be list[str], got list ['g1', 2] "
        "(Expected `str`, got `int` - at `$.group_ids[1]`)",
    ),
    # NaN in a float field: JSON would hold null.
    (
        rt.SnapshotPublished(step=1, path="/s", captured_at=NAN),
        "snapshot_published (seq 7): field 'captured_at' must be a finite number, got float nan: "
        "JSON cannot hold NaN or infinity",
    ),
    # An infinity in a float field.
    (
        rt.SnapshotPublished(step=1, path="/s", captured_at=-INF),
        "field 'captured_at' must be a finite number, got float -inf",
    ),
    # An infinity in a `float | None` field: its null would read back as None.
    (
        Scored(best=INF),
        "test_enc_scored (seq 7): field 'best' must be a finite number, got float inf",
    ),
    # NaN in a dict[str, Any] field.
    (
        Scored(values={"loss": 0.5, "kl": NAN}),
        "test_enc_scored (seq 7): field 'values' must hold finite numbers only, "
        "got float nan at ['kl']: JSON cannot hold NaN or infinity",
    ),
    # NaN nested in a list in an Any field.
    (
        Scored(extra={"runs": [{"reward": [1.0, NAN]}]}),
        "field 'extra' must hold finite numbers only, got float nan at ['runs'][0]['reward'][1]",
    ),
    # NaN inside a numpy array in an Any field (written through orjson).
    (
        Scored(extra=np.array([1.0, np.nan])),
        "field 'extra' must hold finite numbers only, got float nan at [1]",
    ),
    # NaN as a numpy scalar in a float field.
    (
        Scored(score=np.float32("nan")),
        "field 'score' must be a finite number, got float nan",
    ),
    # A bool among floats: msgspec reads `true` back only as a bool.
    (
        Scored(series=[0.5, True]),
        "test_enc_scored (seq 7): field 'series' must be list[float], got list [0.5, True]",
    ),
    # An infinity in a list[float] field.
    (
        Scored(series=[0.5, INF]),
        "field 'series' must hold finite numbers only, got float inf at [1]",
    ),
    # NaN in the user's run metadata.
    (
        rt.TraceOpened(sdk_version="1", pid=1, host="h", meta={"lr": NAN}),
        "trace_opened (seq 7): field 'meta' must hold finite numbers only, got float nan at ['lr']",
    ),
    # A value nothing can encode.
    (
        Scored(extra=object()),
        "test_enc_scored (seq 7): field 'extra' cannot be encoded as JSON, got object <object",
    ),
]


def _name(x: object) -> str | None:
    return type(x).__name__ if isinstance(x, rt.Event) else None


@pytest.mark.parametrize(("ev", "reason"), INVALID, ids=_name)
def test_an_event_its_own_class_refuses_is_not_written(ev: rt.Event, reason: str) -> None:
    ok, ev = _at(1, _dispatched()), _at(7, ev)
    data, bad = BatchEncoder().encode([ok, ev, ok])
    assert data == 2 * (msgspec.json.encode(ok) + b"\n")
    assert len(bad) == 1 and bad[0][0] is ev
    assert reason in bad[0][1]
    assert "\n" not in bad[0][1]  # one line, for the log


VALID: list[rt.Event] = [
    _dispatched(generation_index=np.int64(3)),  # a numpy int in an int field
    _dispatched(prompt_id="p-7"),  # the other half of `int | str`
    _dispatched(attempt=2**80),  # an int of any size
    rt.SnapshotPublished(step=1, path="/s", captured_at=1700000000),  # an int in a float field
    rt.SnapshotPublished(step=1, path="/s", captured_at=np.float64(1.5)),  # a float subclass
    rt.SnapshotPublished(step=np.uint8(1), path="/s", captured_at=np.float32(1.5)),  # numpy
    rt.GroupReserved(group_id="g", prompt_id=1, size=2, weight_version=0),  # a real null
    Scored(best=None, values={"lr": None, "tags": ["a"]}, extra=[None, 1.5]),  # nulls that are None
    Scored(extra={1, 2}),  # a set in an Any field
    Scored(extra={1: 2.5}),  # an int key, written as a string
    Scored(extra=np.arange(3.0)),  # a finite numpy array
    Scored(values={"xs": [0.5] * 100, "n": 3, "ok": True}),  # many finite floats
    Scored(series=[1, 2.5, 10**30]),  # ints in a list[float] field
]


@pytest.mark.parametrize("ev", VALID, ids=_name)
def test_values_that_read_back_are_written(ev: rt.Event) -> None:
    ev = _at(3, ev)
    data, bad = BatchEncoder().encode([ev])
    assert bad == []
    assert data == msgspec.json.encode(ev, enc_hook=encoding._enc_hook) + b"\n"
    msgspec.json.Decoder(type(ev)).decode(data)


def test_a_batch_keeps_the_order_of_its_valid_lines() -> None:
    events = [_at(i, _dispatched(attempt=i)) for i in range(10)]
    events[3].attempt = "three"  # type: ignore[assignment]
    events[8].prompt_id = None  # type: ignore[assignment]
    data, bad = BatchEncoder().encode(events)
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 9
    assert [msgspec.json.decode(line)["seq"] for line in lines[:-1]] == [0, 1, 2, 4, 5, 6, 7, 9]
    assert [(ev.seq, reason.split(":")[0]) for ev, reason in bad] == [
        (3, "attempt_dispatched (seq 3)"),
        (8, "attempt_dispatched (seq 8)"),
    ]


class Dated(rt.Event, tag="test_enc_dated"):
    """A field type the fast check does not cover: always the long way."""

    at: bytes = b""


def _mixed(kinds: str) -> list[rt.Event]:
    """One event per letter: d dispatched, s sealed, t step_trained, c scored,
    b bytes field, and upper case for an invalid one."""
    make: dict[str, Any] = {
        "d": lambda i: _dispatched(attempt=i),
        "s": lambda i: rt.AttemptSealed(group_id="g", prompt_id=i, generation_index=0, attempt=0),
        "t": lambda i: rt.StepTrained(step=i, group_ids=["g"]),
        "c": lambda i: Scored(score=i / 2, values={"i": i}),
        "b": lambda i: Dated(at=b"x"),
        "D": lambda i: _dispatched(attempt=str(i)),
        "T": lambda i: rt.StepTrained(step=i, group_ids=["g", None]),  # type: ignore[list-item]
        "C": lambda i: Scored(score=math.nan),
    }
    return [_at(i, make[k](i)) for i, k in enumerate(kinds)]


@pytest.mark.parametrize(
    "kinds",
    [
        "dddddddd",  # one class: one run
        "dsdsdsds",  # two classes taking turns: a run each
        "ddddssstttccdd",  # runs of several classes, one coming back
        "Dddddddd",  # invalid first
        "ddddDdddd",  # invalid inside a run
        "ddddsssT",  # invalid right after a change of class
        "dddddddD",  # invalid last
        "dCdTsD",  # several, of several classes
        "ddbdd",  # a class the fast check does not cover, inside a run
    ],
)
def test_a_batch_of_many_classes_writes_exactly_its_valid_events(kinds: str) -> None:
    events = _mixed(kinds)
    data, bad = BatchEncoder().encode(events)
    valid = [ev for ev, k in zip(events, kinds, strict=True) if k.islower()]
    assert data == b"".join(msgspec.json.encode(ev) + b"\n" for ev in valid)
    assert [ev.seq for ev, _ in bad] == [i for i, k in enumerate(kinds) if k.isupper()]


@pytest.mark.parametrize("ev", ROLLOUT_SAMPLES, ids=lambda ev: type(ev).__name__)
def test_built_in_events_pass_the_fast_check(ev: rt.Event) -> None:
    # The fast path: no built-in event needs the encode-and-decode check.
    assert encoding._rules(type(ev)).check(_at(1, ev)) is True


@pytest.mark.parametrize(
    "ev",
    [
        _dispatched(generation_index=np.int64(3)),  # a numpy int in an int field
        rt.SnapshotPublished(step=np.int32(1), path="/s", captured_at=np.float32(2.5)),
    ],
    ids=_name,
)
def test_numpy_scalars_pass_the_fast_check(ev: rt.Event) -> None:
    assert encoding._rules(type(ev)).check(_at(1, ev)) is True


def test_a_line_holding_null_is_not_decoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_second_look(*args: Any) -> str | None:
        raise AssertionError("a valid event took the long way")

    monkeypatch.setattr(encoding._Rules, "diagnose", no_second_look)
    events = [
        _at(1, rt.GroupReserved(group_id="g", prompt_id=1, size=2, weight_version=0)),
        _at(2, Scored(values={"lr": None}, extra=None)),
    ]
    data, bad = BatchEncoder().encode(events)
    assert bad == [] and data.count(b"null") == 4


# --- the checks agree with msgspec ------------------------------------------------

_VALUES = st.one_of(
    st.integers(),
    st.booleans(),
    st.none(),
    st.floats(),  # NaN and infinities included
    st.text(max_size=3),
    st.lists(st.one_of(st.text(max_size=2), st.integers(), st.floats(), st.booleans()), max_size=3),
    st.dictionaries(st.text(max_size=2), st.one_of(st.floats(), st.none()), max_size=2),
    st.integers(-5, 5).map(np.int64),
)


def _truth(ev: rt.Event) -> bool:
    """Valid: its own class reads its line back, and no NaN or infinity hides in a null."""
    try:
        msgspec.json.Decoder(type(ev)).decode(msgspec.json.encode(ev, enc_hook=encoding._enc_hook))
    except msgspec.ValidationError:
        return False
    return not _non_finite(msgspec.structs.asdict(ev))


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(map(_non_finite, value.values()))
    if isinstance(value, (list, tuple)):
        return any(map(_non_finite, value))
    return False


@settings(max_examples=300, deadline=None)
@given(template=st.sampled_from([*ROLLOUT_SAMPLES, Scored()]), data=st.data())
def test_the_writer_agrees_with_reading_back(template: rt.Event, data: st.DataObject) -> None:
    own = [f for f in template.__struct_fields__ if f not in rt.Event.__struct_fields__]
    name = data.draw(st.sampled_from(own))
    ev = msgspec.structs.replace(_at(1, template), **{name: data.draw(_VALUES)})
    out, bad = BatchEncoder().encode([ev])
    assert (out != b"") is _truth(ev) is (bad == []), (ev, bad)


def test_a_class_msgspec_cannot_resolve_stops_neither_writer_nor_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A user's annotation names something never defined: msgspec finds out
    # only when it inspects the class, long after the class statement.
    module = types.ModuleType("enc_unresolved")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    source = (
        "from __future__ import annotations\nimport rollout_trace as rt\n"
        "class Ghostly(rt.Event):\n    x: NotDefinedAnywhere\n"
    )
    exec(compile(source, module.__name__, "exec", dont_inherit=True), vars(module))
    ghost, ok = _at(2, module.Ghostly(x=1)), _at(1, _dispatched())
    data, bad = BatchEncoder().encode([ok, ghost])
    assert data == msgspec.json.encode(ok) + b"\n"
    assert bad[0][0] is ghost and "NotDefinedAnywhere" in bad[0][1]
    line = msgspec.json.encode(ghost)
    assert decode_line(line) == rt.UnknownEvent(
        event="ghostly", time=ghost.time, run_id=ghost.run_id, seq=2, fields={"x": 1}
    )
    assert type(decode_line(msgspec.json.encode(ok))) is rt.AttemptDispatched
