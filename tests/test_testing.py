from __future__ import annotations

import asyncio
import math
import types
from pathlib import Path

import pytest
from writing.harness import DRIVERS, IDS, Driver, Handle, Scenario

import rollout_trace as rt
from rollout_trace._writing import tracers
from rollout_trace.testing import capture_events


def controller_step(trace_uri: str) -> None:
    """User code under test: opens its own tracer, as a real controller would."""
    with rt.sync_tracer(trace_uri) as t:
        t.emit(rt.GroupReserved(group_id="g1", prompt_id=1, size=2, weight_version=0))
        t.emit(
            rt.AttemptDispatched(
                group_id="g1", prompt_id=1, generation_index=0, attempt=0, weight_version=0
            )
        )


def test_capture_events_sees_a_sync_tracer_and_writes_no_file(tmp_path: Path) -> None:
    with capture_events() as events:
        controller_step(f"{tmp_path}/never.jsonl")
    assert list(tmp_path.iterdir()) == []
    assert [type(e) for e in events] == [rt.GroupReserved, rt.AttemptDispatched]
    assert events.without_envelope() == [
        rt.GroupReserved(group_id="g1", prompt_id=1, size=2, weight_version=0),
        rt.AttemptDispatched(
            group_id="g1", prompt_id=1, generation_index=0, attempt=0, weight_version=0
        ),
    ]
    assert [e.seq for e in events] == [1, 2]
    assert [type(e).__name__ for e in events.all()][::3] == ["TraceOpened", "TraceClosed"]


def test_capture_events_sees_async_and_disabled_tracers() -> None:
    async def main() -> None:
        async with rt.tracer(enabled=False) as t:
            t.emit(rt.WeightsSynced(weight_version=7))
            await t.flush()

    with capture_events() as events:
        asyncio.run(main())
    assert events.of_type(rt.WeightsSynced)[0].weight_version == 7
    assert len(events) == 1


def test_outside_the_block_tracers_are_untouched(tmp_path: Path) -> None:
    with capture_events() as events:
        pass
    controller_step(f"{tmp_path}/real.jsonl")
    assert len(events) == 0
    assert (tmp_path / "real.jsonl").exists()


# --- strict mode: a test fails where the bad event is made ------------------------


class StrictRow(rt.Event, tag="testing_strict_row"):
    x: int


def _strict_scenario(caught: list[BaseException]) -> Scenario:
    async def scenario(h: Handle) -> None:
        for ev in (
            rt.StepTrained(step="one", group_ids=["g1"]),  # type: ignore[arg-type]
            rt.SnapshotPublished(step=1, path="s", captured_at=math.nan),
        ):
            with pytest.raises(rt.InvalidEventError) as info:
                h.emit(ev)
            caught.append(info.value)
        h.emit(rt.WeightsSynced(weight_version=2))  # a good one goes on as ever

    return scenario


def _check_refusals(caught: list[BaseException], counts: rt.TraceCounts) -> None:
    step, nan = caught
    assert isinstance(step, rt.InvalidEventError) and isinstance(step, ValueError)
    assert "step_trained: field 'step' must be int, got str 'one'" in str(step)
    assert isinstance(step.event, rt.StepTrained) and step.event.step == "one"
    assert "snapshot_published: field 'captured_at' must be a finite number, got float nan" in (
        str(nan)
    )
    # Refused at emit: neither written nor counted.
    assert (counts.emitted, counts.written, counts.invalid) == (1, 1, 0)


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_capture_events_strict_raises_at_emit_for_a_value_the_schema_refuses(
    driver: Driver,
) -> None:
    caught: list[BaseException] = []
    with capture_events(strict=True) as events:
        out = driver.run(["memory://"], _strict_scenario(caught))
    _check_refusals(caught, out.counts)
    assert events.without_envelope() == [rt.WeightsSynced(weight_version=2)]


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_strict_tracer_raises_at_emit_without_capture(driver: Driver) -> None:
    caught: list[BaseException] = []
    out = driver.run(["memory://"], _strict_scenario(caught), strict=True)
    _check_refusals(caught, out.counts)


def test_without_strict_the_event_is_counted_invalid_and_not_written() -> None:
    # What strict mode is for: this passes quietly, the event lost.
    with capture_events() as events, rt.sync_tracer() as t:
        t.emit(rt.StepTrained(step="one", group_ids=["g1"]))  # type: ignore[arg-type]
    assert len(events) == 0
    assert (t.counts.emitted, t.counts.invalid) == (1, 1)


def test_strict_refuses_a_class_whose_tag_another_class_holds() -> None:
    module = types.ModuleType("strict_tags")
    source = (
        "import rollout_trace as rt\n"
        "def define():\n"
        "    class Again(rt.Event, tag='testing_strict_again'):\n"
        "        x: int\n"
        "    return Again\n"
    )
    exec(compile(source, "strict_tags", "exec", dont_inherit=True), vars(module))
    old = module.define()
    new = module.define()  # the same class defined again: the tag is the new one's
    with capture_events(strict=True) as events, rt.sync_tracer() as t:
        with pytest.raises(rt.EventTagError) as info:
            t.emit(old(x=1))
        assert "testing_strict_again" in str(info.value) and "defined again" in str(info.value)
        assert info.value.classes == (new, old)
        t.emit(new(x=2))
        # A class another module holds the tag of: refused, strict or not.
        clash = types.ModuleType("strict_clash")
        exec(
            "import rollout_trace as rt\n"
            "class StrictRow(rt.Event, tag='testing_strict_row'):\n    x: int\n",
            vars(clash),
        )
        with pytest.raises(rt.EventTagError, match="is taken by class"):
            t.emit(clash.StrictRow(x=3))
        t.emit(StrictRow(x=4))
    assert [getattr(ev, "x", None) for ev in events] == [2, 4]


def test_strict_costs_nothing_when_off(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[object] = []
    monkeypatch.setattr(tracers, "refusal", lambda ev: asked.append(ev))
    with capture_events() as events, rt.sync_tracer("memory://") as t:
        plain = t.emit
        t.emit(rt.WeightsSynced(weight_version=1))
    assert asked == [] and len(events) == 1
    with capture_events(strict=True), rt.sync_tracer("memory://") as t:
        t.emit(rt.WeightsSynced(weight_version=1))
    assert len(asked) == 1
    # Off, emit is the plain closure itself: no wrapper, no flag tested per event.
    assert plain.__code__ is not t.emit.__code__
    assert "strict" not in plain.__code__.co_names + plain.__code__.co_freevars


def test_strict_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="strict must be a bool, not str"):
        rt.tracer("memory://", strict="yes")  # type: ignore[arg-type]
    with (
        pytest.raises(TypeError, match="strict must be a bool, not int"),
        capture_events(strict=1),  # type: ignore[arg-type]
    ):
        pass
