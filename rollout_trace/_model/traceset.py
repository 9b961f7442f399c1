"""A trace set as one model: ``analyze(paths_or_events)`` gives a ``Model``.

The files are read once (``_reading``), each run normalized (``runs``) and
passed over once (``tries``); the runs are put in the run order and the stops
paired and costed (``stops``). Every figure, note and try row is read off
that one model.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar, Union

import msgspec

from .._reading.reader import Problems, ReadProblem, iter_blocks
from .._schema.events import Event
from .runs import Collector, normalize
from .stops import Note, StopClasses, StopCost, step_versions, stops_of
from .terms import OPENED, EndKind
from .tries import Run

__all__ = [
    "Builder",
    "Fate",
    "Model",
    "Source",
    "TryRow",
    "analyze",
    "gc_paused",
    "restore_costs",
]

M = TypeVar("M", bound="Model")

# Paths (files, globs, folders) or events already decoded.
Source = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]], Iterable[Any]]


class TryRow(msgspec.Struct, kw_only=True):
    """One try of a sibling in one run: the row ``rollout-trace attempts`` writes.

    ``started_at`` is its start (None: an end whose start is not in the run);
    ``ended_at`` its end event's time (None: open, or superseded by a later
    start of its attempt, which ``end`` tells apart); ``fate`` what a stop
    did to it (``stops.CLASSES``), ``stop`` that stop's number (1, 2, ...; 0
    for none) and ``lost_s`` the seconds of its work that stop lost (None:
    no fate, or not known, as where C is unknown).
    """

    run: int
    run_id: str
    host: str | None
    pid: int | None
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    started_at: float | None
    ended_at: float | None
    duration_s: float | None
    outcome: str
    reason: str | None
    weight_version: int | None
    resumed_turn: int | None
    fate: str | None
    stop: int
    lost_s: float | None
    end: str


class Fate(NamedTuple):
    """What a stop did to a try of its stopped run: the class it counts the try's
    sibling in, the stop's number (1, 2, ...), and the try's lost part, from
    ``lost_from`` (NaN: not known) to the try's t1, ``lost_s`` seconds (None: not
    known, or not a finite number)."""

    fate: str
    stop: int
    lost_from: float
    lost_s: float | None


class Model:
    """One trace set after analysis (``rt.TraceSet`` adds what the commands show).

    ``runs`` are in the run order; ``stops`` their stops with their figures
    (docs: Reference > Restore-cost figures); ``classes`` what each stop did
    to each sibling (None for a stop of an unknown run); ``notes`` what bears
    on the figures; ``problems`` the lines the reader skipped; ``files`` the
    files read; ``step_versions`` the weight version each run's steps are
    judged against (``stops.step_versions``), by its place in the run order.
    """

    def __init__(self, files: list[str], runs: list[Run], problems: list[ReadProblem]) -> None:
        self.files = files
        self.runs = runs
        self.problems = problems
        self.stops: list[StopCost]
        self.notes: list[Note]
        self.classes: list[StopClasses | None]
        self.stops, self.notes, self.classes = stops_of(runs, files)
        self._fates: dict[tuple[int, int], Fate] | None = None
        self._step_versions: list[dict[int, int | None]] | None = None

    @property
    def step_versions(self) -> list[dict[int, int | None]]:
        """Per run, in the run order: the seq of each ``step_trained`` -> the weight
        version it is judged against (``stops.step_versions``; None: not known).
        Made at the first look-up: ``cost`` never needs it."""
        if self._step_versions is None:
            self._step_versions = step_versions(self.runs, self.stops, self.classes)
        return self._step_versions

    @property
    def conflicts(self) -> bool:
        """Whether lines of one ``(run_id, seq)`` differ somewhere in the set."""
        return any(run.events.versions for run in self.runs)

    def bad_lines(self, run_id: str) -> tuple[int, int]:
        """The lines of a run the reader skipped (read from the raw line): torn, invalid."""
        torn = sum(1 for p in self.problems if p.run_id == run_id and p.torn)
        invalid = sum(1 for p in self.problems if p.run_id == run_id and not p.torn)
        return torn, invalid

    @property
    def tries(self) -> list[TryRow]:
        """Every try, run by run in the run order, each run's in the order of its first event."""
        return list(self._try_rows())

    @property
    def fates(self) -> dict[tuple[int, int], Fate]:
        """What the stops did to tries: ``(run index, try index)`` -> its ``Fate``,
        read off each stop's classes (every command marks tries from this)."""
        if self._fates is None:
            fates: dict[tuple[int, int], Fate] = {}
            by_id = {r.run_id: r for r in self.runs}
            for number, (cost, cls) in enumerate(zip(self.stops, self.classes, strict=True), 1):
                if cls is None or cost.stopped_run is None:
                    continue
                a = by_id[cost.stopped_run]
                for i, counted in cls.fates():
                    lost = counted.lost_s
                    fates[(a.index, i)] = Fate(
                        counted.fate,
                        number,
                        counted.lost_from,
                        lost if math.isfinite(lost) else None,
                    )
            self._fates = fates
        return self._fates

    def kept(self) -> dict[str, frozenset[tuple[Any, int]] | None]:
        """Stopped run id -> the siblings whose last try it sealed at or before the
        capture its restored run got back (None: the capture is unknown): a use
        of one of them ends there, as the restored state holds its result."""
        out: dict[str, frozenset[tuple[Any, int]] | None] = {}
        for cost, cls in zip(self.stops, self.classes, strict=True):
            if cls is not None and cost.stopped_run is not None:
                out[cost.stopped_run] = None if cls.kept is None else frozenset(cls.kept)
        return out

    def _try_rows(self) -> Iterator[TryRow]:
        fates = self.fates
        for run in self.runs:
            host, pid = _host_of(run)
            t = run.tries
            for i in range(len(t)):
                started = t.start_kind[i] != 0
                end = EndKind(t.end_kind[i])
                ended = t.end_seq[i] >= 0
                given = fates.get((run.index, i))
                yield TryRow(
                    run=run.index + 1,
                    run_id=run.run_id,
                    host=host,
                    pid=pid,
                    group_id=t.group_id[i],
                    prompt_id=t.prompt_id[i],
                    generation_index=t.generation_index[i],
                    attempt=t.attempt[i],
                    started_at=t.start_time[i] if started else None,
                    ended_at=t.end_time[i] if ended else None,
                    duration_s=t.end_time[i] - t.start_time[i] if started and ended else None,
                    outcome=t.outcomes[i],
                    reason=t.reason[i],
                    weight_version=t.weight_version[i],
                    resumed_turn=t.turn[i],
                    fate=None if given is None else given.fate,
                    stop=0 if given is None else given.stop,
                    lost_s=None if given is None else given.lost_s,
                    end=end.name.lower(),
                )


def _host_of(run: Run) -> tuple[str | None, int | None]:
    i = run.events.first_of(OPENED)
    if i is None:
        return None, None
    ev = run.events.events[i]
    return ev.host, ev.pid


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector while millions of acyclic records are made."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Builder:
    """A trace set gathered a block at a time, in any order of files, runs and
    lines: ``add`` blocks, ``merge`` another builder (a worker's), ``build``.
    Nothing is ordered or compared before ``build``."""

    def __init__(self) -> None:
        self._collector = Collector()

    def add(self, events: Iterable[Any], source: str | None = None) -> None:
        """Take a block of events; ``source`` names the file they come from."""
        self._collector.add(events, source)

    def merge(self, other: Builder) -> None:
        """Take in what another builder gathered."""
        self._collector.merge(other._collector)

    def build(self, problems: Problems = None, make: type[M] = Model) -> M:  # type: ignore[assignment]
        """The model of what was gathered; ``problems`` the reader's bad lines
        (a list is kept on the set for per-run counts)."""
        collector = self._collector
        with gc_paused():
            runs = []
            for run_id, (events, srcs) in collector.runs.items():
                run = self._run_of(run_id, events, srcs)
                if run is not None:
                    runs.append(run)
            runs.sort(key=lambda r: r.events.order)
            for i, run in enumerate(runs):
                run.index = i
            return make(collector.files, runs, problems if isinstance(problems, list) else [])

    def _run_of(self, run_id: str, events: Sequence[Any], srcs: Sequence[int]) -> Run | None:
        """One run's lines normalized and passed over (None: no usable event, so no
        place in the run order). ``_model.live.GrowingBuilder`` keeps what it gives."""
        normal = normalize(run_id, events, srcs)
        if not len(normal):
            return None
        files = [self._collector.files[s] for s in dict.fromkeys(srcs) if s >= 0]
        return Run(normal, files)


def analyze(source: Source, problems: Problems = None, make: type[M] = Model) -> M:  # type: ignore[assignment]
    """The model of a trace set: trace files (paths, globs, folders) or events.

    Events may come in any order of runs and lines; lines read twice count
    once, and lines of one seq that differ are all kept and noted.
    ``problems`` takes the lines the reader skips (default: a list kept on
    the set).
    """
    if problems is None:
        problems = []
    builder = Builder()
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    items = source if isinstance(source, list) else list(source)
    if items and all(isinstance(x, (str, os.PathLike)) for x in items):
        with gc_paused():
            for path, events, _ in iter_blocks(items, problems):
                builder.add(events, path)
    else:
        for ev in items:
            if not isinstance(ev, Event) and not hasattr(ev, "run_id"):
                raise TypeError(f"not a path or an event: {ev!r}")
        builder.add(items)
    return builder.build(problems, make)


def restore_costs(events: Iterable[Any]) -> list[StopCost]:
    """Every stop in ``events`` (one trace set, any layout, any order) with its figures.

    Lines of one ``(run_id, seq)`` read twice count once; lines of one seq
    that differ (conflicting copies) are all kept, in one order, so the
    figures are the same in any order too (``analyze(...).notes`` says so).
    """
    return analyze(list(events)).stops
