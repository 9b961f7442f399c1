"""One run's state as the restore-cost figures need it, folded event by event.

A ``RunFold`` keeps, per run, the attempts open now, one record per sealed
attempt, the steps, the published snapshots and checkpoints, and how the run
began. Events are applied in ``seq`` order: an event that arrives early waits
in a small heap until the ones before it have come (or until the heap fills,
for a gap); one seen twice is counted once.
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from typing import Any, Union

from .._reading.lean import (
    ATTEMPT_KIND,
    DISPATCHED,
    ENDED,
    LEAN,
    SEALED,
    LeanRestoreFinished,
    LeanSnapshotPublished,
    LeanStepTrained,
    LeanTraceOpened,
    LeanTrainerCheckpointPublished,
)
from .._schema.events import (
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

__all__ = ["SiblingKey", "RunFold"]

# A sibling: (prompt_id, generation_index); its attempts are its tries.
SiblingKey = tuple[Union[int, str], int]  # noqa: UP007

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


class RunFold:
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
        self.open: dict[SiblingKey, tuple[int, float]] = {}
        self.superseded: dict[tuple[SiblingKey, int], float] = {}
        # One entry per attempt_sealed: sibling, seal time, seal - start (NaN
        # when A never started that attempt, e.g. its dispatch was dropped).
        self.seal_keys: list[SiblingKey] = []
        self.seal_times = array("d")
        self.seal_spans = array("d")
        self.steps: list[tuple[int, float]] = []
        self.snapshots: dict[str, float] = {}
        self.checkpoints: dict[str, float] = {}
        self.first_rollout: Any = None
        self.restore_finished_at: float | None = None
        self.resumed: set[SiblingKey] = set()

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

    def start(self, key: SiblingKey, attempt: int, t: float) -> None:
        prev = self.open.get(key)
        if prev is not None and prev[0] != attempt:
            # A newer try began while this one had not ended; keep its start
            # in case it still ends (a late seal is still redone work).
            self.superseded[(key, prev[0])] = prev[1]
        self.open[key] = (attempt, t)

    def end(self, key: SiblingKey, attempt: int) -> float | None:
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

    def seal(self, key: SiblingKey, attempt: int, t: float) -> None:
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
