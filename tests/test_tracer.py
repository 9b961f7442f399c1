"""What only the async tracer does (README, Guarantees): a burst on the loop, cancellation,
flushes and closes from other tasks, emits before the open.

What both tracers promise is tested once, over every driver (asyncio, uvloop,
trio and the sync tracer), in tests/writing/test_promises.py.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import anyio
import pytest
from samples import dispatched
from tracecheck import only_run
from writing.harness import ASYNC_DRIVERS, Driver

import rollout_trace as rt
from rollout_trace.sinks import MemorySink


def memory(t: rt.Tracer, i: int = 0) -> MemorySink:
    sink = t.sinks[i]
    assert isinstance(sink, MemorySink)
    return sink


@pytest.mark.parametrize(
    ("buffer", "burst", "dropped"),
    [
        (1_000, 5_000, 4_000),  # a burst 5x the buffer: at most the surplus is dropped
        (1_000, 1_000, 0),  # exactly the buffer: nothing dropped
        (65_536, 50_000, 0),  # the default buffer holds a 50k burst
    ],
)
async def test_a_burst_without_yielding_drops_only_the_surplus(
    buffer: int, burst: int, dropped: int, trace_log: pytest.LogCaptureFixture
) -> None:
    async with rt.tracer("memory://", buffer=buffer, batch_size=min(buffer // 4, 4096)) as t:
        for i in range(burst):  # never yields: the writer thread takes what it can meanwhile
            t.emit(dispatched(i))
        sink = memory(t)
    run = only_run(sink.getvalue(), allow_drops=True, uri="memory://")
    assert run.closed is not None
    c = run.closed
    assert c["emitted"] == burst
    assert c["dropped"] <= dropped  # the queue holds `buffer` events at any time
    assert c["written"] == len(run.events) == burst - c["dropped"]
    # Every dropped event has a seq of the run that no line has.
    seqs = [e["seq"] for e in run.events]
    assert seqs == sorted(set(seqs))
    assert len(set(range(1, burst + 1)) - set(seqs)) == c["dropped"]
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


async def test_after_close_flush_and_aclose_change_nothing(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    t = rt.tracer("memory://")
    async with t:
        t.emit(dispatched(0))
        sink = memory(t)
    before = sink.getvalue()
    assert await t.flush() is True  # nothing emitted to the run was lost
    await t.aclose()
    await t.aclose()
    assert sink.getvalue() == before
    assert t.state == "closed"
    assert trace_log.records == []


async def test_an_emit_before_the_open_is_counted_and_said_once(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    t = rt.tracer("memory://")
    for i in range(3):
        t.emit(dispatched(i))  # the async tracer opens only with `async with`
    assert t.counts.outside_run == 3
    assert await t.flush() is False  # those three are not written anywhere
    reports = [r.getMessage() for r in trace_log.records]
    assert len(reports) == 1 and "not open yet" in reports[0], reports
    async with t:
        t.emit(dispatched(3))
        sink = memory(t)
    run = only_run(sink.getvalue(), uri="memory://")
    assert [e["seq"] for e in run.events] == [1]  # the run counts its own emits only
    assert t.counts.outside_run == 3


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


@pytest.mark.usefixtures("plugins")
async def test_a_flush_can_be_bounded_by_cancelling_it() -> None:
    # Each write takes 0.5 s, well within the 5 s one call may take.
    async with rt.tracer("slow://?delay=0.5", close_timeout=5) as t:
        t.emit(dispatched(0))
        with anyio.move_on_after(0.2) as scope:
            await t.flush()
        assert scope.cancelled_caught
        assert await t.flush() is True


@pytest.mark.parametrize(
    ("hold", "buffer"),
    [
        # The sink's thread stays inside a write: it falls more than the buffer
        # behind. Its batches are lost (counted), and the loop never waits for it.
        (True, 64),
        # A sink within the buffer of the program.
        (False, 65_536),
    ],
)
async def test_the_pump_never_puts_the_loop_to_sleep_for_a_sink(
    hold: bool, buffer: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once the pump slept a millisecond in ten on the loop (GIL and all) to
    # lend the GIL to a sink's thread that was far behind.
    real_sleep = time.sleep
    loop_sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        if threading.current_thread() is threading.main_thread():
            loop_sleeps.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    release = threading.Event()
    async with rt.tracer("memory://", buffer=buffer, batch_size=16) as t:
        sink = memory(t)
        real_write = sink.write

        def held_write(data: bytes) -> None:
            if hold:
                release.wait(10)
            real_write(data)

        sink.write = held_write  # type: ignore[method-assign]
        for i in range(2_000):
            t.emit(dispatched(i))
            if i % 16 == 15:
                await anyio.sleep(0)
        assert loop_sleeps == []
        release.set()
    c = t.counts
    assert c.emitted == 2_000 and c.written + c.dropped == 2_000, c
    assert (c.dropped > 0) is hold, c


@pytest.mark.parametrize("write_s", [0.0, 0.03])
async def test_a_busy_loop_gets_everything_written_without_touching_the_switch_interval(
    write_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy loop drops and retakes the GIL at every poll of its selector, so
    # a thread waiting for it may wait as long as the loop stays busy. Once
    # the tracer answered that by setting the process's switch interval to
    # 10 us (every thread of the host then switched 50 times as often); a
    # library must leave interpreter-wide settings alone. Writes of 30 ms (a
    # slow sink) were the case that set it.
    intervals: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", intervals.append)  # recorded, never applied
    async with rt.tracer("memory://", batch_size=16) as t:
        sink = memory(t)
        real_write = sink.write

        def slow_write(data: bytes) -> None:
            time.sleep(write_s)
            real_write(data)

        sink.write = slow_write  # type: ignore[method-assign]
        for i in range(2_000):
            t.emit(dispatched(i))
            if i % 16 == 15:
                await anyio.sleep(0.0005)
    assert intervals == []
    c = t.counts
    assert c.emitted == c.written == 2_000, c
    assert len(sink.lines()) == 2_002


def test_a_plain_with_on_the_async_tracer_says_what_to_use() -> None:
    t = rt.tracer("memory://")
    with pytest.raises(TypeError) as info, t:
        pass
    message = str(info.value)
    assert "async with rt.tracer(...)" in message and "rt.sync_tracer(...)" in message
    assert t.state == "new"  # nothing was opened


@pytest.mark.parametrize("driver", ASYNC_DRIVERS, ids=[d.name for d in ASYNC_DRIVERS])
def test_async_with_on_the_sync_tracer_says_what_to_use(driver: Driver) -> None:
    t = rt.sync_tracer("memory://")

    async def main() -> None:
        with pytest.raises(TypeError) as info:
            async with t:
                pass
        message = str(info.value)
        assert "with rt.sync_tracer(...)" in message and "async with rt.tracer(...)" in message

    driver.call(main)
    assert t.state == "new"


def test_each_kind_of_schema_error_is_said_once(trace_log: pytest.LogCaptureFixture) -> None:
    # Once for each event class and field, not only the tracer's first: a
    # second mistake is not hidden behind the first.
    with rt.sync_tracer("memory://") as t:
        for _ in range(3):
            t.emit(rt.StepTrained(step="one", group_ids=["g"]))  # type: ignore[arg-type]
            t.emit(rt.StepTrained(step=1, group_ids=[1]))  # type: ignore[list-item]
            t.emit(rt.WeightsSynced(weight_version="v2"))  # type: ignore[arg-type]
    said = [
        r.getMessage() for r in trace_log.records if "does not fit its schema" in r.getMessage()
    ]
    assert len(said) == 3, said
    assert "step_trained (seq 1): field 'step' must be int, got str 'one'" in said[0]
    assert "step_trained (seq 2): field 'group_ids' must be list[str]" in said[1]
    assert "weights_synced (seq 3): field 'weight_version' must be int" in said[2]
    assert t.counts.invalid == 9
