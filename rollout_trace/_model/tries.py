"""One pass per run: its tries (``terms`` defines a try) and its marks.

``pass_run`` is the automaton over a run's attempt events in seq order:

- a start of ``(sibling, attempt)`` while a try of it is open supersedes that
  try (it ends ``SUPERSEDED`` at the new start) and opens a new one;
- an end closes the open try of its ``(sibling, attempt)``, or, with none
  open, is a try of its own with no start;
- what is still open after the run's last event is ``OPEN``.

Tries come out in the order of their first event's seq. Per sibling the pass
also gives its last started try and whether the run resumed it
(``SiblingIndex``), which is all a stop reads of the run. The
other events, in seq order, are the run's marks, but for the restores, which
are paired into ``Restore``s.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from array import array
from collections.abc import Sequence
from itertools import compress
from typing import Any, NamedTuple

import msgspec

from .runs import AttemptTable, RunEvents
from .terms import (
    DISPATCHED,
    END_OF_KIND,
    END_SUPERSEDED,
    PLAIN_OUTCOME,
    RESTORE_FINISHED,
    RESTORE_STARTED,
    RESUMED,
    EndKind,
    is_attempt,
    outcome_of,
)

__all__ = [
    "Restore",
    "Run",
    "SiblingIndex",
    "Tries",
    "marks_of",
    "pass_run",
    "restores_of",
]

# A sibling: (prompt_id, generation_index); an attempt of one: with its number.
SiblingKey = tuple[Any, int]
AttemptKey = tuple[Any, int, int]


class Tries:
    """A run's tries as columns, one row per try, in the order of their first event.

    The pass keeps two columns, ``first`` (the position in the run's
    ``AttemptTable`` of each try's first event) and ``end`` (of the event
    that ended it; -1: none); the others are read off the table at their
    first use, in C:

    ``start_kind`` is 0 for a try with no start in the run, else the kind code
    of its start (dispatched or resumed); ``end_kind`` an ``EndKind``;
    ``end_seq`` -1 and ``end_time`` NaN where no end event closed it (open or
    superseded: ``superseded_at`` then holds the superseding start's time).
    ``weight_version`` (a dispatch's) and ``turn`` (a resume's) are None where
    the start gave none; ``reason`` is a refusal's or abandon's.
    """

    def __init__(self, run: RunEvents, table: AttemptTable) -> None:
        self._run = run
        self._table = table
        self.first: array[int] = array("i")
        self.end: array[int] = array("i")
        self.superseded_at: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.first)

    @functools.cached_property
    def outcomes(self) -> tuple[str, ...]:
        """Each try's outcome (``terms.outcome_of``)."""
        # Abandons (their reason tells) one by one, the rest in C.
        out: list[Any] = list(map(PLAIN_OUTCOME.get, self.end_kind))
        for i in compress(range(len(out)), map(operator.is_, out, _NONE)):
            out[i] = outcome_of(self.end_kind[i], self.reason[i])
        return tuple(out)

    def _at_first(self, column: Sequence[Any]) -> Sequence[Any]:
        """``column`` at each try's first event: an array of a column that is one,
        else a tuple (the model's columns are not changed once made)."""
        got = map(column.__getitem__, self.first)
        return array(column.typecode, list(got)) if isinstance(column, array) else tuple(got)

    @functools.cached_property
    def prompt_id(self) -> Sequence[Any]:
        return self._at_first(self._table.p)

    @functools.cached_property
    def generation_index(self) -> Sequence[int]:
        return self._at_first(self._table.g)

    @functools.cached_property
    def attempt(self) -> Sequence[int]:
        return self._at_first(self._table.a)

    @functools.cached_property
    def group_id(self) -> Sequence[str]:
        return self._at_first(self._table.gid)

    @functools.cached_property
    def start_kind(self) -> bytes:
        return bytes(self._at_first(self._table.kind)).translate(_START_OR_ZERO)

    def _of_run(self, column: array[Any], positions: Sequence[int], missing: Any) -> array[Any]:
        """The run's ``column`` at the events at table ``positions`` (-1: ``missing``)."""
        where = self._table.where + array("i", [len(column)])
        column = column + array(column.typecode, [missing])
        return array(
            column.typecode, list(map(column.__getitem__, map(where.__getitem__, positions)))
        )

    @functools.cached_property
    def _start(self) -> array[int]:
        """Each try's first position, or -1 for a try with no start."""
        out = array("i", self.first)
        for i in compress(range(len(out)), self.start_kind.translate(_IS_ZERO)):
            out[i] = -1
        return out

    @functools.cached_property
    def start_seq(self) -> array[int]:
        return self._of_run(self._run.seq, self._start, -1)

    @functools.cached_property
    def start_time(self) -> array[float]:
        return self._of_run(self._run.time, self._start, math.nan)

    @functools.cached_property
    def end_kind(self) -> bytearray:
        # Position -1 (no end) reads the added 0, which is ``OPEN``.
        kinds = bytes(map((self._table.kind + b"\0").__getitem__, self.end))
        out = bytearray(kinds.translate(_END_KIND_OF))
        for i in self.superseded_at:
            out[i] = END_SUPERSEDED
        return out

    @functools.cached_property
    def end_seq(self) -> array[int]:
        return self._of_run(self._run.seq, self.end, -1)

    @functools.cached_property
    def end_time(self) -> array[float]:
        return self._of_run(self._run.time, self.end, math.nan)

    @functools.cached_property
    def reason(self) -> tuple[str | None, ...]:
        return tuple(map(self._table.reasons.get, self.end))

    @functools.cached_property
    def weight_version(self) -> tuple[int | None, ...]:
        return self._x_of(DISPATCHED)

    @functools.cached_property
    def turn(self) -> tuple[int | None, ...]:
        return self._x_of(RESUMED)

    def _x_of(self, kind: int) -> tuple[int | None, ...]:
        """``x`` of the tries whose first event is of ``kind``, else None."""
        has = self.start_kind.translate(_ONLY[kind])
        both = zip(_NONE, self._at_first(self._table.x), strict=False)
        return tuple(map(tuple.__getitem__, both, has))


_NONE = itertools.repeat(None)


class SiblingIndex(NamedTuple):
    """Per sibling of a run: its last started try, and whether the run resumed it."""

    last_start: dict[SiblingKey, int]
    resumed: set[SiblingKey]


def pass_run(run: RunEvents) -> tuple[Tries, SiblingIndex]:
    """The pass over a whole run (see the module): its tries and its siblings."""
    table = run.events.attempts()
    tries = Tries(run, table)
    # Attempt key -> its open try, or ``~j`` once its last started try j ended.
    open_: dict[AttemptKey, int] = {}
    where = table.where
    # The keys are made in C: the loop does no more than pair ends with starts.
    keys = zip(table.p, table.g, table.a, strict=True)
    first, end, superseded_at = tries.first, tries.end, tries.superseded_at
    times = run.time
    add_first, add_end = first.append, end.append
    n = 0
    for k, (key, kind) in enumerate(zip(keys, table.kind, strict=True)):
        j = open_.get(key)
        if kind <= RESUMED:  # a start
            if j is not None and j >= 0:  # supersedes the open try
                superseded_at[j] = times[where[k]]
            open_[key] = n
            add_first(k), add_end(-1)
            n += 1
        elif j is not None and j >= 0:
            end[j] = k
            open_[key] = ~j
        else:  # an end whose start is not in the run: a try of its own
            add_first(k), add_end(k)
            n += 1
    return tries, _siblings(tries)


def _siblings(t: Tries) -> SiblingIndex:
    started = t.start_kind
    sibs = list(
        zip(compress(t.prompt_id, started), compress(t.generation_index, started), strict=True)
    )
    resumed = started.translate(_ONLY[RESUMED], b"\0")
    last_start = dict(zip(sibs, compress(range(len(t)), started), strict=True))
    return SiblingIndex(last_start, set(compress(sibs, resumed)))


# Kind code -> its ``EndKind`` (``OPEN`` for any kind that ends nothing), and
# -> itself for a start, else 0 (``bytes.translate``).
_END_KIND_OF = bytes(int(END_OF_KIND.get(k, EndKind.OPEN)) for k in range(256))
_START_OR_ZERO = bytes(k if k in (DISPATCHED, RESUMED) else 0 for k in range(256))
_IS_ZERO = bytes([1] + [0] * 255)
_ONLY = {k: bytes(1 if c == k else 0 for c in range(256)) for k in (DISPATCHED, RESUMED)}

_MARK_KINDS = tuple(
    k for k in range(256) if not is_attempt(k) and k not in (RESTORE_STARTED, RESTORE_FINISHED)
)


def marks_of(run: RunEvents) -> list[int]:
    """The indices of the run's marks: its events that are neither attempt
    events nor restores (``restores_of``), in seq order."""
    return run.where(*_MARK_KINDS)


class Restore(msgspec.Struct):
    """A restore in a run: started and finished times (None: not finished), path, step.

    A ``restore_finished`` with no restore started before it is a restore of
    its own, of an unknown path (``""``), started and finished at its time.
    """

    started: float
    finished: float | None
    path: str
    step: int


def restores_of(run: RunEvents) -> list[Restore]:
    """The run's restores in seq order: each ``restore_finished`` finishes the
    earliest restore started and not yet finished."""
    out: list[Restore] = []
    for i in run.where(RESTORE_STARTED, RESTORE_FINISHED):
        k = run.kind[i]
        ev = run.events[i]
        if k == RESTORE_STARTED:
            out.append(Restore(run.time[i], None, ev.path, ev.step))
        else:
            waiting = next((r for r in out if r.finished is None), None)
            if waiting is None:
                out.append(Restore(run.time[i], run.time[i], "", ev.step))
            else:
                waiting.finished = run.time[i]
    return out


class Run:
    """One run after normalize and its pass: what every command reads of it.

    ``index`` is its place in the run order (0-based); ``files`` the files it
    was read from, in read order.
    """

    __slots__ = ("events", "files", "index", "marks", "restores", "sib", "tries")

    def __init__(self, events: RunEvents, files: list[str]) -> None:
        self.events = events
        self.files = files
        self.index = -1
        self.tries, self.sib = pass_run(events)
        self.marks = marks_of(events)
        self.restores = restores_of(events)

    @property
    def run_id(self) -> str:
        return self.events.run_id
