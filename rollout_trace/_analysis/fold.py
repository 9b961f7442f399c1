"""One run's state as the restore-cost figures need it, the same in any arrival order.

A trace set is a set: no order of its files or of their lines may change a
figure. So a ``RunFold`` holds nothing that depends on the order events
arrive in. Each field is the event with the highest (or lowest) ``seq`` of
some kind, ``seq`` being the order in which the tracer accepted the events:
the run's last event, its first rollout event, each attempt's latest start,
end and seal. Folding an event in is therefore commutative, folding it twice
changes nothing, and two folds of parts of one run merge into the fold of the
whole (``merge``), which is what lets files be read apart and joined later.

Two lines may share a seq: a run read twice, or a conflicting copy (an edited
copy, a file torn and written again, two writers with one run id). Both are
folded in; where both would be kept, the one whose encoding (``msgspec``,
fields sorted) sorts first is, so that neither the order nor which copy came
first changes a figure, and a line read twice changes nothing. The seqs seen
more than once are kept (``again``) for the commands to compare the copies;
a fold made with ``copies_later`` leaves those lines out, for that second
read to hand in only the ones that differ (``fold``).

Memory, per run: its siblings (``siblings.SiblingTable``: a live row per
sibling open now, a few numbers per sibling sealed, however often its key is
reused, and 32 bytes per superseded start); the seqs
seen as ranges (one per gap or out-of-order stretch); the steps, snapshots
and checkpoints; and the siblings resumed. Never the events themselves.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

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
from .copies import least
from .seqs import SeqSet
from .siblings import SiblingKey, Siblings, SiblingTable, earlier

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


def tie(held: First, seq: int, ev: Any) -> First:
    """Of two events with one seq, the one kept: the same either way round
    (``copies.least``). Reached only when seqs are equal, which a run read once never has."""
    return held if least(held.event, ev) is held.event else First(seq, ev)


class RunFold:
    """The state of one run that the figures need, in any arrival order."""

    __slots__ = (
        "_siblings",
        "again",
        "checkpoints",
        "copies_later",
        "duplicates",
        "first",
        "first_restore",
        "first_rollout",
        "last",
        "opened",
        "restore_finished",
        "resumed",
        "run_id",
        "seqs",
        "snapshots",
        "sources",
        "steps",
        "table",
        "unusable",
    )

    def __init__(self, run_id: str, *, copies_later: bool = False, history: bool = True) -> None:
        self.run_id = run_id
        self.copies_later = copies_later
        self.seqs = SeqSet()
        # Events whose seq was seen already (a run read from two files) and
        # events with a seq no tracer gives (negative or too large).
        self.duplicates = 0
        self.unusable = 0
        # The seqs seen more than once, and the files the run was read from
        # (named by whoever feeds it): where to look for conflicting copies.
        self.again: SeqSet | None = None
        self.sources: set[str] = set()
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
        self.table = SiblingTable(history=history)
        self._siblings: Siblings | None = None

    # --- folding events in ---------------------------------------------------

    def add(self, ev: Any) -> None:
        """Fold one event of this run in, whatever its place in the arrival order."""
        seq = ev.seq
        if not 0 <= seq < SEQ_LIMIT:
            self.unusable += 1
            return
        fresh = self.seqs.add(seq)
        if not fresh:
            self.duplicates += 1
            if self.again is None:
                self.again = SeqSet()
            self.again.add(seq)
            if self.copies_later:
                return
        self.fold(ev, fresh)

    def fold(self, ev: Any, fresh: bool = False) -> None:
        """Fold in an event whose seq is recorded: ``fresh`` if it was seen first just now.

        One that is not (another line with a seen seq) changes nothing if it
        is a copy of one folded in already.
        """
        seq = ev.seq
        self._siblings = None
        held = self.first
        if held is None or seq < held.seq:
            self.first = First(seq, ev)
        elif seq == held.seq:
            self.first = tie(held, seq, ev)
        held = self.last
        if held is None or seq > held.seq:
            self.last = First(seq, ev)
        elif seq == held.seq:
            self.last = tie(held, seq, ev)
        cls = type(ev)
        if cls in ROLLOUT:
            held = self.first_rollout
            if held is None or seq < held.seq:
                self.first_rollout = First(seq, ev)
            elif seq == held.seq:
                self.first_rollout = tie(held, seq, ev)
        kind = FAST_KIND.get(cls)
        if kind is None:
            self.other(ev)
        elif kind == IGNORED:
            pass
        elif fresh:
            self.attempt(kind, ev)
        elif not self.table.holds(
            (ev.prompt_id, ev.generation_index), kind, seq, ev.attempt, ev.time
        ):
            # Not what a retired sibling holds already: another version of
            # the line, or one its record cannot vouch for; a row takes it.
            # A start may be a version of one the table no longer holds:
            # its history is then folded in at the end (`SiblingTable.unsure`).
            if kind in (DISPATCHED, RESUMED):
                self.table.unsure = True
            self.attempt(kind, ev)
        elif kind == RESUMED:
            self.resumed.add((ev.prompt_id, ev.generation_index))

    def attempt(self, kind: int, ev: Any) -> None:
        """Fold an attempt event in (its seq already recorded)."""
        key = (ev.prompt_id, ev.generation_index)
        table = self.table
        row = table.live(key)
        if kind == SEALED:
            table.seal(key, row, ev.seq, ev.attempt, ev.time)
        elif kind in (DISPATCHED, RESUMED):
            table.start(row, ev.seq, ev.attempt, ev.time, key)
            if kind == RESUMED:
                self.resumed.add(key)
        else:
            table.end(row, ev.seq, ev.attempt)

    def other(self, ev: Any) -> None:
        """Fold in an event that is neither an attempt event nor ignored."""
        seq = ev.seq
        match ev:
            case StepTrained() | LeanStepTrained():
                _keep_step(self.steps, seq, (ev.step, ev.time))
            case SnapshotPublished() | LeanSnapshotPublished():
                _keep_latest(self.snapshots, ev.path, seq, ev.captured_at)
            case TrainerCheckpointPublished() | LeanTrainerCheckpointPublished():
                _keep_latest(self.checkpoints, ev.path, seq, ev.time)
            case RestoreStarted() | LeanRestoreStarted():
                self.first_restore = _lowest(self.first_restore, seq, ev)
            case RestoreFinished() | LeanRestoreFinished():
                self.restore_finished = _lowest(self.restore_finished, seq, ev)
            case TraceOpened() | LeanTraceOpened():
                self.opened = _lowest(self.opened, seq, ev)
            case _:
                pass

    def merge(self, other: RunFold) -> None:
        """Fold in the fold of another part of this run (another file, another process)."""
        if other is self:  # the same part twice: every event seen twice
            self.duplicates += self.seqs.count
            self.again = self.seqs.copy()
            return
        both = self.seqs.intersection(other.seqs)
        if both.tail is not None:
            # Lines of one seq in both parts may differ: see `fold`.
            self.table.unsure = True
        self.duplicates += other.duplicates + both.count
        for part in (self.again, other.again):
            if part is not None:
                both.update(part)
        self.again = both if both.tail is not None else None
        self.sources |= other.sources
        self.unusable += other.unusable
        self.seqs.update(other.seqs)
        self._siblings = None
        self.first = _lower(self.first, other.first)
        self.last = _higher(self.last, other.last)
        self.opened = _lower(self.opened, other.opened)
        self.first_rollout = _lower(self.first_rollout, other.first_rollout)
        self.first_restore = _lower(self.first_restore, other.first_restore)
        self.restore_finished = _lower(self.restore_finished, other.restore_finished)
        for seq, step in other.steps.items():
            _keep_step(self.steps, seq, step)
        for path, (seq, value) in other.snapshots.items():
            _keep_latest(self.snapshots, path, seq, value)
        for path, (seq, value) in other.checkpoints.items():
            _keep_latest(self.checkpoints, path, seq, value)
        self.resumed |= other.resumed
        self.table.merge(other.table)

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
        """Which siblings are in flight at the run's end, and each one's last seal."""
        if self._siblings is None:
            self._siblings = self.table.summary()
        return self._siblings

    def forget_siblings(self) -> None:
        """Let go of the summary ``siblings`` keeps (a key and two numbers a
        sealed sibling) once nothing will read it again; it is made again if asked."""
        self._siblings = None

    def steps_in_order(self) -> list[tuple[int, float]]:
        """``(step, time)`` of each ``step_trained``, in seq order."""
        return [self.steps[seq] for seq in sorted(self.steps)]


def _keep_latest(table: dict[str, tuple[int, float]], path: str, seq: int, value: float) -> None:
    # Published twice under one path: the later one (by seq) stands; of two
    # with one seq (a conflicting copy), the earlier value.
    held = table.get(path)
    if held is None or seq > held[0] or (seq == held[0] and earlier((seq, value), held)):
        table[path] = (seq, value)


def _keep_step(steps: dict[int, tuple[int, float]], seq: int, step: tuple[int, float]) -> None:
    held = steps.get(seq)
    if held is None or earlier(step, held):
        steps[seq] = step


def _lowest(held: First | None, seq: int, ev: Any) -> First | None:
    if held is None or seq < held.seq:
        return First(seq, ev)
    return tie(held, seq, ev) if seq == held.seq else held


def _lower(a: First | None, b: First | None) -> First | None:
    if b is None:
        return a
    return _lowest(a, b.seq, b.event)


def _higher(a: First | None, b: First | None) -> First | None:
    if a is None or (b is not None and b.seq > a.seq):
        return b
    return a if b is None or b.seq < a.seq else tie(a, b.seq, b.event)
