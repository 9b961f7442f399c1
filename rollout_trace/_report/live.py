"""What ``rollout-trace watch`` shows of a trace set that is still being written.

``Follower`` reads what files (and files that appear) have gained since the
last look: a plain file from where it stopped, a gzip file member by member
as the writes come (``gunzip.Members``), a member not yet whole as far as it
is written. An object store's objects (``s3://``) are followed alike, by
their size, etag and first bytes, what is new read in a range. A file is
gzip or text as the reader tells (``reader.is_gzip``), and its text is cut
into lines and decoded by the reader's own ``LineDecoder``: a line is read or
skipped, and a bad line counted (torn, invalid, gzip damage), as every other
command reads it. The one difference is the end of a file, which may still
be written: a last line with no newline, and a gzip member not yet whole,
wait for the rest; damage in the last member is said as soon as it is found.

``LiveView`` answers from the model of the runs it follows
(``_model.live.GrowingBuilder``, fed every new event): runs in the run order,
per run its events, host and pid, last event, tries open now, seals, and
its stalls by ``report``'s own rule (``health``, on the run's
``_timeline.model`` line); the stops and the last one's figures. A build
costs the runs that grew, and a run's figures are read off again only when
it was built again or a stop changed what it did to its tries. A line read
twice (two sinks, a file copied) counts once (``_model.runs.normalize``).

Times are the trace's own: the rate of seals is over the last minute of the
run's events, and a try's age is up to its run's last event, so a trace
made with a simulated clock reads the same as a live one.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from math import isnan
from typing import Any

from .._errors import TraceReadError
from .._model.live import GrowingBuilder
from .._model.stops import StopCost
from .._model.traceset import Fate, Model, gc_paused
from .._model.tries import Run
from .._reading.gunzip import MAGIC, Cut, Members
from .._reading.paths import expand_paths
from .._reading.reader import LineDecoder, ReadProblem, block_decoder, is_gzip
from .._reading.stores import NothingThere, is_url, open_url, url_key
from .._timeline.model import TryColumns, run_line
from .health import Stall, seal_times, stalls_of

__all__ = ["Follower", "LiveRun", "LiveStall", "LiveView", "RATE_WINDOW_S"]

# Seals per second are counted over this much of a run's latest events.
RATE_WINDOW_S = 60.0
# Text is decoded this much at a time (the reader's chunk).
_CHUNK = 1 << 20
# Bad lines kept to show, beyond their count.
_PROBLEMS_KEPT = 5


@dataclass
class _File:
    ident: tuple[int, int] = (-1, -1)  # (device, inode): another file at the path starts over
    head: bytes = b""  # its first bytes: a file cut short and written again starts over
    offset: int = 0  # bytes taken from the file
    size: int = -1  # its size at the last look
    pending: bytes = b""  # ``lines``: a torn last line, so far
    # Gzip or text, as the reader tells by its first bytes (None: not yet told;
    # told at the first look that sees more than the start of gzip's magic).
    gzip: bool | None = None
    undecided: bytes = b""  # the first bytes, while too few to tell
    members: Members | None = None  # a gzip file's walk, member by member
    damaged: bool = False  # gzip damage was skipped in it
    said: bool = False  # damage under way was said before the walk's Cut for it came
    lines: LineDecoder | None = None  # ``blocks``: the reader's lines of its text
    etag: str | None = None  # an object's etag at the last look


# Bytes compared at the head of a file to tell it is still the same one.
_HEAD = 256

Problems = Callable[[ReadProblem], None]


def _damage_under_way(members: Members) -> Cut | None:
    """The Cut the walk will give for the bytes it is skipping now, if they are
    damage for sure: corrupt deflate data, or bytes that are no gzip and no
    zeros. The walk says so only at the next member or the end of the file,
    which a file still being written may not reach for long. (Zeros wait: at
    the end of a file they are a crash's padding, and no bad line.)"""
    why = members._skip
    if why:
        return Cut(
            f"corrupt gzip data from byte {members._start:,} ({why}); read on at the next member",
            torn=False,
        )
    if why == "" and not members._zeros:
        return Cut(f"bytes from byte {members._start:,} are not gzip data", torn=False)
    return None


class Follower:
    """What the files ``paths`` name gained since the last look, each time
    ``blocks`` (decoded, as the reader decodes) or ``lines`` (raw complete
    lines) is called; a Follower is read by one of them only.

    A path that names no file yet (a glob, an empty folder) is looked at again
    each time; a file that is not there at the first look is an error. A file
    replaced at its path (rotated, or cut short and written again) is read
    from its start. ``damaged`` counts the gzip files with damaged bytes,
    which are skipped up to the next member. ``problems`` is told of every
    line ``blocks`` skips.
    """

    def __init__(self, paths: Sequence[str], problems: Problems | None = None) -> None:
        self.paths = list(paths)
        self.files: dict[str, _File] = {}
        self.damaged = 0
        self.problems = problems
        self._first = True
        self._many = block_decoder()

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

    def blocks(self) -> Iterator[tuple[str, list[Any], Sequence[int]]]:
        """``(file, events, line numbers)`` of the complete lines written since the
        last look, decoded as ``reader.iter_blocks`` decodes them; the lines it
        skips go to ``problems``."""
        for name, state, piece in self._pieces():
            if state.lines is None:
                state.lines = LineDecoder(name, self.problems, self._many)
            if isinstance(piece, Cut):
                yield from state.lines._cut(piece.reason, torn=piece.torn)
                continue
            if len(piece) <= _CHUNK:
                yield from state.lines._chunk(piece)
                continue
            for at in range(0, len(piece), _CHUNK):
                yield from state.lines._chunk(piece[at : at + _CHUNK])

    def lines(self) -> Iterator[bytes]:
        """The complete lines written since the last look, as they are (a line
        under way where gzip breaks comes as far as it got)."""
        for _, state, piece in self._pieces():
            if isinstance(piece, Cut):
                # The line under way ends here, whole or cut (a kill, damage):
                # the next member's lines do not go on it.
                if state.pending:
                    yield state.pending
                    state.pending = b""
                continue
            text = state.pending + piece
            cut = text.rfind(b"\n") + 1
            state.pending = text[cut:]
            yield from text[:cut].splitlines()

    def _pieces(self) -> Iterator[tuple[str, _File, bytes | Cut]]:
        """Per file that grew: its new text, and a ``Cut`` where gzip breaks."""
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
            if state.gzip is None:
                data = state.undecided + data
                if MAGIC.startswith(data):
                    state.undecided = data  # gzip's magic, maybe: too few bytes to tell
                    continue
                state.undecided = b""
                state.gzip = is_gzip(data[:_CHUNK], name.endswith(".gz"))
            if not state.gzip:
                yield name, state, data
                continue
            if state.members is None:
                state.members = Members()
            for piece in state.members.feed(data):
                if isinstance(piece, Cut):
                    if not piece.torn and state.said:
                        state.said = False  # the damage said already, when it was found
                        continue
                    self._cut(state, piece)
                yield name, state, piece
            early = None if state.said else _damage_under_way(state.members)
            if early is not None:
                state.said = True
                self._cut(state, early)
                yield name, state, early

    def _cut(self, state: _File, cut: Cut) -> None:
        if not cut.torn and not state.damaged:
            state.damaged = True
            self.damaged += 1

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


@dataclass
class _Figures:
    """What the view shows of one run, read off its model once per build of it."""

    run: Run
    fates: dict[int, Fate]  # what the stops did to its tries (try index ->)
    host: str | None
    pid: int | None
    last_time: float
    closed: bool
    seals: list[float]  # the end time of each sealed try
    sealed_per_s: float  # over the last RATE_WINDOW_S of its events
    open: list[tuple[tuple[Any, int, int], float]]  # each open try: its key, its start
    stalls: list[Stall]  # as ``report`` finds them, oldest first


def _same_fates(a: dict[int, Fate], b: dict[int, Fate]) -> bool:
    """Equal fates, a lost part not known (NaN) equal to another not known."""
    if a.keys() != b.keys():
        return False
    for i, x in a.items():
        y = b[i]
        if (x.fate, x.stop, x.lost_s) != (y.fate, y.stop, y.lost_s):
            return False
        if x.lost_from != y.lost_from and not (isnan(x.lost_from) and isnan(y.lost_from)):
            return False
    return True


def _figures(run: Run, fates: dict[int, Fate], stall_after: float) -> _Figures:
    """One run's figures, from its line as ``timeline_of`` draws it and ``report`` reads it."""
    line = run_line(run, fates)
    t = line.tries
    seals = seal_times(line)
    since = line.last_time - RATE_WINDOW_S
    span = min(RATE_WINDOW_S, max(line.last_time - line.first_time, 1.0))
    return _Figures(
        run=run,
        fates=fates,
        host=line.host,
        pid=line.pid,
        last_time=line.last_time,
        closed=line.closed,
        seals=seals,
        sealed_per_s=sum(1 for t in seals if t > since) / span,
        open=[(_key(t, i), t.start[i]) for i in t.open_indices()],
        stalls=stalls_of(line, stall_after),
    )


def _key(t: TryColumns, i: int) -> tuple[Any, int, int]:
    return (t.prompt_id[i], t.generation_index[i], t.attempt[i])


class LiveRun:
    """One run as the view sees it now: each figure is read off the view's model
    when it is asked for, so a run got before a poll shows what the poll added."""

    def __init__(self, view: LiveView, run_id: str) -> None:
        self.view = view
        self.run_id = run_id

    @property
    def _f(self) -> _Figures:
        return self.view._figures_of(self.run_id)

    @property
    def events(self) -> int:
        """Its events: a line read twice once, each version of a seq whose lines differ."""
        return len(self._f.run.events)

    @property
    def read_twice(self) -> int:
        """Its lines beyond the first of their seq (``RunEvents.repeats``)."""
        return self._f.run.events.repeats

    @property
    def host(self) -> str | None:
        return self._f.host

    @property
    def pid(self) -> int | None:
        return self._f.pid

    @property
    def last_time(self) -> float:
        """The time of its last event (by seq), as ``report`` has it."""
        return self._f.last_time

    @property
    def closed(self) -> bool:
        return self._f.closed

    @property
    def seals(self) -> list[float]:
        return self._f.seals

    def open_tries(self) -> list[tuple[tuple[Any, int, int], float]]:
        """Each try open at its last event (``terms``: not ended, not started again):
        its key and start time."""
        return self._f.open

    def sealed_per_s(self) -> float:
        """Seals per second over the last ``RATE_WINDOW_S`` of its events (over its
        span, at least 1 s, when that is shorter)."""
        return self._f.sealed_per_s


@dataclass
class LiveStall:
    run: LiveRun
    key: tuple[Any, int, int]
    open_s: float
    kind: str  # open_too_long | open_at_close, as ``report`` says them


class LiveView:
    """Every run seen so far, and the stops among them, from the model of the set."""

    def __init__(self, paths: Sequence[str], stall_after: float) -> None:
        self.stall_after = stall_after
        # The reader's bad lines: how many, how many of them torn, the first few.
        self.bad_lines = 0
        self.torn_lines = 0
        self.problems: list[ReadProblem] = []
        self.follower = Follower(paths, self._problem)
        self.model = GrowingBuilder()
        self._set: Model | None = None
        self._figures: dict[str, _Figures] = {}
        self._handles: dict[str, LiveRun] = {}

    def _problem(self, p: ReadProblem) -> None:
        self.bad_lines += 1
        self.torn_lines += p.torn
        if len(self.problems) < _PROBLEMS_KEPT:
            self.problems.append(p)

    def poll(self) -> int:
        """Read what was written since the last poll into the model; the new events."""
        n = 0
        with gc_paused():
            for name, events, _ in self.follower.blocks():
                self.model.add(events, name)
                n += len(events)
        if n:
            self._set = None  # built again when asked
        return n

    @property
    def trace_set(self) -> Model:
        """The model of what was read so far (built again only after a poll read more)."""
        if self._set is None:
            with gc_paused():
                ts: Model = self.model.build()
                self._set = ts
                self._refresh(ts)
        return self._set

    def _refresh(self, ts: Model) -> None:
        """Read again the figures of the runs that were built again, or whose tries
        a stop now does something else to."""
        fates: dict[int, dict[int, Fate]] = {r.index: {} for r in ts.runs}
        for (run_index, i), fate in ts.fates.items():
            fates[run_index][i] = fate
        for run in ts.runs:
            held = self._figures.get(run.run_id)
            mine = fates[run.index]
            if held is None or held.run is not run or not _same_fates(held.fates, mine):
                self._figures[run.run_id] = _figures(run, mine, self.stall_after)

    def _figures_of(self, run_id: str) -> _Figures:
        self.trace_set  # noqa: B018 - built, if it is not
        return self._figures[run_id]

    def _handle(self, run_id: str) -> LiveRun:
        h = self._handles.get(run_id)
        if h is None:
            h = self._handles[run_id] = LiveRun(self, run_id)
        return h

    @property
    def runs(self) -> dict[str, LiveRun]:
        """The runs by id, in the run order."""
        return {r.run_id: self._handle(r.run_id) for r in self.trace_set.runs}

    def ordered(self) -> list[LiveRun]:
        """The runs in the run order (``terms``), as every command lists them."""
        return [self._handle(r.run_id) for r in self.trace_set.runs]

    def stops(self) -> list[StopCost]:
        return self.trace_set.stops

    def stopped(self) -> set[str]:
        return {s.stopped_run for s in self.stops() if s.stopped_run is not None}

    def in_flight(self, run: LiveRun) -> int:
        """Tries open now: none in a run a later run was restored from."""
        return 0 if run.run_id in self.stopped() else len(run.open_tries())

    def stalls(self) -> list[LiveStall]:
        """As ``report`` finds them (``health``): open longer than ``stall_after`` at
        the run's last event, or open at a clean close that no stop took up.
        Oldest first; equal ages in the run order."""
        found = [
            LiveStall(self._handle(run.run_id), (s.prompt_id, s.generation_index, s.attempt),
                      s.open_s, s.kind)
            for run in self.trace_set.runs
            for s in self._figures[run.run_id].stalls
        ]  # fmt: skip
        found.sort(key=lambda s: -s.open_s)
        return found

    def last_stop(self) -> StopCost | None:
        stops = self.stops()
        return stops[-1] if stops else None

    @property
    def files(self) -> int:
        return len(self.follower.files)
