"""A sink that stages what it accepts and delivers it later (``Sink.stages``, an
object store's way): what the engine and the runner count for it.

``StagingSink`` is a store in memory whose delivery the tests hold and let go:
a batch counts as written only once the bytes that hold it are delivered, a
flush says True only when nothing is left staged, and at the close what is
still staged when the drain's deadline comes is counted lost, once, with the
sink's own reason. Every count is checked against the lines really delivered.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from typing import Any

import pytest
from harness import DRIVERS as ALL_DRIVERS
from harness import Driver, Handle, SyncDriver
from tracecheck import check_runs

import rollout_trace as rt
import rollout_trace._writing.specs as sinkspec
from rollout_trace.sinks import Sink

LIFECYCLE = ("trace_opened", "trace_closed")
# The async tracer (a sink's own thread) and the sync tracer (its writer
# thread writes to a lone sink itself).
DRIVERS = [ALL_DRIVERS[0], ALL_DRIVERS[-1]]
IDS = [d.name for d in DRIVERS]
DOWN = "ConnectionError: the store is down (fake)"


class StagingSink(Sink):
    """Stages every write; a flush (or the close) delivers what is staged while
    ``up``, all of it or the first ``budget`` bytes of all it accepted (a cut
    anywhere, mid-line too). Down, a flush takes ``down_s`` and delivers nothing."""

    stages = True

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self.accepted = bytearray()
        self.ends: list[int] = []  # where each write ended
        self.delivered = 0
        self.up = True
        self.budget: int | None = None
        self.down_s = 0.0
        self.flushes = 0
        self.closed = self.discarded = False

    def write(self, data: bytes) -> None:
        self.accepted += data
        self.ends.append(len(self.accepted))

    def flush(self) -> None:
        self.flushes += 1
        if not self.up:
            time.sleep(self.down_s)
            return
        end = len(self.accepted) if self.budget is None else min(self.budget, len(self.accepted))
        self.delivered = max(self.delivered, end)

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
    close_timeout = 2.0

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)
        assert await h.flush()
        sink = _sink(h.tracer)
        sink.up, sink.flushes = False, 0
        await _emit(h, 100, 150)

    out = driver.run([uri], scenario, close_timeout=close_timeout)
    sink = _sink(out.tracer)
    assert out.close_s < close_timeout + 0.5
    assert _events(sink.stored()) == list(range(100))
    c = out.counts
    assert (c.emitted, c.written, c.dropped, c.pending) == (150, 100, 50, 0)
    # Tried again while the drain's share of the deadline lasted (every 0.5 s).
    assert sink.flushes >= 3
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
    # Each try takes 0.9 s; the drain has 1.6 s of the close's 2 s. A second
    # try (at 1.4 s, after the 0.5 s pause) would end at 2.3 s, past the
    # drain, and past the deadline: the sync tracer's writer thread would
    # still be in it (the close gives the run up, for no reason of the
    # sink's), the async one's sink thread too (it is left behind, said
    # twice). Not begun: the reason is the sink's, said once.
    close_timeout = 2.0

    async def scenario(h: Handle) -> None:
        await _emit(h, 0, 100)
        assert await h.flush()
        sink = _sink(h.tracer)
        sink.down_s, sink.up, sink.flushes = 0.9, False, 0
        await _emit(h, 100, 150)

    out = driver.run([uri], scenario, close_timeout=close_timeout)
    sink = _sink(out.tracer)
    assert out.close_s < close_timeout
    assert sink.flushes == 1
    assert (out.counts.written, out.counts.dropped) == (len(_events(sink.stored())), 50)
    (warning,) = _warnings(trace_log, uri, out.tracer.run_id)
    assert f"did not deliver what it staged before the close deadline: {DOWN}" in warning


@pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
def test_a_store_back_during_the_close_gets_everything(
    driver: Driver, uri: str, trace_log: pytest.LogCaptureFixture
) -> None:
    back: list[threading.Timer] = []

    async def scenario(h: Handle) -> None:
        sink = _sink(h.tracer)
        sink.up = False
        await _emit(h, 0, 100)
        timer = threading.Timer(0.6, lambda: setattr(sink, "up", True))
        timer.start()
        back.append(timer)

    out = driver.run([uri], scenario, close_timeout=5.0)
    back[0].join()
    sink = _sink(out.tracer)
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
