"""A run's marks (steps, syncs, checkpoints, snapshots, group and lifecycle events) as columns.

Steps, weight syncs and group events can be as many as the tries (a group
event per group, a sync per step), and the trace-event document draws every
one of them, so a ``MarkTable`` keeps each as one row of columns: its seq and
time in arrays, a one-byte kind code, and two references to what its mark
shows (a step number and the group ids, a group id and the prompt id...),
about 40 bytes a row beside the values themselves, where a ``Mark`` object
with its name and its tuple of values took 300 to 400. A ``Mark`` is made only
when one is drawn (``mark``, ``__iter__``) and let go at once.

``finish`` puts the rows in seq order and keeps one row per seq (a line read
twice counts once; of lines that share a seq, the least by kind, name, time
and values is kept), so the table is the same whatever order the lines came
in.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHECKPOINT",
    "CLOSED",
    "GROUP_ADMITTED",
    "GROUP_DISCARDED",
    "GROUP_RESERVED",
    "GROUP_SEALED",
    "OPENED",
    "OTHER",
    "SNAPSHOT",
    "STEP",
    "WEIGHTS",
    "Mark",
    "MarkTable",
    "codes_of",
]


@dataclass(slots=True)
class Mark:
    """A point on a run's controller track: a step, a weight sync, a checkpoint...

    ``args`` is held as names and values (the names shared by every mark of a
    kind), which is less memory than a dict per mark when there are many.
    """

    kind: str  # step, weights, checkpoint, snapshot, group, opened, closed, other
    time: float
    name: str
    keys: tuple[str, ...]
    values: tuple[Any, ...]
    captured_at: float | None = None  # snapshots only
    seq: int = -1

    @property
    def args(self) -> dict[str, Any]:
        return dict(zip(self.keys, self.values, strict=True))


# A row's kind code. The two references of a row, ``a`` and ``b``, hold:
#   STEP: the step, its group ids          WEIGHTS: the weight version, None
#   CHECKPOINT: the step, its path         SNAPSHOT: the step, (path, captured_at)
#   GROUP_*: the group id, the prompt id (reserved and discarded: a tuple of
#     the prompt id and their other values, in the order of their keys)
#   OPENED, CLOSED: the tuple of their values, None
#   OTHER: the ``Mark`` itself (few: ``fold.OTHER_PER_RUN`` a run), None
(
    STEP,
    WEIGHTS,
    CHECKPOINT,
    SNAPSHOT,
    GROUP_RESERVED,
    GROUP_ADMITTED,
    GROUP_SEALED,
    GROUP_DISCARDED,
    OPENED,
    CLOSED,
    OTHER,
) = range(11)

_KIND = (
    "step",
    "weights",
    "checkpoint",
    "snapshot",
    "group",
    "group",
    "group",
    "group",
    "opened",
    "closed",
    "other",
)
_CODES = {kind: frozenset(c for c, k in enumerate(_KIND) if k == kind) for kind in _KIND}

_GROUP_KEYS = {
    GROUP_RESERVED: ("group_id", "prompt_id", "size", "weight_version", "target_step"),
    GROUP_ADMITTED: ("group_id", "prompt_id"),
    GROUP_SEALED: ("group_id", "prompt_id"),
    GROUP_DISCARDED: ("group_id", "prompt_id", "reason"),
}
_GROUP_NAME = {
    GROUP_RESERVED: "group reserved",
    GROUP_ADMITTED: "group admitted",
    GROUP_SEALED: "group sealed",
    GROUP_DISCARDED: "group discarded",
}
_OPENED_KEYS = ("host", "pid", "sdk_version", "meta")
_CLOSED_KEYS = ("emitted", "written", "dropped", "invalid")


def codes_of(kinds: Collection[str]) -> frozenset[int]:
    """The row codes of mark kinds (``group`` is four: one per group event)."""
    return frozenset().union(*(_CODES.get(k, frozenset()) for k in kinds))


class MarkTable:
    """A run's marks, a row each, in columns; in seq order once ``finish`` has run."""

    __slots__ = ("a", "b", "codes", "seqs", "times")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.times = array("d")
        self.codes = bytearray()
        self.a: list[Any] = []
        self.b: list[Any] = []

    def add(self, code: int, seq: int, time: float, a: Any, b: Any = None) -> None:
        self.seqs.append(seq)
        self.times.append(time)
        self.codes.append(code)
        self.a.append(a)
        self.b.append(b)

    def __len__(self) -> int:
        return len(self.codes)

    def mark(self, i: int) -> Mark:
        """Row ``i`` as a ``Mark``."""
        code, t, seq, a, b = self.codes[i], self.times[i], self.seqs[i], self.a[i], self.b[i]
        if code == STEP:
            return Mark("step", t, f"step {a}", ("step", "groups"), (a, b), None, seq)
        if code == WEIGHTS:
            return Mark("weights", t, f"weights v{a}", ("weight_version",), (a,), None, seq)
        if code == CHECKPOINT:
            keys: tuple[str, ...] = ("step", "path")
            return Mark("checkpoint", t, f"checkpoint step {a}", keys, (a, b), None, seq)
        if code == SNAPSHOT:
            path, cap = b
            keys = ("step", "path", "captured_at")
            return Mark("snapshot", t, f"snapshot step {a}", keys, (a, path, cap), cap, seq)
        if code in _GROUP_KEYS:
            values = (a, *b) if code in (GROUP_RESERVED, GROUP_DISCARDED) else (a, b)
            return Mark("group", t, _GROUP_NAME[code], _GROUP_KEYS[code], values, None, seq)
        if code == OPENED:
            return Mark("opened", t, "trace opened", _OPENED_KEYS, a, None, seq)
        if code == CLOSED:
            return Mark("closed", t, "trace closed", _CLOSED_KEYS, a, None, seq)
        assert isinstance(a, Mark)
        return a

    def kind(self, i: int) -> str:
        return _KIND[self.codes[i]]

    def __iter__(self) -> Iterator[Mark]:
        return map(self.mark, range(len(self.codes)))

    def rows(self, kinds: Collection[str]) -> Iterator[int]:
        """The rows of marks of these kinds, in table order."""
        wanted = codes_of(kinds)
        return (i for i, code in enumerate(self.codes) if code in wanted)

    def count(self, kind: str) -> int:
        wanted = codes_of((kind,))
        return sum(self.codes.count(code) for code in wanted)

    def kinds(self) -> set[str]:
        return {_KIND[code] for code in set(self.codes)}

    def captured(self) -> Iterator[float]:
        """The capture times of the snapshots."""
        for i in self.rows(("snapshot",)):
            captured = self.b[i][1]
            if captured is not None:
                yield captured

    # --- seq order ---------------------------------------------------------------

    def finish(self) -> None:
        """Put the rows in seq order, one row per seq: the same table for any arrival order."""
        seqs = self.seqs
        if all(s < t for s, t in itertools.pairwise(seqs)):
            return  # as written, once: the usual case costs one pass
        order = sorted(range(len(seqs)), key=seqs.__getitem__)
        keep: list[int] = []
        for _, same in itertools.groupby(order, key=seqs.__getitem__):
            rows = list(same)
            keep.append(rows[0] if len(rows) == 1 else min(rows, key=self._rank))
        self.seqs = array("q", list(map(seqs.__getitem__, keep)))
        self.times = array("d", list(map(self.times.__getitem__, keep)))
        self.codes = bytearray(map(self.codes.__getitem__, keep))
        self.a = list(map(self.a.__getitem__, keep))
        self.b = list(map(self.b.__getitem__, keep))

    def _rank(self, i: int) -> tuple[str, str, bool, float, str]:
        return rank(self.mark(i))


def rank(m: Mark) -> tuple[str, str, bool, float, str]:
    """Which of the marks that share a seq is kept, the least: lines that share a
    seq are one line read twice or corrupt data, and which is kept must not
    depend on which came first (NaN included)."""
    t = m.time
    return (m.kind, m.name, t != t, t if t == t else 0.0, repr(m.values))
