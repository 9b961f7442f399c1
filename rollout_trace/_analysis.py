"""What a stop and restore cost, from events alone (README: Reference > Restore-cost figures).

Runs are folded into compact state as events stream by, so a trace set of any
length needs memory for the attempts open at a time, one small record per
sealed attempt and the run's steps, not for its events. Events of a run are
applied in ``seq`` order: an event that arrives early waits in a small heap
until the ones before it have come (or until the heap fills, for a gap).
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Union

import msgspec

from ._events import (
    LIFECYCLE_EVENTS,
    AttemptAbandoned,
    AttemptDispatched,
    AttemptRefused,
    AttemptResumed,
    AttemptSealed,
    GroupAdmitted,
    GroupDiscarded,
    GroupReserved,
    GroupSealed,
    RestoreFinished,
    RestoreStarted,
    SnapshotPublished,
    StepTrained,
    TraceOpened,
    TrainerCheckpointPublished,
    WeightsSynced,
)
from ._figures import StopCost, stop_cost
from ._lean import (
    ATTEMPT_KIND,
    DISPATCHED,
    ENDED,
    ENVELOPE_ONLY,
    LEAN,
    SEALED,
    LeanRestoreFinished,
    LeanRestoreStarted,
    LeanSnapshotPublished,
    LeanStepTrained,
    LeanTraceOpened,
    LeanTrainerCheckpointPublished,
)
from ._schema.decoding import AnyEvent

__all__ = ["CostAnalysis", "restore_costs", "Run", "group_runs"]

_Key = tuple[Union[int, str], int]  # noqa: UP007

# How far ahead of the next expected seq an event may arrive and still be put
# in order. Threads emitting at once shuffle neighbours only; a larger
# distance is a gap (dropped events), and the run moves past it.
_REORDER_WINDOW = 4096

# The rollout events (README: Reference > Rollout events): the first of them tells whether a run's
# rollout work begins with a restore.
_ROLLOUT = frozenset(
    {
        GroupReserved,
        GroupAdmitted,
        GroupSealed,
        GroupDiscarded,
        AttemptDispatched,
        AttemptSealed,
        AttemptRefused,
        AttemptResumed,
        AttemptAbandoned,
        StepTrained,
        WeightsSynced,
        TrainerCheckpointPublished,
        SnapshotPublished,
        RestoreStarted,
        RestoreFinished,
        *(cls for tag, cls in LEAN.items() if tag not in LIFECYCLE_EVENTS),
    }
)

# The hot loop's view of a class: an attempt kind, 0 for a group or weight-sync
# event (no figure needs them), missing for anything `_Run.apply` must see.
_IGNORED = 0
_FAST_KIND: dict[type[Any], int] = dict(ATTEMPT_KIND)
_FAST_KIND.update(dict.fromkeys((GroupReserved, GroupAdmitted, GroupSealed, GroupDiscarded), 0))
_FAST_KIND[WeightsSynced] = _IGNORED
_FAST_KIND.update((LEAN[tag], _IGNORED) for tag in ENVELOPE_ONLY)


class _Run:
    """The state of one run that the figures need, folded as events arrive."""

    __slots__ = (
        "checkpoints",
        "duplicates",
        "first_rollout",
        "first_time",
        "gaps",
        "last_seq",
        "last_time",
        "next_seq",
        "open",
        "opened_at",
        "pending",
        "restore_finished_at",
        "resumed",
        "run_id",
        "seal_keys",
        "seal_spans",
        "seal_times",
        "snapshots",
        "steps",
        "superseded",
        "tiebreak",
    )

    def __init__(self, run_id: str, first_time: float) -> None:
        self.run_id = run_id
        self.first_time = first_time
        self.opened_at: float | None = None
        self.next_seq = 0
        self.last_seq = -1
        self.last_time = first_time
        self.pending: list[tuple[int, int, Any]] = []
        self.tiebreak = 0
        # The seq numbers passed over without their event, as [start, end)
        # ranges: an event below next_seq is a late one only if it is in a gap;
        # otherwise it is a duplicate (a run read twice: two sinks of one
        # tracer, a copied file) and must not count twice.
        self.gaps: list[tuple[int, int]] = []
        self.duplicates = 0
        # sibling -> (attempt, start time) of its open attempt, if it has one.
        self.open: dict[_Key, tuple[int, float]] = {}
        self.superseded: dict[tuple[_Key, int], float] = {}
        # One entry per attempt_sealed: sibling, seal time, seal - start (NaN
        # when A never started that attempt, e.g. its dispatch was dropped).
        self.seal_keys: list[_Key] = []
        self.seal_times = array("d")
        self.seal_spans = array("d")
        self.steps: list[tuple[int, float]] = []
        self.snapshots: dict[str, float] = {}
        self.checkpoints: dict[str, float] = {}
        self.first_rollout: Any = None
        self.restore_finished_at: float | None = None
        self.resumed: set[_Key] = set()

    def apply(self, ev: Any) -> None:
        """Fold one event in, in seq order."""
        if ev.seq > self.last_seq:
            self.last_seq = ev.seq
            self.last_time = ev.time
        if self.first_rollout is None and type(ev) in _ROLLOUT:
            self.first_rollout = ev
        kind = ATTEMPT_KIND.get(type(ev))
        if kind is not None:
            # Attempt events come as real or lean classes: dispatch on kind.
            self.attempt_event(kind, ev)
            return
        match ev:
            case StepTrained() | LeanStepTrained():
                self.steps.append((ev.step, ev.time))
            case SnapshotPublished() | LeanSnapshotPublished():
                self.snapshots[ev.path] = ev.captured_at
            case TrainerCheckpointPublished() | LeanTrainerCheckpointPublished():
                self.checkpoints[ev.path] = ev.time
            case RestoreFinished() | LeanRestoreFinished():
                if self.restore_finished_at is None:
                    self.restore_finished_at = ev.time
            case TraceOpened() | LeanTraceOpened():
                self.opened_at = ev.time
            case _:
                pass

    def start(self, key: _Key, attempt: int, t: float) -> None:
        prev = self.open.get(key)
        if prev is not None and prev[0] != attempt:
            # A newer try began while this one had not ended; keep its start
            # in case it still ends (a late seal is still redone work).
            self.superseded[(key, prev[0])] = prev[1]
        self.open[key] = (attempt, t)

    def end(self, key: _Key, attempt: int) -> float | None:
        """Close ``attempt`` of ``key``; its start time, or None if A never started it."""
        started = self.open.get(key)
        if started is not None and started[0] == attempt:
            del self.open[key]
            return started[1]
        if self.superseded:
            return self.superseded.pop((key, attempt), None)
        return None

    def attempt_event(self, kind: int, ev: Any) -> None:
        key = (ev.prompt_id, ev.generation_index)
        if kind == DISPATCHED:
            self.start(key, ev.attempt, ev.time)
        elif kind == SEALED:
            self.seal(key, ev.attempt, ev.time)
        elif kind == ENDED:
            self.end(key, ev.attempt)
        else:
            # A resume starts the attempt in this run, at the resume's time.
            self.start(key, ev.attempt, ev.time)
            self.resumed.add(key)

    def seal(self, key: _Key, attempt: int, t: float) -> None:
        began = self.end(key, attempt)
        span = math.nan if began is None else t - began
        self.seal_keys.append(key)
        self.seal_times.append(t)
        self.seal_spans.append(span)

    def arrive_out_of_order(self, ev: Any) -> None:
        """An event whose seq is not the next one: hold it, or apply it late."""
        if ev.seq < self.next_seq:
            # Already past it: an event later than the window, or a duplicate.
            if self._fill_gap(ev.seq):
                self.apply(ev)
            else:
                self.duplicates += 1
            return
        self.tiebreak += 1
        heapq.heappush(self.pending, (ev.seq, self.tiebreak, ev))
        if len(self.pending) > _REORDER_WINDOW:
            # The run skipped a seq (a dropped event): move on past the gap.
            self._skip_to(self.pending[0][0])
        self.drain()

    def _skip_to(self, seq: int) -> None:
        if seq > self.next_seq:
            self.gaps.append((self.next_seq, seq))
            self.next_seq = seq

    def _fill_gap(self, seq: int) -> bool:
        """Take ``seq`` out of the gaps; whether it was in one."""
        i = bisect.bisect_right(self.gaps, (seq, math.inf)) - 1
        if i < 0:
            return False
        start, end = self.gaps[i]
        if not start <= seq < end:
            return False
        self.gaps[i : i + 1] = [r for r in ((start, seq), (seq + 1, end)) if r[0] < r[1]]
        return True

    def drain(self) -> None:
        pending = self.pending
        while pending and pending[0][0] <= self.next_seq:
            seq, _, ev = heapq.heappop(pending)
            if seq < self.next_seq:  # the same seq twice in the window
                self.duplicates += 1
                continue
            self.apply(ev)
            self.next_seq = seq + 1

    def finish(self) -> None:
        while self.pending:
            self._skip_to(self.pending[0][0])
            self.drain()

    @property
    def order(self) -> tuple[float, str]:
        return (self.opened_at if self.opened_at is not None else self.first_time, self.run_id)


class CostAnalysis:
    """Folds events (any order of runs, any file layout) into restore costs.

    Feed it with ``add`` as many times as needed, then call ``stops``.
    """

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self.notes: list[str] = []

    def add(self, events: Iterable[Any]) -> None:
        """Fold events in: real ``Event``s, ``UnknownEvent``s or ``_lean`` classes."""
        # The hot loop. Attempt events are most lines of a trace, so they are
        # handled inline, by kind, with the current run's state in locals
        # while its events come in a row; everything else, and any event out
        # of seq order, goes through `_Run.apply`.
        runs = self._runs
        run: _Run | None = None
        run_id = ""
        nxt = 0
        # True while the run's events cannot take the fast path: some wait in
        # its reorder heap, or its first rollout event has not been seen.
        slow = True
        last: Any = None
        open_: dict[_Key, tuple[int, float]] = {}
        seal_keys: list[_Key] = []
        seal_times = seal_spans = array("d")
        kind_of = _FAST_KIND.get
        nan = math.nan
        for ev in events:
            if ev.run_id != run_id:
                if run is not None:
                    self._park(run, nxt, last)
                run_id = ev.run_id
                run = runs.get(run_id)
                if run is None:
                    run = runs[run_id] = _Run(run_id, ev.time)
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
                self._park(run, nxt, last)
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
            self._park(run, nxt, last)

    @staticmethod
    def _park(run: _Run, nxt: int, last: Any) -> None:
        """Write the hot loop's locals back to the run."""
        run.next_seq = nxt
        if last is not None and last.seq > run.last_seq:
            run.last_seq = last.seq
            run.last_time = last.time

    def runs(self) -> list[_Run]:
        """Every run seen, ordered by the time of its ``trace_opened``."""
        for run in self._runs.values():
            run.finish()
        return sorted(self._runs.values(), key=lambda r: r.order)

    def stops(self) -> list[StopCost]:
        """The stops of the trace set, in run order, each with its figures."""
        self.notes = []
        ordered = self.runs()
        out: list[StopCost] = []
        previous: _Run | None = None
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


class Run(msgspec.Struct, kw_only=True):
    """One run's events, sorted by ``seq``."""

    run_id: str
    opened_at: float | None
    events: list[AnyEvent]


def group_runs(events: Iterable[AnyEvent]) -> list[Run]:
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
        runs.append(Run(run_id=run_id, opened_at=opened, events=evs))
    runs.sort(
        key=lambda r: (r.opened_at if r.opened_at is not None else r.events[0].time, r.run_id)
    )
    return runs
