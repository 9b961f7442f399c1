"""What the SDK refuses before it writes a line no reader would take.

An event class whose msgspec options change what its line looks like, a
``meta`` holding NaN, a ``clock=`` that gives no Unix seconds: each used to be
written and counted written, and every reader skipped it.
"""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

import rollout_trace as rt
from rollout_trace._schema.registry import REGISTRY
from rollout_trace.testing import capture_events

# --- event classes whose lines no reader takes ------------------------------------


def _define(module_name: str, source: str) -> types.ModuleType:
    """Run ``source`` as the body of a fresh module named ``module_name``."""
    module = types.ModuleType(module_name)
    source = "import rollout_trace as rt\n" + source
    exec(compile(source, module_name, "exec", dont_inherit=True), vars(module))
    return module


# (a name, the class statement's options, words the refusal says of them)
BAD_OPTIONS = [
    ("array_like", "array_like=True, tag='refused_rows'", "array_like=True"),
    ("tag_field", "tag_field='kind', tag='refused_kind'", "tag_field='kind'"),
    ("no_tag", "tag=False", "tag=False"),
    # rename= renames only the fields a class declares: here, run_id again.
    ("renamed_envelope", "rename='camel', tag='refused_camel'", "'run_id' as 'runId'"),
    # The envelope retyped: the tracer stamps an int seq, readers sort by it.
    ("retyped_envelope", "tag='refused_seq'", "'seq' as <class 'str'>, not int"),
    # An explicit tag is read only after the class statement: a clash too.
    ("built_in_tag", "tag='step_trained'", "taken by class rollout_trace.StepTrained"),
]


def _lines(t: rt.SyncTracer) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in t.sinks[0].lines()]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "options", "said"), BAD_OPTIONS, ids=[o[0] for o in BAD_OPTIONS])
def test_emit_refuses_a_class_whose_lines_no_reader_takes(
    name: str, options: str, said: str
) -> None:
    module_name = f"refusals_{name}"
    with rt.sync_tracer("memory://") as t:
        # Defined after the open, as the last event class: only emit settles it.
        source = f"class Row(rt.Event, kw_only=True, {options}):\n    x: int\n"
        if "rename" in options:
            source += "    run_id: str = ''\n"
        if name == "retyped_envelope":
            source += "    seq: str = ''\n"
        cls = _define(module_name, source).Row
        for _ in range(2):  # refused every time, not only the first
            with pytest.raises(rt.EventTagError) as info:
                t.emit(cls(x=1))
            message = str(info.value)
            assert f"{module_name}.Row" in message and said in message
            assert isinstance(info.value, TypeError)
        t.emit(rt.WeightsSynced(weight_version=1))
    # Nothing of it was written or counted; the tracer went on.
    lines = _lines(t)
    assert [line["event"] for line in lines] == ["trace_opened", "weights_synced", "trace_closed"]
    assert lines[-1]["emitted"] == lines[-1]["written"] == 1
    # In no table: not emittable, not decoded into.
    assert cls not in REGISTRY.emit_types
    assert cls not in rt.event_types().values()
    assert cls not in REGISTRY.decodable_types().values()


def test_a_refusal_says_what_is_allowed() -> None:
    cls = _define("refusals_said", "class Grid(rt.Event, array_like=True):\n    x: int\n").Grid
    with pytest.raises(rt.EventTagError) as info:
        REGISTRY.emit_type(cls)
    message = str(info.value)
    assert "refusals_said.Grid" in message
    assert "object-like struct" in message and 'the field "event"' in message
    assert "a str tag no other class holds" in message
    assert info.value.classes == (cls,)


def test_a_refused_class_stops_neither_reading_nor_capture_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An array_like class in the union made msgspec refuse every decoder: every
    # read and capture in the process raised TypeError. Then the first read
    # after it raised EventTagError: a read has nothing to do with that class.
    path = tmp_path / "trace.jsonl"
    with rt.sync_tracer(str(path)) as t:
        t.emit(rt.WeightsSynced(weight_version=3))
    module = _define("refusals_reading", "class Packed(rt.Event, array_like=True):\n    x: int\n")
    # The first lookup after the class statement says so, once, as a warning.
    with caplog.at_level("WARNING", logger="rollout_trace"):
        assert [type(ev) for ev in rt.read([str(path)])][1] is rt.WeightsSynced
    assert [r.getMessage() for r in caplog.records if "Packed" in r.getMessage()] != []
    caplog.clear()
    assert [type(ev) for ev in rt.read([str(path)])] == [
        rt.TraceOpened,
        rt.WeightsSynced,
        rt.TraceClosed,
    ]
    with capture_events() as events, rt.sync_tracer("memory://") as t:
        t.emit(rt.WeightsSynced(weight_version=4))
        with pytest.raises(rt.EventTagError, match=r"refusals_reading\.Packed"):
            t.emit(module.Packed(x=1))
    assert events.without_envelope() == [rt.WeightsSynced(weight_version=4)]


def test_a_refused_class_is_told_at_the_next_class_statement_which_it_does_not_break(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As a taken explicit tag is: its options are final only after its own
    # class statement, so the next one hears of it, as a warning: that
    # statement (another library's import, say) once raised and was never run.
    module = _define("refusals_next", "class Loose(rt.Event, tag=False):\n    x: int\n")
    with caplog.at_level("WARNING", logger="rollout_trace"):
        fine = _define("refusals_after", "class Innocent(rt.Event):\n    x: int\n").Innocent
    told = [r.getMessage() for r in caplog.records]
    assert [m for m in told if "refusals_next.Loose" in m and "tag=False" in m] != [], told
    assert REGISTRY.emit_type(fine) is False
    with pytest.raises(rt.EventTagError, match=r"refusals_next\.Loose.*tag=False"):
        REGISTRY.emit_type(module.Loose)


def test_emit_type_settles_a_class_defined_last() -> None:
    module = _define(
        "refusals_last",
        "from typing import ClassVar\n"
        "class Alarm(rt.Event, tag='refusals_alarm'):\n"
        "    urgent: ClassVar[bool] = True\n"
        "    x: int\n",
    )
    # An explicit tag is known only once the class is finished: not emittable
    # through the tracers' fast path until the slow one settles it.
    assert module.Alarm not in REGISTRY.emit_types
    assert REGISTRY.emit_type(module.Alarm) is True
    assert REGISTRY.emit_types[module.Alarm] is True
    with rt.sync_tracer("memory://") as t:
        t.emit(module.Alarm(x=1))
    assert [line["event"] for line in _lines(t)][1] == "refusals_alarm"


@pytest.mark.parametrize("thing", [dict, int, rt.Event, msgspec.Struct, type(rt.WeightsSynced)])
def test_emit_type_of_what_is_no_event_class(thing: type) -> None:
    with pytest.raises(TypeError, match=r"takes a rollout_trace\.Event") as info:
        REGISTRY.emit_type(thing)
    assert not isinstance(info.value, rt.EventTagError)


# --- meta ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Opt:
    lr: float


@pytest.mark.parametrize(
    ("meta", "where", "shown"),
    [
        ({"lr": math.nan}, "meta['lr']", "nan"),
        ({"opt": {"betas": [0.9, math.inf]}}, "meta['opt']['betas'][1]", "inf"),
        ({"loss": np.array([1.0, -np.inf])}, "meta['loss'][1]", "-inf"),
        ({"opt": _Opt(lr=math.nan)}, "meta['opt'].lr", "nan"),
    ],
    ids=["top", "nested", "numpy", "dataclass"],
)
@pytest.mark.parametrize("make", [rt.sync_tracer, rt.tracer], ids=["sync", "async"])
def test_meta_with_nan_or_infinity_is_refused_when_the_tracer_is_made(
    make: Any, meta: dict[str, Any], where: str, shown: str
) -> None:
    # It used to be taken, and then trace_opened was quietly not written.
    with pytest.raises(ValueError, match="JSON cannot hold NaN or infinity") as info:
        make("memory://", meta=meta)
    message = str(info.value)
    assert message.startswith(f"{where} must be a finite number, got float {shown}")


# --- clock --------------------------------------------------------------------------


@pytest.mark.parametrize("first", [0.0, -1.0, 0, math.nan, math.inf])
def test_a_clock_that_starts_without_unix_seconds_is_refused(first: float) -> None:
    with pytest.raises(ValueError, match="finite number > 0") as info:
        rt.sync_tracer("memory://", clock=lambda: first)
    assert repr(first) in str(info.value)


def test_events_a_clock_stamps_with_no_unix_seconds_are_invalid(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    # Every reader skips a line whose time is not > 0: such an event is
    # invalid, not written and counted written.
    now = [100.0]
    with rt.sync_tracer("memory://", clock=lambda: now[0]) as t:
        for weight_version, when in enumerate([101.0, 0.0, 102.0, -1.0, 103.0]):
            now[0] = when
            t.emit(rt.WeightsSynced(weight_version=weight_version))
        now[0] = 104.0
    lines = _lines(t)
    assert [(line["event"], line["time"]) for line in lines] == [
        ("trace_opened", 100.0),
        ("weights_synced", 101.0),
        ("weights_synced", 102.0),
        ("weights_synced", 103.0),
        ("trace_closed", 104.0),
    ]
    closed = lines[-1]
    assert (closed["emitted"], closed["written"], closed["invalid"]) == (5, 3, 2)
    assert [line["seq"] for line in lines] == [0, 1, 3, 5, 6]  # the gaps: seq 2 and 4
    assert "field 'time' must be a finite number > 0" in trace_log.text
