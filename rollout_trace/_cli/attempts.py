"""``rollout-trace attempts``: one row per attempt across runs, as CSV or Parquet."""

from __future__ import annotations

import argparse
import sys

from .._errors import RolloutTraceError
from .._model.traceset import gc_paused
from .._report.table import columns_of, write_csv, write_parquet
from .command import Command
from .common import (
    BadLines,
    add_paths,
    fold_timeline,
    output_error,
    report_problems,
    trace_files,
    write_whole,
)

__all__ = ["COMMAND", "SUFFIXES"]

SUFFIXES = {
    ".csv": "CSV with a header row (the standard library)",
    ".parquet": "Parquet (needs pyarrow: pip install 'rollout-trace[parquet]')",
}

_EPILOG = """\
examples:
  rollout-trace attempts runs/*.jsonl -o attempts.csv
  rollout-trace attempts 'logs/**/*.jsonl.gz' -o attempts.parquet

One row per attempt (one try of a sibling in one run), runs in the order the
cost analysis takes them, attempts in seq order: run, run_id, host, pid,
group_id, prompt_id, generation_index, attempt, started_at, ended_at,
duration_s, outcome, reason, weight_version, resumed_turn, trained_step (the
first step_trained that trained it: in its run, or in a run restored from
it), fate (what a stop did to it: resumed, restarted, redone), stop (that
stop's number; 0 for none) and lost_s (the seconds of its work that stop
lost: a resumed try's part after the capture). Times are Unix
seconds; an empty cell (CSV) or null (Parquet) is a value the trace does not
have. Exit status: 0 written, 2 wrong usage, a missing file, an output that
cannot be written, or Parquet without pyarrow.
"""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_paths(p)
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="where to write: OUT.csv or OUT.parquet (the suffix decides)",
    )


def _fail(message: str) -> int:
    print(f"rollout-trace attempts: error: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    out: str = args.output
    files = trace_files(args.paths)
    wrong = output_error(out, SUFFIXES, files)
    if wrong is not None:
        return _fail(wrong)
    problems = BadLines()
    tl = fold_timeline(files, problems)
    report_problems(problems.first, problems.count)
    for note in tl.notes:
        print(f"rollout-trace: note: {note}", file=sys.stderr)
    with gc_paused():
        columns = columns_of(tl)
    try:
        if out.lower().endswith(".csv"):
            with open(out, "w", encoding="utf-8", newline="") as f:
                n = write_csv(columns, f)
        else:
            # Written whole or not at all, as the timeline is.
            n = write_whole(out, lambda f: write_parquet(columns, f))
    except RolloutTraceError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot write {out!r}: {exc}")
    print(f"rollout-trace: wrote {out} ({n:,} attempts, {len(tl.runs)} run(s))", file=sys.stderr)
    return 0


COMMAND = Command(
    name="attempts",
    help="one row per attempt across runs, as .csv or .parquet",
    description="Write a table of every attempt of a trace set (CSV or Parquet).",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
