"""One pass per run: its tries (``terms`` defines a try) and its marks.

``TryPass`` is the automaton over a run's attempt events in seq order:

- a start of ``(sibling, attempt)`` while a try of it is open supersedes that
  try (it ends ``SUPERSEDED`` at the new start) and opens a new one;
- an end closes the open try of its ``(sibling, attempt)``, or, with none
  open, is a try of its own with no start;
- what is still open after the run's last event is ``OPEN``.

Tries come out in the order of their first event's seq. Per sibling the pass
also keeps its last started try, its last sealed try and whether the run
resumed it (``SiblingIndex``), which is all a stop reads of the run. The
other events, in seq order, are the run's marks, but for the restores, which
are paired into ``Restore``s.
"""

from __future__ import annotations

import math
from array import array
from itertools import compress
from typing import Any

import msgspec

from .runs import RunEvents
from .terms import (
    ABANDONED,
    DISPATCHED,
    END_OF_KIND,
    RESTORE_FINISHED,
    RESTORE_STARTED,
    RESUMED,
    SEALED,
    EndKind,
    is_attempt,
    outcome_of,
)

__all__ = [
    "Restore",
    "Run",
    "SiblingIndex",
    "Tries",
    "TryPass",
    "marks_of",
    "pass_run",
    "restores_of",
]

# A sibling: (prompt_id, generation_index); an attempt of one: with its number.
SiblingKey = tuple[Any, int]
AttemptKey = tuple[Any, int, int]


class Tries:
    """A run's tries as columns, one row per try, in the order of their first event.

    ``start_kind`` is 0 for a try with no start in the run, else the kind code
    of its start (dispatched or resumed); ``end_kind`` an ``EndKind``;
    ``end_seq`` -1 and ``end_time`` NaN where no end event closed it (open or
    superseded: ``superseded_at`` then holds the superseding start's time).
    ``weight_version`` (a dispatch's) and ``turn`` (a resume's) are None where
    the start gave none; ``reason`` is a refusal's or abandon's.
    """

    __slots__ = (
        "attempt",
        "end_kind",
        "end_seq",
        "end_time",
        "generation_index",
        "group_id",
        "prompt_id",
        "reason",
        "start_kind",
        "start_seq",
        "start_time",
        "superseded_at",
        "turn",
        "weight_version",
    )

    def __init__(self) -> None:
        self.prompt_id: list[Any] = []
        self.generation_index: list[int] = []
        self.attempt: list[int] = []
        self.group_id: list[str] = []
        self.start_kind = bytearray()
        self.start_seq: array[int] = array("q")
        self.start_time: array[float] = array("d")
        self.end_kind = bytearray()
        self.end_seq: array[int] = array("q")
        self.end_time: array[float] = array("d")
        self.superseded_at: dict[int, float] = {}
        self.reason: list[str | None] = []
        self.weight_version: list[int | None] = []
        self.turn: list[int | None] = []

    def __len__(self) -> int:
        return len(self.attempt)

    def started(self, i: int) -> bool:
        return self.start_kind[i] != 0

    def outcome(self, i: int) -> str:
        return outcome_of(self.end_kind[i], self.reason[i])

    def sibling(self, i: int) -> SiblingKey:
        return (self.prompt_id[i], self.generation_index[i])


class SiblingIndex:
    """Per sibling of a run: its last started try, its last sealed try, and resumes.

    ``began`` holds, for a seal with no start in its try, the time of the
    latest earlier start of the same attempt number (NaN where there is
    none): when the work it sealed began.
    """

    __slots__ = ("began", "last_seal", "last_start", "resumed")

    def __init__(self) -> None:
        self.last_start: dict[SiblingKey, int] = {}
        self.last_seal: dict[SiblingKey, int] = {}
        self.resumed: set[SiblingKey] = set()
        self.began: dict[int, float] = {}


class TryPass:
    """The automaton: feed it a run's events in seq order (see the module)."""

    def __init__(self) -> None:
        self.tries = Tries()
        self.sib = SiblingIndex()
        self.open: dict[AttemptKey, int] = {}
        # The latest start time of each attempt key, for a seal with no start.
        self.latest: dict[AttemptKey, float] = {}

    def feed(self, run: RunEvents, start: int = 0, stop: int | None = None) -> None:
        """Take the run's events ``start:stop`` (attempt events only do anything)."""
        tries, sib, open_, latest = self.tries, self.sib, self.open, self.latest
        events, seqs, times, kinds = run.events, run.seq, run.time, run.kind
        stop = len(kinds) if stop is None else stop
        # The attempt events only, found in C: most of a run, but not all.
        where = compress(range(start, stop), kinds[start:stop].translate(_ATTEMPT_FLAGS))
        # Bound appends: a try is a row of a dozen columns (``Tries.append`` inline).
        t_p, t_g, t_a = tries.prompt_id.append, tries.generation_index.append, tries.attempt.append
        t_gid, t_sk, t_ss = tries.group_id.append, tries.start_kind.append, tries.start_seq.append
        t_st, t_ek, t_es = tries.start_time.append, tries.end_kind.append, tries.end_seq.append
        t_et, t_r = tries.end_time.append, tries.reason.append
        t_wv, t_turn = tries.weight_version.append, tries.turn.append
        end_kind, end_seq, end_time, reason = (
            tries.end_kind,
            tries.end_seq,
            tries.end_time,
            tries.reason,
        )
        last_start, last_seal, resumed = sib.last_start, sib.last_seal, sib.resumed
        nan = math.nan
        superseded_at = tries.superseded_at
        n = len(tries.attempt)
        for i in where:
            kind = kinds[i]
            ev = events[i]
            seq, t = seqs[i], times[i]
            p, g, a = ev.prompt_id, ev.generation_index, ev.attempt
            key = (p, g, a)
            if kind <= RESUMED:  # a start
                j = open_.get(key)
                if j is not None:
                    end_kind[j] = _SUPERSEDED
                    superseded_at[j] = t
                open_[key] = j = n
                n += 1
                t_p(p), t_g(g), t_a(a), t_gid(ev.group_id)
                t_sk(kind), t_ss(seq), t_st(t)
                t_ek(_OPEN), t_es(-1), t_et(nan), t_r(None)
                if kind == DISPATCHED:
                    t_wv(ev.weight_version), t_turn(None)
                else:
                    t_wv(None), t_turn(ev.turn)
                    resumed.add((p, g))
                last_start[(p, g)] = j
                latest[key] = t
                continue
            j = open_.pop(key, None)
            if j is None:  # an end whose start is not in the run: a try of its own
                j = n
                n += 1
                t_p(p), t_g(g), t_a(a), t_gid(ev.group_id)
                t_sk(0), t_ss(-1), t_st(nan)
                t_ek(_OPEN), t_es(-1), t_et(nan), t_r(None), t_wv(None), t_turn(None)
                if kind == SEALED:
                    sib.began[j] = latest.get(key, nan)
            end_kind[j] = _END_OF_KIND[kind]
            end_seq[j] = seq
            end_time[j] = t
            if kind == SEALED:
                last_seal[(p, g)] = j
            else:
                reason[j] = ev.reason


# Plain ints in the loop: an enum member's lookup costs some 70 ns.
_OPEN, _SUPERSEDED = int(EndKind.OPEN), int(EndKind.SUPERSEDED)
_END_OF_KIND = {k: int(v) for k, v in END_OF_KIND.items()}

_MARK_KINDS = tuple(
    k for k in range(256) if not is_attempt(k) and k not in (RESTORE_STARTED, RESTORE_FINISHED)
)

# Kind code -> 1 for the attempt kinds, else 0 (``bytes.translate``).
_ATTEMPT_FLAGS = bytes(1 if DISPATCHED <= k <= ABANDONED else 0 for k in range(256))


def pass_run(run: RunEvents) -> TryPass:
    """The pass over a whole run."""
    p = TryPass()
    p.feed(run)
    return p


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
        elif k == RESTORE_FINISHED:
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
        done = pass_run(events)
        self.tries = done.tries
        self.sib = done.sib
        self.marks = marks_of(events)
        self.restores = restores_of(events)

    @property
    def run_id(self) -> str:
        return self.events.run_id

    def is_open(self, i: int) -> bool:
        """Whether try ``i`` is open at the run's last event (``terms.is_open``)."""
        return self.tries.end_kind[i] == _OPEN
