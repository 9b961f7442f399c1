"""What only the sync tracer does (README, Guarantees): threads, the lazy open, fork,
pickling into another process, interpreter exit, ``close(timeout=)``.

What both tracers promise is tested once, over every driver (asyncio, uvloop,
trio and the sync tracer), in tests/writing/test_promises.py.
"""

from __future__ import annotations

import collections
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deadlines import WatchedClock, past_deadline
from samples import dispatched
from tracecheck import check_runs, only_run

import rollout_trace as rt
from rollout_trace.testing import MockClock


def _emit_many(
    t: rt.SyncTracer,
    thread: int,
    n: int,
    progress: list[int] | None = None,
    checked: threading.Event | None = None,
) -> None:
    for i in range(n):
        t.emit(
            rt.AttemptDispatched(
                group_id="g", prompt_id=i, generation_index=thread, attempt=0, weight_version=0
            )
        )
        if progress is not None:
            progress[thread] = i + 1
        if checked is not None and i == n // 2:
            # Half way, wait for the flush check: on a loaded machine the
            # threads could otherwise be done before it ever ran.
            checked.wait(60)


@pytest.mark.parametrize(
    ("buffer", "may_drop"),
    [
        (500_000, False),  # room for every event: none may be dropped
        (1_000, True),  # a small buffer: drops are counted, never lost
    ],
)
def test_eight_threads_every_event_written_once_or_counted(
    buffer: int, may_drop: bool, tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl"
    t = rt.sync_tracer(str(path), buffer=buffer)
    threads = [threading.Thread(target=_emit_many, args=(t, k, 50_000)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.close()
    run = only_run(path.read_bytes(), allow_drops=may_drop)
    assert run.closed is not None
    c = run.closed
    assert c["emitted"] == 400_000
    assert c["written"] == len(run.events)
    keys = collections.Counter((e["generation_index"], e["prompt_id"]) for e in run.events)
    assert max(keys.values()) == 1  # nothing written twice
    if not may_drop:
        assert c["dropped"] == 0
        assert len(keys) == 400_000


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_one_thread_emitting_flat_out_at_default_settings_drops_nothing() -> None:
    # The writer thread shares the GIL with the thread that emits and gets
    # about half of it while both are busy: it keeps up only if it spends less
    # per event than emit does. Once it spent more, and a long burst filled the
    # default buffer (3-4 % of a million events dropped). A million events:
    # a writer that falls behind by any steady share runs out of buffer.
    n = 1_000_000
    t = rt.sync_tracer("jsonl:///dev/null")
    with t:
        emit, make = t.emit, rt.AttemptDispatched
        for i in range(n):
            emit(make(group_id="g", prompt_id=i, generation_index=0, attempt=0, weight_version=0))
    c = t.counts
    assert (c.emitted, c.written, c.dropped, c.invalid) == (n, n, 0, 0), c


@pytest.mark.parametrize(
    ("kwargs", "burst", "dropped"),
    [
        # The default buffer holds 200,000 events emitted while the writer is
        # held up (a write the system is slow to finish, a busy machine).
        ({}, 200_000, 0),
        # Up to the buffer and no further: the surplus is dropped and counted.
        ({"buffer": 65_536}, 100_000, 100_000 - 65_536),
    ],
)
def test_a_burst_while_the_writer_is_held_up_drops_only_past_the_buffer(
    kwargs: dict[str, Any], burst: int, dropped: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_trace.sinks import MemorySink

    release, held = threading.Event(), threading.Event()
    real_write = MemorySink.write

    def write(self: MemorySink, data: bytes) -> None:
        if b'"attempt_dispatched"' in data:
            held.set()
            release.wait(30)
        real_write(self, data)

    monkeypatch.setattr(MemorySink, "write", write)
    t = rt.sync_tracer("memory://", **kwargs)
    with t:
        t.emit(dispatched(0))
        assert held.wait(10)  # the writer is inside its first write of events
        for i in range(1, burst + 1):
            t.emit(dispatched(i))
        release.set()
    c = t.counts
    assert (c.emitted, c.written, c.dropped) == (burst + 1, burst + 1 - dropped, dropped), c


def test_flush_from_one_thread_while_others_emit(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    t = rt.sync_tracer(str(path), flush_interval=30, buffer=1_000_000)
    progress = [0, 0, 0]
    checked = threading.Event()
    threads = [
        threading.Thread(target=_emit_many, args=(t, k, 60_000, progress, checked))
        for k in range(3)
    ]
    for th in threads:
        th.start()
    checks = 0
    while (any(th.is_alive() for th in threads) and checks < 5) or not checks:
        time.sleep(0.01)
        before = list(progress)  # every event counted here was emitted before flush()
        assert t.flush(timeout=60)
        written = {(e["generation_index"], e["prompt_id"]) for e in _user_events(path)}
        for thread, n in enumerate(before):
            missing = [i for i in range(n) if (thread, i) not in written]
            assert missing == [], f"thread {thread}: {len(missing)} events not on disk"
        checks += 1
        checked.set()
    for th in threads:
        th.join()
    t.close()
    assert checks > 0


def _user_events(path: Path) -> list[dict[str, Any]]:
    import json

    data = path.read_bytes()
    # The writer may be appending the next batch as we read: a last line
    # without its newline is still being written.
    lines = [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]
    return [o for o in lines if o["event"] == "attempt_dispatched"]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("round_", range(5))
def test_fork_while_three_threads_emit(round_: int, tmp_path: Path) -> None:
    t = rt.sync_tracer(f"{tmp_path}/{{pid}}-{{run_id}}.jsonl", buffer=1_000_000)
    stop = threading.Event()

    def spin(k: int) -> None:
        i = 0
        while not stop.is_set():
            t.emit(dispatched(k * 1_000_000 + i))
            i += 1

    threads = [threading.Thread(target=spin, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    time.sleep(0.05)
    pid = os.fork()
    if pid == 0:  # the child: a fresh run of its own, then out
        code = 1
        try:
            for i in range(100):
                t.emit(rt.WeightsSynced(weight_version=i))
            t.close(timeout=10)
            code = 0
        finally:
            os._exit(code)
    time.sleep(0.05)
    stop.set()
    for th in threads:
        th.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    t.close()
    parent = only_run((tmp_path / f"{os.getpid()}-{t.run_id}.jsonl").read_bytes())
    assert parent.closed is not None and parent.closed["emitted"] > 0
    (child_file,) = tmp_path.glob(f"{pid}-*.jsonl")
    child = only_run(child_file.read_bytes())
    assert child.run_id != parent.run_id
    assert child.opened["pid"] == pid
    assert [e["weight_version"] for e in child.events] == list(range(100))  # no parent event


def test_fork_into_the_same_file_keeps_runs_apart(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    t = rt.sync_tracer(str(path))
    for i in range(10):
        t.emit(dispatched(i))
    pid = os.fork()
    if pid == 0:
        try:
            t.emit(rt.WeightsSynced(weight_version=1))
            t.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    t.emit(dispatched(10))
    t.close()
    runs = check_runs(path.read_bytes())
    assert sorted(len(r.events) for r in runs.values()) == [1, 11]


class Controller:
    """Something a user would ship to a Ray actor, holding tracers."""

    def __init__(self, trace: rt.SyncTracer, off: rt.SyncTracer) -> None:
        self.trace = trace
        self.off = off


def test_pickling_round_trips_disabled_and_enabled(tmp_path: Path) -> None:
    on = rt.sync_tracer(f"{tmp_path}/{{run_id}}.jsonl", meta={"actor": "x"})
    on.emit(dispatched(0))
    off = rt.sync_tracer(enabled=False)
    clone = pickle.loads(pickle.dumps(Controller(on, off)))
    on.close()
    assert clone.off.enabled is False
    clone.off.emit(dispatched(1))
    clone.trace.emit(rt.WeightsSynced(weight_version=5))
    clone.trace.close()
    assert clone.trace.run_id not in (None, on.run_id)
    new_run = only_run((tmp_path / f"{clone.trace.run_id}.jsonl").read_bytes())
    assert [e["event"] for e in new_run.events] == ["weights_synced"]
    assert new_run.opened["meta"] == {"actor": "x"}


def test_exit_without_close_writes_everything_and_trace_closed_last(tmp_path: Path) -> None:
    path = tmp_path / "exit.jsonl"
    code = textwrap.dedent(
        f"""
        import rollout_trace as rt
        t = rt.sync_tracer({str(path)!r}, flush_interval=60)
        for i in range(25_000):
            t.emit(rt.WeightsSynced(weight_version=i))
        # no close(): the atexit hook must write the rest and trace_closed
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    run = only_run(path.read_bytes())
    assert run.closed is not None and run.closed["written"] == 25_000


def test_close_is_idempotent(tmp_path: Path, trace_log: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.jsonl"
    t = rt.sync_tracer(str(path))
    t.emit(dispatched(0))
    t.close()
    size = path.stat().st_size
    t.close()
    t.close(timeout=0.1)
    assert t.state == "closed"
    assert t.flush() is True  # nothing emitted to the run was lost
    assert path.stat().st_size == size
    assert trace_log.records == []


@pytest.mark.usefixtures("plugins")
@pytest.mark.timeout(90)
def test_a_lazy_open_that_fails_is_said_once_and_every_emit_still_counts(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    threads = threading.active_count()
    # The deadlines' clock never moves: a flush that waited for its timeout
    # would never return (the test's timeout fails it).
    t = rt.sync_tracer("unopenable://", deadline_clock=MockClock())
    for i in range(100):
        t.emit(dispatched(i))  # opens on the first emit, in the writer thread
    # Never a wait for a writer that is gone; False: nothing was written.
    assert t.flush(timeout=30) is False
    for i in range(100):
        t.emit(dispatched(i))
    assert t.flush(timeout=30) is False
    t.close()
    assert t.state == "closed"
    c = t.counts
    assert min(c) >= 0, c
    assert c.written == 0
    assert c.emitted == c.written + c.dropped + c.invalid + c.pending, c
    assert c.emitted + c.outside_run == 200, c  # every emit, in the run or outside it
    reports = [r.getMessage() for r in trace_log.records if "unopenable://" in r.getMessage()]
    assert len(reports) == 1 and "Permission denied" in reports[0], reports
    assert len(trace_log.records) <= 2  # and at most the one about emits on a closed tracer
    # A deadline on a loaded machine, not a speed check: the thread must end.
    deadline = time.monotonic() + 60
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads  # the writer thread has ended


def test_creating_a_tracer_opens_nothing(tmp_path: Path) -> None:
    threads = threading.active_count()
    t = rt.sync_tracer(f"{tmp_path}/x.jsonl")
    assert t.run_id is None and list(tmp_path.iterdir()) == []
    assert threading.active_count() == threads
    with t:
        assert (tmp_path / "x.jsonl").exists()


@pytest.mark.usefixtures("plugins")
def test_close_honours_its_deadline(trace_log: pytest.LogCaptureFixture) -> None:
    clock = WatchedClock()
    t = rt.sync_tracer("slow://?delay=0.6", batch_size=1, deadline_clock=clock)
    for i in range(50):
        t.emit(dispatched(i))
    # Shorter than the tracer's close_timeout: the close returns at it, not before.
    past_deadline(lambda: t.close(timeout=1.0), clock, 1.0)
    c = t.counts
    assert c.emitted == 50 and c.dropped > 0 and c.written + c.dropped == 50, c
    reports = [r.getMessage() for r in trace_log.records if "slow://" in r.getMessage()]
    assert reports and all("deadline" in m for m in reports), reports


def test_a_fork_that_runs_no_fork_hooks_is_detected(tmp_path: Path) -> None:
    # libc's fork() directly, as some process managers do: Python's at-fork
    # hooks do not run, so the tracer must notice the new pid by itself. It
    # starts no thread there (CPython is not ready for threads in such a
    # child): the child's events are counted outside any run, not written.
    code = textwrap.dedent(
        f"""
        import ctypes, os, time
        import rollout_trace as rt
        t = rt.sync_tracer({str(tmp_path)!r} + "/{{pid}}-{{run_id}}.jsonl",
                           flush_interval=60).open()
        for i in range(100):
            t.emit(rt.WeightsSynced(weight_version=i))
        t.flush()
        time.sleep(0.2)  # the writer sleeps in epoll: not waiting for the GIL
        # PyDLL: fork holding the GIL. A raw fork while another thread waits
        # for the GIL hangs any Python child, tracer or not.
        pid = ctypes.PyDLL(None).fork()
        if pid == 0:
            flushed = t.flush(timeout=5)  # notices the fork: the queue is the parent's
            for i in range(5):
                t.emit(rt.StepTrained(step=i, group_ids=[]))
            t.close(timeout=5)
            print(flushed, t.state, t.counts.outside_run, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        t.close()
        print(pid)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    child_line, parent_line = proc.stdout.decode().splitlines()
    assert child_line.split() == ["True", "closed", "5"]  # nothing of the child's was lost
    assert list(tmp_path.glob(f"{int(parent_line)}-*.jsonl")) == []
    (parent_file,) = tmp_path.glob("*.jsonl")
    parent = only_run(parent_file.read_bytes())
    assert len(parent.events) == 100


def test_emit_after_closing_a_tracer_that_never_opened_opens_nothing(
    tmp_path: Path, trace_log: pytest.LogCaptureFixture
) -> None:
    threads = threading.active_count()
    t = rt.sync_tracer(f"{tmp_path}/t.jsonl")
    t.close()
    t.emit(dispatched(0))  # once a RecursionError; a thread that emits late
    try:
        # Closed means closed: the emit is counted outside any run, and no
        # run, file or thread is made for it.
        assert t.run_id is None
        assert list(tmp_path.iterdir()) == []
        assert threading.active_count() == threads
        assert t.counts == rt.TraceCounts(outside_run=1)
        assert len(trace_log.records) == 1
    finally:
        t.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pause", [0.0, 0.3])  # fork at once after the first emit, or later
def test_a_multiprocessing_child_writes_its_run_and_closes_it(pause: float, tmp_path: Path) -> None:
    # multiprocessing ends a forked child with os._exit(): no atexit hook runs.
    code = textwrap.dedent(
        f"""
        import multiprocessing as mp, time
        import rollout_trace as rt
        t = rt.sync_tracer({str(tmp_path)!r} + "/{{pid}}.jsonl")

        def work():
            for i in range(1000):
                t.emit(rt.WeightsSynced(weight_version=i))

        if __name__ == "__main__":
            t.emit(rt.WeightsSynced(weight_version=-1))
            time.sleep({pause})
            p = mp.get_context("fork").Process(target=work)
            p.start()
            p.join()
            t.close()
            print(p.pid)
        """
    )
    script = tmp_path / "main.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    child = only_run((tmp_path / f"{int(proc.stdout)}.jsonl").read_bytes())
    assert child.closed is not None and child.closed["written"] == 1000
