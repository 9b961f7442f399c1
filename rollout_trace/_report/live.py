"""What ``rollout-trace watch`` shows of a trace set that is still being written.

``Follower`` reads what files (and files that appear) have gained since the
last look: a plain file from where it stopped, complete lines only (a torn
last line waits for its end); a gzip file is inflated again when it grows,
up to where its members end, and the lines already taken are passed over.
``LiveView`` folds each event in as it comes: per run, its tries open now,
its seals, its last event; every event goes to a ``CostAnalysis`` too, for
the figures of the last stop. A line read twice (two sinks, a file copied)
counts once: each run's seqs are kept as ranges (``SeqSet``).

Times are the trace's own: the rate of seals is over the last minute of the
run's events, and a try's age is up to its run's last event, so a trace
made with a simulated clock reads the same as a live one.
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._analysis.cost import CostAnalysis
from .._analysis.figures import StopCost
from .._analysis.seqs import SeqSet
from .._errors import TraceReadError
from .._reading.paths import expand_paths
from .._schema.decoding import decode_one
from .._schema.events import (
    AttemptAbandoned,
    AttemptDispatched,
    AttemptRefused,
    AttemptResumed,
    AttemptSealed,
    TraceClosed,
    TraceOpened,
)

__all__ = ["Follower", "LiveRun", "LiveView", "RATE_WINDOW_S"]

# Seals per second are counted over this much of a run's latest events.
RATE_WINDOW_S = 60.0
_CHUNK = 1 << 20
_STARTS = (AttemptDispatched, AttemptResumed)
_ENDS = (AttemptSealed, AttemptAbandoned, AttemptRefused)


@dataclass
class _File:
    offset: int = 0  # plain: bytes taken; gzip: inflated bytes taken
    size: int = -1  # the size at the last look
    pending: bytes = b""  # a plain file's torn last line, so far


class Follower:
    """New complete lines of the files ``paths`` name, each time ``lines`` is called.

    A path that names no file yet (a glob, an empty folder) is looked at again
    each time; a file that is not there at the first look is an error.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        self.files: dict[str, _File] = {}
        self._first = True

    def _names(self) -> list[str]:
        out: list[str] = []
        for p in self.paths:
            try:
                out += expand_paths(p)
            except TraceReadError:
                # A glob with no match yet and a folder with no trace yet wait;
                # a file must be there at the start.
                if self._first and not glob.has_magic(p) and not os.path.isdir(p):
                    raise
        self._first = False
        return list(dict.fromkeys(out))

    def lines(self) -> Iterator[bytes]:
        for name in self._names():
            state = self.files.setdefault(name, _File())
            try:
                size = os.path.getsize(name)
            except OSError:
                continue  # gone since it was listed
            if size == state.size:
                continue
            state.size = size
            if name.endswith(".gz"):
                yield from self._gzip_lines(name, state)
            else:
                yield from self._plain_lines(name, state)

    @staticmethod
    def _plain_lines(name: str, state: _File) -> Iterator[bytes]:
        if state.size < state.offset:  # truncated or replaced: from the start
            state.offset, state.pending = 0, b""
        try:
            with open(name, "rb") as f:
                f.seek(state.offset)
                data = f.read()
        except OSError:
            return
        state.offset += len(data)
        data = state.pending + data
        cut = data.rfind(b"\n") + 1
        state.pending = data[cut:]
        yield from data[:cut].splitlines()

    @staticmethod
    def _gzip_lines(name: str, state: _File) -> Iterator[bytes]:
        data = _inflate_prefix(name)
        cut = data.rfind(b"\n") + 1
        if cut < state.offset:
            state.offset = 0  # replaced by a shorter file: from the start
        yield from data[state.offset : cut].splitlines()
        state.offset = cut


def _inflate_prefix(name: str) -> bytes:
    """What a gzip file inflates to up to its first damage or its unfinished end."""
    out = bytearray()
    try:
        with gzip.open(name, "rb") as f:
            while chunk := f.read(_CHUNK):
                out += chunk
    except (OSError, EOFError, zlib.error):
        pass  # a member still being written, or damage: what came before stands
    return bytes(out)


@dataclass
class LiveRun:
    """One run as the view sees it: its tries open now, its seals, its last event."""

    run_id: str
    host: str | None = None
    pid: int | None = None
    first_time: float = float("inf")
    last_time: float = float("-inf")
    closed: bool = False
    events: int = 0
    # (prompt_id, generation_index, attempt) -> [start seq, start time, end seq]
    tries: dict[tuple[Any, int, int], list[Any]] = field(default_factory=dict)
    seal_times: array[float] = field(default_factory=lambda: array("d"))
    seqs: SeqSet = field(default_factory=SeqSet)

    def add(self, ev: Any) -> bool:
        """Fold ``ev`` in; False when its seq was seen already (a line read twice)."""
        if not self.seqs.add(ev.seq):
            return False
        self.events += 1
        t = ev.time
        self.first_time = min(self.first_time, t)
        self.last_time = max(self.last_time, t)
        if isinstance(ev, TraceOpened):
            self.host, self.pid = ev.host, ev.pid
        elif isinstance(ev, TraceClosed):
            self.closed = True
        elif isinstance(ev, (*_STARTS, *_ENDS)):
            key = (ev.prompt_id, ev.generation_index, ev.attempt)
            held = self.tries.get(key)
            if held is None:
                held = self.tries[key] = [-1, t, -1]
            if isinstance(ev, _STARTS):
                if ev.seq > held[0]:
                    held[0], held[1] = ev.seq, t
            else:
                held[2] = max(held[2], ev.seq)
                if isinstance(ev, AttemptSealed):
                    self.seal_times.append(t)
        return True

    def open_tries(self) -> list[tuple[tuple[Any, int, int], float]]:
        """Each try started and not ended after its start: its key and start time."""
        return [(k, v[1]) for k, v in self.tries.items() if v[0] >= 0 and v[2] < v[0]]

    def sealed_per_s(self) -> float:
        since = self.last_time - RATE_WINDOW_S
        span = min(RATE_WINDOW_S, max(self.last_time - self.first_time, 1.0))
        return sum(1 for t in self.seal_times if t > since) / span


class LiveView:
    """Every run seen so far, and the restore cost of the stops among them."""

    def __init__(self, paths: Sequence[str], stall_after: float) -> None:
        self.follower = Follower(paths)
        self.stall_after = stall_after
        self.runs: dict[str, LiveRun] = {}
        self.cost = CostAnalysis()
        self.bad_lines = 0

    def poll(self) -> int:
        """Read and fold what was written since the last poll; the new events."""
        block: list[Any] = []
        for raw in self.follower.lines():
            if not raw.strip():
                continue
            ev, _ = decode_one(raw)
            if ev is None:
                self.bad_lines += 1
                continue
            run = self.runs.get(ev.run_id)
            if run is None:
                run = self.runs[ev.run_id] = LiveRun(ev.run_id)
            if run.add(ev):
                block.append(ev)
        if block:
            self.cost.add(block)
        return len(block)

    def ordered(self) -> list[LiveRun]:
        return sorted(self.runs.values(), key=lambda r: (r.first_time, r.run_id))

    def stalls(self) -> list[tuple[LiveRun, tuple[Any, int, int], float]]:
        """Tries open longer than ``stall_after`` at their run's last event, oldest first."""
        found = [
            (run, key, run.last_time - started)
            for run in self.runs.values()
            for key, started in run.open_tries()
            if run.last_time - started > self.stall_after
        ]
        found.sort(key=lambda item: -item[2])
        return found

    def last_stop(self) -> StopCost | None:
        stops = self.cost.stops()
        return stops[-1] if stops else None

    @property
    def files(self) -> int:
        return len(self.follower.files)
