"""``rollout-trace summary``: per run, who wrote it, when, what, and how cleanly."""

from __future__ import annotations

import argparse
import json

from .._analysis.runstats import RunStats, RunSummary
from .._reading.reader import ReadProblem
from .command import Command
from .common import add_paths, blocks, fmt_num, fmt_time, table

__all__ = ["COMMAND", "collect", "render"]

_EPILOG = """\
examples:
  rollout-trace summary runs/*.jsonl
  rollout-trace summary trace.jsonl.gz --json
"""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_paths(p)
    p.add_argument("--json", action="store_true", help='print {"runs": [...]} as JSON')


def collect(paths: list[str]) -> tuple[list[RunSummary], list[ReadProblem]]:
    """Run summaries in order of first time, and the bad lines no run could claim."""
    problems: list[ReadProblem] = []
    runs: dict[str, RunStats] = {}
    for path, events, _ in blocks(paths, problems):
        for ev in events:
            stats = runs.get(ev.run_id)
            if stats is None:
                stats = runs[ev.run_id] = RunStats(ev.run_id)
            stats.files[path] = None
            stats.add(ev)
    unclaimed = []
    for p in problems:
        stats = runs.get(p.run_id) if p.run_id is not None else None
        if stats is None:
            unclaimed.append(p)
        elif p.torn:
            stats.torn_lines += 1
        else:
            stats.invalid_lines += 1
    summaries = sorted((s.summary() for s in runs.values()), key=lambda s: s.first_time)
    return summaries, unclaimed


def _run(args: argparse.Namespace) -> int:
    summaries, unclaimed = collect(args.paths)
    if args.json:
        doc = {
            "runs": [s.to_dict() for s in summaries],
            "unattributed_problems": [
                {"file": p.file, "line": p.line, "reason": p.reason, "torn": p.torn}
                for p in unclaimed
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(render(summaries, unclaimed))
    return 0


def render(summaries: list[RunSummary], unclaimed: list[ReadProblem]) -> str:
    if not summaries:
        return "no runs"
    rows = []
    for s in summaries:
        rows.append(
            [
                s.run_id,
                s.host or "?",
                "?" if s.pid is None else str(s.pid),
                fmt_time(s.first_time),
                fmt_time(s.last_time),
                fmt_num(s.last_time - s.first_time, 1),
                fmt_num(sum(s.events.values())),
                fmt_num(s.missing),
                fmt_num(s.duplicates),
                fmt_num(s.torn_lines),
                fmt_num(s.invalid_lines),
                "yes" if s.closed else "no",
            ]
        )
    headers = ["run_id", "host", "pid", "first", "last", "span_s", "events", "missing_seqs"]
    headers += ["dup_seqs", "torn", "invalid", "closed"]
    out = [table(headers, rows, right=[2, 5, 6, 7, 8, 9, 10])]

    names = sorted({name for s in summaries for name in s.events})
    cols = [f"run {i}" for i in range(1, len(summaries) + 1)]
    by_name = [[name, *(fmt_num(s.events.get(name, 0)) for s in summaries)] for name in names]
    out += ["", "events by name (runs in the order above)"]
    out.append(table(["event", *cols], by_name, right=range(1, len(cols) + 1), indent="  "))
    gappy = [s for s in summaries if s.seq_gaps]
    if gappy:
        out += ["", "seq gaps"]
        for s in gappy:
            ranges = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in s.seq_gaps[:10])
            more = " ..." if len(s.seq_gaps) > 10 else ""
            out.append(f"  {s.run_id}: {ranges}{more}")
    if unclaimed:
        out += ["", "bad lines that name no known run"]
        out += [f"  {p}" for p in unclaimed]
    return "\n".join(out)


COMMAND = Command(
    name="summary",
    help="per run: host, pid, times, events by name, gaps, bad lines, clean close",
    description="Summarize every run of a trace set.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
