"""Which lines that share a ``(run_id, seq)`` differ: a second read of the seqs read twice.

A seq is used once in a run, so two lines with one ``(run_id, seq)`` are the
same event read twice (two file sinks of one tracer, a copied file) or a
conflicting copy: an edited copy, a file torn and written again, two writers
that drew one run id. Only the second is a problem, and only the lines
themselves tell them apart.

Comparing every line would mean hashing every event, which the commands'
first read cannot afford; but that read knows which seqs of which run it saw
more than once (``SeqSet`` ranges: one range for a whole second copy). A
second read of the files holding those runs compares, for those seqs only,
each line with the ones before it: by a 64-bit hash of the event as msgspec
encodes it (fields sorted), so two lines that decode to one event are one,
however they are spelled. The reads go in the same order, so the first line
of a seq here is the one the first read counted.

Memory, per run read again: 8 bytes per seq seen more than once (the hash of
its first version), 8 more once the run has a conflict (a second version) and
8 more with ``places`` (where the first version is, for ``validate``), plus a
set for each seq with a third version.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Mapping
from typing import Any

import msgspec

from .seqs import SeqSet

__all__ = ["COPY", "FIRST", "UNCHECKED", "VERSION", "Conflicts", "CopyCheck", "encoded", "least"]

# What ``CopyCheck.check`` made of a line.
UNCHECKED = 0  # its seq was read once: nothing to compare
FIRST = 1  # the first line of its seq: the one the first read counted
COPY = 2  # the same event as a line before it with its seq
VERSION = 3  # an event that differs from every line before it with its seq

# Fields sorted: a lean event and its full twin encode alike, and so do two
# lines that differ only in the order of their keys.
encoded = msgspec.json.Encoder(order="sorted").encode


def least(a: Any, b: Any) -> Any:
    """Of two events with one seq, the one whose encoding sorts first: the same in any order."""
    if a == b:
        return a
    return b if encoded(b) < encoded(a) else a


# Seqs named in a message before the rest are only counted.
_SHOWN = 5


class Conflicts:
    """A run's seqs held by lines that differ."""

    __slots__ = ("count", "seqs")

    def __init__(self) -> None:
        self.count = 0
        self.seqs = SeqSet()

    def describe(self) -> str:
        """``seq 7``, or ``seqs 2, 7, 9-12 (6 in all)``: the first few ranges, then a count."""
        if self.count == 1:
            return f"seq {self.seqs.ranges()[0][0]}"
        ranges = self.seqs.ranges()
        shown = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges[:_SHOWN])
        more = f" and {len(ranges) - _SHOWN} more ranges" if len(ranges) > _SHOWN else ""
        return f"seqs {shown}{more} ({self.count:,} in all)"


class _Run:
    """One run's seqs seen more than once, each with the hashes of its versions."""

    __slots__ = ("conflicts", "ends", "first", "more", "offsets", "places", "second", "starts")

    def __init__(self, seqs: SeqSet, places: bool) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.offsets: list[int] = []
        n = 0
        for lo, hi in seqs.ranges():
            self.starts.append(lo)
            self.ends.append(hi + 1)
            self.offsets.append(n)
            n += hi + 1 - lo
        self.first = array("q", bytes(8 * n))  # 0: no line of the seq read yet
        self.second: array[int] | None = None
        self.more: dict[int, set[int]] = {}
        self.places = array("q", bytes(8 * n)) if places else None
        self.conflicts = Conflicts()

    def slot(self, seq: int) -> int:
        i = bisect.bisect_right(self.starts, seq) - 1
        if i < 0 or seq >= self.ends[i]:
            return -1
        return self.offsets[i] + seq - self.starts[i]


class CopyCheck:
    """Compares the lines of the seqs seen more than once, as they are read again.

    ``again`` maps each run to compare to those seqs. Feed it every event of
    the files holding those runs, in the order of the first read, with
    ``check``; ``conflicts`` then says, per run, which seqs have lines that
    differ. With ``places``, the place of each seq's first line is kept
    (``first_place``), for messages that name both lines.
    """

    def __init__(self, again: Mapping[str, SeqSet], *, places: bool = False) -> None:
        self._runs = {run_id: _Run(seqs, places) for run_id, seqs in again.items()}

    def check(self, ev: Any, place: int = 0) -> int:
        """What ``ev`` is among the lines of its seq: ``UNCHECKED``, ``FIRST``, ``COPY``
        or ``VERSION``; ``place`` is kept for ``first_place``."""
        run = self._runs.get(ev.run_id)
        if run is None:
            return UNCHECKED
        slot = run.slot(ev.seq)
        if slot < 0:
            return UNCHECKED
        h = hash(encoded(ev)) or 1
        first = run.first
        if first[slot] == 0:
            first[slot] = h
            if run.places is not None:
                run.places[slot] = place
            return FIRST
        if first[slot] == h:
            return COPY
        second = run.second
        if second is None:
            second = run.second = array("q", bytes(8 * len(first)))
        if second[slot] == 0:
            second[slot] = h
        elif second[slot] == h:
            return COPY
        else:
            more = run.more.setdefault(slot, set())
            if h in more:
                return COPY
            more.add(h)
        if run.conflicts.seqs.add(ev.seq):
            run.conflicts.count += 1
        return VERSION

    def first_place(self, ev: Any) -> int:
        """Where the first line of ``ev``'s seq was (as given to ``check``); -1 if unknown."""
        run = self._runs.get(ev.run_id)
        slot = -1 if run is None else run.slot(ev.seq)
        if run is None or run.places is None or slot < 0:
            return -1
        return run.places[slot]

    def conflicts(self) -> dict[str, Conflicts]:
        """Per run with a seq whose lines differ, those seqs."""
        return {run_id: run.conflicts for run_id, run in self._runs.items() if run.conflicts.count}
