"""``rollout-trace sql``: a query of the user's own over the model's tables, in DuckDB."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from typing import Any

from .._errors import RolloutTraceError
from .._report.api import TraceSet
from .command import Command
from .common import BadLines, read_model, report_problems, table, trace_files

__all__ = ["COMMAND", "VIEWS"]

# The views a query sees: what each holds (docs: CLI reference > sql).
VIEWS = {
    "events": "every event: run, run_id, seq, time, event, group_id, prompt_id, "
    "generation_index, attempt, weight_version, step, path, reason, fields (JSON text)",
    "tries": "one row per try: the columns of `rollout-trace attempts`, and open (true: "
    "open at its run's last event, what report calls a stall once it is old enough)",
    "stops": "one row per stop: stop, stopped_run, restored_run and every figure",
    "steps": "one row per step_trained: run, run_id, seq, time, step, groups, "
    "weight_version (the version report's staleness judges it against: the run's latest "
    "weights_synced before it, else the highest version dispatched before it)",
    "runs": "one row per run: run, run_id, host, pid, first_time, last_time, events, "
    "closed, stopped, files",
}

_EPILOG = """\
views:
{views}

examples:
  rollout-trace sql runs/*.jsonl "select * from stops"
  # tries still open at their run's last event, oldest first
  rollout-trace sql runs/*.jsonl "select t.run, prompt_id, r.last_time - started_at as open_s
      from tries t join runs r using (run) where open order by open_s desc"
  # staleness per step: steps behind the weights each trained try was dispatched with
  rollout-trace sql runs/*.jsonl "select s.step, avg(s.weight_version - t.weight_version)
      as mean_lag from tries t join steps s on s.run = t.run and s.step = t.trained_step
      group by s.step order by s.step"
  # tries per sibling
  rollout-trace sql runs/*.jsonl "select prompt_id, generation_index, count(*) as tries
      from tries group by all order by tries desc limit 10" --csv

The query runs in DuckDB (pip install 'rollout-trace[sql]') over the trace
set read once into the same model every command reads. Output: an aligned
table, or --csv / --json (a list of objects). Exit status: 0 the query ran,
2 wrong usage, a missing file, DuckDB not installed, or a query DuckDB
refused (its message is printed).
"""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATHS",
        help="trace files (.jsonl, .jsonl.gz), globs or folders, object store URLs too",
    )
    p.add_argument("query", metavar="QUERY", help="one SQL statement over the views below")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header row")
    fmt.add_argument("--json", action="store_true", help="print a JSON list of objects")


def _fail(message: str) -> int:
    print(f"rollout-trace sql: error: {message}", file=sys.stderr)
    return 2


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise RolloutTraceError(
            "sql runs the query in DuckDB, which is not installed: pip install 'rollout-trace[sql]'"
        ) from None
    return duckdb


def _run(args: argparse.Namespace) -> int:
    try:
        duckdb = _duckdb()
    except RolloutTraceError as exc:
        return _fail(str(exc))
    files = trace_files(args.paths)
    problems = BadLines()
    ts = read_model(files, problems, TraceSet)
    report_problems(problems.first, problems.count)
    try:
        tables = {name: ts.to_arrow(name) for name in VIEWS}
    except RolloutTraceError as exc:
        return _fail(str(exc))
    con = duckdb.connect()
    try:
        for name, t in tables.items():
            con.register(name, t)
        try:
            result = con.execute(args.query)
        except duckdb.Error as exc:
            return _fail(f"the query failed: {str(exc).strip()}")
        if result.description is None:
            return 0  # a statement with no rows to show
        headers = [d[0] for d in result.description]
        rows = result.fetchall()
    finally:
        con.close()
    if args.json:
        doc = [dict(zip(headers, map(_plain, r), strict=True)) for r in rows]
        print(json.dumps(doc, indent=2, allow_nan=False, default=str))
    elif args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows([["" if v is None else v for v in r] for r in rows])
    else:
        print(table(headers, [[_cell(v) for v in r] for r in rows]))
    return 0


def _plain(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.3f}"
    return str(v)


COMMAND = Command(
    name="sql",
    help="your own question: SQL over the set's events, tries, stops, steps and runs (DuckDB)",
    description="Run one SQL query (DuckDB) over views of a trace set: events, tries, stops, "
    "steps and runs.",
    epilog=_EPILOG.format(views="\n".join(f"  {k:<7} {v}" for k, v in VIEWS.items())),
    add_arguments=_add_arguments,
    run=_run,
)
