from __future__ import annotations

import asyncio
from pathlib import Path

import rollout_trace as rt
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
