"""What both tracers promise (README "Guarantees" and "Reference"), each
promise tested once, over every driver: the async tracer under asyncio, uvloop
and trio, and the sync tracer.

Counts are always checked against what is really in each sink's output: the
lines of each run are counted there, never a figure computed as a remainder.
"""

from __future__ import annotations

import asyncio
import collections
import gzip
import json
import math
import os
import pickle
import signal
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from deadlines import WatchedClock, advancing
from harness import ASYNC_DRIVERS, DRIVERS, IDS, Driver, Handle, run_child
from samples import dispatched
from tracecheck import check_runs, only_run, parse_lines

import rollout_trace as rt
from rollout_trace._writing.engine import DRAIN_SHARE
from rollout_trace.testing import MockClock

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
drivers = pytest.mark.parametrize("driver", DRIVERS, ids=IDS)


def read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def said(trace_log: pytest.LogCaptureFixture, *words: str) -> list[str]:
    """What the `rollout_trace` logger said at WARNING or above with every one of ``words``."""
    return [
        r.getMessage()
        for r in trace_log.records
        if r.levelno >= 30 and all(w in r.getMessage() for w in words)
    ]


def tally(run: Any, uri: str) -> dict[str, Any]:
    """The sink ``uri``'s own entry in the run's ``trace_closed.sinks``."""
    assert run.closed is not None, "the run did not close cleanly"
    (entry,) = [s for s in run.closed["sinks"] if s["uri"] == uri]
    return entry  # type: ignore[no-any-return]


def outside_run(counts: rt.TraceCounts) -> int | None:
    return getattr(counts, "outside_run", None)


class MetricsSampled(rt.Event, tag="promises_metrics_sampled"):
    values: dict[str, Any]


class BlobSampled(rt.Event, tag="promises_blob_sampled"):
    data: Any


class Frozen(rt.Event, tag="promises_frozen", frozen=True):
    x: int


# --- 1. `written` is what the sinks acknowledged --------------------------------


@needs_dev_full
@drivers
def test_written_counts_only_what_a_sink_acknowledged(
    driver: Driver, trace_log: pytest.LogCaptureFixture
) -> None:
    async def scenario(h: Handle) -> tuple[bool, rt.TraceCounts]:
        for i in range(1_000):
            h.emit(dispatched(i))
        flushed = await h.flush()
        return flushed, h.counts

    # A clock that never moves: a close that waited for its deadline would
    # never return (the test's timeout fails it).
    out = driver.run(["jsonl:///dev/full"], scenario, close_timeout=5, deadline_clock=MockClock())
    flushed, during = out.value
    assert during.written == 0, during  # nothing reached /dev/full
    assert flushed is False
    c = out.counts
    assert (c.emitted, c.written, c.dropped, c.invalid) == (1_000, 0, 1_000, 0), c
    assert c.emitted == c.written + c.dropped + c.invalid
    # It failed at once (trace_opened, then trace_closed cannot be written
    # there either); said once, with the URI and the reason, and the close
    # does not wait for it.
    reports = said(trace_log, "jsonl:///dev/full")
    assert len(reports) == 1, reports
    assert "No space left on device" in reports[0]


@needs_dev_full
@drivers
def test_a_full_disk_costs_the_other_sink_nothing(
    driver: Driver, tmp_path: Path, trace_log: pytest.LogCaptureFixture
) -> None:
    good = tmp_path / "good.jsonl"

    async def scenario(h: Handle) -> None:
        for i in range(1_000):
            h.emit(dispatched(i))
            if i % 100 == 0:
                await h.sleep(0)

    out = driver.run(["jsonl:///dev/full", str(good)], scenario, batch_size=64)
    c = out.counts
    assert (c.emitted, c.written, c.dropped, c.invalid) == (1_000, 1_000, 0, 0), c
    run = only_run(read(good), uri=str(good))
    assert [e["seq"] for e in run.events] == list(range(1, 1_001))
    assert run.closed is not None
    assert run.closed["written"] == 1_000
    assert tally(run, str(good)) == {"uri": str(good), "written": 1_000, "error": None}
    full = tally(run, "jsonl:///dev/full")
    assert full["written"] == 0 and "No space left on device" in full["error"]
    assert len(said(trace_log, "jsonl:///dev/full")) == 1
    assert said(trace_log) == said(trace_log, "jsonl:///dev/full")  # nothing else said


# --- 2. flush() is True only when every live sink wrote everything before it ------


def _steady(h: Handle) -> None:
    for i in range(100):
        h.emit(dispatched(i))


def _burst(h: Handle) -> None:
    for i in range(100_000):  # never yields: the buffer of 8 overflows
        h.emit(dispatched(i))


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    ("uris", "kwargs", "emit", "expected", "reason"),
    [
        # One sink that wrote every event: True, every time.
        (["memory://"], {}, _steady, [True, True], None),
        # Two sinks, many small batches, both complete: True.
        (["memory://", "null://"], {"batch_size": 16}, _steady, [True, True], None),
        # A burst overflows the buffer: False, and every later flush too (the
        # dropped events were emitted before it).
        (["memory://"], {"buffer": 8, "batch_size": 4}, _burst, [False, False], "dropped"),
        # The only sink fails on its first batch of events (trace_opened was
        # its one good write): no live sink is left.
        (["failing://?ok=1"], {}, _steady, [False, False], "failing"),
        # One of two sinks fails: the other, the only live one, is complete,
        # whenever the failure was noticed (it is reported, and in
        # trace_closed.sinks): True.
        (["failing://?ok=1", "memory://"], {}, _steady, [True, True], "failing"),
    ],
    ids=["one-sink", "two-sinks", "drop", "only-sink-fails", "one-of-two-fails"],
)
@drivers
def test_flush_says_whether_every_live_sink_wrote_everything(
    driver: Driver,
    uris: list[str],
    kwargs: dict[str, Any],
    emit: Callable[[Handle], None],
    expected: list[bool],
    reason: str | None,
) -> None:
    async def scenario(h: Handle) -> list[bool]:
        results = []
        for _ in expected:
            emit(h)
            results.append(await h.flush())
        return results

    out = driver.run(uris, scenario, **kwargs)
    c = out.counts
    if reason == "dropped":
        assert c.dropped > 0, c  # the burst did overflow
    assert out.value == expected, c


# --- 3. a hung or slow sink costs the others nothing ------------------------------

# Fewer bytes than any weights_synced line of a run takes (its run_id alone is 32).
_MIN_LINE = 100


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    ("uri", "kwargs", "flush_every"),
    [
        # Never returns from its second write: given up after close_timeout,
        # the first flush waiting that long, the later ones not at all.
        pytest.param("stuck://?ok=1", {}, 5_000, id="stuck"),
        # 0.2 s per write: it falls behind and loses batches of its own; the
        # close gives it up at the deadline.
        pytest.param("slow://?delay=0.2", {}, None, id="slow"),
        # The same with flushes, each waiting for it: big batches keep them
        # few, but it takes about 5 s.
        pytest.param(
            "slow://?delay=0.2",
            {"batch_size": 32_768},
            50_000,
            id="slow-flushed",
            marks=pytest.mark.slow,
        ),
    ],
)
@drivers
def test_a_hung_or_slow_sink_costs_the_others_no_event(
    driver: Driver,
    uri: str,
    kwargs: dict[str, Any],
    flush_every: int | None,
    tmp_path: Path,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "good.jsonl"
    n = 200_000

    async def keep_pace(h: Handle, emitted: int) -> None:
        # The good sink is given the time it needs to stay within half its
        # buffer of the emits (a thread emitting flat out on a loaded machine
        # can outrun any writer: that is the speed issue's, not this promise).
        # Held up by the other sink instead, it never gets there and the
        # deadline ends the wait, with events lost.
        want = _MIN_LINE * (emitted - 50_000)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            await h.sleep(0.002)
            if (path.stat().st_size if path.exists() else 0) >= want:
                return

    stuck = uri.startswith("stuck")
    clock = WatchedClock()

    async def scenario(h: Handle) -> None:
        ev = rt.WeightsSynced(weight_version=0)
        for i in range(n):
            h.emit(ev)
            if flush_every and (i + 1) == flush_every and stuck:
                # The first flush waits until the hung call has lasted
                # longer than close_timeout; the later ones not at all.
                hung = h.tracer.sinks[0].hung  # type: ignore[attr-defined]
                with advancing(clock, 1.0 + 1e-6, ready=hung.is_set):
                    await h.flush()
            elif flush_every and (i + 1) % flush_every == 0:
                await h.flush()
            elif (i + 1) % 5_000 == 0:
                await keep_pace(h, i + 1)

    out = driver.run(
        [uri, str(path)],
        scenario,
        close_timeout=1,
        deadline_clock=clock,
        # The close has one deadline, hung sink or not: the slow sink is
        # given up at the end of the drain's share of it, the clock moved
        # there and no further (the hung sink was given up before).
        closing=None
        if stuck
        else lambda: advancing(clock, DRAIN_SHARE * 1.0, early=False, must_wait=False),
        **kwargs,
    )
    run = only_run(read(path), uri=str(path), allow_drops=True)
    assert len(run.events) == n
    assert [e["seq"] for e in run.events] == list(range(1, n + 1))
    assert tally(run, str(path)) == {"uri": str(path), "written": n, "error": None}
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (n, n, 0), c
    if stuck:
        mine = tally(run, uri)
        assert mine["written"] == 0 and "longer than 1 s" in mine["error"], mine
        assert said(trace_log, uri, "stopped")


# --- 4. values the schema does not allow are invalid, never written ----------------


@pytest.mark.parametrize(
    ("make", "tag", "field"),
    [
        # a str in an int field
        (lambda: rt.StepTrained(step="one", group_ids=[]), "step_trained", "step"),
        # a reason outside its Literal
        (
            lambda: rt.AttemptAbandoned(
                group_id="g", prompt_id=1, generation_index=0, attempt=0, reason="bogus"
            ),
            "attempt_abandoned",
            "reason",
        ),
        # a str in a float field
        (
            lambda: rt.SnapshotPublished(step=1, path="p", captured_at="x"),
            "snapshot_published",
            "captured_at",
        ),
        # NaN in a float field (msgspec would write null)
        (
            lambda: rt.SnapshotPublished(step=1, path="p", captured_at=math.nan),
            "snapshot_published",
            "captured_at",
        ),
        # an infinity in a float field
        (
            lambda: rt.SnapshotPublished(step=1, path="p", captured_at=-math.inf),
            "snapshot_published",
            "captured_at",
        ),
        # NaN inside a dict[str, Any] field of a user's event
        (
            lambda: MetricsSampled(values={"loss": 0.5, "kl": math.nan}),
            "promises_metrics_sampled",
            "values",
        ),
        # NaN inside a list inside an Any field
        (
            lambda: BlobSampled(data={"curve": [1.0, 2.0, math.inf]}),
            "promises_blob_sampled",
            "data",
        ),
        # something JSON cannot hold at all
        (lambda: BlobSampled(data=object()), "promises_blob_sampled", "data"),
    ],
    ids=[
        "str-for-int",
        "bad-literal",
        "str-for-float",
        "nan",
        "infinity",
        "nan-in-dict-any",
        "inf-in-list-in-any",
        "object",
    ],
)
@drivers
def test_a_value_the_schema_refuses_is_counted_invalid_and_said_once(
    driver: Driver,
    make: Callable[[], rt.Event],
    tag: str,
    field: str,
    tmp_path: Path,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "t.jsonl"
    good: list[Callable[[], rt.Event]] = [
        lambda: dispatched(0),
        # a null that was None, finite metrics, a set: all fine
        lambda: rt.GroupReserved(group_id="g", prompt_id=1, size=2, weight_version=0),
        lambda: MetricsSampled(values={"loss": 0.5, "step": 3, "tags": ["a"]}),
        lambda: BlobSampled(data={1, 2}),
    ]

    async def scenario(h: Handle) -> None:
        for i in range(3):
            h.emit(good[i % len(good)]())  # seqs 1, 3, 5: good
            h.emit(make())  # seqs 2, 4, 6: bad
        h.emit(good[3]())  # seq 7

    out = driver.run([str(path)], scenario)
    c = out.counts
    assert (c.emitted, c.written, c.invalid, c.dropped) == (7, 4, 3, 0), c
    run = only_run(read(path), uri=str(path), allow_drops=True)
    assert [e["seq"] for e in run.events] == [1, 3, 5, 7]
    assert run.closed is not None and run.closed["invalid"] == 3
    reports = said(trace_log)
    assert len(reports) == 1, reports
    assert tag in reports[0] and repr(field) in reports[0], reports[0]


# --- 5. emits on a closed tracer are counted and said once --------------------------


@drivers
def test_emits_on_a_closed_tracer_are_counted_said_once_and_kept_nowhere(
    driver: Driver, tmp_path: Path, trace_log: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    late = 100_000
    kept: list[Callable[[rt.Event], None]] = []

    async def scenario(h: Handle) -> None:
        for i in range(3):
            h.emit(dispatched(i))
        kept.append(h.tracer.emit)  # a caller that keeps the open run's emit

    async def after(h: Handle) -> int:
        h.emit(dispatched(3))  # through the closed tracer
        h.emit(dispatched(4))
        (stale,) = kept
        ev = rt.WeightsSynced(weight_version=1)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(late):  # through the kept reference
                stale(ev)
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()

    out = driver.run([str(path)], scenario, after=after)
    # 100k events kept anywhere (a list, a queue) would be megabytes.
    assert out.after < 1_000_000, out.after
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (3, 3, 0), c
    assert outside_run(c) == 2 + late, c
    run = only_run(read(path), uri=str(path))
    assert len(run.events) == 3
    reports = said(trace_log)
    assert len(reports) == 1 and "closed" in reports[0], reports


# --- 6. memory:// is readable after the close ---------------------------------------


@drivers
def test_a_memory_sink_is_readable_after_the_close(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        for i in range(10):
            h.emit(dispatched(i))

    out = driver.run(["memory://"], scenario)
    lines = out.tracer.sinks[0].lines()  # type: ignore[attr-defined]
    assert len(lines) == 12  # trace_opened, 10 events, trace_closed
    run = only_run(b"".join(line + b"\n" for line in lines), uri="memory://")
    assert [e["seq"] for e in run.events] == list(range(1, 11))


# --- 7. a file deleted or moved away is made again ----------------------------------


@pytest.mark.parametrize(
    "suffix",
    [
        ".jsonl",  # plain
        ".jsonl.gz",  # compressed: each write a whole member, in whichever file
    ],
)
@pytest.mark.parametrize(
    "how",
    [
        "rename",  # moved away, as logrotate does
        "delete",  # removed: what it held is gone, the rest is in the new file
    ],
)
@drivers
def test_a_file_moved_or_deleted_while_written_is_made_again(
    driver: Driver, how: str, suffix: str, tmp_path: Path, trace_log: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / f"t{suffix}"
    moved = tmp_path / f"t.1{suffix}"

    async def scenario(h: Handle) -> None:
        for i in range(100):
            h.emit(dispatched(i))
        assert await h.flush()
        if how == "rename":
            path.rename(moved)  # as logrotate does
        else:
            path.unlink()
        for i in range(100, 200):
            h.emit(dispatched(i))
        await h.flush()

    out = driver.run([str(path)], scenario)
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (200, 200, 0), c
    new = read(path)
    if how == "rename":
        # The old file and the new one hold the run between them, each line once.
        old = read(moved)
        assert len(old.splitlines()) == 101  # trace_opened and the first 100
        run = only_run(old + new, uri=str(path))
        assert [e["seq"] for e in run.events] == list(range(1, 201))
    else:
        objs = parse_lines(new)
        assert [o["seq"] for o in objs[:-1]] == list(range(101, 201))
        assert objs[-1]["event"] == "trace_closed"
        assert objs[-1]["sinks"] == [{"uri": str(path), "written": 200, "error": None}]
    reports = said(trace_log, str(path))
    assert len(reports) == 1 and "new file" in reports[0], said(trace_log)


@pytest.mark.parametrize(
    ("steps", "looks", "lines"),
    [
        # Batches that follow each other: the path is looked at once, not per
        # batch (each look is a system call, and a turn of the GIL lost).
        (["write", "write", "write"], 1, (3, 0)),
        # A quarter of a second after the last look, the next batch looks.
        (["write", "wait", "write", "write"], 2, (3, 0)),
        # A flush makes the next batch look, however soon it comes.
        (["write", "flush", "write"], 2, (2, 0)),
        # Moved away between batches that follow each other: the next one still
        # goes to the old file; the first after the quarter goes to a new one.
        (["write", "move", "write", "wait", "write"], 2, (1, 2)),
        # Moved away, then a flush: the next batch finds it gone.
        (["write", "move", "flush", "write", "write"], 2, (2, 1)),
    ],
)
def test_the_jsonl_sink_looks_at_its_path_at_most_every_quarter_second(
    steps: list[str],
    looks: int,
    lines: tuple[int, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trace_log: pytest.LogCaptureFixture,
) -> None:
    from rollout_trace.sinks import jsonl as sinks_jsonl

    now = [1_000.0]
    stats: list[str] = []
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        stats.append(str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(sinks_jsonl.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(sinks_jsonl.os, "stat", stat)
    path, moved = tmp_path / "t.jsonl", tmp_path / "t.1.jsonl"
    sink = sinks_jsonl.JsonlSink(str(path), {})
    sink.open()
    stats.clear()  # (the open looks for what it makes)
    for step in steps:
        if step == "write":
            sink.write(b"{}\n")
        elif step == "wait":
            now[0] += 0.25
        elif step == "flush":
            sink.flush()
        else:
            path.rename(moved)
    sink.close()
    assert stats.count(str(path)) == looks, stats
    # (lines at the path, lines in the file moved away)
    found = tuple(p.read_bytes().count(b"\n") if p.exists() else 0 for p in (path, moved))
    assert found == lines
    assert sink.reopened == (1 if lines[1] else 0)
    assert len(said(trace_log, "new file")) == sink.reopened


# --- 8. every sink writes what it counts, under every driver: tests/sinks/test_sink_contract.py


# --- 9. urgent events reach the file at once -----------------------------------------


URGENT = [
    ("rt.SnapshotPublished(step=3, path='/snap/3', captured_at=1.5)", "snapshot_published"),
    ("rt.StepTrained(step=3, group_ids=['g1'])", "step_trained"),
    ("rt.RestoreStarted(path='/snap/3', step=3)", "restore_started"),
    ("rt.RestoreFinished(step=3, unfinished_groups=[])", "restore_finished"),
    ("rt.TrainerCheckpointPublished(step=3, path='/ckpt/3')", "trainer_checkpoint_published"),
    ("Noticed(step=3)", "noticed"),  # a user's class with `urgent: ClassVar[bool] = True`
]


@pytest.mark.parametrize(("event", "tag"), URGENT, ids=[tag for _, tag in URGENT])
@drivers
def test_an_urgent_event_survives_a_sigkill_60_ms_later(
    driver: Driver, event: str, tag: str, tmp_path: Path
) -> None:
    path = tmp_path / "killed.jsonl"
    proc = run_child(
        driver,
        [str(path)],
        f"""
        h.emit(rt.WeightsSynced(weight_version=7))  # not urgent, but before it in seq
        h.emit({event})
        await h.sleep(0.06)  # far less than the flush interval of 0.25 s
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        prelude="""
        from typing import ClassVar
        class Noticed(rt.Event, tag="noticed"):
            urgent: ClassVar[bool] = True
            step: int
        """,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run = only_run(read(path))
    assert run.closed is None  # killed
    # One emitter's lines are in seq order, so the event before it is there too.
    assert [(e["seq"], e["event"]) for e in run.events] == [(1, "weights_synced"), (2, tag)]


# --- 10. an idle async tracer does not wake the loop ---------------------------------


def _tasks() -> int:
    """Tasks on the running loop (asyncio and uvloop), or -1 under trio."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no asyncio loop: trio
        return -1


@pytest.mark.parametrize(
    "before",
    [
        0,  # opened, never emitted to
        1,  # one event (a partial batch, written at the flush interval)
        10_000,  # full batches and a partial one
    ],
)
@pytest.mark.parametrize("driver", ASYNC_DRIVERS, ids=[d.name for d in ASYNC_DRIVERS])
def test_an_idle_async_tracer_does_not_wake_the_loop(driver: Driver, before: int) -> None:
    # The tracer keeps no task on the loop: its writer thread does the work,
    # and sleeps while nothing is emitted.
    async def scenario(h: Handle) -> tuple[int, int, float]:
        for i in range(before):
            h.emit(dispatched(i))
        await h.sleep(0.5)  # past the flush interval: everything is written
        start_cpu = time.process_time()
        await h.sleep(1.0)
        lines = len(h.tracer.sinks[0].lines())  # type: ignore[attr-defined]
        return _tasks(), time.process_time() - start_cpu, lines

    tasks_without = driver.call(_count_tasks)  # type: ignore[attr-defined]
    out = driver.run(["memory://"], scenario)
    tasks, cpu, written = out.value
    assert tasks == tasks_without  # no task of the tracer's
    assert cpu < 0.1, cpu  # generous: the whole process, on a noisy VM
    assert written == before + 1  # trace_opened and every event, before the close
    assert len(out.tracer.sinks[0].lines()) == before + 2  # type: ignore[attr-defined]


async def _count_tasks() -> int:
    await anyio.sleep(0)
    return _tasks()


# --- 11. a bad $ROLLOUT_TRACE is an error that names it ------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "bogus://x",  # an unknown scheme
        "x.txt",  # not a URI, not a .jsonl path
        "jsonl:///x.jsonl?nope=1",  # an unknown option
        "memory://,ftp://x",  # one bad URI among good ones
    ],
)
@drivers
def test_a_bad_rollout_trace_value_names_the_variable(
    driver: Driver, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_TRACE", value)
    with pytest.raises(rt.SinkError) as info:
        driver.make()
    assert "$ROLLOUT_TRACE" in str(info.value), str(info.value)


# --- 12. one emitter's lines are in exact seq order -----------------------------------


@drivers
def test_one_emitters_lines_are_in_exact_seq_order(driver: Driver, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    n = 20_000

    async def scenario(h: Handle) -> None:
        for i in range(n):
            if i % 997 == 0:
                h.emit(rt.StepTrained(step=i, group_ids=[]))  # urgent: a short batch
            else:
                h.emit(dispatched(i))
            if i % 3_001 == 0:
                await h.flush()
            elif i % 501 == 0:
                await h.sleep(0)

    driver.run([str(path)], scenario, batch_size=100)
    run = only_run(read(path), uri=str(path))
    assert [e["seq"] for e in run.events] == list(range(1, n + 1))  # in file order


# --- 13. counts stay honest under drops ------------------------------------------------


def _drop_scenario(bad_at: int) -> Callable[[Handle], Any]:
    async def scenario(h: Handle) -> list[int]:
        invalid = []
        for _burst in range(20):
            for i in range(200):  # 200 without yielding into a buffer of 64
                if i == bad_at:
                    h.emit(BlobSampled(data=math.nan))
                    invalid.append(h.counts.emitted)
                else:
                    h.emit(dispatched(i))
            await h.sleep(0.02)
        return invalid

    return scenario


@pytest.mark.usefixtures("plugins")
@drivers
def test_counts_stay_honest_under_drops(driver: Driver, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    slow = "slow://?delay=0.05"
    out = driver.run(
        [slow, str(path)], _drop_scenario(bad_at=7), buffer=64, batch_size=16, close_timeout=2
    )
    invalid_seqs = set(out.value)
    c = out.counts
    assert c.emitted == 4_000 and c.dropped > 0, c
    assert c.written + c.dropped + c.invalid == c.emitted
    assert c.invalid == len(invalid_seqs)
    file_run = only_run(read(path), uri=str(path), allow_drops=True)
    closed = file_run.closed
    assert closed is not None
    assert (closed["emitted"], closed["written"], closed["dropped"], closed["invalid"]) == (
        c.emitted,
        c.written,
        c.dropped,
        c.invalid,
    )
    # The file missed exactly the dropped and invalid events.
    in_file = {e["seq"] for e in file_run.events}
    missing = set(range(1, c.emitted + 1)) - in_file
    assert len(in_file) == c.written
    assert len(missing) == c.dropped + c.invalid
    assert invalid_seqs <= missing
    # The slow sink holds exactly what its own tally says (it lost batches
    # of its own: see the next test).
    slow_objs = parse_lines(out.tracer.sinks[0].getvalue())  # type: ignore[attr-defined]
    assert slow_objs[0]["event"] == "trace_opened" and slow_objs[-1] == closed
    slow_events = slow_objs[1:-1]
    assert tally(file_run, slow)["written"] == len(slow_events)
    assert {e["seq"] for e in slow_events} <= in_file
    seqs = [e["seq"] for e in slow_events]
    assert seqs == sorted(set(seqs))  # each once, in order


@pytest.mark.usefixtures("plugins")
@drivers
def test_a_sink_that_lost_events_does_not_say_it_never_failed(
    driver: Driver, tmp_path: Path
) -> None:
    # README Reference, lifecycle events: "A sink that never failed holds exactly `written` lines".
    # A sink that fell behind and lost batches must say so in its tally.
    path = tmp_path / "t.jsonl"
    slow = "slow://?delay=0.05"
    out = driver.run(
        [slow, str(path)], _drop_scenario(bad_at=-1), buffer=64, batch_size=16, close_timeout=2
    )
    data = out.tracer.sinks[0].getvalue()  # type: ignore[attr-defined]
    run = only_run(read(path), uri=str(path), allow_drops=True)
    assert run.closed is not None
    mine = tally(run, slow)
    if mine["written"] < run.closed["written"]:  # it lost batches
        assert mine["error"], mine
    only_run(data, uri=slow, allow_drops=True)


# --- the rest of what both tracers promise ---------------------------------------------


@drivers
def test_fan_out_gives_every_sink_identical_lines(driver: Driver, tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"

    async def scenario(h: Handle) -> None:
        for i in range(1_000):
            h.emit(dispatched(i))
        await h.flush()

    out = driver.run(["memory://", str(path)], scenario, batch_size=100)
    data = out.tracer.sinks[0].getvalue()  # type: ignore[attr-defined]
    assert data == read(path)
    run = only_run(data, uri="memory://")
    assert tally(run, str(path))["written"] == 1_000


@pytest.mark.usefixtures("plugins")
@drivers
def test_a_failing_sink_is_said_once_and_stops_alone(
    driver: Driver, trace_log: pytest.LogCaptureFixture
) -> None:
    async def scenario(h: Handle) -> None:
        for i in range(500):
            h.emit(dispatched(i))
            if i % 50 == 0:
                await h.flush()

    out = driver.run(["failing://?ok=3", "memory://"], scenario, batch_size=10)
    failing, good = out.tracer.sinks
    run = only_run(good.getvalue(), uri="memory://")  # type: ignore[attr-defined]
    assert len(run.events) == 500
    # trace_opened and two batches, one write that failed, then no more.
    assert failing.writes == 4  # type: ignore[attr-defined]
    assert failing.closed  # type: ignore[attr-defined]
    mine = tally(run, "failing://?ok=3")
    assert mine["written"] == len(failing.lines()) - 1  # type: ignore[attr-defined]
    assert "No space left on device" in mine["error"]
    reports = said(trace_log, "failing://?ok=3")
    assert len(reports) == 1, said(trace_log)
    assert "No space left on device" in reports[0]
    assert not any(r.exc_info for r in trace_log.records)  # one line, no traceback


@drivers
def test_an_exception_in_the_body_comes_out_and_the_trace_is_closed(driver: Driver) -> None:
    t = driver.make("memory://")

    async def scenario(h: Handle) -> None:
        h.emit(dispatched(0))
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        driver.drive(t, scenario)
    run = only_run(t.sinks[0].getvalue(), uri="memory://")  # type: ignore[attr-defined]
    assert run.closed is not None and len(run.events) == 1


@drivers
def test_flush_returns_once_everything_before_it_is_written(driver: Driver, tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"

    async def scenario(h: Handle) -> list[int]:
        seen = []
        for _round in range(3):
            for i in range(700):
                h.emit(dispatched(i))
            assert await h.flush() is True
            seen.append(len(read(path).splitlines()))
        return seen

    out = driver.run([str(path)], scenario, flush_interval=60)
    assert out.value == [701, 1_401, 2_101]  # trace_opened and everything so far


@drivers
def test_the_flush_interval_writes_a_partial_batch(driver: Driver, tmp_path: Path) -> None:
    path = tmp_path / "i.jsonl"

    async def scenario(h: Handle) -> int:
        h.emit(dispatched(0))
        deadline = time.monotonic() + 5
        while len(read(path).splitlines()) < 2 and time.monotonic() < deadline:
            await h.sleep(0.01)
        return len(read(path).splitlines())

    out = driver.run([str(path)], scenario, flush_interval=0.05)
    assert out.value == 2


@pytest.mark.parametrize(
    "thing",
    [
        {"event": "attempt_dispatched"},  # a dict that looks like an event
        None,
        "attempt_dispatched",
        rt.AttemptDispatched,  # the class, not an instance
        msgspec.Struct(),  # a Struct that is not an Event
    ],
    ids=["dict", "none", "str", "class", "struct"],
)
@drivers
def test_emitting_a_non_event_is_a_type_error_at_once(driver: Driver, thing: Any) -> None:
    async def scenario(h: Handle) -> None:
        with pytest.raises(TypeError, match=r"takes a rollout_trace\.Event"):
            h.emit(thing)
        h.emit(dispatched(1))  # and the tracer goes on

    out = driver.run(["memory://"], scenario)
    run = only_run(out.tracer.sinks[0].getvalue())  # type: ignore[attr-defined]
    assert run.closed is not None and run.closed["emitted"] == 1


@drivers
def test_emitting_a_frozen_event_is_a_type_error(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        with pytest.raises(TypeError, match="frozen"):
            h.emit(Frozen(x=1))
        h.emit(dispatched(1))

    out = driver.run(["memory://"], scenario)
    run = only_run(out.tracer.sinks[0].getvalue())  # type: ignore[attr-defined]
    assert len(run.events) == 1


@drivers
def test_emitting_one_object_twice_writes_two_lines(driver: Driver) -> None:
    ev = rt.WeightsSynced(weight_version=1)

    async def scenario(h: Handle) -> None:
        h.emit(ev)
        h.emit(ev)

    out = driver.run(["memory://"], scenario)
    run = only_run(out.tracer.sinks[0].getvalue())  # type: ignore[attr-defined]
    assert [(e["seq"], e["weight_version"]) for e in run.events] == [(1, 1), (2, 1)]


@drivers
def test_reopening_starts_a_new_run(driver: Driver, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    t = driver.make(str(path))

    async def scenario(h: Handle) -> str | None:
        h.emit(dispatched(0))
        return h.tracer.run_id

    first = driver.drive(t, scenario).value
    second = driver.drive(t, scenario).value
    assert first != second and None not in (first, second)
    runs = check_runs(read(path), uri=str(path))
    assert list(runs) == [first, second]
    assert all(len(r.events) == 1 for r in runs.values())


@drivers
def test_trace_opened_carries_meta_and_identity(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        pass

    out = driver.run(["memory://"], scenario, meta={"exp": "grpo-7b", "gpus": 8})
    opened = only_run(out.tracer.sinks[0].getvalue()).opened  # type: ignore[attr-defined]
    assert opened["meta"] == {"exp": "grpo-7b", "gpus": 8}
    assert opened["sdk_version"] == rt.__version__
    assert opened["run_id"] == out.tracer.run_id
    assert opened["pid"] == os.getpid()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"meta": {"x": object()}}, TypeError, "meta must be JSON-encodable"),
        ({"meta": {1: "x"}}, TypeError, "meta keys must be str"),
        ({"buffer": 0}, ValueError, "buffer must be > 0"),
        ({"buffer": math.inf}, TypeError, "buffer must be a int"),
        ({"flush_interval": -1}, ValueError, "flush_interval must be > 0"),
        ({"flush_interval": math.inf}, ValueError, "flush_interval must be > 0 and finite"),
        ({"close_timeout": "1"}, TypeError, "close_timeout must be a float"),
        ({"close_timeout": 0}, ValueError, "close_timeout must be > 0"),
        ({"batch_size": 1.5}, TypeError, "batch_size must be a int"),
        ({"clock": "now"}, TypeError, "clock must be a callable"),  # not callable
        ({"clock": lambda: "12:00"}, TypeError, "must return a float"),  # wrong type
    ],
)
@drivers
def test_bad_settings_are_refused_at_once(
    driver: Driver, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        driver.make("memory://", **kwargs)


@drivers
def test_close_timeout_may_be_infinite(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        h.emit(dispatched(0))

    for _ in range(10):  # the open races the wait for it: try a few times
        out = driver.run(["memory://"], scenario, close_timeout=math.inf)
        assert out.counts.written == 1


@pytest.mark.usefixtures("plugins")
@drivers
def test_a_sink_that_cannot_open_raises_and_leaves_nothing_behind(
    driver: Driver, tmp_path: Path
) -> None:
    first = tmp_path / "new" / "first.jsonl"  # opened before the bad one
    threads = threading.active_count()
    t = driver.make(str(first), "unopenable://")

    async def scenario(h: Handle) -> None:
        pytest.fail("the body must not run")

    with pytest.raises(rt.SinkOpenError) as info:
        driver.drive(t, scenario)
    assert info.value.uri == "unopenable://"
    assert "Permission denied" in str(info.value)
    assert isinstance(info.value.__cause__, PermissionError)
    assert t.sinks == []
    assert list(tmp_path.iterdir()) == []  # no file, no folder
    assert threading.active_count() == threads  # no thread


@drivers
def test_a_disabled_tracer_does_nothing_holds_nothing_and_pickles(driver: Driver) -> None:
    threads = threading.active_count()
    t = driver.make("memory://", enabled=False)

    async def scenario(h: Handle) -> bool:
        h.emit(dispatched(0))
        return await h.flush()

    assert driver.drive(t, scenario).value is True
    assert t.sinks == [] and t.enabled is False
    assert threading.active_count() == threads
    kinds = (
        threading.Thread,
        type(threading.Lock()),
        type(threading.RLock()),
        threading.Event,
        collections.deque,
        anyio.abc.TaskGroup,
    )
    assert [k for k, v in vars(t).items() if isinstance(v, kinds)] == []
    clone = pickle.loads(pickle.dumps(t))
    assert clone.enabled is False


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        (None, False),  # unset: disabled
        ("", False),  # empty: disabled
        (" , ", False),  # only separators: disabled
        ("memory://", True),  # set: those sinks
        ("memory://,null://", True),  # comma-separated
    ],
)
@drivers
def test_no_uri_reads_rollout_trace_from_the_environment(
    driver: Driver, env: str | None, enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("ROLLOUT_TRACE", raising=False)
    else:
        monkeypatch.setenv("ROLLOUT_TRACE", env)
    t = driver.make()
    assert t.enabled is enabled

    async def scenario(h: Handle) -> int:
        h.emit(dispatched(0))
        return len(h.tracer.sinks)

    assert driver.drive(t, scenario).value == (env or "").count("://")


@drivers
def test_an_enabled_tracer_pickles_as_its_configuration(driver: Driver, tmp_path: Path) -> None:
    t = driver.make(f"{tmp_path}/{{run_id}}.jsonl", meta={"a": 1})

    async def scenario(h: Handle) -> bytes:
        h.emit(dispatched(0))
        return pickle.dumps(h.tracer)  # while it is open

    blob = driver.drive(t, scenario).value
    clone = pickle.loads(blob)
    assert clone.state == "new" and clone.run_id is None

    async def again(h: Handle) -> None:
        h.emit(dispatched(1))

    driver.drive(clone, again)
    assert clone.run_id not in (None, t.run_id)
    new_run = only_run(read(tmp_path / f"{clone.run_id}.jsonl"))
    assert new_run.opened["meta"] == {"a": 1}
    assert len(list(tmp_path.glob("*.jsonl"))) == 2


@drivers
def test_a_clock_of_ones_own_stamps_every_time(driver: Driver) -> None:
    ticks = iter(range(1_000, 2_000))

    async def scenario(h: Handle) -> None:
        h.emit(dispatched(0))
        h.emit(dispatched(1))

    out = driver.run(["memory://"], scenario, clock=lambda: float(next(ticks)))
    run = only_run(out.tracer.sinks[0].getvalue())  # type: ignore[attr-defined]
    assert run.opened["time"] == 1_001.0  # the first tick checked the clock itself
    assert [e["time"] for e in run.events] == [1_002.0, 1_003.0]
    assert run.closed is not None and run.closed["time"] == 1_004.0


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (math.nan, "must be a finite number"),  # NaN would be written as null
        (math.inf, "must be a finite number"),
        (True, "must be float"),  # a bool is read back as a bool
        ("noon", "must be float"),  # a str
    ],
)
@drivers
def test_a_clock_of_ones_own_is_checked_like_any_field(
    driver: Driver, bad: Any, reason: str, trace_log: pytest.LogCaptureFixture
) -> None:
    # Only time.time() is trusted to give finite floats: the tracer's own
    # stamps are left out of the writer's check, a clock of one's own is not.
    ticks = iter([1_000.0, 1_001.0, 1.0, bad, 3.0, bad, 5.0, 6.0])

    async def scenario(h: Handle) -> None:
        for i in range(5):
            h.emit(dispatched(i))

    out = driver.run(["memory://"], scenario, clock=lambda: next(ticks))
    run = only_run(out.tracer.sinks[0].getvalue(), allow_drops=True)  # type: ignore[attr-defined]
    assert [e["time"] for e in run.events] == [1.0, 3.0, 5.0]
    c = out.counts
    assert (c.emitted, c.written, c.invalid, c.dropped) == (5, 3, 2, 0), c
    assert run.closed is not None and run.closed["time"] == 6.0
    assert len(said(trace_log, "field 'time'", reason)) == 1


@drivers
def test_an_emit_held_from_before_the_open_writes_into_the_run(driver: Driver) -> None:
    t = driver.make("memory://")
    emit = t.emit  # taken before the tracer opened

    async def scenario(h: Handle) -> None:
        for i in range(5):
            emit(dispatched(i))

    driver.drive(t, scenario)
    run = only_run(t.sinks[0].getvalue())  # type: ignore[attr-defined]
    assert run.closed is not None and run.closed["written"] == 5


@pytest.mark.usefixtures("plugins")
@drivers
def test_close_honours_its_deadline_with_a_slow_sink(
    driver: Driver, trace_log: pytest.LogCaptureFixture
) -> None:
    async def scenario(h: Handle) -> None:
        for i in range(20):
            h.emit(dispatched(i))
            await h.sleep(0)

    # Each write takes 0.8 s: trace_opened's is under way when the close
    # begins, and the sink cannot have written the events by the deadline,
    # on a thread of its own or on the sync tracer's writer thread.
    # The clock is moved to the close's deadline (the close is still under
    # way then), and no further: the close returns.
    clock = WatchedClock()
    out = driver.run(
        ["slow://?delay=0.8"],
        scenario,
        batch_size=1,
        close_timeout=1.0,
        deadline_clock=clock,
        closing=lambda: advancing(clock, 1.0, early=False),
    )
    c = out.counts
    assert c.emitted == 20 and c.dropped > 0 and c.written + c.dropped == 20, c
    # Given up, the sink may still finish the write it was in; what it wrote
    # after the counts were fixed is not counted, and it gets no trace_closed.
    lines = out.tracer.sinks[0].lines()  # type: ignore[attr-defined]
    assert len([line for line in lines if b'"attempt_dispatched"' in line]) >= c.written
    assert not any(b'"trace_closed"' in line for line in lines)
    assert said(trace_log, "slow://?delay=0.8", "deadline")


@drivers
def test_counts_before_open_are_zero(driver: Driver) -> None:
    t = driver.make("memory://")
    assert tuple(t.counts)[:5] == (0, 0, 0, 0, 0)
    assert t.run_id is None
    json.dumps(t.counts._asdict())  # plain numbers
