"""Per run, its events in seq order: the normalize stage of the model.

Events come in any order of files and lines (``Collector.add``, a block at a
time). ``normalize`` puts one run's lines in seq order and settles the lines
that share a seq: lines that decode to one event (``terms.canonical``) are
one event read twice, a **copy**, kept once; lines that differ are
conflicting **versions**, all kept, in one order (their canonical encoding,
ascending), and flagged, so no file is read a second time to tell the two
apart. Lines whose seq no tracer gives are counted and left out.

A ``RunEvents`` holds the run's columns (``seq``, ``time``, ``kind``, and
the decoded events, so nothing of a built-in event is lost) and what the
stage found: copy counts, the seqs with versions, the seq ranges (hence the
gaps), and the lowest/highest-seq events the run order and the stop read.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import operator
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from .terms import (
    KIND,
    OPENED,
    OTHER,
    RESTORE_FINISHED,
    RESTORE_STARTED,
    SEQ_LIMIT,
    SNAPSHOT,
    STEP,
    canonical,
    is_rollout,
    kind_of,
    run_order_key,
    usable,
)

__all__ = ["Collector", "RunEvents", "normalize", "settle"]

_ROLLOUT_KINDS = tuple(k for k in range(256) if is_rollout(k))

_seq_of = operator.attrgetter("seq")
_group_id_of = operator.attrgetter("group_id")
_RUN_ID = itertools.repeat("run_id")
_GROUP_ID = itertools.repeat("group_id")
_NO = itertools.repeat(False)
# The built-in classes with a group id (a str, as the decoder checked).
_GROUPED = {cls: True for cls in KIND if "group_id" in cls.__struct_fields__}
_time_of = operator.attrgetter("time")
_run_id_of = operator.attrgetter("run_id")


class Collector:
    """Gathers decoded events per run, each with the file it came from.

    ``add`` takes a block (one file's, or any batch of events); nothing is
    ordered or compared until ``normalize``.
    """

    def __init__(self, *, lines: bool = False) -> None:
        self.files: list[str] = []
        # One string object per distinct run id and group id.
        self._names: dict[str, str] = {}
        self._file_index: dict[str, int] = {}
        # run id -> (events, the file index of each)
        self.runs: dict[str, tuple[list[Any], array[int]]] = {}
        # With ``lines``: run id -> the line of each event in its file (-1: not given).
        self.lines: dict[str, array[int]] | None = {} if lines else None

    def _index(self, source: str) -> int:
        src = self._file_index.get(source, -1)
        if src < 0:
            src = self._file_index[source] = len(self.files)
            self.files.append(source)
        return src

    def merge(self, other: Collector) -> None:
        """Take in what another collector gathered (a worker's): its files keep their names."""
        remap = [self._index(f) for f in other.files]
        identity = remap == list(range(len(remap)))
        for run_id, (evs, srcs) in other.runs.items():
            held = self.runs.get(run_id)
            if held is None:
                held = self.runs[run_id] = ([], array("i"))
            self._share(evs, run_id)
            held[0].extend(evs)
            held[1].extend(
                srcs if identity else array("i", [remap[s] if s >= 0 else s for s in srcs])
            )
            if self.lines is not None:
                given = None if other.lines is None else other.lines.get(run_id)
                mine = self.lines.setdefault(run_id, array("q"))
                mine.extend(given if given is not None else array("q", [-1]) * len(evs))

    def add(
        self, events: Iterable[Any], source: str | None = None, lines: Iterable[int] | None = None
    ) -> None:
        """Take a block of events; ``source`` names the file they come from, and
        ``lines`` (kept by a collector made with ``lines=True``) their lines in it."""
        src = -1 if source is None else self._index(source)
        if self.lines is not None:
            self._add_lines(events, src, lines)
            return
        runs = self.runs
        if not isinstance(events, list):
            events = list(events)
        # One file per run is the norm: a block of one run is taken whole, in C.
        ids = set(map(_run_id_of, events))
        if len(ids) == 1:
            (only,) = ids
            held = runs.get(only)
            if held is None:
                held = runs[only] = ([], array("i"))
            self._share(events, only)
            held[0].extend(events)
            held[1].extend(array("i", [src]) * len(events))
            return
        run_id: str | None = None
        evs: list[Any] = []
        srcs: array[int] = array("i")
        for ev in events:
            # One file per run is the norm: switch lists only when the run changes.
            if ev.run_id != run_id:
                run_id = ev.run_id
                held = runs.get(run_id)
                if held is None:
                    held = runs[run_id] = ([], array("i"))
                evs, srcs = held
            evs.append(ev)
            srcs.append(src)

    def _share(self, events: Sequence[Any], run_id: str) -> None:
        """Make the events of one run hold one string object for their run id and
        one per group id: a decoder makes one per line (some 80 bytes each)."""
        names = self._names
        try:  # in C: a Python loop here cost a tenth of the whole read
            collections.deque(map(setattr, events, _RUN_ID, itertools.repeat(run_id)), 0)
        except AttributeError:  # a user's frozen class among them: one by one
            for ev in events:
                with contextlib.suppress(AttributeError):
                    ev.run_id = run_id
        grouped = list(itertools.compress(events, map(_GROUPED.get, map(type, events), _NO)))
        gids = list(map(_group_id_of, grouped))
        collections.deque(map(setattr, grouped, _GROUP_ID, map(names.setdefault, gids, gids)), 0)

    def _add_lines(self, events: Iterable[Any], src: int, lines: Iterable[int] | None) -> None:
        """``add``, with the line of each event kept too."""
        assert self.lines is not None
        runs, kept = self.runs, self.lines
        pairs = (
            zip(events, itertools.repeat(-1)) if lines is None else zip(events, lines, strict=True)
        )
        run_id: str | None = None
        evs: list[Any] = []
        srcs: array[int] = array("i")
        at: array[int] = array("q")
        for ev, line in pairs:
            if ev.run_id != run_id:
                run_id = ev.run_id
                held = runs.get(run_id)
                if held is None:
                    held = runs[run_id] = ([], array("i"))
                evs, srcs = held
                at = kept.setdefault(run_id, array("q"))
            evs.append(ev)
            srcs.append(src)
            at.append(line)


class RunEvents:
    """One run after normalize: every kept event, in seq order (versions in theirs).

    ``repeats`` counts the usable lines beyond the first of their seq (copies
    and versions alike: the ``read_twice`` note); ``same_file`` and
    ``other_file`` split the copies by where the repeat was (in the file that
    already held the seq, or in another); ``versions`` lists the seqs held by
    lines that differ; ``unusable`` counts the lines left out for their seq,
    and ``left_out`` holds them: ``(event, file index, line)`` in the order
    gathered. ``sources`` are the files the run was read from (indices into
    the set's).

    Where the collector kept lines (``Collector(lines=True)``), ``src`` and
    ``line`` give, per kept event, the file and line of the first line read
    that holds it, and ``copies`` each other usable line that holds a kept
    event: ``(its index, file index, line)``, seqs ascending, each seq's in
    the order read. Otherwise ``src`` and ``line`` are None and ``copies``
    empty; a line not given is -1.
    """

    __slots__ = (
        "copies",
        "events",
        "kind",
        "left_out",
        "line",
        "other_file",
        "repeats",
        "run_id",
        "same_file",
        "seq",
        "sources",
        "src",
        "time",
        "unusable",
        "versions",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.events: list[Any] = []
        self.seq: array[int] = array("q")
        self.time: array[float] = array("d")
        self.kind = bytearray()
        self.repeats = 0
        self.same_file = 0
        self.other_file = 0
        self.versions: list[int] = []
        self.unusable = 0
        self.sources: set[int] = set()
        self.left_out: list[tuple[Any, int, int]] = []
        self.src: array[int] | None = None
        self.line: array[int] | None = None
        self.copies: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self.events)

    # --- what the model reads of a run --------------------------------------------

    def ranges(self) -> list[tuple[int, int]]:
        """The kept seqs as inclusive ``(lo, hi)`` ranges."""
        out: list[tuple[int, int]] = []
        for s in self.seq:
            if out and s <= out[-1][1] + 1:
                if s > out[-1][1]:
                    out[-1] = (out[-1][0], s)
            else:
                out.append((s, s))
        return out

    def gaps(self) -> list[tuple[int, int]]:
        """The seqs missing between the lowest and the highest kept one, as ranges."""
        r = self.ranges()
        return [(a[1] + 1, b[0] - 1) for a, b in itertools.pairwise(r)]

    def where(self, *kinds: int) -> list[int]:
        """The indices of the events of ``kinds``, in seq order (found in C)."""
        flags = bytearray(256)
        for k in kinds:
            flags[k] = 1
        return list(itertools.compress(range(len(self.kind)), self.kind.translate(flags)))

    def first_of(self, *kinds: int) -> int | None:
        """The index of the lowest-seq event of one of ``kinds`` (the first version)."""
        found = [i for i in map(self.kind.find, kinds) if i >= 0]
        return min(found) if found else None

    def first_rollout(self) -> int | None:
        """The index of the run's first rollout event (``terms.is_rollout``)."""
        return self.first_of(*_ROLLOUT_KINDS)

    @property
    def last_time(self) -> float:
        """The time of the run's last event: the highest seq, its last version."""
        return self.time[-1] if self.time else math.nan

    @property
    def min_time(self) -> float:
        """The earliest time of a kept event (what ``summary`` shows as first)."""
        return min(self.time, default=math.nan)

    @property
    def max_time(self) -> float:
        """The latest time of a kept event (what ``summary`` shows as last)."""
        return max(self.time, default=math.nan)

    @property
    def opened_at(self) -> float | None:
        i = self.first_of(OPENED)
        return None if i is None else self.time[i]

    @property
    def order(self) -> tuple[float, str]:
        """Its place in the run order (``terms.run_order_key``)."""
        return run_order_key(self.opened_at, self.time[0] if self.time else math.nan, self.run_id)

    def steps(self) -> list[tuple[int, float]]:
        """``(step, time)`` of each ``step_trained``, in seq order."""
        ev = self.events
        return [(ev[i].step, self.time[i]) for i in self.where(STEP)]

    def published(self, kind: int) -> dict[str, float]:
        """Path -> value of the latest (by seq) ``snapshot_published`` (its
        ``captured_at``) or ``trainer_checkpoint_published`` (its time)."""
        out: dict[str, float] = {}
        ev = self.events
        for i in self.where(kind):
            out[ev[i].path] = ev[i].captured_at if kind == SNAPSHOT else self.time[i]
        return out

    def restores(self) -> tuple[int | None, int | None]:
        """The indices of the lowest-seq ``restore_started`` and ``restore_finished``."""
        return self.first_of(RESTORE_STARTED), self.first_of(RESTORE_FINISHED)


def normalize(
    run_id: str, events: Sequence[Any], sources: Sequence[int], lines: Sequence[int] | None = None
) -> RunEvents:
    """One run's lines (any order, copies and versions included) as a ``RunEvents``;
    ``lines`` (optional) the line of each in its file."""
    out = RunEvents(run_id)
    seqs = list(map(_seq_of, events))
    # The usual case, done column by column in C: lines in seq order, none
    # repeated, every seq usable.
    if seqs and seqs[0] >= 0 and seqs[-1] < SEQ_LIMIT and all(map(operator.lt, seqs, seqs[1:])):
        out.events = list(events)
        out.seq = array("q", seqs)
        out.time = array("d", map(_time_of, events))
        out.kind = bytearray(map(KIND.get, map(type, events), itertools.repeat(OTHER)))
        out.sources = set(sources)
        if lines is not None:
            out.src = array("i", sources)
            out.line = array("q", lines)
        return out
    keep = [i for i, ev in enumerate(events) if usable(ev.seq)]
    out.unusable = len(events) - len(keep)
    if out.unusable:
        held = set(keep)
        out.left_out = [
            (ev, sources[i], -1 if lines is None else lines[i])
            for i, ev in enumerate(events)
            if i not in held
        ]
    seqs = [events[i].seq for i in keep]
    # The usual case costs a check: lines already in seq order, none repeated.
    if not all(a < b for a, b in itertools.pairwise(seqs)):
        keep.sort(key=lambda i: events[i].seq)
    out.sources = set(sources)
    ev_in, seq_in, time_in, kind_in = (
        out.events.append,
        out.seq.append,
        out.time.append,
        out.kind.append,
    )
    # With lines: the index of each kept event's first line.
    kept: list[int] | None = None if lines is None else []
    n = len(keep)
    j = 0
    while j < n:
        i = keep[j]
        seq = events[i].seq
        k = j + 1
        while k < n and events[keep[k]].seq == seq:
            k += 1
        group = [i] if k == j + 1 else settle(out, seq, keep[j:k], events, sources, lines)
        for x in group:
            ev = events[x]
            ev_in(ev)
            seq_in(seq)
            time_in(ev.time)
            kind_in(kind_of(ev))
        if kept is not None:
            kept.extend(group)
        j = k
    if kept is not None and lines is not None:
        out.src = array("i", [sources[x] for x in kept])
        out.line = array("q", [lines[x] for x in kept])
    return out


def settle(
    out: RunEvents,
    seq: int,
    group: list[int],
    events: Sequence[Any],
    sources: Sequence[int],
    lines: Sequence[int] | None,
) -> list[int]:
    """Of the lines ``group`` (indices into ``events``, in the order read) that share
    ``seq``, those kept: copies once (the first read), versions in their order.

    What it finds is counted on ``out`` (``repeats``, ``same_file``,
    ``other_file``, ``versions``; ``copies`` with ``lines``, indexed from
    ``len(out.events)``, where the caller puts the kept ones).
    """
    out.repeats += len(group) - 1
    files = {sources[x] for x in group}
    out.other_file += len(files) - 1
    out.same_file += len(group) - len(files)
    codes = [canonical(events[x]) for x in group]
    first: dict[bytes, int] = {}
    for x, code in zip(group, codes, strict=True):
        first.setdefault(code, x)
    if len(first) > 1:
        out.versions.append(seq)
    order = sorted(first)
    if lines is not None:
        at = {code: len(out.events) + rank for rank, code in enumerate(order)}
        for x, code in zip(group, codes, strict=True):
            if first[code] != x:
                out.copies.append((at[code], sources[x], lines[x]))
    return [first[c] for c in order]
