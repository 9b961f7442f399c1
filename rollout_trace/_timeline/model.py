"""What a timeline draws: runs, their attempts in lanes, their marks, and the stops.

Both views (the trace-event document and the HTML page) are drawn from this
one model, so they always agree on what an attempt is and how it ended.
``timeline_of`` reads it off the trace set's model (``_model``): each try is
an ``Attempt``, and what a stop did to it comes from the stop's classes.

An attempt is one try of a sibling within one run, keyed by
``(prompt_id, generation_index, attempt)``. It begins at its
``attempt_dispatched`` (or ``attempt_resumed``, which starts it in the run that
resumes it, as docs: Reference > Restore-cost figures says) and ends at its ``attempt_sealed``,
``attempt_refused`` or ``attempt_abandoned``. One still open at the run's last
event ends there, as ``unended``. An end whose start is not in the run (a
restored run restarting a try of the run before it) becomes an attempt of zero
length at the end's time, so that it is still seen.

Outcomes are named so that none is also the name of a restore-cost figure:
an ``attempt_abandoned`` with reason ``restart`` is the outcome
``abandoned_restart`` (``restarted`` is a figure, counted in siblings), and a
try with no end in its run is ``unended`` (``in_flight`` is a figure). What a
stop did to a try is its ``fate``, named after the figure that counts it:
``resumed``, ``restarted`` or ``redone``, with the part of its work the stop
lost (``lost_from`` to its end: after the capture, for a resumed try).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any

from .._model import terms
from .._model.stops import CLASSES, FIGURES, Note, StopCost
from .._model.traceset import Fate, Model, analyze
from .._model.tries import Run, Tries
from .._schema.decoding import UnknownEvent
from . import marks
from .marks import Mark, MarkTable

__all__ = [
    "FATES",
    "OTHER_PER_RUN",
    "OUTCOME_LABELS",
    "OUTCOMES",
    "Attempt",
    "Mark",
    "Restore",
    "RunLine",
    "Timeline",
    "build_timeline",
    "pack_lanes",
    "stop_figures",
    "timeline_of",
]


# Every way an attempt can end, in the order a legend lists them.
OUTCOMES = terms.OUTCOMES
# How an outcome reads on the page and as a bar's name in the document.
OUTCOME_LABELS = {
    "sealed": "sealed",
    "failed": "failed",
    "dropped": "dropped",
    "cancelled": "cancelled",
    "refused": "refused",
    "abandoned_restart": "abandoned: restart",
    "whole_group": "whole group",
    "unended": "unended",
}
# What a stop did to an attempt, each the name of the figure that counts it.
FATES = CLASSES


@dataclass(slots=True)
class Attempt:
    """One try of a sibling in one run, from its start to its end."""

    start: float
    end: float
    outcome: str
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    weight_version: int | None = None
    resumed_turn: int | None = None
    reason: str | None = None
    # False for an end whose start is in an earlier run (drawn with no length).
    started: bool = True
    # What a stop did to it (one of FATES), and that stop's number (1, 2, ...);
    # the stop lost its work from ``lost_from`` to its end, ``lost_s`` seconds
    # (NaN and None: not known).
    fate: str | None = None
    stop: int = 0
    lost_from: float = math.nan
    lost_s: float | None = None
    lane: int = 0
    # The seqs of the events that started and ended it (-1: none in its run).
    # Within a run, attempts are listed by their first event's seq.
    start_seq: int = -1
    end_seq: int = -1
    # How the model's pass ended it (``terms.EndKind``).
    end_kind: int = terms.END_OPEN

    @property
    def open(self) -> bool:
        """Open at its run's last event (``terms``)."""
        return self.end_kind == terms.END_OPEN

    @property
    def seq(self) -> int:
        return self.start_seq if self.started else self.end_seq


@dataclass(slots=True)
class Restore:
    started: float
    finished: float | None
    path: str
    step: int


@dataclass
class RunLine:
    """One run (one tracer, so one process) and everything drawn for it."""

    index: int
    run_id: str
    host: str | None
    pid: int | None
    first_time: float
    last_time: float
    closed: bool
    # Its tries; ``attempts`` makes an ``Attempt`` of each at the first look.
    tries: TryColumns = field(default_factory=lambda: TryColumns())
    # In seq order, one per seq; a ``Mark`` is made as each is read.
    marks: MarkTable = field(default_factory=MarkTable)
    restores: list[Restore] = field(default_factory=list)
    # Events of kinds the timeline does not know that were left out (beyond
    # the first ``fold.OTHER_PER_RUN`` by seq): True when there were any.
    others_cut: bool = False
    # The seq of each step -> the weight version it is judged against
    # (``_model.stops.step_versions``; None: not known).
    step_versions: dict[int, int | None] = field(default_factory=dict)
    _lanes: int | None = field(default=None, repr=False, compare=False)
    _attempts: list[Attempt] | None = field(default=None, repr=False, compare=False)

    @property
    def attempts(self) -> list[Attempt]:
        """Each try as an ``Attempt``, in seq order of its first event."""
        if self._attempts is None:
            self._attempts = self.tries.attempts()
        return self._attempts

    @property
    def lanes(self) -> int:
        """The rows the tries take; each try's ``lane`` is given at the first look
        (only a drawing needs them: ``pack_lanes``)."""
        if self._lanes is None:
            self._lanes = pack_lanes(self.attempts)
        return self._lanes

    @property
    def label(self) -> str:
        host = self.host if self.host is not None else "unknown host"
        pid = f"pid {self.pid}" if self.pid is not None else "pid ?"
        return f"{host} {pid} run {self.run_id[:8]}"


@dataclass
class Timeline:
    runs: list[RunLine]
    stops: list[StopCost]
    t0: float
    t1: float
    # What the cost analysis noted (runs read twice, a restore with no run before it).
    notes: list[Note] = field(default_factory=list)
    # Stopped run id -> the siblings whose result the restored state holds
    # (``Model.kept``; None: the capture is unknown).
    kept: dict[str, frozenset[tuple[Any, int]] | None] = field(default_factory=dict)
    # run id -> its number, made at the first look-up: a page marks a try per
    # sibling in flight at each stop, and each names the run that restored it.
    _numbers: tuple[int, dict[str, int]] = field(
        default=(-1, {}), init=False, repr=False, compare=False
    )

    @property
    def attempt_count(self) -> int:
        return sum(len(r.tries) for r in self.runs)

    def run_number(self, run_id: str | None) -> int | None:
        """The 1-based place of a run in the timeline, or None if it is not in it."""
        made_for, numbers = self._numbers
        if made_for != len(self.runs):
            # The first run of an id wins, as a scan would find it.
            numbers = {}
            for run in self.runs:
                numbers.setdefault(run.run_id, run.index + 1)
            self._numbers = (len(self.runs), numbers)
        return numbers.get(run_id) if run_id is not None else None


def pack_lanes(attempts: list[Attempt]) -> int:
    """Give each attempt the lowest lane free at its start; return the lane count.

    Greedy by start time is optimal for intervals: the count is the most
    attempts ever running at once, so a few thousand attempts of a run with
    64 slots stay 64 rows, and a lane that frees up is reused at once.
    """
    busy: list[tuple[float, int]] = []  # (end, lane)
    free: list[int] = []
    lanes = 0
    for a in sorted(attempts, key=attrgetter("start", "end")):
        # Strictly before: a try of no length (a restart reported by the next
        # run) at the very start of another would hide under it.
        while busy and busy[0][0] < a.start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = lanes
            lanes += 1
        a.lane = lane
        heapq.heappush(busy, (a.end, lane))
    return lanes


def stop_figures(stop: StopCost) -> tuple[dict[str, Any], dict[str, str]]:
    """A stop's figures by name, and why each missing one is missing.

    A figure that is not a finite number (times at the ends of the float range
    are too far apart to subtract) is missing too: JSON has no infinity, and
    a page should not show one as a cost.
    """
    values: dict[str, Any] = {}
    reasons = dict(stop.reasons)
    for name in FIGURES:
        v = getattr(stop, name, None)
        if isinstance(v, float) and not math.isfinite(v):
            reasons.setdefault(
                name, f"{v} (the times it is computed from are too far apart for a float)"
            )
            v = None
        values[name] = v
    return values, reasons


# --- from the model of the trace set ----------------------------------------------

# Events of kinds the timeline does not know (a user's own, or unknown to this
# process) are drawn up to this many per run, those with the lowest seq: they
# can be most of a trace (metrics sampled per token).
OTHER_PER_RUN = 1000
_ENVELOPE = frozenset({"time", "run_id", "seq"})
_MARK_CODE = {
    terms.STEP: marks.STEP,
    terms.WEIGHTS: marks.WEIGHTS,
    terms.CHECKPOINT: marks.CHECKPOINT,
    terms.SNAPSHOT: marks.SNAPSHOT,
    terms.GROUP_RESERVED: marks.GROUP_RESERVED,
    terms.GROUP_ADMITTED: marks.GROUP_ADMITTED,
    terms.GROUP_SEALED: marks.GROUP_SEALED,
    terms.GROUP_DISCARDED: marks.GROUP_DISCARDED,
    terms.OPENED: marks.OPENED,
    terms.CLOSED: marks.CLOSED,
}


def timeline_of(ts: Model) -> Timeline:
    """The timeline of a trace set's model: its runs in the run order, each try
    an ``Attempt`` (with the fate its stop gave it), its marks and restores."""
    by_run: dict[int, dict[int, Fate]] = {}
    for (r, i), given in ts.fates.items():
        by_run.setdefault(r, {})[i] = given
    versions = ts.step_versions
    runs = [run_line(run, by_run.get(run.index, {}), versions[run.index]) for run in ts.runs]
    times = [r.first_time for r in runs] + [run.events.max_time for run in ts.runs]
    times += [c for r in runs for c in r.marks.captured()]
    return Timeline(
        runs=runs,
        stops=ts.stops,
        t0=min(times, default=0.0),
        t1=max(times, default=0.0),
        notes=ts.notes,
        kept=ts.kept(),
    )


def build_timeline(events: Iterable[Any]) -> Timeline:
    """The timeline of a trace set's events (any order, any file layout)."""
    return timeline_of(analyze(list(events)))


def run_line(
    run: Run,
    fates: Mapping[int, Fate],
    step_versions: dict[int, int | None] | None = None,
) -> RunLine:
    """One run as the timeline draws it; ``fates``: what the stops did to its tries,
    by try (``Model.fates``); ``step_versions``: its steps' versions
    (``Model.step_versions``)."""
    ev = run.events
    last_time = ev.last_time
    line = RunLine(
        index=run.index,
        run_id=run.run_id,
        host=None,
        pid=None,
        first_time=ev.min_time,
        last_time=last_time,
        closed=False,
        step_versions={} if step_versions is None else step_versions,
    )
    line.tries = _try_columns(run.tries, last_time, fates)
    table = line.marks
    others: list[int] = []
    for i, e in zip(run.marks, ev.events.at(run.marks), strict=True):
        kind, seq, time = ev.kind[i], ev.seq[i], ev.time[i]
        code = _MARK_CODE.get(kind)
        if code is None:
            others.append(i)
        elif code == marks.STEP:
            table.add(code, seq, time, e.step, e.group_ids)
        elif code == marks.WEIGHTS:
            table.add(code, seq, time, e.weight_version)
        elif code == marks.CHECKPOINT:
            table.add(code, seq, time, e.step, e.path)
        elif code == marks.SNAPSHOT:
            table.add(code, seq, time, e.step, (e.path, e.captured_at))
        elif code == marks.GROUP_RESERVED:
            values = (e.prompt_id, e.size, e.weight_version, e.target_step)
            table.add(code, seq, time, e.group_id, values)
        elif code == marks.GROUP_DISCARDED:
            table.add(code, seq, time, e.group_id, (e.prompt_id, e.reason))
        elif code in (marks.GROUP_ADMITTED, marks.GROUP_SEALED):
            table.add(code, seq, time, e.group_id, e.prompt_id)
        elif code == marks.OPENED:
            table.add(code, seq, time, (e.host, e.pid, e.sdk_version, e.meta))
            if line.host is None:
                line.host, line.pid = e.host, e.pid
        else:
            table.add(code, seq, time, (e.emitted, e.written, e.dropped, e.invalid))
            line.closed = True
    # The lowest seqs, one mark per seq (the least of its versions), as any order gives.
    kept: dict[int, Mark] = {}
    for i in others:
        seq = ev.seq[i]
        mark = Mark("other", ev.time[i], *event_fields(ev.events[i]), None, seq)
        held = kept.get(seq)
        if held is None:
            if len(kept) == OTHER_PER_RUN:
                line.others_cut = True
                continue
            kept[seq] = mark
        elif marks.rank(mark) < marks.rank(held):
            kept[seq] = mark
    for seq, mark in kept.items():
        table.add(marks.OTHER, seq, mark.time, mark)
    table.finish()
    line.restores = [Restore(r.started, r.finished, r.path, r.step) for r in run.restores]
    return line


@dataclass
class TryColumns:
    """A run's tries as columns, one per field of ``Attempt`` but ``lane``, in
    the order of ``RunLine.attempts`` (which are made from them at the first
    look): what the report's folds read, with no object per try. Columns are
    arrays where their values allow, else lists or tuples."""

    start: Sequence[float] = field(default_factory=list)
    end: Sequence[float] = field(default_factory=list)
    outcome: Sequence[str] = field(default_factory=list)
    group_id: Sequence[str] = field(default_factory=list)
    prompt_id: Sequence[int | str] = field(default_factory=list)
    generation_index: Sequence[int] = field(default_factory=list)
    attempt: Sequence[int] = field(default_factory=list)
    weight_version: Sequence[int | None] = field(default_factory=list)
    resumed_turn: Sequence[int | None] = field(default_factory=list)
    reason: Sequence[str | None] = field(default_factory=list)
    started: Sequence[bool] = field(default_factory=list)
    fate: Sequence[str | None] = field(default_factory=list)
    stop: Sequence[int] = field(default_factory=list)
    lost_from: Sequence[float] = field(default_factory=list)
    lost_s: Sequence[float | None] = field(default_factory=list)
    start_seq: Sequence[int] = field(default_factory=list)
    end_seq: Sequence[int] = field(default_factory=list)
    end_kind: Sequence[int] = field(default_factory=bytes)

    def __len__(self) -> int:
        return len(self.start)

    def ended(self) -> list[bool]:
        """Whether each try's end event is in its run (``Attempt.end_seq >= 0``)."""
        return list(map(operator.ge, self.end_seq, _ZEROS))

    def open_indices(self) -> list[int]:
        """The tries open at their run's last event (``terms``)."""
        return list(compress(range(len(self)), bytes(self.end_kind).translate(terms.OPEN_FLAGS)))

    def sealed_indices(self) -> tuple[int, ...]:
        """The sealed tries (made once, read by every fold)."""
        return self._sealed

    @functools.cached_property
    def sealed_flags(self) -> list[bool]:
        """Whether each try is sealed (made once, read by every fold)."""
        return list(map(operator.eq, self.outcome, _SEALED))

    @functools.cached_property
    def _sealed(self) -> tuple[int, ...]:
        return tuple(compress(range(len(self)), self.sealed_flags))

    def attempts(self) -> list[Attempt]:
        before_lane = [getattr(self, f) for f in _BEFORE_LANE]
        after_lane = [getattr(self, f) for f in _AFTER_LANE]
        return list(map(Attempt, *before_lane, itertools.repeat(0), *after_lane))


# ``Attempt``'s fields in its order, ``lane`` (0 until drawn) between the two.
_FIELDS = list(TryColumns.__dataclass_fields__)
_LANE_AT = list(Attempt.__dataclass_fields__).index("lane")
_BEFORE_LANE, _AFTER_LANE = _FIELDS[:_LANE_AT], _FIELDS[_LANE_AT:]


def _try_columns(t: Tries, last_time: float, fates: Mapping[int, Fate]) -> TryColumns:
    """The run's tries as ``TryColumns``, in the order of their first event's seq.

    A try with no start starts at its end; an open one stops at the run's
    last event, a superseded one at the start that superseded it."""
    n = len(t)
    started = t.start_kind.translate(_NONZERO)
    start = array(
        "d", list(map(tuple.__getitem__, zip(t.end_time, t.start_time, strict=True), started))
    )
    stop = array("d", t.end_time)
    for i in compress(range(n), t.end_kind.translate(terms.OPEN_FLAGS)):
        stop[i] = max(last_time, start[i])
    for i, at in t.superseded_at.items():
        stop[i] = at
    fate: list[str | None] = [None] * n
    stop_no = [0] * n
    lost_from = [math.nan] * n
    lost_s: list[float | None] = [None] * n
    for i, given in fates.items():
        fate[i], stop_no[i], lost_from[i], lost_s[i] = given
    cols = TryColumns(
        start,
        stop,
        t.outcomes,
        t.group_id,
        _own(t.prompt_id),
        _own(t.generation_index),
        _own(t.attempt),
        t.weight_version,
        t.turn,
        t.reason,
        list(map(bool, started)),
        fate,
        stop_no,
        lost_from,
        lost_s,
        _own(t.start_seq),
        _own(t.end_seq),
        bytes(t.end_kind),
    )
    # First-event seqs strictly rising (the usual case) need no sort.
    first = list(map(tuple.__getitem__, zip(t.end_seq, t.start_seq, strict=True), started))
    if not all(map(operator.lt, first, itertools.islice(first, 1, None))):
        _sort_columns(cols, first)
    return cols


def _own(column: Sequence[Any]) -> Sequence[Any]:
    """One of the model's columns for a timeline: an array copied (in C), so that
    a change to the timeline's is not a change to the model; a tuple shared."""
    return column[:] if isinstance(column, array) else column


def _sort_columns(cols: TryColumns, first: list[int]) -> None:
    """By the seq of each one's first event; ties (lines that share a seq) by their ids."""
    order = sorted(range(len(first)), key=first.__getitem__)
    if any(first[a] == first[b] for a, b in itertools.pairwise(order)):
        p, g, a = cols.prompt_id, cols.generation_index, cols.attempt
        order = sorted(
            range(len(first)),
            key=lambda i: (first[i], type(p[i]).__name__, str(p[i]), g[i], a[i]),
        )
    for name in _FIELDS:
        column = getattr(cols, name)
        setattr(cols, name, list(map(column.__getitem__, order)))


_NONZERO = bytes([0] + [1] * 255)
_ZEROS, _SEALED = itertools.repeat(0), itertools.repeat("sealed")


def event_fields(e: Any) -> tuple[str, tuple[str, ...], tuple[Any, ...]]:
    """An event's name, and its fields but the envelope as names and values: a
    user's own event class's as they would be written, an ``UnknownEvent``'s as read."""
    if isinstance(e, UnknownEvent):
        fields = e.fields
        return e.event, tuple(fields), tuple(fields.values())
    keys = tuple(f for f in e.__struct_fields__ if f not in _ENVELOPE)
    return str(type(e).__struct_config__.tag), keys, tuple(getattr(e, f) for f in keys)
