"""Events, a block at a time, into a ``model.Timeline``: the events themselves are never kept.

``TimelineFold.add`` takes blocks of events as the reader gives them (any
order of files, runs and lines) and feeds each block to the restore-cost
analysis (``CostAnalysis``) and to a fold per run that keeps only what is
drawn. ``timeline`` then resolves what needs the whole run: an attempt's
start and end are matched by seq, so the result is the same whatever order
the lines came in (a trace set is a set), and a line read twice (the same run
in two files) counts once.

What is kept, per run (the bound on memory; the events are never held):

- one ``Attempt`` record per try (the document draws every try);
- one row of a ``marks.MarkTable`` per step, weight sync, checkpoint,
  snapshot, group event and lifecycle event, about 40 bytes beside its values
  (the document draws every one; the page draws steps, syncs, checkpoints
  and snapshots at most one per pixel column, and no group events); a line
  read twice holds two rows until the run is drawn;
- the restores;
- at most ``OTHER_PER_RUN`` events of kinds this timeline does not know,
  those with the lowest seq, whatever order they arrive in.

A line whose seq is below 0 or at or above ``SEQ_LIMIT`` is left out, as the
restore-cost analysis leaves it out (and notes it): the bars and the figures
count the same lines, in any order.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections.abc import Iterable
from typing import Any, Union

from .._analysis.cost import CostAnalysis, gc_paused
from .._analysis.fold import SEQ_LIMIT
from .._schema.decoding import AnyEvent, UnknownEvent
from .._schema.events import (
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
    TraceClosed,
    TraceOpened,
    TrainerCheckpointPublished,
    WeightsSynced,
)
from .fates import mark_fates
from .marks import (
    CHECKPOINT,
    CLOSED,
    GROUP_ADMITTED,
    GROUP_DISCARDED,
    GROUP_RESERVED,
    GROUP_SEALED,
    OPENED,
    OTHER,
    SNAPSHOT,
    STEP,
    WEIGHTS,
    Mark,
    MarkTable,
)
from .model import OUTCOMES, Attempt, Restore, RunLine, Timeline, pack_lanes

__all__ = ["OTHER_PER_RUN", "TimelineFold", "build_timeline"]

# Events of kinds the timeline does not know (a user's own, or unknown to this
# process) are drawn up to this many per run: they can be most of a trace
# (metrics sampled per token), and keeping them all would keep the trace.
OTHER_PER_RUN = 1000
# Events per block when ``build_timeline`` is handed a plain iterable.
_BLOCK = 1024

_DISPATCHED, _RESUMED, _SEALED, _REFUSED, _ABANDONED = range(5)
_ATTEMPT_CODE: dict[type[Any], int] = {
    AttemptDispatched: _DISPATCHED,
    AttemptResumed: _RESUMED,
    AttemptSealed: _SEALED,
    AttemptRefused: _REFUSED,
    AttemptAbandoned: _ABANDONED,
}
_GROUP_CODE: dict[type[Any], int] = {
    GroupReserved: GROUP_RESERVED,
    GroupAdmitted: GROUP_ADMITTED,
    GroupSealed: GROUP_SEALED,
    GroupDiscarded: GROUP_DISCARDED,
}
_ENVELOPE = frozenset({"time", "run_id", "seq"})

# An attempt event of a tangled try, kept until the run is whole:
# (seq, code, time, group_id, weight_version / turn / reason).
_Item = tuple[int, int, float, str, Union[int, str, None]]  # noqa: UP007
_Key = tuple[Union[int, str], int, int]  # noqa: UP007


def _ending(code: int, reason: str | None) -> str:
    if code == _SEALED:
        return "sealed"
    if code == _REFUSED:
        return "refused"
    if reason == "restart":
        return "abandoned_restart"
    # A reason outside the schema's list can only come from events built in
    # Python, unchecked; it is drawn as dropped and keeps its reason.
    return reason if reason in OUTCOMES else "dropped"


class _Run:
    """What one run draws, folded from its events in any order."""

    __slots__ = (
        "first_seq",
        "first_seq_time",
        "first_time",
        "last_seq",
        "last_time",
        "marks",
        "max_time",
        "names",
        "opened",
        "others",
        "others_cut",
        "others_heap",
        "restore_items",
        "run_id",
        "tangled",
        "tries",
    )

    def __init__(self, run_id: str, t: float) -> None:
        self.run_id = run_id
        self.first_time = t
        self.max_time = t
        self.last_seq = -sys.maxsize
        self.last_time = t
        self.first_seq = sys.maxsize
        self.first_seq_time = t
        # One record per try while it has at most one start before one end;
        # a try with more (an attempt number used twice in a run, a line
        # read twice with a changed time) moves to `tangled` as items.
        self.tries: dict[_Key, Attempt] = {}
        self.tangled: dict[_Key, list[_Item]] = {}
        self.marks = MarkTable()
        # The (seq, time) of the run's first trace_opened: where it is ordered.
        self.opened: tuple[int, float] | None = None
        self.others: dict[int, Mark] = {}
        self.others_heap: list[int] = []  # the kept others' seqs, negated
        self.others_cut = False
        self.restore_items: list[tuple[int, int, float, str, int]] = []
        # One string object per group id and reason, not one per event.
        self.names: dict[str, str] = {}

    # --- attempts --------------------------------------------------------------

    def attempt(self, code: int, ev: Any) -> None:
        key: _Key = (ev.prompt_id, ev.generation_index, ev.attempt)
        rec = self.tries.get(key)
        if rec is None:
            items = self.tangled.get(key)
            if items is not None:
                items.append(self._item(code, ev))
            else:
                self.tries[key] = self._record(code, ev, key)
            return
        seq = ev.seq
        if code <= _RESUMED:
            if not rec.started and seq < rec.end_seq:
                # The start of a try whose end came first.
                self._set_start(rec, code, ev)
                return
        elif rec.end_seq < 0 and seq > rec.start_seq:
            self._set_end(rec, code, ev)
            return
        held, item = self._items_of(rec), self._item(code, ev)
        if item in held:
            return  # the same line again
        # Another start or end, or another line with a seq the try has (a
        # conflicting copy): `_untangle` sorts it out, the same in any order.
        del self.tries[key]
        self.tangled[key] = [*held, item]

    def _name(self, s: str) -> str:
        return self.names.setdefault(s, s)

    def _record(self, code: int, ev: Any, key: _Key) -> Attempt:
        t = ev.time
        a = Attempt(t, t, "unended", self._name(ev.group_id), *key)
        if code <= _RESUMED:
            self._set_start(a, code, ev)
        else:
            a.started = False
            self._set_end(a, code, ev)
        return a

    def _set_start(self, a: Attempt, code: int, ev: Any) -> None:
        a.start = ev.time
        a.started = True
        a.start_seq = ev.seq
        a.group_id = self._name(ev.group_id)
        if code == _DISPATCHED:
            a.weight_version = ev.weight_version
        else:
            a.resumed_turn = ev.turn

    def _set_end(self, a: Attempt, code: int, ev: Any) -> None:
        reason = None if code == _SEALED else self._name(ev.reason)
        a.end = ev.time
        a.outcome = _ending(code, reason)
        a.reason = reason
        a.end_seq = ev.seq

    def _item(self, code: int, ev: Any) -> _Item:
        if code == _DISPATCHED:
            extra: int | str | None = ev.weight_version
        elif code == _RESUMED:
            extra = ev.turn
        elif code == _SEALED:
            extra = None
        else:
            extra = self._name(ev.reason)
        return (ev.seq, code, ev.time, self._name(ev.group_id), extra)

    @staticmethod
    def _items_of(a: Attempt) -> list[_Item]:
        """The events a record was folded from, as items again."""
        out: list[_Item] = []
        if a.started:
            if a.resumed_turn is not None:
                out.append((a.start_seq, _RESUMED, a.start, a.group_id, a.resumed_turn))
            else:
                out.append((a.start_seq, _DISPATCHED, a.start, a.group_id, a.weight_version))
        if a.end_seq >= 0:
            code = {"sealed": _SEALED, "refused": _REFUSED}.get(a.outcome, _ABANDONED)
            out.append((a.end_seq, code, a.end, a.group_id, a.reason))
        return out

    def _untangle(self, key: _Key, items: list[_Item]) -> list[Attempt]:
        """A tangled try's events, in seq order, as the attempts they make."""
        # Of the lines that share a seq, the least (by kind, time and fields) is kept.
        items.sort(key=lambda it: (it[0], it[1], *_time_rank(it[2]), it[3], repr(it[4])))
        out: list[Attempt] = []
        open_: Attempt | None = None
        for seq, group in itertools.groupby(items, key=lambda it: it[0]):
            _, code, t, gid, extra = next(group)  # a seq seen twice counts once
            if code <= _RESUMED:
                if open_ is not None:
                    # Started again with no end between: it ran until then.
                    open_.end = t
                open_ = Attempt(t, t, "unended", gid, *key, start_seq=seq)
                if code == _DISPATCHED:
                    open_.weight_version = extra  # type: ignore[assignment]
                else:
                    open_.resumed_turn = extra  # type: ignore[assignment]
                out.append(open_)
                continue
            reason = extra if isinstance(extra, str) else None
            outcome = _ending(code, reason)
            if open_ is None:
                out.append(
                    Attempt(t, t, outcome, gid, *key, reason=reason, started=False, end_seq=seq)
                )
            else:
                open_.end = t
                open_.outcome, open_.reason, open_.end_seq = outcome, reason, seq
                open_ = None
        if open_ is not None:
            open_.end = max(self.last_time, open_.start)
        return out

    # --- everything else -------------------------------------------------------

    def other(self, ev: Any) -> None:
        t, seq = ev.time, ev.seq
        cls = type(ev)
        add = self.marks.add
        if cls is StepTrained:
            groups = ev.group_ids
            if type(groups) is list:
                # A step names the groups it trained on, which group events
                # name too: one string per id, not one per line.
                groups = [self._name(g) if type(g) is str else g for g in groups]
            add(STEP, seq, t, ev.step, groups)
        elif cls is WeightsSynced:
            add(WEIGHTS, seq, t, ev.weight_version)
        elif cls in _GROUP_CODE:
            code = _GROUP_CODE[cls]
            gid = ev.group_id
            gid = self._name(gid) if type(gid) is str else gid
            if cls is GroupReserved:
                add(code, seq, t, gid, (ev.prompt_id, ev.size, ev.weight_version, ev.target_step))
            elif cls is GroupDiscarded:
                add(code, seq, t, gid, (ev.prompt_id, self._name(ev.reason)))
            else:
                add(code, seq, t, gid, ev.prompt_id)
        elif cls is TrainerCheckpointPublished:
            add(CHECKPOINT, seq, t, ev.step, ev.path)
        elif cls is SnapshotPublished:
            add(SNAPSHOT, seq, t, ev.step, (ev.path, ev.captured_at))
        elif cls is RestoreStarted:
            self.restore_items.append((seq, 0, t, ev.path, ev.step))
        elif cls is RestoreFinished:
            self.restore_items.append((seq, 1, t, "", ev.step))
        elif cls is TraceOpened:
            add(OPENED, seq, t, (ev.host, ev.pid, ev.sdk_version, ev.meta))
            if self.opened is None or (seq, t) < self.opened:
                self.opened = (seq, t)
        elif cls is TraceClosed:
            add(CLOSED, seq, t, (ev.emitted, ev.written, ev.dropped, ev.invalid))
        elif isinstance(ev, UnknownEvent):
            fields = ev.fields
            self._keep_other(
                Mark("other", t, ev.event, tuple(fields), tuple(fields.values()), None, seq)
            )
        else:
            # A user's own event class: its fields, as they would be written.
            keys = tuple(f for f in ev.__struct_fields__ if f not in _ENVELOPE)
            values = tuple(getattr(ev, f) for f in keys)
            tag = str(cls.__struct_config__.tag)
            self._keep_other(Mark("other", t, tag, keys, values, None, seq))

    def _keep_other(self, mark: Mark) -> None:
        """Keep the ``OTHER_PER_RUN`` lowest seqs: the same ones in any order of arrival."""
        seq = mark.seq
        held = self.others.get(seq)
        if held is not None:
            # The same line again, or two lines that share a seq: the one
            # kept must not depend on which came first.
            if _other_rank(mark) < _other_rank(held):
                self.others[seq] = mark
            return
        heap = self.others_heap
        if len(heap) < OTHER_PER_RUN:
            self.others[seq] = mark
            heapq.heappush(heap, -seq)
            return
        self.others_cut = True
        if seq < -heap[0]:
            del self.others[-heapq.heappushpop(heap, -seq)]
            self.others[seq] = mark

    # --- the whole run ---------------------------------------------------------

    def line(self) -> RunLine:
        run = RunLine(
            index=0,
            run_id=self.run_id,
            host=None,
            pid=None,
            first_time=self.first_time,
            last_time=self.last_time,
            closed=False,
            others_cut=self.others_cut,
        )
        attempts: list[Attempt] = []
        for a in self.tries.values():
            if a.end_seq < 0:
                a.end = max(self.last_time, a.start)
            attempts.append(a)
        for key, items in self.tangled.items():
            attempts.extend(self._untangle(key, items))
        # The records are the attempts now; the index to them can go.
        self.tries, self.tangled = {}, {}
        _sort_attempts(attempts)
        run.attempts = attempts
        marks = self.marks
        for mark in self.others.values():
            marks.add(OTHER, mark.seq, mark.time, mark)
        self.others, self.others_heap = {}, []
        marks.finish()
        run.marks = marks
        for i in marks.rows(("opened",)):
            if run.host is None:
                run.host, run.pid = marks.a[i][0], marks.a[i][1]
        run.closed = marks.count("closed") > 0
        run.restores = _restores(self.restore_items)
        return run

    @property
    def order(self) -> tuple[float, str]:
        # Runs are ordered as the cost analysis orders them (README: Reference >
        # Restore-cost figures): by their trace_opened, else their first event.
        opened = self.opened
        return (opened[1] if opened is not None else self.first_seq_time, self.run_id)


def _other_rank(m: Mark) -> tuple[str, bool, float, str]:
    return (m.name, *_time_rank(m.time), repr(m.values))


def _time_rank(t: float) -> tuple[bool, float]:
    # A total order on times, NaN last: ties go the same way in any order.
    return (t != t, t if t == t else 0.0)


def _sort_attempts(attempts: list[Attempt]) -> None:
    """By the seq of each one's first event; ties (lines that share a seq) by their ids."""
    attempts.sort(key=lambda a: a.start_seq if a.started else a.end_seq)
    if any(a.seq == b.seq for a, b in itertools.pairwise(attempts)):
        attempts.sort(
            key=lambda a: (
                a.seq,
                type(a.prompt_id).__name__,
                str(a.prompt_id),
                a.generation_index,
                a.attempt,
            )
        )


def _restores(items: list[tuple[int, int, float, str, int]]) -> list[Restore]:
    # Of restore lines that share a seq, the least is kept (see `_untangle`).
    items.sort(key=lambda it: (it[0], it[1], *_time_rank(it[2]), it[3], repr(it[4])))
    out: list[Restore] = []
    for _, group in itertools.groupby(items, key=lambda it: it[0]):
        _, finished, t, path, step = next(group)
        if not finished:
            out.append(Restore(t, None, path, step))
            continue
        for r in out:
            if r.finished is None:
                r.finished = t
                break
        else:
            out.append(Restore(t, t, "", step))
    return out


class TimelineFold:
    """Folds blocks of events (any order, any file layout) into a ``Timeline``.

    Call ``add`` once per block, then ``timeline`` once. Memory grows with
    what is drawn (attempts, marks), not with the events read.
    """

    def __init__(self, *, copies_later: bool = False) -> None:
        # ``copies_later``: see ``CostAnalysis``; this fold keeps every line anyway.
        self._copies_later = copies_later
        self.cost = CostAnalysis(copies_later=copies_later)
        self._runs: dict[str, _Run] = {}

    def add(self, events: Iterable[AnyEvent], source: str | None = None) -> None:
        """Fold a block in; ``source`` names its file (see ``CostAnalysis.add``)."""
        block: list[Any] = events if isinstance(events, list) else list(events)
        self.cost.add(block, source)
        # The hot loop. A try's first event and the end that follows its
        # start are most lines of a trace: they are folded inline; the rest
        # goes through `_Run.attempt` and `_Run.other`.
        runs = self._runs
        run: _Run | None = None
        run_id = None
        tries: dict[_Key, Attempt] = {}
        names: dict[str, str] = {}
        attempt_code = _ATTEMPT_CODE.get
        limit = SEQ_LIMIT
        for ev in block:
            seq = ev.seq
            if not 0 <= seq < limit:
                # Left out, as the cost analysis leaves it out (and notes it):
                # drawn, it would be a try or an end the figures do not count.
                continue
            if ev.run_id != run_id:
                run_id = ev.run_id
                run = runs.get(run_id)
                if run is None:
                    run = runs[run_id] = _Run(run_id, ev.time)
                tries, names = run.tries, run.names
            assert run is not None
            t = ev.time
            if t < run.first_time:
                run.first_time = t
            elif t > run.max_time:
                run.max_time = t
            if seq >= run.last_seq and (seq > run.last_seq or t > run.last_time):
                run.last_seq, run.last_time = seq, t
            if seq <= run.first_seq and (seq < run.first_seq or t < run.first_seq_time):
                run.first_seq, run.first_seq_time = seq, t
            code = attempt_code(type(ev))
            if code is None:
                run.other(ev)
                continue
            key = (ev.prompt_id, ev.generation_index, ev.attempt)
            rec = tries.get(key)
            if code == _DISPATCHED and rec is None and key not in run.tangled:
                gid = ev.group_id
                tries[key] = Attempt(
                    t,
                    t,
                    "unended",
                    names.setdefault(gid, gid),
                    *key,
                    ev.weight_version,
                    start_seq=seq,
                )
                continue
            if code == _SEALED and rec is not None and rec.end_seq < 0 and seq > rec.start_seq:
                rec.end = t
                rec.outcome = "sealed"
                rec.end_seq = seq
                continue
            run.attempt(code, ev)

    def timeline(self) -> Timeline:
        """The timeline of everything added; the fold lets go of its state."""
        stops = self.cost.stops()
        notes = list(self.cost.notes)
        self.cost = CostAnalysis(copies_later=self._copies_later)
        folds = sorted(self._runs.values(), key=lambda r: r.order)
        runs = [f.line() for f in folds]
        for i, run in enumerate(runs):
            run.index = i
            run.lanes = pack_lanes(run.attempts)
        self._runs = {}
        mark_fates(runs, stops)
        times = [f.first_time for f in folds] + [f.max_time for f in folds]
        times += [c for r in runs for c in r.marks.captured()]
        return Timeline(
            runs=runs,
            stops=stops,
            t0=min(times, default=0.0),
            t1=max(times, default=0.0),
            notes=notes,
        )


def build_timeline(events: Iterable[AnyEvent]) -> Timeline:
    """Fold a trace set's events (any order, any file layout) into a ``Timeline``.

    ``events`` is read once, a block at a time: a generator over a large trace
    set is folded without holding it.
    """
    fold = TimelineFold()
    it = iter(events)
    with gc_paused():
        while block := list(itertools.islice(it, _BLOCK)):
            fold.add(block)
        return fold.timeline()
