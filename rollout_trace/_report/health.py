"""Rollout health from a timeline: outcomes, tries, durations, stalls, staleness, rates.

Everything here is read off the ``Timeline`` model (``_timeline.model``), which
is folded from events in any order and file layout; so is every answer here.
An attempt is one try of a sibling in one run (see the model's docstring).

- **Tries per sibling** and **staleness** (policy lag) cross stops: see
  ``lineage`` for what a use of a sibling is and which tries a step trained.
  A run's tries count the uses it sealed (with the tries before its restore)
  and its siblings unsealed at its end; the whole set's count each use once,
  where it was sealed or where its restore chain ends. A lag is the version
  the step is judged against (the run's latest ``weights_synced`` before it,
  else the highest version dispatched before it, for a restored run at least
  that of the state it restored: ``_model.stops.step_versions``) minus the
  try's dispatch ``weight_version``; ``unknown`` when either is missing.
- **Stalls**: a try open at its run's last event (``_model.terms``: not
  superseded by a later start of its attempt), open longer than
  ``stall_after`` seconds then (``open_too_long``); or open in a run that
  closed cleanly (``trace_closed``) with no stop that resumed or
  restarted it: a phantom "in flight" (``open_at_close``), whatever its age.
- **Intervals** between a run's steps and syncs; the set pools every run's.
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import compress

import msgspec

from .._timeline.lineage import Lineage, TrainedStep, TriesState, lag_of, quantile, tries_pass
from .._timeline.marks import STEP, WEIGHTS
from .._timeline.model import OUTCOMES, RunLine, Timeline

__all__ = [
    "DEFAULT_STALL_AFTER",
    "RunHealth",
    "HealthReport",
    "Spread",
    "Stall",
    "Staleness",
    "StepLag",
    "Rate",
    "report_of",
    "spread",
]

DEFAULT_STALL_AFTER = 600.0
# Sealed attempts per second are counted in about this many buckets a run.
_BUCKETS = 60
_BUCKET_WIDTHS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
TRIES_COLUMNS = ("1", "2", "3+", "unsealed")


class Spread(msgspec.Struct, kw_only=True):
    """How many values, and their percentiles (linear between ranks) and maximum."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


class Stall(msgspec.Struct, kw_only=True):
    kind: str  # open_too_long | open_at_close
    prompt_id: int | str
    generation_index: int
    attempt: int
    group_id: str
    started_at: float
    open_s: float


class StepLag(msgspec.Struct, kw_only=True):
    step: int
    time: float
    # The version the step is judged against (``_model.stops.step_versions``);
    # None: not known.
    weight_version: int | None
    attempts: int  # tries it trained with a known lag
    unknown: int  # ... and with none
    missing_groups: int  # groups it names with no sealed try in the run or before it
    p50: float | None
    max: float | None


class Staleness(msgspec.Struct, kw_only=True):
    attempts: int
    unknown: int
    p50: float | None
    max: float | None
    steps: list[StepLag] = []


class Rate(msgspec.Struct, kw_only=True):
    """Sealed attempts per second in buckets of ``bucket_s`` from ``start``."""

    start: float
    bucket_s: float
    per_s: list[float]


class RunHealth(msgspec.Struct, kw_only=True):
    """The health of one run (``HealthReport.runs``): who wrote it and when, its
    attempts by outcome, tries per sibling, durations, stalls, staleness,
    intervals and sealed attempts per second (docs: Reading the figures > Rollout health)."""

    run_id: str
    host: str | None
    pid: int | None
    first_time: float
    last_time: float
    closed: bool
    stopped: bool  # a later run restored from it
    attempts: dict[str, int]  # by outcome
    tries: dict[str, int]  # sealed siblings by tries (1, 2, 3+), and unsealed
    duration_s: Spread
    stalls: list[Stall]
    staleness: Staleness
    step_interval_s: Spread
    weight_sync_interval_s: Spread
    sealed_per_s: Rate


class HealthReport(msgspec.Struct, kw_only=True):
    """What ``rt.health_report()`` and ``rollout-trace report`` give: each run's
    ``RunHealth`` and the same figures over the whole set (docs: Reading the
    figures > Rollout health)."""

    stall_after_s: float
    runs: list[RunHealth]
    attempts: dict[str, int]
    tries: dict[str, int]
    duration_s: Spread
    stalls: int
    staleness: Staleness  # over every run (``steps`` left empty)
    step_interval_s: Spread  # between steps of one run, over every run
    weight_sync_interval_s: Spread
    sealed_per_s: Rate  # over the set's whole span
    bad_lines: int = 0  # lines of the files read that are no trace event
    notes: list[str] = []  # what the reading noted (the notes of ``cost``)


def spread(values: Iterable[float]) -> Spread:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return Spread(count=0, p50=None, p90=None, p99=None, max=None)
    return Spread(
        count=n,
        p50=quantile(ordered, 0.5),
        p90=quantile(ordered, 0.9),
        p99=quantile(ordered, 0.99),
        max=ordered[-1],
    )


def report_of(
    tl: Timeline, stall_after: float = DEFAULT_STALL_AFTER, bad_lines: int = 0
) -> HealthReport:
    """The health report of a timeline (``_timeline.model.timeline_of``)."""
    lineage = Lineage(tl)
    runs = []
    attempts: Counter[str] = Counter()
    tries: Counter[str] = Counter()
    durations = array("d")
    lags = array("d")
    unknown = 0
    step_gaps: list[float] = []
    sync_gaps: list[float] = []
    # Uses of siblings as they close, by the run that sealed them; then each
    # run's siblings unsealed at its end.
    closed: Counter[tuple[str, str]] = Counter()
    unsealed: dict[str, int] = {}
    ended: dict[str, TriesState] = {}
    for run in tl.runs:
        before = lineage.before.get(run.run_id)
        # Only the run restored from it reads a run's state: let go of it then.
        carried = ended.pop(before.run_id, None) if before is not None else None
        # A restored run goes on with its siblings' uses.
        state = carried if carried is not None else TriesState()
        closed += tries_pass(run, state, tl.kept)
        if run.run_id in lineage.after:
            ended[run.run_id] = state
        unsealed[run.run_id] = state.unsealed()
        if run.run_id not in lineage.after:  # the end of its chain: its open uses end here
            closed += state.finish()
            tries["unsealed"] += unsealed[run.run_id]
    for (_, which), n in closed.items():
        tries[which] += n
    for run in tl.runs:
        run_tries = Counter(
            {which: n for (where, which), n in closed.items() if where == run.run_id}
        )
        run_tries["unsealed"] = unsealed[run.run_id]
        # Each figure's values once: the run's spreads and the set's pooled ones.
        values = _RunValues(
            durations=list(_durations(run)),
            steps=[(step, *_lags(step)) for step in lineage.trained(run)],
            step_gaps=_gaps(run, STEP),
            sync_gaps=_gaps(run, WEIGHTS),
        )
        report = _run_report(run, lineage, run_tries, values, stall_after)
        runs.append(report)
        attempts.update(report.attempts)
        durations.extend(values.durations)
        lags.extend(v for _, known, _ in values.steps for v in known)
        unknown += report.staleness.unknown
        step_gaps += values.step_gaps
        sync_gaps += values.sync_gaps
    overall = spread(lags)
    return HealthReport(
        stall_after_s=stall_after,
        runs=runs,
        attempts={k: attempts.get(k, 0) for k in OUTCOMES},
        tries={k: tries.get(k, 0) for k in TRIES_COLUMNS},
        duration_s=spread(durations),
        stalls=sum(len(r.stalls) for r in runs),
        staleness=Staleness(
            attempts=overall.count, unknown=unknown, p50=overall.p50, max=overall.max
        ),
        step_interval_s=spread(step_gaps),
        weight_sync_interval_s=spread(sync_gaps),
        sealed_per_s=_rate(tl.runs),
        bad_lines=bad_lines,
        notes=[str(n) for n in tl.notes],
    )


def _lags(step: TrainedStep) -> tuple[list[float], int]:
    """The lags of the tries a step trained, and how many are unknown."""
    known, unknown = [], 0
    for _, _, v in step.tries:
        lag = lag_of(step.weight_version, v)
        if lag is None:
            unknown += 1
        else:
            known.append(lag)
    return known, unknown


@dataclass
class _RunValues:
    """What a run's figures are spread over, each computed once."""

    durations: list[float]
    steps: list[tuple[TrainedStep, list[float], int]]  # each step, its lags, its unknowns
    step_gaps: list[float]
    sync_gaps: list[float]


def _run_report(
    run: RunLine,
    lineage: Lineage,
    tries: Counter[str],
    values: _RunValues,
    stall_after: float,
) -> RunHealth:
    outcome = run.tries.outcome
    per_step = values.steps
    overall = spread(v for _, known, _ in per_step for v in known)
    return RunHealth(
        run_id=run.run_id,
        host=run.host,
        pid=run.pid,
        first_time=run.first_time,
        last_time=run.last_time,
        closed=run.closed,
        stopped=run.run_id in lineage.after,
        attempts={k: outcome.count(k) for k in OUTCOMES},
        tries={k: tries.get(k, 0) for k in TRIES_COLUMNS},
        duration_s=spread(values.durations),
        stalls=stalls_of(run, stall_after),
        staleness=Staleness(
            attempts=overall.count,
            unknown=sum(u for _, _, u in per_step),
            p50=overall.p50,
            max=overall.max,
            steps=[
                StepLag(
                    step=step.step,
                    time=step.time,
                    weight_version=step.weight_version,
                    attempts=s.count,
                    unknown=u,
                    missing_groups=step.missing_groups,
                    p50=s.p50,
                    max=s.max,
                )
                for step, known, u in per_step
                for s in (spread(known),)
            ],
        ),
        step_interval_s=spread(values.step_gaps),
        weight_sync_interval_s=spread(values.sync_gaps),
        sealed_per_s=_rate([run]),
    )


def _gaps(run: RunLine, code: int) -> list[float]:
    """The intervals between the run's marks of one kind, in seq order."""
    m = run.marks
    times = [m.times[i] for i, c in enumerate(m.codes) if c == code]
    return [b - a for a, b in itertools.pairwise(times)]


def _durations(run: RunLine) -> Iterable[float]:
    """Start to end of every attempt started in the run that ended in it."""
    t = run.tries
    return compress(map(operator.sub, t.end, t.start), map(operator.and_, t.started, t.ended()))


def stalls_of(run: RunLine, stall_after: float) -> list[Stall]:
    """The run's stalls, oldest first: each try open at its run's last event that is
    open at a clean close no stop took up, or open longer than ``stall_after``
    seconds. The one rule of ``report`` and ``watch``."""
    found = []
    t = run.tries
    for i in t.open_indices():
        open_s = run.last_time - t.start[i]
        if run.closed and t.fate[i] is None:
            kind = "open_at_close"
        elif open_s > stall_after:
            kind = "open_too_long"
        else:
            continue
        found.append(
            Stall(
                kind=kind,
                prompt_id=t.prompt_id[i],
                generation_index=t.generation_index[i],
                attempt=t.attempt[i],
                group_id=t.group_id[i],
                started_at=t.start[i],
                open_s=open_s,
            )
        )
    found.sort(key=lambda s: -s.open_s)
    return found


def seal_times(run: RunLine) -> list[float]:
    """When each sealed try of the run ended."""
    return list(map(run.tries.end.__getitem__, run.tries.sealed_indices()))


def _rate(runs: list[RunLine]) -> Rate:
    """Sealed tries per second over the runs' span, in about ``_BUCKETS`` buckets."""
    seals = list(filter(math.isfinite, itertools.chain.from_iterable(map(seal_times, runs))))
    times = [t for run in runs for t in (run.first_time, run.last_time) if math.isfinite(t)]
    finite = times + seals
    if not finite:
        return Rate(start=0.0, bucket_s=0.0, per_s=[])
    first, span = min(finite), max(finite) - min(finite)
    width: float = next(
        (w for w in _BUCKET_WIDTHS if w * _BUCKETS >= span), math.ceil(span / _BUCKETS) or 1
    )
    n = max(1, math.ceil(span / width))
    # A seal's bucket is (t - first) // width (clamped to the buckets), which
    # rises with t: each bucket's first seal is found by bisection.
    seals.sort()

    def bucket(t: float) -> float:
        return (t - first) // width

    edges = [bisect_left(seals, float(b), key=bucket) for b in range(1, n)]
    counts = list(map(operator.sub, [*edges, len(seals)], [0, *edges]))
    return Rate(start=first, bucket_s=float(width), per_s=[c / width for c in counts])
