"""What the folds give for values that only events built in Python carry.

msgspec does not check field types when an event is made, so a program's own
events can hold a NaN version or a group id that is a list. The folds take
them as they always did: the same figures, no new crash.
"""

from __future__ import annotations

import csv
import io
import math
from array import array
from pathlib import Path
from typing import Any

import msgspec

import rollout_trace as rt
from rollout_trace._report.table import columns_of, write_csv

RUN = "a" * 32
ONE = {"group_id": "g1", "generation_index": 0, "attempt": 0}


def _ev(cls: type[rt.Event], seq: int, **fields: Any) -> Any:
    return cls(time=100.0 + seq, run_id=RUN, seq=seq, **fields)


def _opened() -> Any:
    return _ev(rt.TraceOpened, 0, sdk_version="0.9.0", pid=1, host="h")


def test_a_nan_version_then_a_higher_one_judges_the_step_by_the_fold_in_order() -> None:
    # The highest version so far is folded pairwise in seq order: NaN first, then
    # 5, gives 5 (max over the same values would keep the NaN).
    events = [
        _opened(),
        _ev(rt.AttemptDispatched, 1, prompt_id=1, weight_version=math.nan, **ONE),
        _ev(rt.AttemptDispatched, 2, prompt_id=2, weight_version=5, **ONE),
        _ev(rt.AttemptSealed, 3, prompt_id=1, **ONE),
        _ev(rt.AttemptSealed, 4, prompt_id=2, **ONE),
        _ev(rt.StepTrained, 5, step=1, group_ids=["g1"]),
    ]
    ts = rt.analyze(events)
    assert ts.step_versions == [{5: 5}]
    (step,) = ts.health().runs[0].staleness.steps
    assert step.weight_version == 5


def test_a_group_id_that_is_a_list_with_no_step_after_it_is_not_looked_up() -> None:
    # A step looks up the groups it names; seals after the last step are never
    # filed by group, so an unhashable group id there breaks nothing.
    group = {"group_id": ["g"], "generation_index": 0, "attempt": 0}
    events = [
        _opened(),
        _ev(rt.AttemptDispatched, 1, prompt_id=1, weight_version=1, **group),
        _ev(rt.AttemptSealed, 2, prompt_id=1, **group),
    ]
    ts = rt.analyze(events)
    assert ts.health().attempts["sealed"] == 1
    assert [a.group_id for a in ts.attempts()] == [["g"]]
    out = io.StringIO()
    write_csv(columns_of(ts.timeline()), out)
    assert next(csv.DictReader(io.StringIO(out.getvalue())))["group_id"] == "['g']"


def test_a_group_id_that_is_a_list_in_the_run_a_step_looks_back_into_is_passed_over() -> None:
    # A stopped run sealed a try of a group whose id is a list (an event built in
    # Python); the restored run's step names a group, so the step looks back
    # into the stopped run's seals. No step can name a list: it is passed over
    # (it raised TypeError).
    import scenario

    listed = {"group_id": ["g"], "generation_index": 0, "attempt": 0}
    a = scenario.make_run(
        1,
        90.0,
        [
            (100.0, rt.AttemptDispatched(prompt_id=1, weight_version=1, **listed)),
            (101.0, rt.AttemptSealed(prompt_id=1, **listed)),
            (102.0, rt.AttemptDispatched(prompt_id=2, weight_version=1, **ONE)),
            (103.0, rt.AttemptSealed(prompt_id=2, **ONE)),
            (111.0, scenario.snapshot(1, "/s", captured_at=110.0)),
        ],
    )
    b = scenario.make_run(
        2,
        140.0,
        [
            (141.0, scenario.restore("/s", 1)),
            (143.0, scenario.restored(1)),
            (150.0, rt.StepTrained(step=1, group_ids=["g1"])),
        ],
        closed=200.0,
    )
    ts = rt.analyze(a + b)
    [step] = ts.health().runs[1].staleness.steps
    assert step.step == 1
    trained = ts.timeline_document()["traceEvents"]
    assert any(e.get("cat") == "step" for e in trained)
    assert rt.health_report(a + b).attempts["sealed"] == 2


def test_a_group_id_that_is_a_list_sealed_before_a_step_of_its_run_is_passed_over() -> None:
    # The step looks at its own run's seals of the groups it names: one whose
    # group id is a list (an event built in Python) is never among them (it
    # raised TypeError).
    listed = {"group_id": ["g"], "generation_index": 0, "attempt": 0}
    events = [
        _opened(),
        _ev(rt.AttemptDispatched, 1, prompt_id=1, weight_version=1, **listed),
        _ev(rt.AttemptSealed, 2, prompt_id=1, **listed),
        _ev(rt.AttemptDispatched, 3, prompt_id=2, weight_version=1, **ONE),
        _ev(rt.AttemptSealed, 4, prompt_id=2, **ONE),
        _ev(rt.StepTrained, 5, step=1, group_ids=["g1"]),
    ]
    ts = rt.analyze(events)
    assert ts.health().attempts["sealed"] == 2
    [step] = ts.health().runs[0].staleness.steps
    assert step.step == 1


def test_changing_a_timelines_try_columns_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    events = [
        _opened(),
        _ev(rt.AttemptDispatched, 1, prompt_id=1, weight_version=1, **ONE),
        _ev(rt.AttemptSealed, 2, prompt_id=1, **ONE),
    ]
    # Read from a file, the numbers are arrays (copies of the model's, for a timeline).
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(ev) + b"\n" for ev in events))
    ts = rt.analyze(str(path))
    before = ts.health()
    tries = ts.timeline().runs[0].tries
    for name in ("start_seq", "end_seq", "prompt_id", "generation_index", "attempt"):
        column = getattr(tries, name)
        assert isinstance(column, array), name
        column[0] = column[0] + 7
    for name in ("outcome", "group_id", "weight_version", "reason", "resumed_turn"):
        # Shared with the model, so they cannot be changed.
        assert isinstance(getattr(tries, name), tuple), name
    assert ts.health() == before


def test_a_csv_of_mixed_prompt_ids_writes_a_missing_one_as_null() -> None:
    # Ints and strs in one column are written as JSON text, each value alike.
    events = [
        _opened(),
        _ev(rt.AttemptDispatched, 1, prompt_id=7, weight_version=1, **ONE),
        _ev(rt.AttemptDispatched, 2, prompt_id="7", weight_version=1, **ONE),
        _ev(rt.AttemptDispatched, 3, prompt_id=None, weight_version=1, **ONE),
    ]
    out = io.StringIO()
    write_csv(columns_of(rt.analyze(events).timeline()), out)
    got = [row["prompt_id"] for row in csv.DictReader(io.StringIO(out.getvalue()))]
    assert got == ["7", '"7"', "null"]
