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

import rollout_trace as rt
from sinks import MemorySink


def memory(t: rt.Tracer, i: int = 0) -> MemorySink:
    sink = t.sinks[i]
    assert isinstance(sink, MemorySink)
    return sink


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
    run = only_run(sink.getvalue(), allow_drops=True, uri="memory://")
    assert run.closed is not None
    c = run.closed
    assert c["emitted"] == burst
    assert c["dropped"] == dropped  # the buffer holds exactly `buffer` events
    assert c["written"] == len(run.events) == burst - dropped
    # The oldest events are kept, the newest dropped.
    assert [e["seq"] for e in run.events] == list(range(1, burst - dropped + 1))
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


@pytest.mark.parametrize(
    ("hold", "lent"),
    [
        # The sink's thread is behind without a turn of the GIL for longer than
        # two switch intervals (here: held between two of its calls, where a
        # thread waits for the GIL): the pump lends it the GIL (a short switch
        # interval) instead of putting the loop to sleep.
        ("between", True),
        # Held inside a write (a slow sink, a pipe nobody reads): a thread back
        # from a short call may be waiting for the GIL and is lent it, but a
        # call that lasts is a sink blocked in the system: the interval is put
        # back while it still hangs, not kept short for a sink that hangs.
        ("write", None),
        # Inside writes of 30 ms each: as far as the pump can tell, each may
        # have returned and be waiting for the GIL, so it is lent.
        ("short-write", True),
        # A sink that keeps up may or may not be lent it, briefly.
        (None, None),
    ],
)
async def test_a_sink_thread_without_a_turn_is_lent_the_gil_and_it_is_put_back(
    hold: str | None, lent: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_trace._internals import LEND_INTERVAL

    before = sys.getswitchinterval()
    intervals: list[float] = []
    real_set = sys.setswitchinterval

    def setswitchinterval(value: float) -> None:
        intervals.append(value)
        real_set(value)

    monkeypatch.setattr(sys, "setswitchinterval", setswitchinterval)
    loop_sleeps: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread() is threading.main_thread():
            loop_sleeps.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    release = threading.Event()
    async with rt.tracer("memory://", batch_size=16) as t:
        sink = memory(t)
        real_write = sink.write
        (runner,) = t._engine.runners
        real_progress = runner._on_progress
        wrote_events = threading.Event()

        def held_write(data: bytes) -> None:
            if b'"attempt_dispatched"' in data:
                if hold == "write":
                    release.wait(10)
                elif hold == "short-write":
                    release.wait(0.03)
                wrote_events.set()
            real_write(data)

        def held_progress() -> None:
            # Called by the sink's thread after each write, outside the call.
            if hold == "between" and wrote_events.is_set():
                release.wait(10)
            real_progress()

        sink.write = held_write  # type: ignore[method-assign]
        runner._on_progress = held_progress  # type: ignore[method-assign]
        for i in range(2_000):
            t.emit(dispatched(i))
            if i % 16 == 15:
                await anyio.sleep(0.0005)
        if hold == "write":
            assert wrote_events.wait(0) is False  # still inside its write
            for i in range(2_000, 2_050):  # a busy pump, for LEND_IN_CALL and more
                t.emit(dispatched(i))
                await anyio.sleep(0.01)
            assert sys.getswitchinterval() == pytest.approx(before)
        release.set()
    assert t.counts.written == (2_050 if hold == "write" else 2_000)
    if lent is not None:
        assert (LEND_INTERVAL in intervals) is lent, intervals
    assert sys.getswitchinterval() == pytest.approx(before)  # put back
    assert loop_sleeps == []
