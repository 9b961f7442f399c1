"""Per-run bookkeeping shared by ``summary`` and ``validate``: seqs, times, counts.

A run may be read from several files: a run spread over them (each holds a
part), or a run read twice (two file sinks of one tracer, a copied file: the
README's own two-sink setup). An event whose ``(run_id, seq)`` was already
seen in another file is the same event read again: it is counted once. The
same seq twice in one file is a real duplicate.

Unless the lines differ (a conflicting copy): the seqs seen more than once
are kept (``again``) for a second read (``copies.CopyCheck``) to compare, and
each other version it finds is counted too (``add_version``), so that no order
of lines or files changes a count.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._schema.decoding import UnknownEvent
from .._schema.events import Event, TraceClosed, TraceOpened
from .copies import Conflicts, least
from .seqs import SeqSet

__all__ = ["RunStats", "RunSummary", "NEW", "COPY", "DUPLICATE", "TABLE_COLUMNS"]

# What ``RunStats.add`` made of an event.
NEW = 0  # first seen: counted
COPY = 1  # seen before in another file: the same event read again, not counted
DUPLICATE = 2  # its seq seen before in the same file: a real duplicate


def _class_tag(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    return tag if isinstance(tag, str) else cls.__name__


# The columns of ``rollout-trace summary``'s table, each a key of a run's
# ``--json`` object with the same meaning (the table formats the value).
TABLE_COLUMNS = (
    "run_id",
    "host",
    "pid",
    "first_time",
    "last_time",
    "span_s",
    "events",
    "missing_seqs",
    "duplicate_seqs",
    "conflicts",
    "torn_lines",
    "invalid_lines",
    "closed",
)


class RunSummary(msgspec.Struct, kw_only=True):
    """What ``rollout-trace summary`` reports for one run.

    ``events`` counts the run's events, each ``(run_id, seq)`` once, or once
    per version where lines of one seq differ; ``read_twice`` the lines that
    were the same event read again from another file (not in ``events``);
    ``duplicate_seqs`` the lines that repeat a seq of their own file (not in
    ``events`` either); ``conflicts`` the seqs whose lines differ
    (``conflict_seqs``, as ranges).
    """

    run_id: str
    files: list[str]
    host: str | None
    pid: int | None
    first_time: float
    last_time: float
    span_s: float
    events: int
    events_by_name: dict[str, int]
    seq_gaps: list[tuple[int, int]]
    missing_seqs: int
    duplicate_seqs: int
    conflicts: int
    conflict_seqs: list[tuple[int, int]]
    read_twice: int
    torn_lines: int
    invalid_lines: int
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class RunStats:
    """Folds one run's events; events and files may come in any order."""

    __slots__ = (
        "again",
        "closed",
        "conflicts",
        "counts",
        "duplicates",
        "files",
        "first_time",
        "invalid_lines",
        "last_time",
        "opened",
        "read_twice",
        "run_id",
        "seqs",
        "torn_lines",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        # The seqs each file holds: a seq twice in one file is a duplicate, a
        # seq in two files the same event read twice.
        self.files: dict[str, SeqSet] = {}
        self.seqs = SeqSet()
        self.counts: dict[type[Event] | str, int] = {}
        self.first_time = float("inf")
        self.last_time = float("-inf")
        self.opened: TraceOpened | None = None
        self.closed: TraceClosed | None = None
        self.duplicates = 0
        self.read_twice = 0
        self.torn_lines = 0
        self.invalid_lines = 0
        # The seqs seen more than once; those whose lines differ (a second read finds them).
        self.again: SeqSet | None = None
        self.conflicts = Conflicts()

    def add(self, ev: Event | UnknownEvent, path: str) -> int:
        """Fold one event read from ``path``: ``NEW``, ``COPY`` or ``DUPLICATE``."""
        seqs = self.seqs
        in_file = self.files.get(path)
        if in_file is None:
            if not self.files:
                # A run read from one file (the usual case) keeps one set of seqs.
                in_file = seqs
            else:
                if len(self.files) == 1:
                    seqs = self.seqs = seqs.copy()
                in_file = SeqSet()
            self.files[path] = in_file
        seq = ev.seq
        if not in_file.add(seq):
            self.duplicates += 1
            self._again(seq)
            return DUPLICATE
        if in_file is not seqs and not seqs.add(seq):
            self.read_twice += 1
            self._again(seq)
            return COPY
        t = ev.time
        if t < self.first_time:
            self.first_time = t
        if t > self.last_time:
            self.last_time = t
        kind: Any = type(ev)
        if kind is UnknownEvent:
            kind = ev.event  # type: ignore[union-attr]
        elif kind is TraceOpened:
            if self.opened is None or seq < self.opened.seq:
                self.opened = ev  # type: ignore[assignment]
        elif kind is TraceClosed and (self.closed is None or seq > self.closed.seq):
            self.closed = ev  # type: ignore[assignment]
        counts = self.counts
        counts[kind] = counts.get(kind, 0) + 1
        return NEW

    def _again(self, seq: int) -> None:
        if self.again is None:
            self.again = SeqSet()
        self.again.add(seq)

    def add_version(self, ev: Event | UnknownEvent) -> None:
        """Count an event whose seq was counted with another event (a conflicting copy).

        Counted as ``add`` counts a new one, except that of two
        ``trace_opened`` (or ``trace_closed``) with one seq the one whose
        encoding sorts first stands, as it would in any order.
        """
        t, seq = ev.time, ev.seq
        if t < self.first_time:
            self.first_time = t
        if t > self.last_time:
            self.last_time = t
        kind: Any = type(ev)
        if isinstance(ev, UnknownEvent):
            kind = ev.event
        elif isinstance(ev, TraceOpened):
            opened = self.opened
            if opened is None or seq < opened.seq:
                self.opened = ev
            elif seq == opened.seq:
                self.opened = least(opened, ev)
        elif isinstance(ev, TraceClosed):
            closed = self.closed
            if closed is None or seq > closed.seq:
                self.closed = ev
            elif seq == closed.seq:
                self.closed = least(closed, ev)
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def events_by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind, n in self.counts.items():
            name = kind if isinstance(kind, str) else _class_tag(kind)
            out[name] = out.get(name, 0) + n
        return dict(sorted(out.items()))

    def summary(self) -> RunSummary:
        gaps = self.seqs.gaps()
        return RunSummary(
            run_id=self.run_id,
            files=list(self.files),
            host=self.opened.host if self.opened else None,
            pid=self.opened.pid if self.opened else None,
            first_time=self.first_time,
            last_time=self.last_time,
            span_s=self.last_time - self.first_time,
            events=sum(self.counts.values()),
            events_by_name=self.events_by_name(),
            seq_gaps=gaps,
            missing_seqs=sum(hi - lo + 1 for lo, hi in gaps),
            duplicate_seqs=self.duplicates,
            conflicts=self.conflicts.count,
            conflict_seqs=self.conflicts.seqs.ranges(),
            read_twice=self.read_twice,
            torn_lines=self.torn_lines,
            invalid_lines=self.invalid_lines,
            closed=self.closed is not None,
        )
