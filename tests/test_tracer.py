"""The async tracer (SPEC section 7): emit, flush, close, drops, failures, cancellation."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from samples import dispatched
from tracecheck import check_runs, only_run

import rollout_trace as rt
from sinks import MemorySink


def memory(t: rt.Tracer, i: int = 0) -> MemorySink:
    sink = t.sinks[i]
    assert isinstance(sink, MemorySink)
    return sink


async def test_fan_out_gives_every_sink_identical_lines(tmp_path: Path) -> None:
    async with rt.tracer("memory://", f"{tmp_path}/a.jsonl", batch_size=100) as t:
        for i in range(1_000):
            t.emit(dispatched(i))
        await t.flush()
        first = memory(t)
    data = first.getvalue()
    assert data == (tmp_path / "a.jsonl").read_bytes()
    run = only_run(data)
    assert run.closed is not None and run.closed["written"] == 1_000


@pytest.mark.usefixtures("plugins")
async def test_a_failing_sink_is_reported_once_and_the_others_keep_everything(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    async with rt.tracer("failing://?ok=2", "memory://", batch_size=10) as t:
        for i in range(500):
            t.emit(dispatched(i))
            if i % 50 == 0:
                await anyio.sleep(0)
        failing, good = t.sinks
    run = only_run(good.getvalue())  # type: ignore[attr-defined]
    assert run.closed is not None and run.closed["written"] == 500
    reports = [r for r in trace_log.records if "failing://?ok=2" in r.getMessage()]
    assert len(reports) == 1, [r.getMessage() for r in trace_log.records]
    assert "No space left on device" in reports[0].getMessage()
    assert reports[0].exc_info is None  # one line, no traceback
    assert failing.closed  # type: ignore[attr-defined]
    assert failing.writes == 3  # type: ignore[attr-defined] - 2 good, 1 failed, then none


@pytest.mark.parametrize(
    ("buffer", "burst", "dropped"),
    [
        (1_000, 5_000, 4_000),  # a burst 5x the buffer: the surplus is dropped
        (1_000, 1_000, 0),  # exactly the buffer: nothing dropped
        (65_536, 50_000, 0),  # the default buffer holds a 50k burst
    ],
)
async def test_a_burst_without_yielding_drops_only_the_surplus(
    buffer: int, burst: int, dropped: int, trace_log: pytest.LogCaptureFixture
) -> None:
    async with rt.tracer("memory://", buffer=buffer, batch_size=min(buffer // 4, 4096)) as t:
        for i in range(burst):  # never yields: the writer cannot run
            t.emit(dispatched(i))
        sink = memory(t)
    run = only_run(sink.getvalue(), allow_drops=True)
    assert run.closed is not None
    c = run.closed
    assert c["emitted"] == burst
    # The first batch also carries trace_opened, so one more event may drop.
    assert dropped <= c["dropped"] <= dropped + 1
    assert c["written"] + c["dropped"] == burst
    full = [r for r in trace_log.records if "is full" in r.getMessage()]
    assert len(full) == (1 if c["dropped"] else 0)


async def test_cancelling_the_task_still_writes_everything_and_trace_closed() -> None:
    box: dict[str, Any] = {}

    async def holder(task_status: anyio.abc.TaskStatus[None]) -> None:
        async with rt.tracer("memory://", batch_size=64) as t:
            box["sink"] = memory(t)
            for i in range(1_000):
                t.emit(dispatched(i))
            task_status.started()
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        await tg.start(holder)
        tg.cancel_scope.cancel()
    run = only_run(box["sink"].getvalue())
    assert run.closed is not None and run.closed["written"] == 1_000


async def test_an_exception_in_the_body_propagates_and_the_trace_is_closed() -> None:
    with pytest.raises(ZeroDivisionError):
        async with rt.tracer("memory://") as t:
            sink = memory(t)
            t.emit(dispatched(0))
            1 / 0  # noqa: B018
    run = only_run(sink.getvalue())
    assert run.closed is not None and run.closed["written"] == 1


async def test_flush_returns_when_everything_before_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    async with rt.tracer(str(path), flush_interval=60) as t:
        for round_ in range(3):
            for i in range(700):
                t.emit(dispatched(i))
            await t.flush()
            lines = path.read_bytes().splitlines()
            assert len(lines) == 1 + 700 * (round_ + 1)  # trace_opened + all so far


async def test_the_flush_interval_writes_a_partial_batch(tmp_path: Path) -> None:
    path = tmp_path / "i.jsonl"
    async with rt.tracer(str(path), flush_interval=0.05) as t:
        t.emit(dispatched(0))
        deadline = time.monotonic() + 5
        while len(path.read_bytes().splitlines()) < 2 and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        assert len(path.read_bytes().splitlines()) == 2


@pytest.mark.parametrize(
    "thing",
    [
        {"event": "attempt_dispatched"},  # a dict that looks like an event
        None,
        rt.AttemptDispatched,  # the class, not an instance
        msgspec.Struct(),  # a Struct that is not an Event
    ],
)
async def test_emitting_a_non_event_is_a_type_error(thing: Any) -> None:
    async with rt.tracer("memory://") as t:
        with pytest.raises(TypeError, match=r"takes an rollout_trace\.Event"):
            t.emit(thing)
        t.emit(dispatched(1))  # and the tracer goes on
        sink = memory(t)
    run = only_run(sink.getvalue())
    assert run.closed is not None and run.closed["emitted"] == 1


async def test_an_event_that_cannot_be_encoded_is_counted_invalid_once(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    class Odd(rt.Event, tag="odd_value"):
        value: Any

    async with rt.tracer("memory://") as t:
        t.emit(dispatched(0))
        t.emit(Odd(value=object()))
        t.emit(Odd(value={1, 2}))  # a set is fine
        t.emit(Odd(value=object()))
        t.emit(dispatched(1))
        sink = memory(t)
    run = only_run(sink.getvalue(), allow_drops=True)
    assert run.closed is not None
    assert (run.closed["emitted"], run.closed["written"], run.closed["invalid"]) == (5, 3, 2)
    assert [e["seq"] for e in run.events] == [1, 3, 5]
    invalid = [r for r in trace_log.records if "cannot be encoded" in r.getMessage()]
    assert len(invalid) == 1 and "odd_value" in invalid[0].getMessage()


async def test_emitting_one_object_twice_writes_two_lines() -> None:
    ev = rt.WeightsSynced(weight_version=1)
    async with rt.tracer("memory://") as t:
        t.emit(ev)
        t.emit(ev)
        sink = memory(t)
    run = only_run(sink.getvalue())
    assert [e["seq"] for e in run.events] == [1, 2]


async def test_after_close_everything_is_a_quiet_no_op(trace_log: pytest.LogCaptureFixture) -> None:
    t = rt.tracer("memory://")
    async with t:
        sink = memory(t)
    before = sink.getvalue()
    t.emit(dispatched(0))
    await t.flush()
    await t.aclose()
    assert sink.getvalue() == before
    assert trace_log.records == []


async def test_a_stale_emit_reference_after_close_does_not_grow_memory() -> None:
    t = rt.tracer("memory://", buffer=64, batch_size=16)
    async with t:
        emit = t.emit  # a caller that cached the bound emit
    for i in range(10_000):
        emit(dispatched(i))
    assert len(t._pending) <= 16


async def test_reopening_starts_a_new_run() -> None:
    t = rt.tracer("memory://")
    async with t:
        first = t.run_id
        t.emit(dispatched(0))
    async with t:
        assert t.run_id != first
        sink = memory(t)
    assert len(check_runs(sink.getvalue())) == 1


async def test_trace_opened_carries_meta_and_identity() -> None:
    async with rt.tracer("memory://", meta={"exp": "grpo-7b", "gpus": 8}) as t:
        sink = memory(t)
    opened = only_run(sink.getvalue()).opened
    assert opened["meta"] == {"exp": "grpo-7b", "gpus": 8}
    assert opened["sdk_version"] == rt.__version__
    assert opened["run_id"] == t.run_id


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"meta": {"x": object()}}, TypeError, "meta must be JSON-encodable"),
        ({"meta": {1: "x"}}, TypeError, "meta keys must be str"),
        ({"buffer": 0}, ValueError, "buffer must be > 0, got 0"),
        ({"flush_interval": -1}, ValueError, "flush_interval must be > 0"),
        ({"close_timeout": "1"}, TypeError, "close_timeout must be a float"),
        ({"batch_size": 1.5}, TypeError, "batch_size must be a int"),
    ],
)
def test_bad_settings_are_refused_at_once(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        rt.tracer("memory://", **kwargs)


@pytest.mark.usefixtures("plugins")
async def test_a_sink_that_cannot_open_raises_at_entry_and_closes_the_others() -> None:
    t = rt.tracer("memory://", "unopenable://")
    with pytest.raises(rt.SinkOpenError) as info:
        async with t:
            pytest.fail("the body must not run")
    assert info.value.uri == "unopenable://"
    assert "Permission denied" in str(info.value)
    assert isinstance(info.value.__cause__, PermissionError)
    assert t.sinks == []


async def test_a_disabled_tracer_does_nothing_and_pickles() -> None:
    t = rt.tracer("memory://", enabled=False)
    async with t:
        t.emit(dispatched(0))
        await t.flush()
        assert t.sinks == []
    clone = pickle.loads(pickle.dumps(t))
    assert clone.enabled is False
    assert not [v for v in vars(t).values() if isinstance(v, (anyio.abc.TaskGroup,))]


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        (None, False),  # unset: disabled
        ("", False),  # empty: disabled
        ("memory://", True),  # set: those sinks
    ],
)
async def test_no_uri_reads_rollout_trace_from_the_environment(
    env: str | None, enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("ROLLOUT_TRACE", raising=False)
    else:
        monkeypatch.setenv("ROLLOUT_TRACE", env)
    t = rt.tracer()
    assert t.enabled is enabled
    async with t:
        t.emit(dispatched(0))
        assert len(t.sinks) == int(enabled)


def test_a_bad_environment_value_fails_like_a_bad_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_TRACE", "memory://,ftp://x")
    with pytest.raises(rt.UnknownSchemeError, match="ftp"):
        rt.tracer()


async def test_an_enabled_tracer_pickles_as_its_configuration(tmp_path: Path) -> None:
    t = rt.tracer(f"{tmp_path}/{{run_id}}.jsonl", meta={"a": 1})
    async with t:
        t.emit(dispatched(0))
        blob = pickle.dumps(t)
    clone = pickle.loads(blob)
    async with clone:
        clone.emit(dispatched(1))
    assert clone.run_id != t.run_id
    assert len(list(tmp_path.glob("*.jsonl"))) == 2


@pytest.mark.usefixtures("plugins")
async def test_close_honours_its_deadline_with_a_slow_sink(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    t = rt.tracer("slow://?delay=0.5", batch_size=1, close_timeout=1.0)
    async with t:
        for i in range(20):
            t.emit(dispatched(i))
        start = time.monotonic()
    assert time.monotonic() - start < 2.0
    assert any(
        "close_timeout" in r.getMessage() or "took longer" in r.getMessage()
        for r in trace_log.records
    )


async def test_a_clock_of_ones_own_stamps_every_time() -> None:
    ticks = iter(range(1_000, 2_000))
    async with rt.tracer("memory://", clock=lambda: float(next(ticks))) as t:
        t.emit(dispatched(0))
        t.emit(dispatched(1))
        sink = memory(t)
    times = [o["time"] for o in check_runs(sink.getvalue())[t.run_id or ""].events]
    run = only_run(sink.getvalue())
    assert run.opened["time"] == 1_001.0  # the first tick checked the clock itself
    assert times == [1_002.0, 1_003.0]
    assert run.closed is not None and run.closed["time"] == 1_004.0


@pytest.mark.parametrize(
    ("clock", "words"),
    [
        ("now", "clock must be a callable"),  # not callable
        (lambda: "12:00", "must return a float"),  # wrong type
    ],
)
def test_a_bad_clock_is_refused(clock: Any, words: str) -> None:
    with pytest.raises(TypeError, match=words):
        rt.tracer("memory://", clock=clock)


async def test_a_flush_racing_close_returns() -> None:
    async with rt.tracer("memory://") as t:
        t.emit(dispatched(0))
        results: list[bool] = []

        async def flusher() -> None:
            with anyio.fail_after(5):
                results.append(await t.flush())

        async with anyio.create_task_group() as tg:
            tg.start_soon(flusher)
            tg.start_soon(t.aclose)
    assert len(results) == 1  # returned, True or False, never hung


async def test_aclose_inside_the_block_leaves_the_scopes_in_order() -> None:
    with anyio.move_on_after(30):
        async with rt.tracer("memory://") as t:
            t.emit(dispatched(0))
            await t.aclose()
    assert t.counts.written == 1


async def test_an_emit_held_from_before_the_open_writes_into_the_run() -> None:
    t = rt.tracer("memory://")
    emit = t.emit  # taken before `async with`
    async with t:
        for i in range(5):
            emit(dispatched(i))
        sink = memory(t)
    run = only_run(sink.getvalue())
    assert run.closed is not None and run.closed["written"] == 5


@pytest.mark.usefixtures("plugins")
async def test_a_flush_can_be_bounded_by_cancelling_it() -> None:
    async with rt.tracer("slow://?delay=1", close_timeout=1) as t:
        t.emit(dispatched(0))
        with anyio.move_on_after(0.2) as scope:
            await t.flush()
        assert scope.cancelled_caught
        assert await t.flush() is True


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),  # a NaN metric
        float("inf"),  # an infinity
        -float("inf"),
    ],
)
async def test_a_float_json_cannot_hold_is_counted_invalid(
    value: float, trace_log: pytest.LogCaptureFixture
) -> None:
    async with rt.tracer("memory://") as t:
        t.emit(rt.SnapshotPublished(step=1, path="/s", captured_at=value))
        t.emit(rt.GroupReserved(group_id="g", prompt_id=1, size=2, weight_version=0))  # a null
        sink = memory(t)
    run = only_run(sink.getvalue(), allow_drops=True)
    assert run.closed is not None
    assert (run.closed["written"], run.closed["invalid"]) == (1, 1)
    assert [e["event"] for e in run.events] == ["group_reserved"]
    assert any("NaN or infinity" in r.getMessage() for r in trace_log.records)
