"""What a stop and restore cost, from events alone (README: Reference > Restore-cost figures).

Runs are folded into order-free state (``fold.RunFold``) as events stream by,
so a trace set of any length and any layout needs memory for a few numbers
per sibling (however often its prompt is reused; 32 bytes per try superseded)
and the run's steps, not for its events, and gives the same
figures whatever order its files and lines come in. ``CostAnalysis.add`` is
the hot loop: events that arrive in seq order take a short path; any other
goes through ``RunFold.add``. ``stops`` orders the runs, pairs each run that
begins with a restore with the run before it, computes the figures
(``figures.stop_cost``) and says what looked wrong on the way (``Note``).

The short path takes only seqs never seen before, so two events with one seq
(a run read twice, a conflicting copy) always meet in ``RunFold.add``, which
keeps the same one in any order. Which of them differ is found by a second
read of the seqs seen more than once (``copies.CopyCheck``, run by the
commands); its answer, handed to ``conflicts``, becomes a note.
"""

from __future__ import annotations

import bisect
import gc
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from .._reading.lean import DISPATCHED, SEALED, LeanRestoreStarted
from .._schema.decoding import AnyEvent
from .._schema.events import RestoreStarted, TraceOpened
from .copies import Conflicts
from .figures import Note, StopCost, orphan_cost, stop_cost, stop_notes
from .fold import FAST_KIND, IGNORED, ROLLOUT, SEQ_LIMIT, First, RunFold
from .retired import E_SEQ, EXTRA, INDEX_BITS, PROMPT_LIMIT, S_ATT, S_SEQ, S_TIME
from .seqs import SeqSet
from .siblings import INT64_MAX, INT64_MIN, SiblingTable

__all__ = ["CostAnalysis", "gc_paused", "restore_costs", "RunEvents", "group_runs"]


# The short path hands on no seq past the last one a tracer can give.
_LAST_SEQ = SEQ_LIMIT - 1
_INDEXES = 1 << INDEX_BITS


class CostAnalysis:
    """Folds events (any order of runs, files and lines) into restore costs.

    Feed it with ``add`` as many times as needed, then call ``stops``. Two
    analyses of parts of one trace set combine with ``merge``.

    With ``copies_later``, a line whose seq was seen already is only counted:
    a second read that compares those lines (``copies.CopyCheck``) hands in
    the ones that differ with ``add_version``, so that a run read twice costs
    its first read no more than counting.

    Without ``history``, the starts a sibling's later tries make unreadable
    are forgotten rather than kept (32 bytes each, a number that grows with
    the lines of a run whose prompts come round again). They matter only
    when a line differs from its copy: a caller that meets one (``conflicts``
    after the second read) must fold the set again with ``history``.
    """

    def __init__(self, *, copies_later: bool = False, history: bool = True) -> None:
        self._copies_later = copies_later
        self._history = history
        self._runs: dict[str, RunFold] = {}
        self.notes: list[Note] = []
        # Per run, the seqs whose lines differ, as a second read of those in
        # ``seen_again`` finds them (``copies.CopyCheck``); each becomes a note.
        self.conflicts: dict[str, Conflicts] = {}

    def add(self, events: Iterable[Any], source: str | None = None) -> None:
        """Fold events in: real ``Event``s, ``UnknownEvent``s or ``_reading.lean`` classes.

        ``source`` names the file they come from, for ``files_to_compare``.
        """
        # The hot loop. While a run's events come in a row and in seq order,
        # each one only extends the run's last seq range and, for an attempt
        # event, updates its attempt's row; the first event of a run, an
        # event out of order and a seen one go through `RunFold.add`. The
        # usual seal retires its sibling here, as `SiblingTable.retire`
        # would, with the table's columns and filter held in locals: a call
        # costs more than the work. Every other path may rebuild the filter,
        # so the locals are taken again after it (`_Retire.load`).
        runs = self._runs
        run: RunFold | None = None
        run_id = ""
        nxt: int | None = None  # the seq that continues the run's last range
        kind_of = FAST_KIND.get
        rollout = ROLLOUT
        need_first_rollout = False
        last: Any = None
        table = SiblingTable()
        rows: dict[Any, list[Any]] = {}
        nan = math.nan
        last_seq = _LAST_SEQ
        retired = _Retire(table)
        bits, mask, key_in, s_seq_in, s_att_in, s_time_in, z_seq_in, z_att_in, z_time_in = (
            retired.load()
        )
        hash_in, collide = retired.hash_in, table.collide
        for ev in events:
            if ev.run_id != run_id:
                if run is not None:
                    _store(run, nxt, last)
                run_id = ev.run_id
                run = runs.get(run_id)
                if run is None:
                    run = runs[run_id] = RunFold(
                        run_id, copies_later=self._copies_later, history=self._history
                    )
                if source is not None:
                    run.sources.add(source)
                nxt, last = None, None
                need_first_rollout = run.first_rollout is None
                table = run.table
                rows = table.rows
                retired = _Retire(table)
                bits, mask, key_in, s_seq_in, s_att_in, s_time_in, z_seq_in, z_att_in, z_time_in = (
                    retired.load()
                )
                hash_in, collide = retired.hash_in, table.collide
            assert run is not None
            seq = ev.seq
            if seq != nxt:
                _store(run, nxt, last)
                run.add(ev)
                bits, mask = retired.filter()
                last = None
                # The short path takes an event that extends the highest
                # range: one later than every event of the run so far.
                nxt = run.seqs.tail
                if nxt is not None and nxt >= SEQ_LIMIT:
                    nxt = None  # past the seqs a tracer gives: RunFold.add leaves them out
                need_first_rollout = run.first_rollout is None
                continue
            nxt = seq + 1 if seq < last_seq else None
            last = ev
            cls = type(ev)
            if need_first_rollout and cls in rollout:
                run.first_rollout = First(seq, ev)
                need_first_rollout = False
            kind = kind_of(cls)
            if kind == IGNORED:
                continue
            if kind is None:
                run.other(ev)
                continue
            key = (ev.prompt_id, ev.generation_index)
            row = rows.get(key)
            if kind == DISPATCHED and row is None:
                # The usual first event of a sibling: its first try.
                rows[key] = [seq, ev.attempt, ev.time, -1, -1, -1, -1, nan, None]
                slot = hash(key) & mask
                if bits[slot >> 3] & (1 << (slot & 7)):  # `maybe_retired`
                    collide.add(key)
                continue
            attempt = ev.attempt
            if (
                kind == SEALED
                and row is not None
                and row[E_SEQ] < 0 <= row[S_SEQ]
                and row[EXTRA] is None
                and row[S_ATT] == attempt
                and INT64_MIN <= attempt <= INT64_MAX
            ):
                # The usual seal: the first end after the sibling's only
                # start, of that try. All the figures need of it is kept.
                del rows[key]
                prompt, index = key
                if type(prompt) is int and 0 <= prompt < PROMPT_LIMIT and 0 <= index < _INDEXES:
                    key_in(prompt << INDEX_BITS | index)
                else:
                    key_in(table.codes.code(key))
                s_seq_in(row[S_SEQ])
                s_att_in(attempt)
                s_time_in(row[S_TIME])
                z_seq_in(seq)
                z_att_in(attempt)
                z_time_in(ev.time)
                h = hash(key)
                hash_in(h)
                slot = h & mask
                bit = 1 << (slot & 7)
                if bits[slot >> 3] & bit:
                    # Retired before, maybe: once enough are, the records
                    # their later ones supersede go (`SiblingTable.compact`).
                    collide.add(key)
                    table.again += 1
                    if table.again > table.again_limit:
                        table.compact()
                        bits, mask = retired.filter()
                        continue
                bits[slot >> 3] |= bit
                retired.count += 1
                if retired.count << 4 > mask + 1:  # as `SiblingTable.retire` grows it
                    table.grow()
                    bits, mask = retired.filter()
            else:
                run.attempt(kind, ev)
                bits, mask = retired.filter()
        if run is not None:
            _store(run, nxt, last)

    def merge(self, other: CostAnalysis, *, take: bool = False) -> None:
        """Fold in another analysis of more of the same trace set.

        With ``take``, ``other`` is given up to this one (it is not used again,
        as an analysis sent back by a worker process is not): a run only it
        holds is taken over as it is, not copied.
        """
        for run_id, theirs in list(other._runs.items()):
            mine = self._runs.get(run_id)
            if mine is None:
                if take:
                    self._runs[run_id] = theirs
                    continue
                # A copy: `other` stays as it was, whatever is merged later.
                mine = self._runs[run_id] = RunFold(run_id, history=self._history)
            mine.merge(theirs)
        if take:
            other._runs = {}

    def needs_history(self) -> bool:
        """Whether a fold that keeps the history of dropped starts could give other
        figures: this one keeps none, and a run with a line that differs from its
        copy (``conflicts``) dropped some."""
        if self._history:
            return False
        for run_id in self.conflicts:
            table = self._runs[run_id].table
            if table.collide:
                # As the figures will (``summary``): what it drops counts too.
                table.compact()
            if table.dropped:
                return True
        return False

    def add_version(self, ev: Any) -> None:
        """Fold in a line that differs from those before it with its seq (``copies_later``)."""
        run = self._runs[ev.run_id]
        run.fold(ev)

    def seen_again(self) -> dict[str, SeqSet]:
        """Per run seen more than once at some seq, those seqs: what ``CopyCheck`` compares."""
        return {r.run_id: r.again for r in self._runs.values() if r.again is not None}

    def files_to_compare(self, files: Iterable[str]) -> list[str]:
        """Those of ``files`` (in their order) that hold a run with a seq seen twice."""
        wanted = set().union(*(r.sources for r in self._runs.values() if r.again is not None))
        return [f for f in files if f in wanted]

    def runs(self) -> list[RunFold]:
        """Every run seen, ordered by the time of its ``trace_opened``."""
        return sorted((r for r in self._runs.values() if r.last is not None), key=lambda r: r.order)

    def stops(self) -> list[StopCost]:
        """The stops of the trace set, in run order, each with its figures.

        A run that begins with a restore but has no earlier run with rollout
        events is a stop too, of an unknown run: every figure that needs the
        stopped run is None, with the reason.
        """
        self.notes = []
        ordered = self.runs()
        out: list[StopCost] = []
        previous: RunFold | None = None
        # path -> the places in `ordered` of the runs that published it
        published: dict[str, list[int]] = {}
        for i, run in enumerate(ordered):
            for path in {*run.snapshots, *run.checkpoints}:
                published.setdefault(path, []).append(i)
        for i, run in enumerate(ordered):
            self.notes.extend(_run_notes(run, self.conflicts.get(run.run_id)))
            first = run.first_rollout
            if first is not None and isinstance(first.event, (RestoreStarted, LeanRestoreStarted)):
                self.notes.extend(_skew_notes(run, first.event, i, ordered, published))
                if previous is None:
                    out.append(orphan_cost(run, first.event))
                    self.notes.append(
                        Note(
                            kind="no_stopped_run",
                            run_id=run.run_id,
                            text=f"run {run.run_id} begins with a restore from "
                            f"{first.event.path!r} but no earlier run with rollout events is in "
                            "the trace set: the figures of the stopped run are n/a",
                        )
                    )
                else:
                    cost = stop_cost(previous, run, first.event)
                    out.append(cost)
                    self.notes.extend(stop_notes(previous, run, cost))
            if first is not None:
                if previous is not None:
                    # No later stop reads it: the summaries of every run at
                    # once came to a tenth of the peak (10M lines: 333 -> 311 MB).
                    previous.forget_siblings()
                previous = run
        return out


class _Retire:
    """What the hot loop retires siblings into: one run's table, its columns' appends."""

    __slots__ = ("count", "hash_in", "table")

    def __init__(self, table: SiblingTable) -> None:
        self.table = table
        self.count = len(table.hashes)
        self.hash_in = table.hashes.append

    def filter(self) -> tuple[bytearray, int]:
        """The table's filter of retired keys, and the mask of its slots (it may grow)."""
        bits = self.table.bits
        self.count = len(self.table.hashes)
        return bits, (len(bits) << 3) - 1

    def load(self) -> tuple[Any, ...]:
        t = self.table
        return (
            *self.filter(),
            t.r_keys.append,
            t.r_s_seq.append,
            t.r_s_att.append,
            t.r_s_time.append,
            t.r_z_seq.append,
            t.r_z_att.append,
            t.r_z_time.append,
        )


def _store(run: RunFold, nxt: int | None, last: Any) -> None:
    """Write the hot loop's locals back to the run."""
    run.invalidate()
    if nxt is None:
        return
    run.seqs.extend_tail(nxt)
    if last is not None:
        run.last = First(last.seq, last)


def _run_notes(run: RunFold, conflicts: Conflicts | None) -> Iterator[Note]:
    if conflicts is not None:
        files = f" (in {', '.join(sorted(run.sources))})" if run.sources else ""
        yield Note(
            kind="conflicting_copies",
            run_id=run.run_id,
            text=f"run {run.run_id}: lines that differ share {conflicts.describe()}{files}: "
            "copies of the run disagree (an edited copy, a file torn and written again, or "
            "two writers with one run_id); each figure counts every version of such a line, "
            "the same in any order, but may not be what the run did",
        )
    if run.duplicates:
        yield Note(
            kind="read_twice",
            run_id=run.run_id,
            text=f"run {run.run_id}: {run.duplicates:,} event(s) seen twice were counted once "
            "(the same run read from two files, such as two sinks of one tracer)",
        )
    if run.unusable:
        yield Note(
            kind="bad_seq",
            run_id=run.run_id,
            text=f"run {run.run_id}: {run.unusable:,} event(s) with a seq below 0 or above "
            "2**62 were left out (corrupt data)",
        )
    finished, first = run.restore_finished, run.first_rollout
    if finished is not None and first is not None and finished.seq == first.seq:
        yield Note(
            kind="restore_started_missing",
            run_id=run.run_id,
            text=f"run {run.run_id}'s first rollout event is restore_finished (seq "
            f"{finished.seq}) with no restore_started before it (lost to a gap in the seqs?): "
            "it may be a restored run, but no stop can be counted for it",
        )
    restore = run.first_restore
    if restore is not None and first is not None and restore.seq != first.seq:
        yield Note(
            kind="restore_not_first",
            run_id=run.run_id,
            text=f"run {run.run_id}: restore_started at seq {restore.seq} comes after its first "
            f"rollout event ({_tag(first.event)} at seq {first.seq}), so the run does not begin "
            "with a restore and no stop is counted for it",
        )


def _skew_notes(
    run: RunFold, restore: Any, place: int, ordered: list[RunFold], published: dict[str, list[int]]
) -> Iterator[Note]:
    """A run that opened after the restoring one but published what it restored."""
    places = published.get(restore.path, [])
    later = bisect.bisect_right(places, place)
    if later < len(places):
        other = ordered[places[later]]
        yield Note(
            kind="clock_skew",
            run_id=run.run_id,
            text=f"run {run.run_id} restores {restore.path!r}, which run {other.run_id} "
            f"published, but run {other.run_id} opened later ({_when(other)} against "
            f"{_when(run)}), so it is not the run the stop is counted against: do the "
            "clocks of their hosts disagree?",
        )


def _when(run: RunFold) -> str:
    return f"{run.order[0]:.6f}"


def _tag(ev: Any) -> str:
    tag = type(ev).__struct_config__.tag
    return tag if isinstance(tag, str) else type(ev).__name__


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
    """Every stop in ``events`` (one trace set, any layout, any order) with its figures.

    Lines of one ``(run_id, seq)`` that differ (conflicting copies) give the
    same figures in any order too; telling them from a line read twice takes
    a second read of the files, which the ``cost`` command does.
    """
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
