"""What a timeline draws: runs, their attempts in lanes, their marks, and the stops.

Both views (the trace-event document and the HTML page) are drawn from this
one model, so they always agree on what an attempt is and how it ended.

An attempt is one try of a sibling within one run, keyed by
``(prompt_id, generation_index, attempt)``. It begins at its
``attempt_dispatched`` (or ``attempt_resumed``, which starts it in the run that
resumes it, as README: Reference > Restore-cost figures says) and ends at its ``attempt_sealed``,
``attempt_refused`` or ``attempt_abandoned``. One still open at the run's last
event ends there, as ``in_flight``. An end whose start is not in the run (a
restored run restarting a try of the run before it) becomes an attempt of zero
length at the end's time, so that it is still seen.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._analysis.cost import restore_costs
from .._analysis.figures import StopCost
from .._schema.decoding import AnyEvent, UnknownEvent
from .._schema.events import (
    AttemptAbandoned,
    AttemptDispatched,
    AttemptRefused,
    AttemptResumed,
    AttemptSealed,
    GroupAdmitted,
    GroupDiscarded,
    GroupReserved,
    GroupSealed,
    RestoreFinished,
    RestoreStarted,
    SnapshotPublished,
    StepTrained,
    TraceClosed,
    TraceOpened,
    TrainerCheckpointPublished,
    WeightsSynced,
)

__all__ = [
    "OUTCOMES",
    "Attempt",
    "Mark",
    "Restore",
    "RunLine",
    "Timeline",
    "build_timeline",
    "pack_lanes",
]


# Every way an attempt can end, in the order a legend lists them. An
# abandoned try's outcome is its reason, with `restart` spelled `restarted`.
OUTCOMES = (
    "sealed",
    "failed",
    "dropped",
    "cancelled",
    "refused",
    "restarted",
    "whole_group",
    "in_flight",
)
_ABANDONED = {"restart": "restarted"}

_GROUP_EVENTS = (GroupReserved, GroupAdmitted, GroupSealed, GroupDiscarded)


@dataclass(slots=True)
class Attempt:
    """One try of a sibling in one run, from its start to its end."""

    start: float
    end: float
    outcome: str
    group_id: str
    prompt_id: int | str
    generation_index: int
    attempt: int
    weight_version: int | None = None
    resumed_turn: int | None = None
    reason: str | None = None
    # False for an end whose start is in an earlier run (drawn with no length).
    started: bool = True
    # For an attempt in flight at a stop: what the restored run did with it.
    after_stop: str | None = None
    lane: int = 0


@dataclass(slots=True)
class Mark:
    """A point on a run's controller track: a step, a weight sync, a checkpoint..."""

    kind: str  # step, weights, checkpoint, snapshot, group, opened, closed, other
    time: float
    name: str
    args: dict[str, Any]
    captured_at: float | None = None  # snapshots only


@dataclass(slots=True)
class Restore:
    started: float
    finished: float | None
    path: str
    step: int


@dataclass
class RunLine:
    """One run (one tracer, so one process) and everything drawn for it."""

    index: int
    run_id: str
    host: str | None
    pid: int | None
    first_time: float
    last_time: float
    closed: bool
    attempts: list[Attempt] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    restores: list[Restore] = field(default_factory=list)
    lanes: int = 0

    @property
    def label(self) -> str:
        host = self.host if self.host is not None else "unknown host"
        pid = f"pid {self.pid}" if self.pid is not None else "pid ?"
        return f"{host} {pid} run {self.run_id[:8]}"


@dataclass
class Timeline:
    runs: list[RunLine]
    stops: list[StopCost]
    t0: float
    t1: float

    @property
    def attempt_count(self) -> int:
        return sum(len(r.attempts) for r in self.runs)


def build_timeline(events: Iterable[AnyEvent]) -> Timeline:
    """Fold a trace set's events (any order, any file layout) into a ``Timeline``."""
    by_run: dict[str, list[AnyEvent]] = {}
    for ev in events:
        by_run.setdefault(ev.run_id, []).append(ev)
    every = [ev for evs in by_run.values() for ev in evs]
    stops = restore_costs(every)
    runs = []
    for run_id, evs in by_run.items():
        evs.sort(key=lambda e: e.seq)
        runs.append(_fold(run_id, evs))
    runs.sort(key=lambda r: (_opened_at(r, by_run[r.run_id]), r.run_id))
    for i, run in enumerate(runs):
        run.index = i
        run.lanes = pack_lanes(run.attempts)
    _mark_after_stop(runs, stops)
    times = [ev.time for ev in every]
    times += [m.captured_at for r in runs for m in r.marks if m.captured_at is not None]
    t0 = min(times, default=0.0)
    t1 = max(times, default=0.0)
    return Timeline(runs=runs, stops=stops, t0=t0, t1=t1)


def _opened_at(run: RunLine, evs: list[AnyEvent]) -> float:
    # Runs are ordered as the cost analysis orders them (README: Reference >
    # Restore-cost figures).
    for ev in evs:
        if isinstance(ev, TraceOpened):
            return ev.time
    return run.first_time


def _fold(run_id: str, evs: list[AnyEvent]) -> RunLine:
    run = RunLine(
        index=0,
        run_id=run_id,
        host=None,
        pid=None,
        first_time=min(e.time for e in evs),
        last_time=evs[-1].time,
        closed=False,
    )
    open_: dict[tuple[int | str, int, int], Attempt] = {}
    attempts = run.attempts
    marks = run.marks
    for ev in evs:
        cls = type(ev)
        if cls is AttemptDispatched or cls is AttemptResumed:
            key = (ev.prompt_id, ev.generation_index, ev.attempt)  # type: ignore[union-attr]
            a = Attempt(ev.time, ev.time, "in_flight", ev.group_id, *key)  # type: ignore[union-attr]
            if cls is AttemptDispatched:
                a.weight_version = ev.weight_version  # type: ignore[union-attr]
            else:
                a.resumed_turn = ev.turn  # type: ignore[union-attr]
            # A second start of an open attempt replaces it: the trace has no
            # end for the first, and one bar per attempt keeps lanes honest.
            open_[key] = a
            attempts.append(a)
        elif cls is AttemptSealed or cls is AttemptRefused or cls is AttemptAbandoned:
            _end(ev, open_, attempts)
        else:
            _other(ev, run, marks)
    for a in open_.values():
        a.end = run.last_time
    return run


def _end(
    ev: Any, open_: dict[tuple[int | str, int, int], Attempt], attempts: list[Attempt]
) -> None:
    key = (ev.prompt_id, ev.generation_index, ev.attempt)
    if isinstance(ev, AttemptSealed):
        outcome, reason = "sealed", None
    elif isinstance(ev, AttemptRefused):
        outcome, reason = "refused", ev.reason
    else:
        outcome, reason = _ABANDONED.get(ev.reason, ev.reason), ev.reason
    a = open_.pop(key, None)
    if a is None:
        a = Attempt(ev.time, ev.time, outcome, ev.group_id, *key, started=False)
        attempts.append(a)
    a.end = max(ev.time, a.start)
    a.outcome = outcome
    a.reason = reason


def _other(ev: AnyEvent, run: RunLine, marks: list[Mark]) -> None:
    t = ev.time
    if isinstance(ev, StepTrained):
        marks.append(Mark("step", t, f"step {ev.step}", {"step": ev.step, "groups": ev.group_ids}))
    elif isinstance(ev, WeightsSynced):
        marks.append(
            Mark(
                "weights", t, f"weights v{ev.weight_version}", {"weight_version": ev.weight_version}
            )
        )
    elif isinstance(ev, TrainerCheckpointPublished):
        marks.append(
            Mark("checkpoint", t, f"checkpoint step {ev.step}", {"step": ev.step, "path": ev.path})
        )
    elif isinstance(ev, SnapshotPublished):
        args = {"step": ev.step, "path": ev.path, "captured_at": ev.captured_at}
        marks.append(Mark("snapshot", t, f"snapshot step {ev.step}", args, ev.captured_at))
    elif isinstance(ev, RestoreStarted):
        run.restores.append(Restore(t, None, ev.path, ev.step))
    elif isinstance(ev, RestoreFinished):
        for r in run.restores:
            if r.finished is None:
                r.finished = t
                break
        else:
            run.restores.append(Restore(t, t, "", ev.step))
    elif isinstance(ev, _GROUP_EVENTS):
        args = {"group_id": ev.group_id, "prompt_id": ev.prompt_id}
        if isinstance(ev, GroupReserved):
            args.update(size=ev.size, weight_version=ev.weight_version, target_step=ev.target_step)
        elif isinstance(ev, GroupDiscarded):
            args["reason"] = ev.reason
        name = type(ev).__struct_config__.tag
        marks.append(Mark("group", t, str(name).replace("_", " "), args))
    elif isinstance(ev, TraceOpened):
        run.host, run.pid = ev.host, ev.pid
        args = {"host": ev.host, "pid": ev.pid, "sdk_version": ev.sdk_version, "meta": ev.meta}
        marks.append(Mark("opened", t, "trace opened", args))
    elif isinstance(ev, TraceClosed):
        run.closed = True
        args = {"emitted": ev.emitted, "written": ev.written, "dropped": ev.dropped}
        args["invalid"] = ev.invalid
        marks.append(Mark("closed", t, "trace closed", args))
    elif isinstance(ev, UnknownEvent):
        marks.append(Mark("other", t, ev.event, dict(ev.fields)))
    else:
        # A user's own event class: its fields, as they would be written.
        fields = {f: getattr(ev, f) for f in ev.__struct_fields__}
        for envelope in ("time", "run_id", "seq"):
            fields.pop(envelope, None)
        marks.append(Mark("other", t, str(type(ev).__struct_config__.tag), fields))


def pack_lanes(attempts: list[Attempt]) -> int:
    """Give each attempt the lowest lane free at its start; return the lane count.

    Greedy by start time is optimal for intervals: the count is the most
    attempts ever running at once, so a few thousand attempts of a run with
    64 slots stay 64 rows, and a lane that frees up is reused at once.
    """
    order = sorted(range(len(attempts)), key=lambda i: (attempts[i].start, attempts[i].end))
    busy: list[tuple[float, int]] = []  # (end, lane)
    free: list[int] = []
    lanes = 0
    for i in order:
        a = attempts[i]
        # Strictly before: a try of no length (a restart reported by the next
        # run) at the very start of another would hide under it.
        while busy and busy[0][0] < a.start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = lanes
            lanes += 1
        a.lane = lane
        heapq.heappush(busy, (a.end, lane))
    return lanes


def _mark_after_stop(runs: list[RunLine], stops: list[StopCost]) -> None:
    """Tell each attempt in flight at a stop whether the next run resumed it."""
    by_id = {r.run_id: r for r in runs}
    for stop in stops:
        a_run, b_run = by_id.get(stop.stopped_run), by_id.get(stop.restored_run)
        if a_run is None or b_run is None:
            continue
        resumed = {
            (a.prompt_id, a.generation_index) for a in b_run.attempts if a.resumed_turn is not None
        }
        for a in a_run.attempts:
            if a.outcome == "in_flight":
                key = (a.prompt_id, a.generation_index)
                verb = "resumed" if key in resumed else "restarted"
                a.after_stop = f"{verb} by run {b_run.run_id}"
