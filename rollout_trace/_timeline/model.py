"""What a timeline draws: runs, their attempts in lanes, their marks, and the stops.

Both views (the trace-event document and the HTML page) are drawn from this
one model, so they always agree on what an attempt is and how it ended.
``fold.TimelineFold`` builds it from events; nothing here holds an event.

An attempt is one try of a sibling within one run, keyed by
``(prompt_id, generation_index, attempt)``. It begins at its
``attempt_dispatched`` (or ``attempt_resumed``, which starts it in the run that
resumes it, as README: Reference > Restore-cost figures says) and ends at its ``attempt_sealed``,
``attempt_refused`` or ``attempt_abandoned``. One still open at the run's last
event ends there, as ``unended``. An end whose start is not in the run (a
restored run restarting a try of the run before it) becomes an attempt of zero
length at the end's time, so that it is still seen.

Outcomes are named so that none is also the name of a restore-cost figure:
an ``attempt_abandoned`` with reason ``restart`` is the outcome
``abandoned_restart`` (``restarted`` is a figure, counted in siblings), and a
try with no end in its run is ``unended`` (``in_flight`` is a figure). What a
stop did to a try is its ``fate``, named after the figure that counts it:
``resumed``, ``restarted`` or ``redone``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from .._analysis.figures import FIGURES, Note, StopCost
from .marks import Mark, MarkTable

__all__ = [
    "FATES",
    "OUTCOME_LABELS",
    "OUTCOMES",
    "Attempt",
    "Mark",
    "Restore",
    "RunLine",
    "Timeline",
    "pack_lanes",
    "stop_figures",
]


# Every way an attempt can end, in the order a legend lists them.
OUTCOMES = (
    "sealed",
    "failed",
    "dropped",
    "cancelled",
    "refused",
    "abandoned_restart",
    "whole_group",
    "unended",
)
# How an outcome reads on the page and as a bar's name in the document.
OUTCOME_LABELS = {
    "sealed": "sealed",
    "failed": "failed",
    "dropped": "dropped",
    "cancelled": "cancelled",
    "refused": "refused",
    "abandoned_restart": "abandoned: restart",
    "whole_group": "whole group",
    "unended": "unended",
}
# What a stop did to an attempt, each the name of the figure that counts it.
FATES = ("resumed", "restarted", "redone")


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
    # What a stop did to it (one of FATES), and that stop's number (1, 2, ...).
    fate: str | None = None
    stop: int = 0
    lane: int = 0
    # The seqs of the events that started and ended it (-1: none in its run).
    # Within a run, attempts are listed by their first event's seq.
    start_seq: int = -1
    end_seq: int = -1

    @property
    def seq(self) -> int:
        return self.start_seq if self.started else self.end_seq


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
    # In seq order, one per seq; a ``Mark`` is made as each is read.
    marks: MarkTable = field(default_factory=MarkTable)
    restores: list[Restore] = field(default_factory=list)
    lanes: int = 0
    # Events of kinds the timeline does not know that were left out (beyond
    # the first ``fold.OTHER_PER_RUN`` by seq): True when there were any.
    others_cut: bool = False

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
    # What the cost analysis noted (runs read twice, a restore with no run before it).
    notes: list[Note] = field(default_factory=list)
    # run id -> its number, made at the first look-up: a page marks a try per
    # sibling in flight at each stop, and each names the run that restored it.
    _numbers: tuple[int, dict[str, int]] = field(
        default=(-1, {}), init=False, repr=False, compare=False
    )

    @property
    def attempt_count(self) -> int:
        return sum(len(r.attempts) for r in self.runs)

    def run_number(self, run_id: str | None) -> int | None:
        """The 1-based place of a run in the timeline, or None if it is not in it."""
        made_for, numbers = self._numbers
        if made_for != len(self.runs):
            # The first run of an id wins, as a scan would find it.
            numbers = {}
            for run in self.runs:
                numbers.setdefault(run.run_id, run.index + 1)
            self._numbers = (len(self.runs), numbers)
        return numbers.get(run_id) if run_id is not None else None


def pack_lanes(attempts: list[Attempt]) -> int:
    """Give each attempt the lowest lane free at its start; return the lane count.

    Greedy by start time is optimal for intervals: the count is the most
    attempts ever running at once, so a few thousand attempts of a run with
    64 slots stay 64 rows, and a lane that frees up is reused at once.
    """
    busy: list[tuple[float, int]] = []  # (end, lane)
    free: list[int] = []
    lanes = 0
    for a in sorted(attempts, key=attrgetter("start", "end")):
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


def stop_figures(stop: StopCost) -> tuple[dict[str, Any], dict[str, str]]:
    """A stop's figures by name, and why each missing one is missing.

    A figure that is not a finite number (times at the ends of the float range
    are too far apart to subtract) is missing too: JSON has no infinity, and
    a page should not show one as a cost.
    """
    values: dict[str, Any] = {}
    reasons = dict(stop.reasons)
    for name in FIGURES:
        v = getattr(stop, name, None)
        if isinstance(v, float) and not math.isfinite(v):
            reasons.setdefault(
                name, f"{v} (the times it is computed from are too far apart for a float)"
            )
            v = None
        values[name] = v
    return values, reasons
