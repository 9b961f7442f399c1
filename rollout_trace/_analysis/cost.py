"""What a stop and restore cost, from events alone (README: Reference > Restore-cost figures).

Runs are folded into compact state (``fold.RunFold``) as events stream by, so
a trace set of any length needs memory for the attempts open at a time, one
small record per sealed attempt and the run's steps, not for its events.
``CostAnalysis.add`` is the hot loop: attempt events in seq order are folded
inline; everything else goes through ``RunFold``. ``stops`` pairs each run
that begins with a restore with the run before it and computes the figures
(``figures.stop_cost``).
"""

from __future__ import annotations

import gc
import math
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from .._reading.lean import (
    ATTEMPT_KIND,
    DISPATCHED,
    ENVELOPE_ONLY,
    LEAN,
    SEALED,
    LeanRestoreStarted,
)
from .._schema.decoding import AnyEvent
from .._schema.events import (
    GroupAdmitted,
    GroupDiscarded,
    GroupReserved,
    GroupSealed,
    RestoreStarted,
    TraceOpened,
    WeightsSynced,
)
from .figures import StopCost, stop_cost
from .fold import RunFold, SiblingKey

__all__ = ["CostAnalysis", "gc_paused", "restore_costs", "RunEvents", "group_runs"]

# The hot loop's view of a class: an attempt kind, 0 for a group or weight-sync
# event (no figure needs them), missing for anything `RunFold.apply` must see.
_IGNORED = 0
_FAST_KIND: dict[type[Any], int] = dict(ATTEMPT_KIND)
_FAST_KIND.update(dict.fromkeys((GroupReserved, GroupAdmitted, GroupSealed, GroupDiscarded), 0))
_FAST_KIND[WeightsSynced] = _IGNORED
_FAST_KIND.update((LEAN[tag], _IGNORED) for tag in ENVELOPE_ONLY)


class CostAnalysis:
    """Folds events (any order of runs, any file layout) into restore costs.

    Feed it with ``add`` as many times as needed, then call ``stops``.
    """

    def __init__(self) -> None:
        self._runs: dict[str, RunFold] = {}
        self.notes: list[str] = []

    def add(self, events: Iterable[Any]) -> None:
        """Fold events in: real ``Event``s, ``UnknownEvent``s or ``_reading.lean`` classes."""
        # The hot loop. Attempt events are most lines of a trace, so they are
        # handled inline, by kind, with the current run's state in locals
        # while its events come in a row; everything else, and any event out
        # of seq order, goes through `RunFold.apply`.
        runs = self._runs
        run: RunFold | None = None
        run_id = ""
        nxt = 0
        # True while the run's events cannot take the fast path: some wait in
        # its reorder heap, or its first rollout event has not been seen.
        slow = True
        last: Any = None
        open_: dict[SiblingKey, tuple[int, float]] = {}
        seal_keys: list[SiblingKey] = []
        seal_times = seal_spans = array("d")
        kind_of = _FAST_KIND.get
        nan = math.nan
        for ev in events:
            if ev.run_id != run_id:
                if run is not None:
                    self._store_locals(run, nxt, last)
                run_id = ev.run_id
                run = runs.get(run_id)
                if run is None:
                    run = runs[run_id] = RunFold(run_id, ev.time)
                nxt = run.next_seq
                slow = bool(run.pending) or run.first_rollout is None
                last = None
                open_ = run.open
                seal_keys = run.seal_keys
                seal_times = run.seal_times
                seal_spans = run.seal_spans
            assert run is not None
            seq = ev.seq
            if slow or seq != nxt:
                self._store_locals(run, nxt, last)
                last = None
                run.arrive_out_of_order(ev)
                nxt = run.next_seq
                slow = bool(run.pending) or run.first_rollout is None
                continue
            nxt = seq + 1
            last = ev
            kind = kind_of(type(ev))
            if kind == DISPATCHED:
                key = (ev.prompt_id, ev.generation_index)
                if key in open_:
                    run.start(key, ev.attempt, ev.time)
                else:
                    open_[key] = (ev.attempt, ev.time)
            elif kind == SEALED:
                key = (ev.prompt_id, ev.generation_index)
                t = ev.time
                began = open_.pop(key, None)
                if began is not None and began[0] == ev.attempt:
                    seal_spans.append(t - began[1])
                else:
                    if began is not None:
                        open_[key] = began  # a newer try is open; this seal is older
                    start = run.end(key, ev.attempt)
                    seal_spans.append(nan if start is None else t - start)
                seal_keys.append(key)
                seal_times.append(t)
            elif kind != _IGNORED:
                run.next_seq = nxt
                run.apply(ev)
            # else: a group or weight-sync event, which no figure needs.
        if run is not None:
            self._store_locals(run, nxt, last)

    @staticmethod
    def _store_locals(run: RunFold, nxt: int, last: Any) -> None:
        """Write the hot loop's locals back to the run."""
        run.next_seq = nxt
        if last is not None and last.seq > run.last_seq:
            run.last_seq = last.seq
            run.last_time = last.time

    def runs(self) -> list[RunFold]:
        """Every run seen, ordered by the time of its ``trace_opened``."""
        for run in self._runs.values():
            run.finish()
        return sorted(self._runs.values(), key=lambda r: r.order)

    def stops(self) -> list[StopCost]:
        """The stops of the trace set, in run order, each with its figures."""
        self.notes = []
        ordered = self.runs()
        out: list[StopCost] = []
        previous: RunFold | None = None
        for run in ordered:
            if run.duplicates:
                self.notes.append(
                    f"run {run.run_id}: {run.duplicates} events seen twice were counted once "
                    "(the same run read from two files?)"
                )
            first = run.first_rollout
            if isinstance(first, (RestoreStarted, LeanRestoreStarted)):
                if previous is None:
                    self.notes.append(
                        f"run {run.run_id} begins with a restore from {first.path!r} "
                        "but no earlier run with rollout events is in the trace set"
                    )
                else:
                    out.append(stop_cost(previous, run, first))
            if first is not None:
                previous = run
        return out


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector while folding millions of acyclic records."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def restore_costs(events: Iterable[AnyEvent]) -> list[StopCost]:
    """Every stop in ``events`` (one trace set, any layout) with its figures."""
    analysis = CostAnalysis()
    with gc_paused():
        analysis.add(events)
        return analysis.stops()


class RunEvents(msgspec.Struct, kw_only=True):
    """One run's events, sorted by ``seq``."""

    run_id: str
    opened_at: float | None
    events: list[AnyEvent]


def group_runs(events: Iterable[AnyEvent]) -> list[RunEvents]:
    """Events grouped by ``run_id``, runs ordered by their ``trace_opened`` time.

    Holds every event in memory; ``restore_costs`` does not need to.
    """
    by_run: dict[str, list[AnyEvent]] = {}
    for ev in events:
        by_run.setdefault(ev.run_id, []).append(ev)
    runs = []
    for run_id, evs in by_run.items():
        evs.sort(key=lambda e: e.seq)
        opened = next((e.time for e in evs if isinstance(e, TraceOpened)), None)
        runs.append(RunEvents(run_id=run_id, opened_at=opened, events=evs))
    runs.sort(
        key=lambda r: (r.opened_at if r.opened_at is not None else r.events[0].time, r.run_id)
    )
    return runs
