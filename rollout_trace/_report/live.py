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
import os
import zlib
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
from .health import stall_kind

__all__ = ["Follower", "LiveRun", "LiveView", "RATE_WINDOW_S"]

# Seals per second are counted over this much of a run's latest events.
RATE_WINDOW_S = 60.0
_CHUNK = 1 << 20
_STARTS = (AttemptDispatched, AttemptResumed)
_ENDS = (AttemptSealed, AttemptAbandoned, AttemptRefused)


@dataclass
class _File:
    ident: tuple[int, int] = (-1, -1)  # (device, inode): another file at the path starts over
    head: bytes = b""  # its first bytes: a file cut short and written again starts over
    offset: int = 0  # bytes taken from the file
    size: int = -1  # its size at the last look
    pending: bytes = b""  # a torn last line, so far
    inflater: Any = None  # a gzip file's member being inflated
    broken: bool = False  # gzip damage: nothing more is read of this file


# Bytes compared at the head of a file to tell it is still the same one.
_HEAD = 256


class Follower:
    """New complete lines of the files ``paths`` name, each time ``lines`` is called.

    A path that names no file yet (a glob, an empty folder) is looked at again
    each time; a file that is not there at the first look is an error. A file
    replaced at its path (rotated, or cut short and written again) is read
    from its start. ``damaged`` counts the gzip files that cannot be inflated.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        self.files: dict[str, _File] = {}
        self.damaged = 0
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
                with open(name, "rb") as f:
                    st = os.fstat(f.fileno())
                    head = f.read(_HEAD)
                    ident = (st.st_dev, st.st_ino)
                    same = (
                        ident == state.ident
                        and st.st_size >= state.offset
                        and head[: len(state.head)] == state.head
                    )
                    if not same:
                        self.files[name] = state = _File(ident=ident)
                    state.head = head
                    if st.st_size == state.size or state.broken:
                        continue
                    state.size = st.st_size
                    f.seek(state.offset)
                    data = f.read()
            except OSError:
                continue  # gone since it was listed, or unreadable now: looked at again later
            state.offset += len(data)
            if name.endswith(".gz"):
                data = self._inflate(state, data)
            data = state.pending + data
            cut = data.rfind(b"\n") + 1
            state.pending = data[cut:]
            yield from data[:cut].splitlines()

    def _inflate(self, state: _File, data: bytes) -> bytes:
        """What new gzip bytes inflate to: member after member, the last one as far
        as it is written (the sink ends each batch with a full flush)."""
        out = bytearray()
        try:
            while data:
                if state.inflater is None:
                    state.inflater = zlib.decompressobj(wbits=31)
                out += state.inflater.decompress(data)
                if not state.inflater.eof:
                    break
                data = state.inflater.unused_data
                state.inflater = None
        except zlib.error:
            state.broken = True
            self.damaged += 1
        return bytes(out)


@dataclass
class LiveRun:
    """One run as the view sees it: its tries open now, its seals, its last event.

    Every event is folded in, a line read twice too, in a way that gives the
    same state in any order (the least or the greatest of what the copies say).
    """

    run_id: str
    host: str | None = None
    pid: int | None = None
    opened_seq: int = -1
    first_time: float = float("inf")
    last_time: float = float("-inf")
    closed: bool = False
    read_twice: int = 0  # lines whose seq was seen already
    # (prompt_id, generation_index, attempt) -> [start seq, start time, end seq]
    tries: dict[tuple[Any, int, int], list[Any]] = field(default_factory=dict)
    seals: dict[int, float] = field(default_factory=dict)  # seq -> time
    seqs: SeqSet = field(default_factory=SeqSet)

    @property
    def events(self) -> int:
        return self.seqs.count

    def add(self, ev: Any) -> None:
        if not self.seqs.add(ev.seq):
            self.read_twice += 1
        t = ev.time
        self.first_time = min(self.first_time, t)
        self.last_time = max(self.last_time, t)
        if isinstance(ev, TraceOpened):
            if self.opened_seq < 0 or (ev.seq, repr((ev.host, ev.pid))) < (
                self.opened_seq,
                repr((self.host, self.pid)),
            ):
                self.opened_seq, self.host, self.pid = ev.seq, ev.host, ev.pid
        elif isinstance(ev, TraceClosed):
            self.closed = True
        elif isinstance(ev, (*_STARTS, *_ENDS)):
            key = (ev.prompt_id, ev.generation_index, ev.attempt)
            held = self.tries.get(key)
            if held is None:
                held = self.tries[key] = [-1, t, -1]
            if isinstance(ev, _STARTS):
                if ev.seq > held[0] or (ev.seq == held[0] and t < held[1]):
                    held[0], held[1] = ev.seq, t
            else:
                held[2] = max(held[2], ev.seq)
                if isinstance(ev, AttemptSealed):
                    self.seals[ev.seq] = min(t, self.seals.get(ev.seq, t))

    def open_tries(self) -> list[tuple[tuple[Any, int, int], float]]:
        """Each try started and not ended after its start: its key and start time."""
        return [(k, v[1]) for k, v in self.tries.items() if v[0] >= 0 and v[2] < v[0]]

    def sealed_per_s(self) -> float:
        since = self.last_time - RATE_WINDOW_S
        span = min(RATE_WINDOW_S, max(self.last_time - self.first_time, 1.0))
        return sum(1 for t in self.seals.values() if t > since) / span


@dataclass
class LiveStall:
    run: LiveRun
    key: tuple[Any, int, int]
    open_s: float
    kind: str  # open_too_long | open_at_close, as ``report`` says them


# Events folded into the cost analysis at a time.
_BLOCK = 8192


class LiveView:
    """Every run seen so far, and the restore cost of the stops among them."""

    def __init__(self, paths: Sequence[str], stall_after: float) -> None:
        self.follower = Follower(paths)
        self.stall_after = stall_after
        self.runs: dict[str, LiveRun] = {}
        self.cost = CostAnalysis()
        self.bad_lines = 0
        self._stops: list[StopCost] | None = []

    def poll(self) -> int:
        """Read and fold what was written since the last poll; the new lines."""
        block: list[Any] = []
        n = 0
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
            run.add(ev)
            block.append(ev)
            if len(block) >= _BLOCK:
                n += self._fold(block)
                block = []
        return n + self._fold(block)

    def _fold(self, block: list[Any]) -> int:
        if block:
            self.cost.add(block)
            self._stops = None  # computed again when asked
        return len(block)

    def stops(self) -> list[StopCost]:
        if self._stops is None:
            self._stops = self.cost.stops()
        return self._stops

    def stopped(self) -> set[str]:
        return {s.stopped_run for s in self.stops() if s.stopped_run is not None}

    def ordered(self) -> list[LiveRun]:
        return sorted(self.runs.values(), key=lambda r: (r.first_time, r.run_id))

    def in_flight(self, run: LiveRun) -> int:
        """Tries open now: none in a run a later run was restored from."""
        return 0 if run.run_id in self.stopped() else len(run.open_tries())

    def stalls(self) -> list[LiveStall]:
        """As ``report`` finds them: open too long at the run's last event, or open
        at a clean close that no stop followed. Oldest first."""
        stopped = self.stopped()
        found = []
        for run in self.runs.values():
            for key, started in run.open_tries():
                open_s = run.last_time - started
                at_close = run.closed and run.run_id not in stopped
                kind = stall_kind(open_s, at_close, self.stall_after)
                if kind is not None:
                    found.append(LiveStall(run, key, open_s, kind))
        found.sort(key=lambda s: -s.open_s)
        return found

    def last_stop(self) -> StopCost | None:
        stops = self.stops()
        return stops[-1] if stops else None

    @property
    def files(self) -> int:
        return len(self.follower.files)
