"""The seqs seen in one run, as ranges: duplicates on arrival, gaps at the end."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator

__all__ = ["SeqSet"]

# Seqs that arrive out of order wait in a set at least this large before they
# are merged into the ranges (see ``SeqSet``).
_LOOSE_MIN = 1024


class SeqSet:
    """A set of seqs kept as sorted, disjoint ``[start, end)`` ranges.

    Memory grows with the gaps between the seqs, never with their size: a
    corrupt seq of 2**62 costs one range. Seqs that arrive in order extend the
    last range in O(1). One that arrives below the last range waits in a
    loose set, merged into the ranges once it is as large as they are, so
    that even a shuffled run costs O(log n) per seq and at most twice the
    memory of its ranges.
    """

    __slots__ = ("_ends", "_loose", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        # Below the last range's end, in no range: so never next to its end.
        self._loose: set[int] = set()

    def add(self, seq: int) -> bool:
        """Record ``seq``; False when it was seen before."""
        ends = self._ends
        if ends and seq == ends[-1]:
            ends[-1] = seq + 1
        elif not ends or seq > ends[-1]:
            self._starts.append(seq)
            ends.append(seq + 1)
        else:
            loose = self._loose
            if seq in loose:
                return False
            i = bisect.bisect_right(self._starts, seq) - 1
            if i >= 0 and seq < ends[i]:
                return False
            loose.add(seq)
            if len(loose) > max(_LOOSE_MIN, len(ends)):
                self._merge()
        return True

    @property
    def count(self) -> int:
        """How many seqs were seen."""
        return len(self._loose) + sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    @property
    def max(self) -> int:
        """The largest seq seen, -1 when none was (the loose ones lie below the last range)."""
        return self._ends[-1] - 1 if self._ends else -1

    def copy(self) -> SeqSet:
        out = SeqSet()
        out._starts, out._ends, out._loose = list(self._starts), list(self._ends), set(self._loose)
        return out

    def __contains__(self, seq: int) -> bool:
        if seq in self._loose:
            return True
        i = bisect.bisect_right(self._starts, seq) - 1
        return i >= 0 and seq < self._ends[i]

    def _merge(self) -> None:
        if not self._loose:
            return
        singles = ((seq, seq + 1) for seq in sorted(self._loose))
        self._loose = set()
        self._starts, self._ends = _join(heapq.merge(self._pairs(), singles))

    def ranges(self) -> list[tuple[int, int]]:
        """The seqs as inclusive ``(first, last)`` ranges, in order."""
        self._merge()
        return [(s, e - 1) for s, e in zip(self._starts, self._ends, strict=True)]

    def gaps(self) -> list[tuple[int, int]]:
        """Missing seqs between 0 and the largest seen, as inclusive ranges."""
        self._merge()
        out: list[tuple[int, int]] = []
        cursor = 0
        for s, e in zip(self._starts, self._ends, strict=True):
            if s > cursor:
                out.append((cursor, s - 1))
            cursor = max(cursor, e)
        return out

    @property
    def tail(self) -> int | None:
        """The seq that would extend the highest range: one above the largest seen."""
        return self._ends[-1] if self._ends else None

    def extend_tail(self, end: int) -> None:
        """Record every seq from ``tail`` up to ``end`` (exclusive): a hot loop's run of adds."""
        self._ends[-1] = end

    def overlap(self, other: SeqSet) -> int:
        """How many seqs both hold."""
        return sum(e - s for s, e in self._common(other))

    def intersection(self, other: SeqSet) -> SeqSet:
        """The seqs both hold."""
        out = SeqSet()
        out._starts, out._ends = _join(self._common(other))
        return out

    def _common(self, other: SeqSet) -> Iterator[tuple[int, int]]:
        self._merge()
        other._merge()
        i = j = 0
        a_s, a_e, b_s, b_e = self._starts, self._ends, other._starts, other._ends
        while i < len(a_s) and j < len(b_s):
            lo, hi = max(a_s[i], b_s[j]), min(a_e[i], b_e[j])
            if lo < hi:
                yield lo, hi
            if a_e[i] <= b_e[j]:
                i += 1
            else:
                j += 1

    def update(self, other: SeqSet) -> None:
        """Add every seq of ``other``."""
        self._merge()
        other._merge()
        self._starts, self._ends = _join(heapq.merge(self._pairs(), other._pairs()))

    def _pairs(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)


def _join(ranges: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sorted ``[start, end)`` ranges, those that overlap or touch made one."""
    starts: list[int] = []
    ends: list[int] = []
    for s, e in ranges:
        if ends and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    return starts, ends
