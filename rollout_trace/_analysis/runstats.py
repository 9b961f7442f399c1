"""Per-run bookkeeping shared by ``summary`` and ``validate``: seqs, times, counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from .._schema.decoding import UnknownEvent
from .._schema.events import Event, TraceClosed, TraceOpened

__all__ = ["SeqSet", "RunStats", "RunSummary"]

# Seqs below this are kept in a bitmap of one byte each; a larger one is
# implausible for a real run (corrupt data) and goes to a set instead, so a
# single bad number cannot make the bitmap huge.
_BITMAP_LIMIT = 1 << 27


class SeqSet:
    """The seqs seen in one run: duplicates on arrival, gaps at the end."""

    __slots__ = ("_big", "_bits", "count", "max")

    def __init__(self) -> None:
        self._bits = bytearray(1024)
        self._big: set[int] = set()
        self.count = 0
        self.max = -1

    def add(self, seq: int) -> bool:
        """Record ``seq``; False when it was seen before."""
        if 0 <= seq < _BITMAP_LIMIT:
            bits = self._bits
            if seq >= len(bits):
                bits.extend(bytes(max(seq + 1 - len(bits), len(bits))))
            if bits[seq]:
                return False
            bits[seq] = 1
        else:
            if seq in self._big:
                return False
            self._big.add(seq)
        self.count += 1
        if seq > self.max:
            self.max = seq
        return True

    def gaps(self) -> list[tuple[int, int]]:
        """Missing seqs between 0 and the largest seen, as inclusive ranges."""
        out: list[tuple[int, int]] = []
        top = min(self.max, _BITMAP_LIMIT - 1)
        bits = bytes(self._bits[: top + 1])
        pos = bits.find(0)
        while 0 <= pos <= top:
            end = bits.find(1, pos)
            end = top + 1 if end < 0 else end
            out.append((pos, end - 1))
            pos = bits.find(0, end)
        return out


def _class_tag(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    return tag if isinstance(tag, str) else cls.__name__


class RunSummary(msgspec.Struct, kw_only=True):
    """What ``rollout-trace summary`` reports for one run."""

    run_id: str
    files: list[str]
    host: str | None
    pid: int | None
    first_time: float
    last_time: float
    events: dict[str, int]
    seq_gaps: list[tuple[int, int]]
    missing: int
    duplicates: int
    torn_lines: int
    invalid_lines: int
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class RunStats:
    """Folds one run's events; events may come in any order."""

    __slots__ = (
        "closed",
        "counts",
        "duplicates",
        "files",
        "first_time",
        "invalid_lines",
        "last_time",
        "opened",
        "run_id",
        "seqs",
        "torn_lines",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.files: dict[str, None] = {}
        self.seqs = SeqSet()
        self.counts: Counter[type[Event] | str] = Counter()
        self.first_time = float("inf")
        self.last_time = float("-inf")
        self.opened: TraceOpened | None = None
        self.closed: TraceClosed | None = None
        self.duplicates = 0
        self.torn_lines = 0
        self.invalid_lines = 0

    def add(self, ev: Event | UnknownEvent) -> bool:
        """Fold one event; False when its seq is a duplicate."""
        t = ev.time
        if t < self.first_time:
            self.first_time = t
        if t > self.last_time:
            self.last_time = t
        self.counts[ev.event if isinstance(ev, UnknownEvent) else type(ev)] += 1
        match ev:
            case TraceOpened():
                self.opened = ev
            case TraceClosed():
                self.closed = ev
            case _:
                pass
        if self.seqs.add(ev.seq):
            return True
        self.duplicates += 1
        return False

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
            events=self.events_by_name(),
            seq_gaps=gaps,
            missing=sum(hi - lo + 1 for lo, hi in gaps),
            duplicates=self.duplicates,
            torn_lines=self.torn_lines,
            invalid_lines=self.invalid_lines,
            closed=self.closed is not None,
        )
