"""One run's state as the restore-cost figures need it, the same in any arrival order.

A trace set is a set: no order of its files or of their lines may change a
figure. So a ``RunFold`` holds nothing that depends on the order events
arrive in. Each field is the event with the highest (or lowest) ``seq`` of
some kind, ``seq`` being the order in which the tracer accepted the events:
the run's last event, its first rollout event, each attempt's latest start,
end and seal. Folding an event in is therefore commutative, folding it twice
changes nothing, and two folds of parts of one run merge into the fold of the
whole (``merge``), which is what lets files be read apart and joined later.

Memory, per run: one row per sibling (eight numbers in arrays: its latest
start, its latest end after that start, its latest seal), plus the older
starts and ends of the few siblings tried more than once; the seqs seen as
ranges (one per gap or out-of-order stretch); the steps, snapshots and
checkpoints; and the siblings resumed. Never the events themselves.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, NamedTuple, Union

from .._reading.lean import (
    ATTEMPT_KIND,
    DISPATCHED,
    ENVELOPE_ONLY,
    LEAN,
    RESUMED,
    SEALED,
    LeanRestoreFinished,
    LeanRestoreStarted,
    LeanSnapshotPublished,
    LeanStepTrained,
    LeanTraceOpened,
    LeanTrainerCheckpointPublished,
)
from .._schema.events import (
    LIFECYCLE_EVENTS,
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
from .seqs import SeqSet

__all__ = [
    "FAST_KIND",
    "IGNORED",
    "ROLLOUT",
    "SEQ_LIMIT",
    "First",
    "RunFold",
    "SiblingKey",
    "Siblings",
]

# A sibling: (prompt_id, generation_index); its attempts are its tries.
SiblingKey = tuple[Union[int, str], int]  # noqa: UP007

# Seqs are kept in signed 64-bit arrays; a larger one is corrupt data.
SEQ_LIMIT = 1 << 62

# The hot loop's view of a class: an attempt kind, IGNORED for an event no
# figure reads beyond its envelope, missing for anything `RunFold.other` reads.
IGNORED = 0
FAST_KIND: dict[type[Any], int] = dict(ATTEMPT_KIND)
FAST_KIND.update(
    dict.fromkeys((GroupReserved, GroupAdmitted, GroupSealed, GroupDiscarded, WeightsSynced), 0)
)
FAST_KIND.update((LEAN[tag], IGNORED) for tag in ENVELOPE_ONLY)

# The rollout events (README: Reference > Rollout events): the first of them,
# by seq, tells whether a run's rollout work begins with a restore.
ROLLOUT: frozenset[type[Any]] = frozenset(
    {
        *ATTEMPT_KIND,
        GroupReserved,
        GroupAdmitted,
        GroupSealed,
        GroupDiscarded,
        StepTrained,
        WeightsSynced,
        TrainerCheckpointPublished,
        SnapshotPublished,
        RestoreStarted,
        RestoreFinished,
        *(cls for tag, cls in LEAN.items() if tag not in LIFECYCLE_EVENTS),
    }
)


class First(NamedTuple):
    """An event picked by its seq (the first or last of a kind): its seq and the event."""

    seq: int
    event: Any


class Siblings(NamedTuple):
    """A run's siblings as the figures see them at its end.

    ``open`` maps each sibling in flight to the time its open attempt began;
    ``seals`` holds, per sibling with an ``attempt_sealed``, its last seal:
    ``(key, seal time, seal time minus the attempt's start)``, the span NaN
    where the run has no start of that attempt before the seal.
    """

    open: dict[SiblingKey, float]
    seals: list[tuple[SiblingKey, float, float]]


class RunFold:
    """The state of one run that the figures need, in any arrival order."""

    __slots__ = (
        "_siblings",
        "checkpoints",
        "duplicates",
        "e_att",
        "e_seq",
        "extra",
        "first",
        "first_restore",
        "first_rollout",
        "last",
        "opened",
        "restore_finished",
        "resumed",
        "rows",
        "run_id",
        "s_att",
        "s_seq",
        "s_time",
        "seqs",
        "snapshots",
        "steps",
        "unusable",
        "z_att",
        "z_seq",
        "z_time",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.seqs = SeqSet()
        # Events whose seq was seen already (a run read from two files) and
        # events with a seq no tracer gives (negative or too large).
        self.duplicates = 0
        self.unusable = 0
        # The events with the lowest and highest seq, and the first of kinds.
        self.first: First | None = None
        self.last: First | None = None
        self.opened: First | None = None
        self.first_rollout: First | None = None
        self.first_restore: First | None = None
        self.restore_finished: First | None = None
        self.steps: dict[int, tuple[int, float]] = {}  # seq -> (step, time)
        self.snapshots: dict[str, tuple[int, float]] = {}  # path -> (seq, captured_at)
        self.checkpoints: dict[str, tuple[int, float]] = {}  # path -> (seq, time)
        self.resumed: set[SiblingKey] = set()
        # One row per sibling, -1 (NaN for a time) where there is none:
        # s_*: its latest start (dispatch or resume): seq, attempt, time;
        # e_*: its latest end (seal, refusal, abandonment) after that start;
        # z_*: its latest seal: seq, attempt, time.
        # `extra` holds, for the rare sibling that needs them, its other
        # starts and its other ends after the latest start (see `_Extra`).
        self.rows: dict[SiblingKey, int] = {}
        self.s_seq = array("q")
        self.s_att = array("q")
        self.s_time = array("d")
        self.e_seq = array("q")
        self.e_att = array("q")
        self.z_seq = array("q")
        self.z_att = array("q")
        self.z_time = array("d")
        self.extra: dict[int, _Extra] = {}
        self._siblings: Siblings | None = None

    # --- folding events in ---------------------------------------------------

    def add(self, ev: Any) -> None:
        """Fold one event of this run in, whatever its place in the arrival order."""
        seq = ev.seq
        if not 0 <= seq < SEQ_LIMIT:
            self.unusable += 1
            return
        if not self.seqs.add(seq):
            self.duplicates += 1
            return
        self._siblings = None
        if self.first is None or seq < self.first.seq:
            self.first = First(seq, ev)
        if self.last is None or seq > self.last.seq:
            self.last = First(seq, ev)
        cls = type(ev)
        if cls in ROLLOUT and (self.first_rollout is None or seq < self.first_rollout.seq):
            self.first_rollout = First(seq, ev)
        kind = FAST_KIND.get(cls)
        if kind is None:
            self.other(ev)
        elif kind != IGNORED:
            self.attempt(kind, ev)

    def attempt(self, kind: int, ev: Any) -> None:
        """Fold an attempt event in (its seq already recorded)."""
        key = (ev.prompt_id, ev.generation_index)
        row = self.rows.get(key)
        if row is None:
            row = self.new_row(key)
        if kind in (DISPATCHED, RESUMED):
            self.start(row, ev.seq, ev.attempt, ev.time)
            if kind == RESUMED:
                self.resumed.add(key)
            return
        self.end(row, ev.seq, ev.attempt)
        if kind == SEALED and ev.seq > self.z_seq[row]:
            self.z_seq[row] = ev.seq
            self.z_att[row] = ev.attempt
            self.z_time[row] = ev.time

    def new_row(self, key: SiblingKey) -> int:
        row = self.rows[key] = len(self.s_seq)
        for column in (self.s_seq, self.s_att, self.e_seq, self.e_att, self.z_seq, self.z_att):
            column.append(-1)
        self.s_time.append(math.nan)
        self.z_time.append(math.nan)
        return row

    def start(self, row: int, seq: int, attempt: int, t: float) -> None:
        held = self.s_seq[row]
        if seq == held:
            return  # the same event again (a merge of overlapping parts)
        extra = self.extra.get(row)
        if seq < held:
            if extra is None:
                extra = self.extra[row] = _Extra()
            if (seq, attempt, t) not in extra.starts:
                extra.starts.append((seq, attempt, t))
            return
        if held >= 0:
            if extra is None:
                extra = self.extra[row] = _Extra()
            extra.starts.append((held, self.s_att[row], self.s_time[row]))
        self.s_seq[row] = seq
        self.s_att[row] = attempt
        self.s_time[row] = t
        # Only ends after the latest start can end it: forget the others.
        if self.e_seq[row] < seq:
            self.e_seq[row] = self.e_att[row] = -1
            if extra is not None and extra.ends:
                extra.ends = [e for e in extra.ends if e[0] > seq]
                if extra.ends:
                    best = max(extra.ends)
                    extra.ends.remove(best)
                    self.e_seq[row], self.e_att[row] = best
        elif extra is not None:
            extra.ends = [e for e in extra.ends if e[0] > seq]

    def end(self, row: int, seq: int, attempt: int) -> None:
        held = self.e_seq[row]
        if seq <= self.s_seq[row] or seq == held:
            return  # before the latest start, or the same event again
        if seq > held:
            if held >= 0:
                self._extra(row).ends.append((held, self.e_att[row]))
            self.e_seq[row] = seq
            self.e_att[row] = attempt
        elif (seq, attempt) not in (extra := self._extra(row)).ends:
            extra.ends.append((seq, attempt))

    def _extra(self, row: int) -> _Extra:
        extra = self.extra.get(row)
        if extra is None:
            extra = self.extra[row] = _Extra()
        return extra

    def other(self, ev: Any) -> None:
        """Fold in an event that is neither an attempt event nor ignored."""
        seq = ev.seq
        match ev:
            case StepTrained() | LeanStepTrained():
                self.steps[seq] = (ev.step, ev.time)
            case SnapshotPublished() | LeanSnapshotPublished():
                _keep_latest(self.snapshots, ev.path, seq, ev.captured_at)
            case TrainerCheckpointPublished() | LeanTrainerCheckpointPublished():
                _keep_latest(self.checkpoints, ev.path, seq, ev.time)
            case RestoreStarted() | LeanRestoreStarted():
                if self.first_restore is None or seq < self.first_restore.seq:
                    self.first_restore = First(seq, ev)
            case RestoreFinished() | LeanRestoreFinished():
                if self.restore_finished is None or seq < self.restore_finished.seq:
                    self.restore_finished = First(seq, ev)
            case TraceOpened() | LeanTraceOpened():
                if self.opened is None or seq < self.opened.seq:
                    self.opened = First(seq, ev)
            case _:
                pass

    def merge(self, other: RunFold) -> None:
        """Fold in the fold of another part of this run (another file, another process)."""
        self.duplicates += other.duplicates + self.seqs.overlap(other.seqs)
        self.unusable += other.unusable
        self.seqs.update(other.seqs)
        self._siblings = None
        self.first = _lower(self.first, other.first)
        self.last = _higher(self.last, other.last)
        self.opened = _lower(self.opened, other.opened)
        self.first_rollout = _lower(self.first_rollout, other.first_rollout)
        self.first_restore = _lower(self.first_restore, other.first_restore)
        self.restore_finished = _lower(self.restore_finished, other.restore_finished)
        self.steps.update(other.steps)
        for path, (seq, value) in other.snapshots.items():
            _keep_latest(self.snapshots, path, seq, value)
        for path, (seq, value) in other.checkpoints.items():
            _keep_latest(self.checkpoints, path, seq, value)
        self.resumed |= other.resumed
        for key, theirs in other.rows.items():
            row = self.rows.get(key)
            if row is None:
                row = self.new_row(key)
            starts = [(other.s_seq[theirs], other.s_att[theirs], other.s_time[theirs])]
            ends = [(other.e_seq[theirs], other.e_att[theirs])]
            extra = other.extra.get(theirs)
            if extra is not None:
                starts += extra.starts
                ends += extra.ends
            for seq, attempt, t in starts:
                if seq >= 0:
                    self.start(row, seq, attempt, t)
            for seq, attempt in ends:
                if seq >= 0:
                    self.end(row, seq, attempt)
            if other.z_seq[theirs] > self.z_seq[row]:
                self.z_seq[row] = other.z_seq[theirs]
                self.z_att[row] = other.z_att[theirs]
                self.z_time[row] = other.z_time[theirs]

    def invalidate(self) -> None:
        """Forget what ``siblings`` computed: more events were folded in."""
        self._siblings = None

    # --- what the figures read -------------------------------------------------

    @property
    def last_time(self) -> float:
        """The time of the run's last event by seq: its stop time."""
        return math.nan if self.last is None else float(self.last.event.time)

    @property
    def opened_at(self) -> float | None:
        return None if self.opened is None else float(self.opened.event.time)

    @property
    def order(self) -> tuple[float, str]:
        """Runs are ordered by their ``trace_opened`` time (the first event's, lacking one)."""
        if self.opened is not None:
            return (self.opened.event.time, self.run_id)
        return (math.nan if self.first is None else self.first.event.time, self.run_id)

    def siblings(self) -> Siblings:
        """Which siblings are in flight at the run's end, and each one's last seal.

        A sibling is in flight when its latest start (by seq) is of an
        attempt that the run has no end of after that start.
        """
        if self._siblings is not None:
            return self._siblings
        open_: dict[SiblingKey, float] = {}
        seals: list[tuple[SiblingKey, float, float]] = []
        s_seq, e_seq, z_seq, extras = self.s_seq, self.e_seq, self.z_seq, self.extra
        for key, row in self.rows.items():
            extra = extras.get(row)
            if s_seq[row] >= 0:
                attempt = self.s_att[row]
                ended = e_seq[row] >= 0 and self.e_att[row] == attempt
                if not ended and extra is not None:
                    ended = any(a == attempt for _, a in extra.ends)
                if not ended:
                    open_[key] = self.s_time[row]
            if z_seq[row] >= 0:
                sealed_at = self.z_time[row]
                seals.append((key, sealed_at, sealed_at - self._began(row, extra)))
        self._siblings = Siblings(open_, seals)
        return self._siblings

    def _began(self, row: int, extra: _Extra | None) -> float:
        """When the try of the sibling's last seal began: its latest start before the seal."""
        sealed, attempt = self.z_seq[row], self.z_att[row]
        best = (-1, math.nan)
        if self.s_att[row] == attempt and 0 <= self.s_seq[row] < sealed:
            best = (self.s_seq[row], self.s_time[row])
        if extra is not None:
            for seq, a, t in extra.starts:
                if a == attempt and best[0] < seq < sealed:
                    best = (seq, t)
        return best[1]

    def steps_in_order(self) -> list[tuple[int, float]]:
        """``(step, time)`` of each ``step_trained``, in seq order."""
        return [self.steps[seq] for seq in sorted(self.steps)]


class _Extra:
    """A sibling's starts other than its latest, and its ends after that start but one."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[tuple[int, int, float]] = []  # (seq, attempt, time)
        self.ends: list[tuple[int, int]] = []  # (seq, attempt), each after the latest start


def _keep_latest(table: dict[str, tuple[int, float]], path: str, seq: int, value: float) -> None:
    # Published twice under one path: the later one (by seq) stands.
    held = table.get(path)
    if held is None or seq > held[0]:
        table[path] = (seq, value)


def _lower(a: First | None, b: First | None) -> First | None:
    if a is None or (b is not None and b.seq < a.seq):
        return b
    return a


def _higher(a: First | None, b: First | None) -> First | None:
    if a is None or (b is not None and b.seq > a.seq):
        return b
    return a
