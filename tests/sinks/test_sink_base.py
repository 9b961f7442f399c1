"""What every sink inherits (``Sink``): its deadlines on the tracer's clock.

A sink's own timeouts and backoffs are on ``Sink.deadline_clock``, which the
tracer sets to its ``deadline_clock``; ``wait_until`` waits on it, so a test's
``MockClock`` held still holds every such wait, however short in seconds.
"""

from __future__ import annotations

import threading
from importlib.metadata import EntryPoint

import pytest
from deadlines import WatchedClock, at_once, past_deadline

import rollout_trace as rt
import rollout_trace._writing.specs as sinkspec
from rollout_trace.sinks import MemorySink, Sink
from rollout_trace.testing import MockClock


def test_wait_until_waits_for_the_clock_not_for_real_time() -> None:
    sink = Sink("x", {})
    clock = sink.deadline_clock = WatchedClock()
    # 10 ms on the clock: a wait in real time would be over long before the
    # clock is moved (``past_deadline`` holds it still for 150 ms first).
    assert past_deadline(lambda: sink.wait_until(clock() + 0.01), clock, 0.01) is False


def test_wait_until_ends_when_its_event_is_set_or_its_deadline_has_passed() -> None:
    sink = Sink("x", {})
    clock = sink.deadline_clock = MockClock()
    done = threading.Event()
    done.set()
    assert at_once(lambda: sink.wait_until(clock() + 60, done)) is True
    assert at_once(lambda: sink.wait_until(clock() - 1)) is False


class _Stamping(MemorySink):
    """A sink of its own with an attribute named ``clock`` (read-only)."""

    @property
    def clock(self) -> str:
        return "the sink's own"


def test_a_sink_with_a_clock_of_its_own_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    group = sinkspec.ENTRY_POINT_GROUP
    entry = EntryPoint(name="stamping", value=f"{__name__}:_Stamping", group=group)
    monkeypatch.setitem(sinkspec._registry(), "stamping", entry)
    clock = MockClock()
    with rt.sync_tracer("stamping://", deadline_clock=clock) as t:
        t.emit(rt.WeightsSynced(weight_version=1))
    (sink,) = t.sinks
    assert isinstance(sink, _Stamping)
    assert sink.clock == "the sink's own" and sink.deadline_clock is clock
    assert t.counts.written == 1


def test_advance_to_lands_on_the_deadline_where_steps_would_round_short() -> None:
    clock = MockClock()  # 1000.0
    deadline = clock() + 0.2
    clock.advance(0.2 - 1e-3)
    clock.advance(1e-3)
    assert clock() < deadline  # the steps round a little short of it
    clock.advance_to(deadline)
    assert clock() == deadline
    with pytest.raises(ValueError, match="only goes forward"):
        clock.advance_to(deadline - 1)
