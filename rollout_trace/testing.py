"""Helpers for testing code that emits events: ``capture_events()``.

Like structlog's ``capture_logs``: inside the block, every tracer that is
created and opened (async or sync, enabled or not, whatever its URIs) writes
to memory instead, and the block's value gives the events back, typed::

    from rollout_trace.testing import capture_events

    def test_dispatch():
        with capture_events() as events:
            run_controller_once()          # opens and closes its own tracer
        assert events.of_type(rt.AttemptDispatched)[0].attempt == 0

Events show up once written: after the tracer's ``flush()`` or close.
``capture_events(strict=True)`` also makes every tracer opened inside the
block raise at ``emit`` for an event it would otherwise count invalid.

``MockClock`` is a clock for the tracer's deadlines (``deadline_clock=``):
it stands still until the test moves it, so a test of a close that gives
up, a flush that times out or a hung sink is exact and takes no time::

    clock = MockClock()
    t = rt.sync_tracer(uri_of_a_sink_that_hangs, close_timeout=5, deadline_clock=clock)
    ...                         # emit; the sink hangs in a write
    closer = threading.Thread(target=t.close); closer.start()
    clock.advance(5.0)          # to the close's deadline, once the close began
    closer.join()               # the close gives the run up within 50 ms
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar, overload

import msgspec

from rollout_trace.sinks import MemorySink, Sink

from ._schema.decoding import UnknownEvent, decode_line
from ._schema.events import LIFECYCLE_EVENTS, Event, tag_of
from ._writing.specs import capture_override, capture_strict

__all__ = ["CapturedEvents", "MockClock", "capture_events"]

E = TypeVar("E", bound=Event)


class CapturedEvents(Sequence[Event]):
    """The events written so far by tracers opened inside ``capture_events()``.

    A sequence of the user's events (lifecycle events left out; ``all()``
    has them), each with its envelope (``time``, ``run_id``, ``seq``).
    """

    def __init__(self) -> None:
        self._sinks: list[MemorySink] = []

    def _new_sink(self) -> list[tuple[str, Sink]]:
        sink = MemorySink("capture", {})
        self._sinks.append(sink)
        return [("memory://capture", sink)]

    def all(self) -> list[Event | UnknownEvent]:
        """Every event written, lifecycle events included, run by run."""
        return [decode_line(line) for sink in self._sinks for line in sink.lines()]

    def _events(self) -> list[Event]:
        return [
            ev
            for ev in self.all()
            if isinstance(ev, Event) and tag_of(type(ev)) not in LIFECYCLE_EVENTS
        ]

    def of_type(self, cls: type[E]) -> list[E]:
        """The events of one class (subclasses included)."""
        return [ev for ev in self._events() if isinstance(ev, cls)]

    def without_envelope(self) -> list[Event]:
        """The events with the envelope reset, to compare with freshly built ones."""
        return [msgspec.structs.replace(ev, time=0.0, run_id="", seq=-1) for ev in self._events()]

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...
    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        return self._events()[index]

    def __len__(self) -> int:
        return len(self._events())

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events())

    def __repr__(self) -> str:
        return f"CapturedEvents({self._events()!r})"


@contextmanager
def capture_events(*, strict: bool = False) -> Iterator[CapturedEvents]:
    """Capture the events of every tracer created and opened inside the block.

    ``strict=True`` makes every tracer opened inside the block strict, as
    ``rt.tracer(..., strict=True)`` does: ``emit`` raises
    ``rt.InvalidEventError`` for an event its class's schema refuses (a
    field of the wrong type, a NaN) and ``rt.EventTagError`` for a class
    whose tag another class holds, instead of counting it invalid, and an
    ``attempt`` block left without a choice raises ``rt.TracerStateError``.
    A test then fails at the line that made the event.
    """
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, not {type(strict).__name__}: {strict!r}")
    captured = CapturedEvents()
    capture_override.append(captured._new_sink)
    capture_strict.append(strict)
    try:
        yield captured
    finally:
        at = capture_override.index(captured._new_sink)
        del capture_override[at], capture_strict[at]


class MockClock:
    """A clock that moves only when told to (``advance``), for ``deadline_clock=``.

    Modelled on trio's ``MockClock``: calling it returns its time in seconds
    (``start``, 1000.0 unless given), which ``advance(seconds)`` (or
    ``advance_to(t)``) moves forward;
    any thread may read or advance it. The tracer's waits go on polling in
    real time (every 50 ms at most): a deadline the clock is moved past ends
    its wait at the next poll, and none that it is not moved past ever ends.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` (>= 0) forward."""
        if not seconds >= 0:  # NaN too
            raise ValueError(f"a clock only goes forward: advance({seconds!r})")
        with self._lock:
            self._now += seconds

    def advance_to(self, t: float) -> None:
        """Move the clock to ``t`` exactly (not before its time now): a deadline
        ``t`` is reached however the sum of the steps to it would round."""
        with self._lock:
            if not t >= self._now:
                raise ValueError(f"a clock only goes forward: advance_to({t!r}) at {self._now!r}")
            self._now = float(t)

    def __repr__(self) -> str:
        return f"MockClock({self._now!r})"
