"""The one writer core under both tracers: what it promises the program hosting it.

Each test here reproduces a defect of the tracers as they were before the
core (the async tracer encoded on the event loop, a blocked loop wrote
nothing, a wake-up could be lost, an interrupted close never ended, a
SIGTERM hook that could not be installed went unsaid).
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import anyio
import pytest
from harness import child_env
from samples import dispatched
from tracecheck import only_run

import rollout_trace as rt
from rollout_trace._writing import engine, tracers
from rollout_trace.sinks import MemorySink

ASYNC_BACKENDS = [
    pytest.param("asyncio", {}, id="asyncio"),
    pytest.param("asyncio", {"use_uvloop": True}, id="uvloop"),
    pytest.param("trio", {}, id="trio"),
]


@pytest.mark.parametrize(("backend", "options"), ASYNC_BACKENDS)
def test_nothing_is_encoded_on_the_event_loop_thread(
    backend: str, options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Encoding 250,000 queued events on the loop stalled a 1 ms ticker for a
    # quarter of a second, and an urgent emit encoded the whole queue inline.
    # Every call that encodes is recorded with the thread it ran on.
    threads: list[int] = []
    real = engine.Engine.process

    def process(self: engine.Engine, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(engine.Engine, "process", process)
    path = tmp_path / "run.jsonl"
    n = 50_000

    async def main() -> int:
        loop_thread = threading.get_ident()
        async with rt.tracer(str(path)) as t:
            for i in range(n):
                t.emit(dispatched(i))
            t.emit(rt.StepTrained(step=1, group_ids=["g"]))  # urgent, with 50k queued
            for i in range(10):
                t.emit(rt.SnapshotPublished(step=i, path=f"/s/{i}", captured_at=1.0))
                await anyio.sleep(0.01)  # the loop runs: a pump would run too
            assert await t.flush()
        return loop_thread

    loop_thread = anyio.run(main, backend=backend, backend_options=options)
    assert threads, "nothing was encoded"
    assert loop_thread not in threads
    run = only_run(path.read_bytes())
    assert run.closed is not None and run.closed["written"] == len(run.events) == n + 11


_BLOCKED = """
import asyncio, sys, threading, time
import rollout_trace as rt

async def main():
    async with rt.tracer(sys.argv[1]) as t:
        for i in range(int(sys.argv[2])):
            t.emit(rt.AttemptDispatched(group_id="g", prompt_id=i, generation_index=0,
                                        attempt=0, weight_version=1))
        print("emitted", flush=True)
        threading.Event().wait()  # synchronous code holds the loop (a tokenizer, ray.get)

asyncio.run(main())
"""


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


def test_a_loop_blocked_by_synchronous_code_still_gets_its_events_written(
    tmp_path: Path,
) -> None:
    # Full batches waited for a task on the loop: a controller that ran
    # synchronous code and was then SIGKILLed lost every event it had
    # emitted. The writer thread writes them (the last, partial batch after
    # the flush interval), so the kill loses nothing that was emitted before.
    path = tmp_path / "run.jsonl"
    n = 3 * 4_096 + 100  # three full batches and a partial one
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED, str(path), str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"emitted\n"
        # Waited for by what the file holds; the deadline only ends a failure.
        deadline = time.monotonic() + 30
        while len(_lines(path)) < n + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    events = [e for e in _lines(path) if e["event"] == "attempt_dispatched"]
    assert len(events) == n
    assert [e["seq"] for e in events] == list(range(1, n + 1))


class _PreemptedDeque(collections.deque):  # type: ignore[type-arg]
    """A queue whose length, read by an emitting thread while ``armed``, takes
    as long as a thread preempted right after reading it."""

    armed = threading.Event()

    def __len__(self) -> int:
        n = super().__len__()
        if self.armed.is_set() and not threading.current_thread().name.startswith("rollout"):
            time.sleep(0.3)  # preempted here: the writer drains and goes to sleep
        return n


def test_a_wake_up_is_never_lost_when_emit_is_preempted(monkeypatch: pytest.MonkeyPatch) -> None:
    # emit used to read the queue's length and then append; the writer to
    # drain and then sleep with no timeout. An emit preempted between the
    # two, while the writer drained, woke nobody: its event waited for more
    # traffic (1 burst in 160 on Python 3.10), and a kill lost it.
    monkeypatch.setattr(tracers, "deque", _PreemptedDeque)
    with rt.sync_tracer("memory://", flush_interval=0.05) as t:
        t.emit(dispatched(0))  # the writer gives this batch the flush interval to fill
        _PreemptedDeque.armed.set()
        try:
            t.emit(dispatched(1))  # read 1 queued, then preempted past the interval
        finally:
            _PreemptedDeque.armed.clear()
        # Nothing more is emitted. The deadline only ends a failure.
        deadline = time.monotonic() + 5
        while t.counts.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.counts.pending == 0, t.counts
        assert len(t.sinks[0].lines()) == 3  # type: ignore[attr-defined]


def _writer(*, woken_ago: float, taken_ago: float | None) -> Any:
    now = time.monotonic()
    wake = threading.Event()
    wake.set()  # woken, and it has not cleared the flag yet
    return types.SimpleNamespace(
        wake_flag=wake,
        woken_at=now - woken_ago,
        taken_at=0.0 if taken_ago is None else now - taken_ago,
        handed_at=0.0,
        gap=0.0,
        engine=types.SimpleNamespace(in_long_call=lambda now: False),
    )


@pytest.mark.parametrize(
    ("woken_ago", "taken_ago", "behind", "starved"),
    [
        pytest.param(0.001, None, False, False, id="woken-just-now-never-took"),
        pytest.param(1.0, 0.006, False, False, id="took-one-switch-interval-ago"),
        pytest.param(1.0, 0.001, True, True, id="took-just-now-and-falls-behind"),
        pytest.param(1.0, 0.020, False, True, id="took-nothing-for-four-intervals"),
        pytest.param(0.020, None, False, True, id="woken-four-intervals-ago-never-took"),
    ],
)
def test_only_a_writer_kept_from_the_gil_or_falling_behind_is_handed_it(
    woken_ago: float, taken_ago: float | None, behind: bool, starved: bool
) -> None:
    # An emitter that runs flat out is made to let a waiting thread in within
    # one switch interval (5 ms), so a writer that last took the queue 6 ms
    # ago, or was woken a moment ago and has taken nothing since the run
    # opened, is not starved: handing it the GIL then cost the loop about
    # 1 ms each time, 6-26 times in a burst of 200,000 emits. But a writer given
    # the GIL once an interval writes one slice a time, less than a flat-out
    # emitter makes: with the queue long, one interval is enough.
    core = types.SimpleNamespace(_switch=0.005)
    run = _writer(woken_ago=woken_ago, taken_ago=taken_ago)
    assert tracers._TracerCore._starved(core, run, behind) is starved  # type: ignore[arg-type]


@pytest.mark.usefixtures("plugins")
def test_ctrl_c_in_close_leaves_a_tracer_that_closes_and_opens_again(tmp_path: Path) -> None:
    # Ctrl-C while close() waited left the tracer "closing" for good: a second
    # close() did nothing, open() was a no-op, and the exit hook waited the
    # whole close_timeout for a close that had already finished.
    t = rt.sync_tracer("slow://?delay=0.3", "memory://", batch_size=10, close_timeout=30)
    t.open()
    for i in range(100):
        t.emit(dispatched(i))
    timer = threading.Timer(0.1, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        t.close()  # the slow sink holds the close up past the Ctrl-C
    timer.join()
    t.close()  # waits for the close under way
    assert t.state == "closed"
    (memory_sink,) = [s for s in t.sinks if type(s) is MemorySink]
    run = only_run(memory_sink.getvalue(), uri="memory://")
    assert run.closed is not None and run.closed["written"] == 100
    first = t.run_id
    t.open()  # a new run
    assert t.state == "open" and t.run_id != first
    t.emit(dispatched(0))
    t.close()
    assert t.state == "closed"


_OFF_MAIN = """
import sys, threading
import rollout_trace as rt

def work():
    with rt.sync_tracer(sys.argv[1]) as t:
        t.emit(rt.WeightsSynced(weight_version=1))

thread = threading.Thread(target=work)
thread.start()
thread.join()
"""


def test_a_tracer_opened_off_the_main_thread_says_sigterm_cannot_close_it(
    tmp_path: Path,
) -> None:
    # Only the main thread may install a signal handler: a tracer built and
    # opened on another thread had no SIGTERM hook, and nothing said so.
    proc = subprocess.run(
        [sys.executable, "-c", _OFF_MAIN, str(tmp_path / "run.jsonl")],
        capture_output=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.decode()
    assert err.count("SIGTERM cannot close") == 1, err
    assert "main thread" in err


_BUILT_ON_MAIN = """
import sys, threading
import rollout_trace as rt

t = rt.sync_tracer(sys.argv[1])  # the hook is installed here, on the main thread

def work():
    with t:
        t.emit(rt.WeightsSynced(weight_version=1))

thread = threading.Thread(target=work)
thread.start()
thread.join()
"""


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(
            "import signal\nsignal.signal(signal.SIGTERM, lambda *a: None)\n" + _OFF_MAIN,
            id="own-handler",
        ),
        pytest.param(_BUILT_ON_MAIN, id="built-on-main"),
    ],
)
def test_a_tracer_whose_run_sigterm_closes_is_not_warned(code: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "run.jsonl")],
        capture_output=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"SIGTERM" not in proc.stderr, proc.stderr


def test_one_event_object_emitted_twice_is_two_events() -> None:
    # The queued object keeps its own envelope: emitting it again copies it.
    # That was decided by `ev.time` being set, which a clock reading 0.0 left
    # unset, so the writer numbered one object twice.
    armed: list[bool] = []

    def clock() -> float:  # 0.0 for the emits (the writer stamps its lifecycle lines)
        return 0.0 if armed and threading.current_thread() is threading.main_thread() else 1.0

    t = rt.sync_tracer("memory://", clock=clock)
    ev = dispatched(0)
    with t:
        armed.append(True)
        t.emit(ev)
        t.emit(ev)
        t.emit(ev)
    lines = [json.loads(line) for line in t.sinks[0].lines()]  # type: ignore[attr-defined]
    seqs = [line["seq"] for line in lines]
    assert len(seqs) == len(set(seqs)), seqs
    c = t.counts
    assert c.emitted == 3 and c.written + c.invalid == 3, c
    assert len(lines) == c.written + 2


# --- found by review of the core ------------------------------------------------------


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(("backend", "options"), ASYNC_BACKENDS[:1] + ASYNC_BACKENDS[2:])
def test_a_flush_after_a_drop_says_false_while_another_task_emits(
    backend: str, options: dict[str, Any]
) -> None:
    # A drop was numbered before a flush's boundary only when the flush mark
    # ended its slice of the queue: with another task emitting meanwhile, the
    # flush said True although an event emitted before it was dropped.
    async def main() -> list[tuple[bool, rt.TraceCounts]]:
        out = []
        for _ in range(3):
            async with rt.tracer("slow://?delay=0.05", buffer=10_000) as t:
                stop = anyio.Event()

                async def other(t: rt.Tracer, stop: anyio.Event) -> None:
                    while not stop.is_set():
                        t.emit(dispatched(2))
                        await anyio.sleep(0.0002)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(other, t, stop)
                    before = t.counts.dropped
                    while t.counts.dropped == before:  # until one of ours is dropped
                        t.emit(dispatched(1))
                    ok = await t.flush()
                    stop.set()
            out.append((ok, t.counts))
        return out

    for ok, counts in anyio.run(main, backend=backend, backend_options=options):
        assert counts.dropped > 0
        assert ok is False, counts


async def _cancelled_in_close(t: rt.Tracer, results: list[str]) -> None:
    try:
        await t.aclose()
    except BaseException as exc:
        results.append(type(exc).__name__)
        raise
    results.append("returned")


@pytest.mark.usefixtures("plugins")
def test_a_native_cancel_during_aclose_is_raised_once_the_trace_is_complete() -> None:
    # aclose() took a native Task.cancel() and returned as if never cancelled,
    # and the cancellation it kept made the tracer's next clean run raise.
    import asyncio

    async def main() -> tuple[list[str], str]:
        t = rt.tracer("slow://?delay=0.3")
        await t.__aenter__()
        t.emit(dispatched(1))
        results: list[str] = []
        task = asyncio.create_task(_cancelled_in_close(t, results))
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        state = t.state
        async with t:  # a clean run of the same tracer: nothing left to raise
            t.emit(dispatched(2))
        return results, state

    results, state = asyncio.run(main())
    assert results == ["CancelledError"]
    assert state == "closed"


class SlowOpenSink(MemorySink):
    """Takes ``open_s`` seconds to open."""

    options = frozenset({"open_s"})

    def __init__(self, location: str, options: Any) -> None:
        super().__init__(location, options)
        self.open_s = float(options.get("open_s", "0.02"))

    def open(self) -> None:
        time.sleep(self.open_s)
        super().open()


def test_an_entry_cancelled_as_the_sinks_open_leaves_no_thread_behind(
    plugins: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cancellation that came after the writer thread had opened the sinks,
    # and before the entering task saw it, marked the run failed while the
    # writer went on serving it: its thread and sink were never closed.
    from importlib.metadata import EntryPoint

    from rollout_trace._writing import specs

    monkeypatch.setitem(
        specs._registry(),
        "slowopen",
        EntryPoint("slowopen", "test_writer_core:SlowOpenSink", specs.ENTRY_POINT_GROUP),
    )

    async def main() -> list[str]:
        left: list[str] = []
        for k in range(24):
            t = rt.tracer("slowopen://?open_s=0.02")
            with anyio.move_on_after(0.018 + k * 0.0003):
                async with t:
                    await anyio.sleep(0.05)
            run_id = (t.run_id or "")[:8]
            deadline = time.monotonic() + 5  # only ends a failure
            while time.monotonic() < deadline and any(
                run_id in th.name for th in threading.enumerate()
            ):
                await anyio.sleep(0.01)
            left += [th.name for th in threading.enumerate() if run_id and run_id in th.name]
            assert t.state == "closed"
        return left

    assert anyio.run(main) == []


@pytest.mark.usefixtures("plugins")
def test_a_flush_waiting_on_a_hung_sink_does_not_make_a_count_short() -> None:
    # A flush mark the stuck writer had taken off the queue was still taken
    # off the count of queued events: `emitted` came out one short a flush.
    t = rt.sync_tracer("stuck://?ok=1", close_timeout=0.5)
    t.open()
    for i in range(100):
        t.emit(dispatched(i))
    # The writer takes the batch and the flush's mark, and hangs in its write.
    assert t.flush(timeout=0.2) is False
    for i in range(100):
        t.emit(dispatched(i))
    t.close()
    c = t.counts
    assert c.emitted == 200 and c.written + c.dropped == 200, c


_FORK_KEPT = """
import os, sys
import rollout_trace as rt

t = rt.sync_tracer(sys.argv[1])
t.open()
emit = t.emit  # kept from the parent's run
pid = os.fork()
if pid == 0:
    for i in range(100):
        emit(rt.WeightsSynced(weight_version=i))
    c = t.counts
    print(c.emitted, c.outside_run, t.flush(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
t.close()
"""


def test_an_emit_kept_from_before_a_fork_counts_in_the_child(tmp_path: Path) -> None:
    # An emit bound to the parent's run put the child's events into a dead
    # copy of the parent's queue: no file, no count, and flush() said True.
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_KEPT, str(tmp_path / "run-{pid}.jsonl")],
        capture_output=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [b"0", b"100", b"False"], proc.stdout


def test_a_clock_that_fails_later_costs_its_events_not_trace_closed() -> None:
    readings = iter([5.0, 6.0])  # the check when built, trace_opened; then 0.0

    t = rt.sync_tracer("memory://", clock=lambda: next(readings, 0.0))
    with t:
        t.emit(dispatched(0))
    lines = [json.loads(line) for line in t.sinks[0].lines()]  # type: ignore[attr-defined]
    assert [line["event"] for line in lines] == ["trace_opened", "trace_closed"]
    assert lines[-1]["invalid"] == 1 and lines[-1]["time"] == 6.0


def test_the_ctrl_c_tests_hold_when_the_suite_runs_as_a_background_job(tmp_path: Path) -> None:
    # A shell starts a background job with SIGINT ignored; the suite's own
    # setup gives the tests that send a real Ctrl-C the handler they need.
    test = f"{__file__}::test_ctrl_c_in_close_leaves_a_tracer_that_closes_and_opens_again"
    bt = ["--basetemp", str(tmp_path / "bt")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test, *bt],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stdout[-3000:]
