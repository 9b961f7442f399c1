"""``rollout-trace report``: rollout health per run and for the whole set."""

from __future__ import annotations

import argparse
import json
import math
import sys

import msgspec

from .._model.traceset import gc_paused
from .._report.health import (
    DEFAULT_STALL_AFTER,
    TRIES_COLUMNS,
    HealthReport,
    RunHealth,
    Spread,
    report_of,
)
from .._timeline.model import OUTCOME_LABELS
from .command import Command
from .common import (
    BadLines,
    add_paths,
    fmt_num,
    fmt_time,
    fold_timeline,
    report_problems,
    table,
    trace_files,
)

__all__ = ["COMMAND", "render", "stall_after_arg"]

# Stalls listed per run in the text output (--json lists every one).
_STALLS_SHOWN = 10
_SPARKS = " ▁▂▃▄▅▆▇█"

_EPILOG = f"""\
examples:
  rollout-trace report runs/*.jsonl
  rollout-trace report 'logs/**/*.jsonl.gz' --json --stall-after 300

Per run and for the whole set: attempts by outcome; tries per sibling (how
many sealed siblings needed 1, 2, 3 or more tries); attempt duration
percentiles; stalls: attempts open longer than --stall-after seconds at the
run's last event (open_too_long), and attempts still open in a run that closed
cleanly that no stop resumed or restarted (open_at_close, a phantom "in
flight"); staleness: for each step_trained, the policy lag of the sealed
attempts of its groups (the weight version of the latest weights_synced
before the step minus the attempt's dispatch weight_version); step and weight
sync intervals; sealed attempts per second over the run.

Exit status: 0 no stall, 1 a stall was found (so that it can gate a job), 2
wrong usage or a missing file. Default --stall-after: {DEFAULT_STALL_AFTER:g} s.
"""


def stall_after_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds: give a finite number above 0, such as 300"
        )
    return value


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_paths(p)
    p.add_argument("--json", action="store_true", help='print {"runs": [...], ...} as JSON')
    p.add_argument(
        "--stall-after",
        type=stall_after_arg,
        default=DEFAULT_STALL_AFTER,
        metavar="S",
        help="an attempt open longer than S seconds at its run's last event is a stall "
        f"(default {DEFAULT_STALL_AFTER:g})",
    )


def _run(args: argparse.Namespace) -> int:
    files = trace_files(args.paths)
    problems = BadLines()
    tl = fold_timeline(files, problems)
    report_problems(problems.first, problems.count)
    for note in tl.notes:
        print(f"rollout-trace: note: {note}", file=sys.stderr)
    with gc_paused():
        found = report_of(tl, args.stall_after, problems.count)
    if args.json:
        doc = msgspec.to_builtins(found)
        doc["files"] = files
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(render(found))
    return 1 if found.stalls else 0


def _spread(s: Spread, unit: str = " s") -> str:
    if not s.count:
        return "none"
    return (
        f"p50 {fmt_num(s.p50)}{unit}  p90 {fmt_num(s.p90)}{unit}  p99 {fmt_num(s.p99)}{unit}  "
        f"max {fmt_num(s.max)}{unit}  ({s.count:,})"
    )


def _counts(counts: dict[str, int], labels: dict[str, str] | None = None) -> str:
    shown = [f"{(labels or {}).get(k, k)} {v:,}" for k, v in counts.items() if v]
    return ",  ".join(shown) or "none"


def _sparkline(per_s: list[float]) -> str:
    top = max(per_s, default=0.0)
    if top <= 0:
        return "(none sealed)"
    steps = len(_SPARKS) - 1
    return "".join(_SPARKS[math.ceil(v / top * steps)] for v in per_s)


def _run_block(i: int, r: RunHealth) -> list[str]:
    host = r.host if r.host is not None else "unknown host"
    pid = r.pid if r.pid is not None else "?"
    ending = "closed" if r.closed else "not closed"
    if r.stopped:
        ending += ", stopped (a later run restored from it)"
    lag = r.staleness
    out = [
        f"run {i}  {r.run_id}  {host} pid {pid}",
        f"  {fmt_time(r.first_time)} to {fmt_time(r.last_time)} "
        f"({fmt_num(r.last_time - r.first_time, 1)} s), {ending}",
        f"  attempts      {_counts(r.attempts, OUTCOME_LABELS)}",
        f"  tries         {_tries(r.tries)}",
        f"  duration      {_spread(r.duration_s)}",
        f"  staleness     {_lag(lag.p50, lag.max, lag.attempts, lag.unknown)}",
        f"  steps         every {_spread(r.step_interval_s)}",
        f"  weight syncs  every {_spread(r.weight_sync_interval_s)}",
        f"  sealed/s      {_sparkline(r.sealed_per_s.per_s)}  peak "
        f"{fmt_num(max(r.sealed_per_s.per_s, default=0.0), 2)}/s, "
        f"buckets of {r.sealed_per_s.bucket_s:g} s",
    ]
    if r.stalls:
        out.append(f"  stalls        {len(r.stalls):,}")
        rows = [
            [
                s.kind,
                repr(s.prompt_id),
                str(s.generation_index),
                str(s.attempt),
                s.group_id,
                fmt_num(s.open_s, 1),
            ]
            for s in r.stalls[:_STALLS_SHOWN]
        ]
        headers = ["kind", "prompt_id", "generation", "attempt", "group_id", "open_s"]
        out.append(table(headers, rows, right=[2, 3, 5], indent="    "))
        if len(r.stalls) > _STALLS_SHOWN:
            out.append(f"    ... and {len(r.stalls) - _STALLS_SHOWN:,} more (--json lists each)")
    else:
        out.append("  stalls        none")
    return out


def _tries(tries: dict[str, int]) -> str:
    sealed = ",  ".join(f"{k}: {tries[k]:,}" for k in TRIES_COLUMNS if k != "unsealed")
    return f"{sealed} sealed siblings;  {tries['unsealed']:,} unsealed"


def _lag(p50: float | None, top: float | None, known: int, unknown: int) -> str:
    if not known:
        text = "no trained attempt with a known policy lag"
    else:
        text = f"policy lag p50 {fmt_num(p50, 1)}  max {fmt_num(top, 1)}  ({known:,} attempts)"
    return text + (f", {unknown:,} of unknown lag" if unknown else "")


def render(found: HealthReport) -> str:
    if not found.runs:
        return "no runs: no trace event in the files given"
    out: list[str] = []
    for i, r in enumerate(found.runs, 1):
        out += [*_run_block(i, r), ""]
    lag = found.staleness
    out += [
        f"whole set ({len(found.runs)} run(s))",
        f"  attempts      {_counts(found.attempts, OUTCOME_LABELS)}",
        f"  tries         {_tries(found.tries)}",
        f"  duration      {_spread(found.duration_s)}",
        f"  staleness     {_lag(lag.p50, lag.max, lag.attempts, lag.unknown)}",
        f"  steps         every {_spread(found.step_interval_s)}",
        f"  weight syncs  every {_spread(found.weight_sync_interval_s)}",
        f"  sealed/s      {_sparkline(found.sealed_per_s.per_s)}  peak "
        f"{fmt_num(max(found.sealed_per_s.per_s, default=0.0), 2)}/s, "
        f"buckets of {found.sealed_per_s.bucket_s:g} s",
        f"  stalls        {found.stalls:,} (open longer than {found.stall_after_s:g} s at "
        "the run's end, or open at a clean close)",
    ]
    if found.bad_lines:
        out.append(f"  bad lines     {found.bad_lines:,} (on standard error, the first few)")
    return "\n".join(out)


COMMAND = Command(
    name="report",
    help="rollout health: outcomes, tries, durations, stalls, staleness (exit 1 on a stall)",
    description="Report the health of every run of a trace set and of the whole set.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
