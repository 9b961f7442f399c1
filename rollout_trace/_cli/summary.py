"""``rollout-trace summary``: per run, who wrote it, when, what, and how cleanly."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .._model.runs import Collector
from .._model.summary import TABLE_COLUMNS, RunSummary, summarize
from .._model.traceset import gc_paused
from .._reading.reader import ReadProblem
from .command import Command
from .common import (
    PROBLEMS_SHOWN,
    BadLines,
    add_paths,
    blocks,
    fmt_num,
    fmt_time,
    report_problems,
    table,
    trace_files,
)

__all__ = ["COMMAND", "SetSummary", "collect", "render"]

_EPILOG = """\
examples:
  rollout-trace summary runs/*.jsonl
  rollout-trace summary trace.jsonl.gz --json

A run read from several files is one run: an event found again in another
file (two file sinks of one tracer, a copied file) counts once, in read_twice.
Lines of one (run_id, seq) that differ (a conflicting copy) are counted in
conflicts, and each version in events. Runs are listed in the order of their
trace_opened times. Bad lines go to standard error, the first few of them;
rollout-trace validate says where each is.
"""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_paths(p)
    p.add_argument("--json", action="store_true", help='print {"runs": [...], ...} as JSON')


@dataclass
class SetSummary:
    """What ``summary`` found in a trace set: its runs, and the lines it read."""

    files: list[str]
    runs: list[RunSummary]
    lines: int = 0
    bad: BadLines = field(default_factory=BadLines)
    # Bad lines that name no run of the set: how many, and the first of them.
    unattributed: int = 0
    unattributed_first: list[ReadProblem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "lines": self.lines,
            "bad_lines": self.bad.count,
            "runs": [s.to_dict() for s in self.runs],
            "unattributed_lines": self.unattributed,
            "unattributed_problems": [
                {"file": p.file, "line": p.line, "reason": p.reason, "torn": p.torn}
                for p in self.unattributed_first
            ],
        }


def collect(paths: list[str]) -> SetSummary:
    """Run summaries in the run order, and what was read: the set read once."""
    files = trace_files(paths)
    collector = Collector()
    # Bad lines are charged to their runs once every run is known: one per
    # run and kind is kept, not one per line.
    charges: Counter[tuple[str | None, bool]] = Counter()
    unattributed: list[ReadProblem] = []

    def charge(p: ReadProblem) -> None:
        charges[p.run_id, p.torn] += 1
        # A line of a run not seen yet may belong to a run seen later.
        if len(unattributed) < 2 * PROBLEMS_SHOWN and p.run_id not in collector.runs:
            unattributed.append(p)

    bad = BadLines(then=charge)
    lines = 0
    # Millions of small acyclic records: the cyclic collector would walk them
    # all, again and again, for nothing.
    with gc_paused():
        for path, events, _ in blocks(files, bad):
            lines += len(events)
            collector.add(events, source=path)
        runs = summarize(collector)
    out = SetSummary(files=files, runs=runs, lines=lines + bad.count, bad=bad)
    by_id = {s.run_id: s for s in runs}
    for (run_id, torn), n in charges.items():
        summary = by_id.get(run_id) if run_id is not None else None
        if summary is None:
            out.unattributed += n
        elif torn:
            summary.torn_lines += n
        else:
            summary.invalid_lines += n
    out.unattributed_first = [p for p in unattributed if p.run_id not in by_id][:PROBLEMS_SHOWN]
    return out


def _run(args: argparse.Namespace) -> int:
    found = collect(args.paths)
    report_problems(found.bad.first, found.bad.count)
    if args.json:
        print(json.dumps(found.to_dict(), indent=2))
    else:
        print(render(found))
    return 0


def _cell(s: RunSummary, column: str) -> str:
    value = getattr(s, column)
    if column in ("first_time", "last_time"):
        return fmt_time(value)
    if column == "span_s":
        return fmt_num(value, 1)
    if column == "closed":
        return "yes" if value else "no"
    if value is None:
        return "?"
    # A pid is a name, not a quantity: no thousands separator.
    return str(value) if column == "pid" or isinstance(value, str) else fmt_num(value)


def _read(found: SetSummary) -> str:
    """What was read: lines, files, bad lines."""
    files = f"{len(found.files)} file(s)"
    if not found.lines:
        return f"the {files} given hold no line"
    bad = found.bad.count
    kinds = f" ({found.bad.torn:,} torn)" if found.bad.torn else ""
    return f"{found.lines:,} lines read from {files}, {bad:,} of them bad{kinds}"


def render(found: SetSummary) -> str:
    summaries = found.runs
    if not summaries:
        if not found.lines:
            return f"no runs: {_read(found)}"
        return (
            f"no runs: {_read(found)}; not one line is a trace event\n"
            "the bad lines are on standard error (the first few); "
            "rollout-trace validate lists each"
        )
    rows = [[_cell(s, column) for column in TABLE_COLUMNS] for s in summaries]
    right = [
        i
        for i, c in enumerate(TABLE_COLUMNS)
        if c not in ("run_id", "host", "first_time", "last_time", "closed")
    ]
    out = [table(list(TABLE_COLUMNS), rows, right=right)]

    names = sorted({name for s in summaries for name in s.events_by_name})
    cols = [f"run {i}" for i in range(1, len(summaries) + 1)]
    by_name = [
        [name, *(fmt_num(s.events_by_name.get(name, 0)) for s in summaries)] for name in names
    ]
    out += ["", "events by name (runs in the order above)"]
    out.append(table(["event", *cols], by_name, right=range(1, len(cols) + 1), indent="  "))
    gappy = [s for s in summaries if s.seq_gaps]
    if gappy:
        out += ["", "seq gaps"]
        for s in gappy:
            ranges = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in s.seq_gaps[:10])
            more = " ..." if len(s.seq_gaps) > 10 else ""
            out.append(f"  {s.run_id}: {ranges}{more}")
    differ = [s for s in summaries if s.conflicts]
    if differ:
        out += ["", "conflicting copies (lines of one run_id and seq that differ; each counted)"]
        for s in differ:
            ranges = ", ".join(
                f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in s.conflict_seqs[:10]
            )
            more = " ..." if len(s.conflict_seqs) > 10 else ""
            out.append(f"  {s.run_id}: {s.conflicts:,} seq(s): {ranges}{more}")
    twice = [s for s in summaries if s.read_twice]
    if twice:
        out += ["", "runs read from more than one file (each event counted once)"]
        for s in twice:
            out.append(
                f"  {s.run_id}: in {len(s.files)} files; {s.read_twice:,} line(s) "
                "repeat events of another file"
            )
    if found.bad.count:
        out += ["", f"bad lines: {_read(found)}"]
        if found.unattributed:
            out.append(f"  {found.unattributed:,} of them name no run of the set")
        out.append("  listed on standard error (the first few); rollout-trace validate lists each")
    return "\n".join(out)


COMMAND = Command(
    name="summary",
    help="per run: host, pid, times, events by name, gaps, bad lines, clean close",
    description="Summarize every run of a trace set.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
