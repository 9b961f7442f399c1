"""What ``rollout-trace watch`` shows of a trace set that is still being written.

``Follower`` reads what files (and files that appear) have gained since the
last look: a plain file from where it stopped, complete lines only (a torn
last line waits for its end); a gzip file member by member as the writes
come (``gunzip.Members``), a member not yet whole as far as it is written.
``LiveView`` folds each event in as it comes: per run, its tries open now,
its seals, its last event; every event goes to a ``CostAnalysis`` too, for
the figures of the last stop. An object store's objects (``s3://``) are
followed alike, by their size, etag and first bytes, what is new read in a
range. A line read twice (two sinks, a file copied)
counts once: each run's seqs are kept as ranges (``SeqSet``).

Times are the trace's own: the rate of seals is over the last minute of the
run's events, and a try's age is up to its run's last event, so a trace
made with a simulated clock reads the same as a live one.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._analysis.cost import CostAnalysis
from .._analysis.figures import StopCost
from .._analysis.seqs import SeqSet
from .._errors import TraceReadError
from .._reading.gunzip import Cut, Members
from .._reading.paths import expand_paths
from .._reading.stores import NothingThere, is_url, open_url, url_key
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
    members: Members | None = None  # a gzip file's walk, member by member
    damaged: bool = False  # gzip damage was skipped in it
    etag: str | None = None  # an object's etag at the last look


# Bytes compared at the head of a file to tell it is still the same one.
_HEAD = 256


class Follower:
    """New complete lines of the files ``paths`` name, each time ``lines`` is called.

    A path that names no file yet (a glob, an empty folder) is looked at again
    each time; a file that is not there at the first look is an error. A file
    replaced at its path (rotated, or cut short and written again) is read
    from its start. ``damaged`` counts the gzip files with damaged bytes,
    which are skipped up to the next member.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        self.files: dict[str, _File] = {}
        self.damaged = 0
        self._first = True

    def _names(self) -> list[str]:
        out: dict[str, str] = {}
        for p in self.paths:
            try:
                names = expand_paths(p)
            except TraceReadError as exc:
                # A glob with no match yet and a folder with no trace yet wait
                # (a prefix or a bucket, with its closing slash or not); a file
                # must be there at the start, and a store must answer.
                if is_url(p):
                    waits = isinstance(exc, NothingThere) and (
                        exc.prefix or glob.has_magic(p) or p.endswith("/")
                    )
                else:
                    waits = glob.has_magic(p) or os.path.isdir(p)
                if self._first and not waits:
                    raise
                continue
            for name in names:
                out.setdefault(url_key(name) if is_url(name) else name, name)
        self._first = False
        return list(out.values())

    def lines(self) -> Iterator[bytes]:
        for name in self._names():
            try:
                got = self._object(name) if is_url(name) else self._file(name)
            except (OSError, TraceReadError):
                # Gone since it was listed, unreadable now, or the store did not
                # answer: looked at again later, as if this look had not been.
                continue
            if got is None:
                continue
            state, data = got
            state.offset += len(data)
            if name.endswith(".gz"):
                yield from self._gzip_lines(state, data)
                continue
            data = state.pending + data
            cut = data.rfind(b"\n") + 1
            state.pending = data[cut:]
            yield from data[:cut].splitlines()

    def _file(self, name: str) -> tuple[_File, bytes] | None:
        """The state of the file ``name`` and its bytes since the last look, if it grew.

        What is seen is kept only once it is read: a read that fails leaves the
        state as the last look left it, and the next look reads it again.
        """
        with open(name, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(_HEAD)
            state = self._look(name, (st.st_dev, st.st_ino), st.st_size, head)
            data = None
            if st.st_size != state.size:
                f.seek(state.offset)
                data = f.read()
        return self._keep(name, state, head, st.st_size, None, data)

    def _object(self, name: str) -> tuple[_File, bytes] | None:
        """The same for an object store's object, read in ranges.

        An object the sink uploads again under its key is its bytes before and
        more (whole lines, or whole gzip members): what is new is read from the
        size at the last look. An object that is shorter, that begins with
        other bytes, or that changed (its etag) with no byte more was written
        anew: it is read from its start. Its size and etag are the listing's:
        an object that did not change costs no request.
        """
        state = self.files.get(name)
        with open_url(name, ahead=False) as f:
            size, etag = f.size, f.etag  # what the listing (or the open) found
            if state is not None and etag == state.etag and size == state.size:
                return None  # unchanged: not even its head is read
            anew = state is not None and etag != state.etag and size <= state.size
            head = f.read(_HEAD)
            state = self._look(name, (0, 0), size, head, anew=anew)
            data = None
            if size != state.size:
                f.seek(state.offset)
                data = f.read()
        return self._keep(name, state, head, size, etag, data)

    def _look(
        self, name: str, ident: tuple[int, int], size: int, head: bytes, *, anew: bool = False
    ) -> _File:
        """The state of the file at ``name``: a new one if it is another file now
        (or ``anew``), kept only by ``_keep``."""
        state = self.files.get(name)
        if (
            state is None
            or anew
            or ident != state.ident
            or size < state.offset
            or head[: len(state.head)] != state.head
        ):
            state = _File(ident=ident)
        return state

    def _keep(
        self,
        name: str,
        state: _File,
        head: bytes,
        size: int,
        etag: str | None,
        data: bytes | None,
    ) -> tuple[_File, bytes] | None:
        """Keep what a look saw of ``name``, once it is read: its first bytes, size
        and etag, and its bytes since the last look (``data``; None: none to read)."""
        self.files[name] = state
        state.head, state.etag = head, etag
        if data is None:
            return None
        state.size = size
        return state, data

    def _gzip_lines(self, state: _File, data: bytes) -> Iterator[bytes]:
        """The complete lines that new gzip bytes inflate to."""
        if state.members is None:
            state.members = Members()
        for piece in state.members.feed(data):
            if isinstance(piece, Cut):
                # The line under way ends here, whole or cut (a kill, damage):
                # the next member's lines do not go on it.
                if state.pending:
                    yield state.pending
                    state.pending = b""
                if not piece.torn and not state.damaged:
                    state.damaged = True
                    self.damaged += 1
                continue
            text = state.pending + piece
            cut = text.rfind(b"\n") + 1
            state.pending = text[cut:]
            yield from text[:cut].splitlines()


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
