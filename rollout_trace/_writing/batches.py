"""What the engine hands its sinks, and how each batch is counted written.

A ``Batch`` is encoded events handed to every sink at once; it counts as
written once, by the first sink that holds it. An ``Unsent`` is a staging
sink's write not yet delivered whole, and how far into it the sink delivered.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from .._internals import first_caller, peek_count

__all__ = ["Batch", "Unsent"]


# Held to count a batch a staging sink delivered in part (``Batch.ack_part``)
# and by the first sink that wrote a batch whole: the two must not both count
# the same events.
_PART_LOCK = threading.Lock()


class Batch:
    """Encoded events handed to every sink at once, one line each; ``on_first_ack``
    counts them written once (what the run counts): when the first sink wrote
    it whole, or as far as a staging sink delivered its first lines."""

    __slots__ = ("_acks", "_part", "first_seq", "n", "on_first_ack")

    def __init__(self, n: int, first_seq: float, on_first_ack: Callable[[int], None]) -> None:
        self.n = n
        self.first_seq = first_seq
        self.on_first_ack = on_first_ack
        self._acks = itertools.count()
        self._part = 0  # its first events counted by ack_part (under _PART_LOCK)

    def ack(self) -> None:
        if first_caller(self._acks):
            with _PART_LOCK:
                self.on_first_ack(self.n - self._part)
                self._part = self.n

    def ack_part(self, k: int) -> None:
        """A sink holds the batch's first ``k`` events (of ``n``)."""
        with _PART_LOCK:
            if peek_count(self._acks) == 0 and k > self._part:
                self.on_first_ack(k - self._part)
                self._part = k


class Unsent:
    """A staging sink's write not yet delivered whole: its batches, and how
    far into them the sink delivered."""

    __slots__ = ("batches", "done", "end", "end_lines", "lines", "whole")

    def __init__(self, end: int, end_lines: int, lines: int, batches: list[Batch]) -> None:
        self.end = end  # the runner's accepted bytes at its end
        self.end_lines = end_lines  # ... and accepted lines
        self.lines = lines
        self.batches = batches
        # Whether its lines are its batches' events, one each, in order (a
        # lifecycle batch, n == 0, is one line): then a part is counted.
        self.whole = lines == sum(b.n or 1 for b in batches)
        self.done = 0  # lines of it the sink delivered (and were counted)

    def count(self, upto: int) -> int:
        """Count its first ``upto`` lines delivered (acks); the events newly counted."""
        upto = min(upto, self.lines)
        if upto <= self.done or (upto < self.lines and not self.whole):
            return 0
        if not self.whole:  # all of it, at once
            self.done = upto
            for batch in self.batches:
                batch.ack()
            return sum(batch.n for batch in self.batches)
        new, start = 0, 0
        for batch in self.batches:
            size = batch.n or 1
            if start + size > self.done and start < upto:  # it gains lines
                have = min(upto, start + size) - start
                if have == size:
                    batch.ack()
                else:
                    batch.ack_part(have)
                if batch.n:
                    new += have - max(self.done - start, 0)
            start += size
        self.done = upto
        return new

    def short(self) -> list[Batch]:
        """Its batches not delivered whole."""
        if not self.whole:
            return self.batches
        out, start = [], 0
        for batch in self.batches:
            start += batch.n or 1
            if start > self.done:
                out.append(batch)
        return out

    def left(self) -> int:
        """Its events not counted written."""
        total = sum(b.n for b in self.batches)
        if not self.whole:
            return total if self.done < self.lines else 0
        start, done = 0, 0
        for batch in self.batches:
            size = batch.n or 1
            if batch.n:
                done += min(max(self.done - start, 0), size)
            start += size
        return total - done
