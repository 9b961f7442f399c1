"""A trace set as one model: ``analyze(paths_or_events)`` gives a ``TraceSet``.

The files are read once (``_reading``), each run normalized (``runs``) and
passed over once (``tries``); the runs are put in the run order and the stops
paired and costed (``stops``). Every figure, note and try row is read off
that one model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, Union

import msgspec

from .._reading.reader import ReadProblem, iter_blocks
from .._schema.events import Event
from .runs import Collector, normalize
from .stops import Note, StopClasses, StopCost, stops_of
from .terms import OPENED, EndKind
from .tries import Run

__all__ = ["Source", "TraceSet", "TryRow", "analyze"]

# Paths (files, globs, folders) or events already decoded.
Source = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]], Iterable[Any]]


class TryRow(msgspec.Struct, kw_only=True):
    """One try of a sibling in one run: the row ``rollout-trace attempts`` writes.

    ``started_at`` is its start (None: an end whose start is not in the run);
    ``ended_at`` its end event's time (None: open, or superseded by a later
    start of its attempt, which ``end`` tells apart); ``fate`` what a stop
    did to it and ``stop`` that stop's number (1, 2, ...; 0 for none).
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
    end: str


class TraceSet:
    """One trace set after analysis.

    ``runs`` are in the run order; ``stops`` their stops with their figures
    (README: Reference > Restore-cost figures); ``classes`` what each stop did
    to each sibling (None for a stop of an unknown run); ``notes`` what bears
    on the figures; ``problems`` the lines the reader skipped; ``files`` the
    files read.
    """

    def __init__(self, files: list[str], runs: list[Run], problems: list[ReadProblem]) -> None:
        self.files = files
        self.runs = runs
        self.problems = problems
        self.stops: list[StopCost]
        self.notes: list[Note]
        self.classes: list[StopClasses | None]
        self.stops, self.notes, self.classes = stops_of(runs, files)

    def bad_lines(self, run_id: str) -> tuple[int, int]:
        """The lines of a run the reader skipped (read from the raw line): torn, invalid."""
        torn = sum(1 for p in self.problems if p.run_id == run_id and p.torn)
        invalid = sum(1 for p in self.problems if p.run_id == run_id and not p.torn)
        return torn, invalid

    @property
    def tries(self) -> list[TryRow]:
        """Every try, run by run in the run order, each run's in the order of its first event."""
        return list(self._try_rows())

    def _try_rows(self) -> Iterator[TryRow]:
        fates: dict[tuple[int, int], tuple[str, int]] = {}
        by_id = {r.run_id: r for r in self.runs}
        for number, (cost, cls) in enumerate(zip(self.stops, self.classes, strict=True), 1):
            if cls is None or cost.stopped_run is None:
                continue
            a = by_id[cost.stopped_run]
            for i, what in cls.fates():
                fates[(a.index, i)] = (what, number)
        for run in self.runs:
            host, pid = _host_of(run)
            t = run.tries
            for i in range(len(t)):
                started = t.started(i)
                end = EndKind(t.end_kind[i])
                ended = t.end_seq[i] >= 0
                fate: str | None = None
                stop = 0
                if (run.index, i) in fates:
                    fate, stop = fates[(run.index, i)]
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
                    outcome=t.outcome(i),
                    reason=t.reason[i],
                    weight_version=t.weight_version[i],
                    resumed_turn=t.turn[i],
                    fate=fate,
                    stop=stop,
                    end=end.name.lower(),
                )


def _host_of(run: Run) -> tuple[str | None, int | None]:
    i = run.events.first_of(OPENED)
    if i is None:
        return None, None
    ev = run.events.events[i]
    return ev.host, ev.pid


def analyze(source: Source) -> TraceSet:
    """The model of a trace set: trace files (paths, globs, folders) or events.

    Events may come in any order of runs and lines; lines read twice count
    once, and lines of one seq that differ are all kept and noted.
    """
    problems: list[ReadProblem] = []
    collector = Collector()
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    items = source if isinstance(source, list) else list(source)
    if items and all(isinstance(x, (str, os.PathLike)) for x in items):
        for path, events, _ in iter_blocks(items, problems):
            collector.add(events, path)
    else:
        for ev in items:
            if not isinstance(ev, Event) and not hasattr(ev, "run_id"):
                raise TypeError(f"not a path or an event: {ev!r}")
        collector.add(items)
    runs = []
    for run_id, (events, srcs) in collector.runs.items():
        normal = normalize(run_id, events, srcs)
        if not len(normal):
            continue  # no usable event: no place in the run order
        files = [collector.files[s] for s in dict.fromkeys(srcs) if s >= 0]
        runs.append(Run(normal, files))
    runs.sort(key=lambda r: r.events.order)
    for i, run in enumerate(runs):
        run.index = i
    return TraceSet(collector.files, runs, problems)
