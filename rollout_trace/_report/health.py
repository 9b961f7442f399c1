"""Rollout health from a timeline: outcomes, tries, durations, stalls, staleness, rates.

Everything here is read off the ``Timeline`` model (``_timeline.model``), which
is folded from events in any order and file layout; so is every answer here.
An attempt is one try of a sibling in one run (see the model's docstring).

- **Tries per sibling**: a run's started attempts of one
  ``(prompt_id, generation_index)`` are counted in seq order up to and
  including the one that seals it; a seal ends that use of the sibling (a
  prompt that comes round again starts a new count). A sibling with tries
  and no seal by the run's end is ``unsealed``.
- **Stalls**: an attempt started in the run and still open at its last event,
  open longer than ``stall_after`` seconds then (``open_too_long``); or open in
  a run that closed cleanly (``trace_closed``) with no stop that resumed or
  restarted it: a phantom "in flight" (``open_at_close``), whatever its age.
- **Staleness** (policy lag): for each ``step_trained``, the weight version of
  the run's latest ``weights_synced`` before it (by seq), minus the dispatch
  ``weight_version`` of each sealed attempt of the groups it names. A resumed
  attempt takes the version of its dispatch in the run the stop restored
  from; an attempt whose dispatch is in neither is ``unknown``.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence

import msgspec

from .._timeline.marks import STEP, WEIGHTS
from .._timeline.model import OUTCOMES, Attempt, RunLine, Timeline

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
    # The version of the latest weights_synced before the step; None: none yet.
    weight_version: int | None
    attempts: int  # sealed attempts of its groups with a known lag
    unknown: int  # ... and with none
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
    stall_after_s: float
    runs: list[RunHealth]
    attempts: dict[str, int]
    tries: dict[str, int]
    duration_s: Spread
    stalls: int
    staleness: Staleness  # over every run (``steps`` left empty)


def spread(values: Iterable[float]) -> Spread:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return Spread(count=0, p50=None, p90=None, p99=None, max=None)

    def at(p: float) -> float:
        # Linear between the closest ranks (numpy's default).
        pos = (n - 1) * p
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return Spread(count=n, p50=at(0.5), p90=at(0.9), p99=at(0.99), max=ordered[-1])


def report_of(tl: Timeline, stall_after: float = DEFAULT_STALL_AFTER) -> HealthReport:
    """The health report of a timeline (``_timeline.fold.TimelineFold``)."""
    by_id = {r.run_id: r for r in tl.runs}
    stopped = {s.stopped_run for s in tl.stops if s.stopped_run is not None}
    # The run each restored run came from: a resumed attempt's dispatch is there.
    restored_from = {
        s.restored_run: by_id[s.stopped_run]
        for s in tl.stops
        if s.stopped_run in by_id and s.restored_run is not None
    }
    runs = []
    attempts: Counter[str] = Counter()
    tries: Counter[str] = Counter()
    durations = array("d")
    lags = array("d")
    unknown = 0
    for run in tl.runs:
        steps = _step_lags(run, restored_from.get(run.run_id))
        report = _run_report(run, run.run_id in stopped, steps, stall_after)
        runs.append(report)
        attempts.update(report.attempts)
        tries.update(report.tries)
        durations.extend(_durations(run))
        lags.extend(v for _, values, _ in steps for v in values)
        unknown += report.staleness.unknown
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
    )


def _run_report(run: RunLine, stopped: bool, lags: list[_Lags], stall_after: float) -> RunHealth:
    outcomes = Counter(a.outcome for a in run.attempts)
    steps = _marks(run, STEP)
    syncs = _marks(run, WEIGHTS)
    known = [v for _, values, _ in lags for v in values]
    overall = spread(known)
    return RunHealth(
        run_id=run.run_id,
        host=run.host,
        pid=run.pid,
        first_time=run.first_time,
        last_time=run.last_time,
        closed=run.closed,
        stopped=stopped,
        attempts={k: outcomes.get(k, 0) for k in OUTCOMES},
        tries=_tries(run.attempts),
        duration_s=spread(_durations(run)),
        stalls=_stalls(run, stall_after),
        staleness=Staleness(
            attempts=overall.count,
            unknown=sum(u for _, _, u in lags),
            p50=overall.p50,
            max=overall.max,
            steps=[
                StepLag(
                    step=step,
                    time=t,
                    weight_version=version,
                    attempts=s.count,
                    unknown=u,
                    p50=s.p50,
                    max=s.max,
                )
                for (step, t, version), values, u in lags
                for s in (spread(values),)
            ],
        ),
        step_interval_s=spread(_gaps(t for _, t, _ in steps)),
        weight_sync_interval_s=spread(_gaps(t for _, t, _ in syncs)),
        sealed_per_s=_rate(run),
    )


def _marks(run: RunLine, code: int) -> list[tuple[int, float, object]]:
    """(seq, time, a) of the run's marks of one kind, in seq order."""
    m = run.marks
    return [(m.seqs[i], m.times[i], m.a[i]) for i, c in enumerate(m.codes) if c == code]


def _gaps(times: Iterable[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def _durations(run: RunLine) -> Iterable[float]:
    """Start to end of every attempt started in the run that ended in it."""
    return (a.end - a.start for a in run.attempts if a.started and a.end_seq >= 0)


def _tries(attempts: Sequence[Attempt]) -> dict[str, int]:
    out: Counter[str] = Counter()
    open_: Counter[tuple[int | str, int]] = Counter()
    # Attempts are listed by their first event's seq: the order they were tried.
    for a in attempts:
        key = (a.prompt_id, a.generation_index)
        if a.started:
            open_[key] += 1
        if a.outcome == "sealed" and open_[key]:
            n = open_.pop(key)
            out[str(n) if n < 3 else "3+"] += 1
    out["unsealed"] = sum(1 for n in open_.values() if n)
    return {k: out.get(k, 0) for k in TRIES_COLUMNS}


def _stalls(run: RunLine, stall_after: float) -> list[Stall]:
    found = []
    for a in run.attempts:
        if not a.started or a.end_seq >= 0:
            continue
        open_s = run.last_time - a.start
        if run.closed and a.fate is None:
            kind = "open_at_close"
        elif open_s > stall_after:
            kind = "open_too_long"
        else:
            continue
        found.append(
            Stall(
                kind=kind,
                prompt_id=a.prompt_id,
                generation_index=a.generation_index,
                attempt=a.attempt,
                group_id=a.group_id,
                started_at=a.start,
                open_s=open_s,
            )
        )
    found.sort(key=lambda s: -s.open_s)
    return found


# A step's (step, time, synced weight version), its lags, its attempts of unknown lag.
_Lags = tuple[tuple[int, float, int | None], list[float], int]


def _step_lags(run: RunLine, before: RunLine | None) -> list[_Lags]:
    """Per step_trained in seq order: (step, time, synced version), its lags, its unknowns."""
    m = run.marks
    sealed: dict[str, list[Attempt]] = {}
    for a in run.attempts:
        if a.outcome == "sealed":
            sealed.setdefault(a.group_id, []).append(a)
    dispatched = _versions(before)
    version: int | None = None
    out = []
    for i, code in enumerate(m.codes):
        if code == WEIGHTS:
            version = m.a[i]
        elif code == STEP:
            lags: list[float] = []
            unknown = 0
            for gid in m.b[i] or ():
                for a in sealed.get(gid, ()):
                    v = a.weight_version
                    if v is None:
                        v = dispatched.get((a.prompt_id, a.generation_index, a.attempt))
                    if v is None or version is None:
                        unknown += 1
                    else:
                        lags.append(float(version - v))
            out.append(((m.a[i], m.times[i], version), lags, unknown))
    return out


def _versions(run: RunLine | None) -> dict[tuple[int | str, int, int], int]:
    """The dispatch weight version of each try of ``run``."""
    if run is None:
        return {}
    return {
        (a.prompt_id, a.generation_index, a.attempt): a.weight_version
        for a in run.attempts
        if a.weight_version is not None
    }


def _rate(run: RunLine) -> Rate:
    span = max(run.last_time - run.first_time, 0.0)
    width: float = next(
        (w for w in _BUCKET_WIDTHS if w * _BUCKETS >= span), math.ceil(span / _BUCKETS) or 1
    )
    counts = [0] * max(1, math.ceil(span / width) if span else 1)
    for a in run.attempts:
        if a.outcome == "sealed":
            i = int((a.end - run.first_time) // width)
            counts[min(max(i, 0), len(counts) - 1)] += 1
    return Rate(start=run.first_time, bucket_s=float(width), per_s=[c / width for c in counts])
