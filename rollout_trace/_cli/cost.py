"""``rollout-trace cost``: the restore-cost figures of every stop in a trace set."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import msgspec

from .._model.stops import FIGURE_ROWS, FIGURES, StopCost
from .._model.traceset import Builder, Model, gc_paused
from .command import Command
from .common import (
    BadLines,
    add_paths,
    blocks,
    fmt_num,
    fmt_time,
    report_problems,
    table,
    trace_files,
)
from .jobs import NoWorkers, WorkerDied, read_in_processes, read_in_ray

__all__ = ["COMMAND", "render"]

_EPILOG = """\
examples:
  rollout-trace cost runs/*.jsonl
  rollout-trace cost 'logs/**/rollout_trace*.jsonl.gz' --json > cost.json

A stop is a run followed by a later run whose rollout work begins with
restore_started. The exact rules for stops and the definition of every figure
are in the docs, Reference > Restore-cost figures.

A run read from two files (two sinks of one tracer, a copy) counts once;
lines of one seq that differ (a conflicting copy) are all kept, in one
order, and noted (conflicting_copies).

Files are read in --jobs worker processes, one per usable core unless told:
whole files, and byte ranges of a large plain .jsonl file. A trace set with a
path only this process can open (a pipe, /dev/stdin, <(...)) is read in this
process, as is one where worker processes cannot be started (no usable
/dev/shm: a warning says so). --ray reads them as Ray tasks instead; the
files must then be readable by the same paths on every node. The output is
the same in every case.

Run from another program's main(["cost", ...]), cost reads in that process
unless given --jobs N, and then the program must start from an
`if __name__ == "__main__":` block, as Python's multiprocessing requires.

Exit status (docs, CLI reference > Exit codes): 0 every figure computed,
1 some figure could not be computed (shown as n/a, with the reason) or lines
of one (run_id, seq) differ, or a worker died, 2 wrong usage, a missing file,
or --ray with a RAY_ADDRESS that is malformed or cannot be reached.
"""

# Every figure adds up over stops but the points in time and the step.
_SUMMED = [f for f in FIGURES if f not in ("stop_time", "restored_step", "captured_at")]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_paths(p)
    p.add_argument("--json", action="store_true", help='print {"stops": [...]} as JSON')
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="read in N worker processes (default: one per usable core, or 1 when called "
        "from another program's main([...]); 1 reads in this process); each takes whole "
        "files, or byte ranges of a large .jsonl file",
    )
    where.add_argument(
        "--ray",
        action="store_true",
        help="read as Ray tasks, on the cluster RAY_ADDRESS names or else a local one "
        "(pip install 'rollout-trace[ray]'); every worker must be able to open the files "
        "by the paths given",
    )


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of worker processes: give a whole number, 1 or more "
            "(1 reads in this process)"
        )
    return n


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _read(files: list[str], args: argparse.Namespace) -> tuple[Model, BadLines]:
    """The model of ``files``, read here, in worker processes or as Ray tasks; the bad lines."""
    gathered: tuple[Builder, BadLines] | None = None
    if args.ray:
        gathered = read_in_ray(files)
    else:
        jobs = args.jobs
        if jobs is None:
            # Workers re-import the __main__ of the program that starts them: only
            # the command line's own is known to be safe to (main.program).
            jobs = _usable_cores() if getattr(args, "program", False) else 1
        if jobs > 1:
            try:
                gathered = read_in_processes(files, jobs)
            except NoWorkers as exc:
                print(
                    f"rollout-trace cost: warning: {exc}; reading in this process, as --jobs 1 "
                    "does",
                    file=sys.stderr,
                )
    if gathered is None:
        # Counted, the first few kept: a text log given by mistake is millions of them.
        problems = BadLines()
        builder = Builder()
        with gc_paused():
            for path, events, _ in blocks(files, problems):
                builder.add(events, source=path)
        gathered = builder, problems
    builder, problems = gathered
    return builder.build(), problems


def _run(args: argparse.Namespace) -> int:
    files = trace_files(args.paths)
    try:
        model, problems = _read(files, args)
    except WorkerDied as exc:
        print(f"rollout-trace cost: error: {exc}", file=sys.stderr)
        return 1
    stops = model.stops
    report_problems(problems.first, problems.count)
    for note in model.notes:
        print(f"rollout-trace: note: {note}", file=sys.stderr)
    if args.json:
        doc = {
            "stops": [s.to_dict() for s in stops],
            "notes": [msgspec.to_builtins(n) for n in model.notes],
            "reasons": [
                {
                    "stopped_run": s.stopped_run,
                    "restored_run": s.restored_run,
                    "figure": figure,
                    "reason": reason,
                }
                for s in stops
                for figure, reason in s.reasons.items()
            ],
        }
        # Every figure is finite or null (StopCost's rule): allow_nan=False
        # makes a slip fail here rather than print JSON no parser takes.
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(render(stops))
    # Lines that disagree make the data set inconsistent, whatever it gave.
    return 1 if any(s.reasons for s in stops) or model.conflicts else 0


def _value(stop: StopCost, figure: str) -> str:
    v = getattr(stop, figure)
    if figure in ("stop_time", "captured_at"):
        return fmt_time(v)
    return fmt_num(v)


def render(stops: list[StopCost]) -> str:
    if not stops:
        return "no stops: no run in the trace set begins with a restore"
    out: list[str] = []
    for i, stop in enumerate(stops, 1):
        stopped = (
            "an unknown run stopped (none before it in the trace set)"
            if stop.stopped_run is None
            else f"run {stop.stopped_run} stopped"
        )
        out.append(
            f"stop {i} of {len(stops)}: {stopped}; "
            f"run {stop.restored_run} restored {stop.restore_path!r}"
        )
        rows = []
        for figure, (unit, what) in FIGURE_ROWS.items():
            note = what
            if figure == "captured_at" and stop.captured_from:
                note = f"{what} ({stop.captured_from})"
            if figure in stop.reasons:
                note = f"n/a: {stop.reasons[figure]}"
            rows.append([figure, _value(stop, figure), unit, note])
        out.append(table(["figure", "value", "unit", "meaning"], rows, right=[1], indent="  "))
        out.append("")
    totals = []
    for figure in _SUMMED:
        values = [getattr(s, figure) for s in stops]
        known = [v for v in values if v is not None]
        total = sum(known) if len(known) == len(values) else None
        if isinstance(total, float) and not math.isfinite(total):
            total = None  # each stop's figure is finite, their sum is not
        totals.append([figure, fmt_num(total), FIGURE_ROWS[figure][0]])
    out.append(f"all {len(stops)} stop(s)")
    out.append(table(["total", "value", "unit"], totals, right=[1], indent="  "))
    return "\n".join(out)


COMMAND = Command(
    name="cost",
    help="what each stop and restore cost (docs: Reference > Restore-cost figures)",
    description="Compute the restore-cost figures of every stop in a trace set.\n"
    "Each figure is defined in the docs, Reference > Restore-cost figures.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
