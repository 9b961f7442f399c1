"""A sink that stages what it accepts and delivers it later (``Sink.stages``, an
object store's way): what the engine and the runner count for it.

``StagingSink`` is a store in memory whose delivery the tests hold and let go:
a batch counts as written only once the bytes that hold it are delivered, a
flush says True only when nothing is left staged, and at the close what is
still staged when the drain's deadline comes is counted lost, once, with the
sink's own reason. Every count is checked against the lines really delivered.

The close's tries and pauses are on the tracer's deadline clock, a
``WatchedClock`` the tests move: a try to a store that is down moves it as
long as the try takes, and ``_closing`` moves it through each pause.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import EntryPoint
from typing import Any

import pytest
from deadlines import HANG_S, POLLS_S, WatchedClock, advancing
from harness import DRIVERS as ALL_DRIVERS
from harness import Driver, Handle, SyncDriver
from tracecheck import check_runs

import rollout_trace as rt
import rollout_trace._writing.specs as sinkspec
from rollout_trace._writing.engine import DRAIN_SHARE, Engine
from rollout_trace.sinks import Sink
from rollout_trace.testing import MockClock

LIFECYCLE = ("trace_opened", "trace_closed")
# The async tracer (a sink's own thread) and the sync tracer (its writer
# thread writes to a lone sink itself).
DRIVERS = [ALL_DRIVERS[0], ALL_DRIVERS[-1]]
IDS = [d.name for d in DRIVERS]
DOWN = "ConnectionError: the store is down (fake)"


class StagingSink(Sink):
    """Stages every write; a flush (or the close) delivers what is staged while
    ``up``, all of it or the first ``budget`` bytes of all it accepted (a cut
    anywhere, mid-line too). Down, a flush takes ``down_s`` on the sink's clock
    (a test's ``MockClock``, moved that much) and delivers nothing; ``failed``
    is when each such try began, on that clock. ``back_after``: the store is
    up again once that many tries failed."""

    stages = True

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self.accepted = bytearray()
        self.ends: list[int] = []  # where each write ended
        self.delivered = 0
        self.up = True
        self.budget: int | None = None
        self.down_s = 0.0
        self.back_after: int | None = None
        self.failed: list[float] = []
        self.flushes = 0
        self.closed = self.discarded = False

    def write(self, data: bytes) -> None:
        self.accepted += data
        self.ends.append(len(self.accepted))

    def flush(self) -> None:
        self.flushes += 1
        if not self.up:
            self._fail()
            return
        end = len(self.accepted) if self.budget is None else min(self.budget, len(self.accepted))
        self.delivered = max(self.delivered, end)

    def _fail(self) -> None:
        began = self.deadline_clock()
        if self.down_s:
            # A try that takes its time takes it on the tracer's deadline clock.
            assert isinstance(self.deadline_clock, MockClock), "down_s is for a test's clock"
            self.deadline_clock.advance(self.down_s)
        self.failed.append(began)  # last: the try is over once it is counted
        if len(self.failed) == self.back_after:
            self.up = True

    def staged_bytes(self) -> int:
        return len(self.accepted) - self.delivered

    def why_staged(self) -> str | None:
        return None if self.up or not self.staged_bytes() else DOWN

    def close(self) -> None:
        self.flush()
        self.closed = True

    def discard(self) -> None:
        self.discarded = True

    def stored(self) -> bytes:
        """What was delivered: the only bytes a reader of the store could see."""
        return bytes(self.accepted[: self.delivered])


@pytest.fixture
def uri(monkeypatch: pytest.MonkeyPatch) -> str:
    """``staging://`` installed as a plugin would be (an entry point), and a
    uri of it for this test alone: what is said of it is this test's."""
    monkeypatch.setitem(
        sinkspec._registry(),
        "staging",
        EntryPoint(
            name="staging", value=f"{__name__}:StagingSink", group=sinkspec.ENTRY_POINT_GROUP
        ),
    )
    return f"staging://{uuid.uuid4().hex[:12]}"


def _sink(t: rt.Tracer | rt.SyncTracer) -> StagingSink:
    (sink,) = t.sinks
    assert isinstance(sink, StagingSink)
    return sink


def _events(data: bytes) -> list[int]:
    """The events among the whole lines of ``data`` (a cut line is no line)."""
    lines = data.split(b"\n")[:-1]
    return [
        json.loads(line)["weight_version"]
        for line in lines
        if json.loads(line)["event"] not in LIFECYCLE
    ]


async def _emit(h: Handle, start: int, stop: int) -> None:
    for i in range(start, stop):
        h.emit(rt.WeightsSynced(weight_version=i))


def _warnings(log: pytest.LogCaptureFixture, *about: str | None) -> list[str]:
    """What was said of the sink or the run (``about``: its URI, its run_id)."""
    messages = [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]
    return [m for m in messages if any(word and word in m for word in about)]


# How far short of a pause's end the clock stops first (a power of two: the
# clock then lands on the end exactly).
SHORT_S = 2.0**-10


@contextmanager
def _closing(
    clock: WatchedClock, t: rt.Tracer | rt.SyncTracer, pauses: list[float]
) -> Iterator[None]:
    """The close of ``t``, on ``clock``, whose drain pauses ``pauses`` between
    its tries to the store: once the k-th try failed and the writer thread
    (which drains) has read the clock since, fixing the pause's end, the clock
    moves to just short of that end, where the store must not be tried again
    (for a few of the wait's polls), then to it. A pause fewer fails the test,
    and so does one more: after ``HANG_S`` of real time the clock is moved a
    day on, so that the close ends."""
    sink = _sink(t)
    assert t.run_id is not None
    writer = f"rollout_trace writer {t.run_id[:8]}"
    done = threading.Event()
    wrong: list[str] = []

    def until(cond: Callable[[], bool]) -> bool:
        end = time.monotonic() + HANG_S
        while not cond():
            if done.is_set() or time.monotonic() > end:
                return False
            time.sleep(0.002)
        return True

    def read_by_writer() -> bool:
        ident = next((th.ident for th in threading.enumerate() if th.name == writer), None)
        return clock.read_by(ident)

    def pause(k: int, seconds: float) -> bool:
        if not until(lambda: len(sink.failed) >= k):
            return False
        clock.forget()
        if not until(read_by_writer):
            return False
        end, tried = clock() + seconds, sink.flushes
        clock.advance(end - SHORT_S - clock())
        if done.wait(POLLS_S) or sink.flushes != tried:
            wrong.append(f"the store was tried again {SHORT_S} s before a pause's end")
        clock.advance(max(0.0, end - clock()))  # (not back, if it was tried)
        return True

    def drain() -> None:
        for k, seconds in enumerate(pauses, 1):
            if not pause(k, seconds):
                wrong.append(f"the close did not pause after its try {k}")
                break
        if not done.wait(HANG_S):
            wrong.append(f"the close waited for more than {len(pauses)} pauses")
            clock.advance(86_400.0)

    mover = threading.Thread(target=drain, name="test clock", daemon=True)
    mover.start()
    try:
        yield
    finally:
        done.set()
        mover.join(HANG_S)
    assert not wrong, wrong


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_batch_counts_as_written_once_it_is_delivered(
    driver: Driver, uri: str, trace_log: pytest.LogCaptureFixture
) -> None:
    async def scenario(h: Handle) -> None:
        sink = _sink(h.tracer)
        sink.up = False
        await _emit(h, 0, 100)
        # Accepted by the sink, not delivered: not written, and flush says so.
        assert not await h.flush()
        assert not await h.flush()
        assert sink.staged_bytes() > 0
        assert h.counts.written == len(_events(sink.stored())) == 0
        assert h.counts.pending == 100
        sink.up = True
        await _emit(h, 100, 150)
        assert await h.flush()
        assert h.counts.written == len(_events(sink.stored())) == 150

    out = driver.run([uri], scenario)
    sink = _sink(out.tracer)
    assert _events(sink.stored()) == list(range(150))
    check_runs(sink.stored(), uri=uri)  # trace_closed's own count is the lines delivered
    assert out.counts.written == 150 and sink.closed
    assert _warnings(trace_log, uri, out.tracer.run_id) == []


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_write_counts_only_once_all_of_it_is_delivered(driver: Driver, uri: str) -> None:
    async def scenario(h: Handle) -> None:
        sink = _sink(h.tracer)
        sink.up = False
        for n in range(5):  # five writes, each flushed out of the tracer
            await _emit(h, 20 * n, 20 * (n + 1))
            assert not await h.flush()
        assert len(sink.ends) >= 6  # trace_opened, then the five
        # Delivered: every write up to the fourth from the end, and ten bytes
        # of the next (not a whole line of it).
        cut = sink.ends[-4] + 10
        sink.budget, sink.up = cut, True
        assert not await h.flush()  # some is still staged
        stored = sink.stored()
        assert len(stored) == cut and not stored.endswith(b"\n")
        assert h.counts.written == len(_events(stored)) == 40
        sink.budget = None
        assert await h.flush()
        assert h.counts.written == len(_events(sink.stored())) == 100

    driver.run([uri], scenario)


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_what_is_staged_at_the_close_deadline_is_counted_lost_and_said_once(
    driver: Driver, uri: str, trace_log: pytest.LogCaptureFixture
) -> None:
    # Each try to the store, down, takes 0.25 s; the drain has 2 s of the
    # close's 2.5 s. Tries at 0, 0.75 and 1.5 s, each after a pause of 0.5 s;
    # after the third, the drain leaves no pause before a fourth: not begun.
    close_timeout = 2.5
    clock = WatchedClock()
    start = clock()

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)
        assert await h.flush()
        sink = _sink(h.tracer)
        sink.down_s, sink.up, sink.flushes = 0.25, False, 0
        await _emit(h, 100, 150)

    t = driver.make(uri, close_timeout=close_timeout, deadline_clock=clock)
    out = driver.drive(t, scenario, closing=lambda: _closing(clock, t, [0.5, 0.5]))
    sink = _sink(out.tracer)
    assert _events(sink.stored()) == list(range(100))
    c = out.counts
    assert (c.emitted, c.written, c.dropped, c.pending) == (150, 100, 50, 0)
    # Tried again while the drain's share of the deadline lasted, and the
    # close over with the last try, within its deadline.
    assert sink.failed == [start, start + 0.75, start + 1.5]
    assert sink.flushes == 3
    assert clock() == start + 1.75 < start + close_timeout
    # Stopped: discarded, not closed (what it stages was counted lost and is
    # not delivered after the counts).
    assert (sink.discarded, sink.closed) == (True, False)
    (warning,) = _warnings(trace_log, uri, out.tracer.run_id)
    assert uri in warning
    assert f"did not deliver what it staged before the close deadline: {DOWN}" in warning


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_slow_try_at_the_close_is_not_begun_past_what_the_deadline_leaves(
    driver: Driver, uri: str, trace_log: pytest.LogCaptureFixture
) -> None:
    # Each try takes 1.25 s; the drain has 2 s of the close's 2.5 s. A second
    # try (at 1.75 s, after the 0.5 s pause) would end at 3 s, past the
    # drain, and past the deadline: the sync tracer's writer thread would
    # still be in it (the close gives the run up, for no reason of the
    # sink's), the async one's sink thread too (it is left behind, said
    # twice). Not begun, nor paused for: the reason is the sink's, said once.
    close_timeout = 2.5
    clock = WatchedClock()
    start = clock()

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)
        assert await h.flush()
        sink = _sink(h.tracer)
        sink.down_s, sink.up, sink.flushes = 1.25, False, 0
        await _emit(h, 100, 150)

    t = driver.make(uri, close_timeout=close_timeout, deadline_clock=clock)
    out = driver.drive(t, scenario, closing=lambda: _closing(clock, t, []))
    sink = _sink(out.tracer)
    assert sink.failed == [start] and sink.flushes == 1
    assert clock() == start + 1.25  # the one try, and nothing waited for after it
    assert (out.counts.written, out.counts.dropped) == (len(_events(sink.stored())), 50)
    (warning,) = _warnings(trace_log, uri, out.tracer.run_id)
    assert f"did not deliver what it staged before the close deadline: {DOWN}" in warning


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_the_drain_ends_at_its_share_of_the_close_however_late_the_writer_gets_there(
    driver: Driver, uri: str, trace_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The drain's deadline is four fifths of close_timeout from the close's
    # call. The writer thread gets to the close only once the clock stands
    # there (a writer held up as a loaded machine may hold it): the close ends
    # at once, the store given up. Timed from the writer's own read, the drain
    # would pause for one more try, past where the clock was moved.
    close_timeout = 2.5
    clock = WatchedClock()
    start = clock()
    closing = Engine.closing

    def held_up(engine: Engine, *args: Any) -> Any:
        end = time.monotonic() + HANG_S  # (a hang guard: the clock moves at the close's call)
        while clock() == start and time.monotonic() < end:
            time.sleep(0.002)
        return closing(engine, *args)

    monkeypatch.setattr(Engine, "closing", held_up)

    async def scenario(h: Handle) -> None:
        _sink(h.tracer).up = False
        await _emit(h, 0, 100)
        assert not await h.flush()  # in the sink, staged: only its delivery is left

    out = driver.run(
        [uri],
        scenario,
        close_timeout=close_timeout,
        deadline_clock=clock,
        closing=lambda: advancing(clock, close_timeout * DRAIN_SHARE, early=False),
    )
    assert clock() == start + close_timeout * DRAIN_SHARE
    c = out.counts
    assert (c.emitted, c.written, c.dropped) == (100, 0, 100)
    assert _sink(out.tracer).discarded
    (warning,) = _warnings(trace_log, uri, out.tracer.run_id)
    assert f"did not deliver what it staged before the close deadline: {DOWN}" in warning


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_store_back_during_the_close_gets_everything(
    driver: Driver, uri: str, trace_log: pytest.LogCaptureFixture
) -> None:
    # The close's first try fails, and the store is back by the next, after
    # the pause of 0.5 s on the clock.
    clock = WatchedClock()
    start = clock()

    async def scenario(h: Handle) -> None:
        sink = _sink(h.tracer)
        sink.up, sink.back_after = False, 1
        await _emit(h, 0, 100)

    t = driver.make(uri, close_timeout=5.0, deadline_clock=clock)
    out = driver.drive(t, scenario, closing=lambda: _closing(clock, t, [0.5]))
    sink = _sink(out.tracer)
    # The try that failed, the one that delivered, and the sink's own close.
    assert sink.failed == [start] and sink.flushes == 3
    assert clock() == start + 0.5
    assert _events(sink.stored()) == list(range(100))
    (run,) = check_runs(sink.stored(), uri=uri).values()
    assert run.closed is not None and run.closed["written"] == out.counts.written == 100
    assert sink.closed and not sink.discarded
    assert _warnings(trace_log, uri, out.tracer.run_id) == []


def test_the_sync_driver_is_direct(uri: str) -> None:
    """The sync tracer writes to its lone sink on its writer thread (what the
    slow-try test relies on to show a try is not cut short)."""
    t = SyncDriver().make(uri)
    t.open()
    try:
        engine: Any = t._run.engine
        assert [r.direct for r in engine.runners] == [True]
    finally:
        t.close()
