"""``rollout-trace watch``: a terminal view of a trace set still being written."""

from __future__ import annotations

import argparse
import sys
import time

from .._errors import TraceReadError
from .._report.health import DEFAULT_STALL_AFTER
from .._report.live import RATE_WINDOW_S, LiveView
from .command import Command
from .common import add_paths, fmt_num, fmt_time, table
from .report import stall_after_arg

__all__ = ["COMMAND", "frame"]

_STALLS_SHOWN = 10
# Clear the screen and go home: each frame replaces the last on a terminal.
_CLEAR = "\x1b[H\x1b[2J"

_EPILOG = f"""\
examples:
  rollout-trace watch runs/
  rollout-trace watch 'logs/**/*.jsonl' --interval 5
  rollout-trace watch runs/ --once          # one frame, for scripts

Follows the files as they grow and the files that appear (a folder or glob is
listed again each time; a torn last line waits for its end) and redraws,
every --interval seconds (default 2): per run, in the run order, its last
event, how long ago that was, the tries in flight now, the tries sealed and
sealed per second over the last {RATE_WINDOW_S:g} s of its events, its stalls
(as report finds them: tries open longer than --stall-after seconds at its
last event, default {DEFAULT_STALL_AFTER:g}, or open at a clean close no stop
took up); the oldest stalls; the restore cost of the last stop; the bad lines,
counted as summary counts them. Ctrl-C stops it (exit 0).
With --once: one frame, then exit 0, or 1 when it shows a stall.
"""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_paths(p)
    p.add_argument(
        "--interval",
        type=stall_after_arg,  # a number of seconds above 0, as that
        default=2.0,
        metavar="S",
        help="seconds between frames (default 2)",
    )
    p.add_argument(
        "--stall-after",
        type=stall_after_arg,
        default=DEFAULT_STALL_AFTER,
        metavar="S",
        help=f"a try open longer than S seconds is a stall (default {DEFAULT_STALL_AFTER:g})",
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit")


def frame(view: LiveView, wall_now: float, interval: float | None = None) -> str:
    runs = view.ordered()
    events = sum(r.events for r in runs)
    every = f" (every {interval:g} s; Ctrl-C stops)" if interval is not None else ""
    out = [
        f"rollout-trace watch: {len(runs)} run(s) in {view.files} file(s), {events:,} events, "
        f"at {fmt_time(wall_now)}{every}",
        "",
    ]
    if not runs:
        out.append("no trace event yet")
        if view.bad_lines or view.follower.damaged:
            out.append(_bad_lines(view, damaged=bool(view.follower.damaged)))
        return "\n".join(out)
    stalls = view.stalls()
    stopped = view.stopped()
    per_run = {r.run_id: 0 for r in runs}
    for stall in stalls:
        per_run[stall.run.run_id] += 1
    rows = []
    for i, r in enumerate(runs, 1):
        state = "stopped" if r.run_id in stopped else "closed" if r.closed else "open"
        rows.append(
            [
                str(i),
                r.run_id[:8],
                r.host or "?",
                "?" if r.pid is None else str(r.pid),
                fmt_time(r.last_time),
                fmt_num(max(wall_now - r.last_time, 0.0), 1),
                f"{view.in_flight(r):,}",
                f"{len(r.seals):,}",
                fmt_num(r.sealed_per_s(), 2),
                f"{per_run[r.run_id]:,}",
                state,
            ]
        )
    headers = ["run", "run_id", "host", "pid", "last event", "idle_s", "in_flight", "sealed"]
    headers += ["sealed/s", "stalls", "state"]
    out.append(table(headers, rows, right=[0, 3, 5, 6, 7, 8, 9]))
    out.append("")
    if stalls:
        out.append(
            f"stalls: {len(stalls):,} (open longer than {view.stall_after:g} s at the run's "
            "last event, or open at a clean close)"
        )
        number = {r.run_id: i for i, r in enumerate(runs, 1)}
        srows = [
            [str(number[st.run.run_id]), st.kind, repr(st.key[0]), str(st.key[1]),
             str(st.key[2]), fmt_num(st.open_s, 1)]
            for st in stalls[:_STALLS_SHOWN]
        ]  # fmt: skip
        headers = ["run", "kind", "prompt_id", "generation", "attempt", "open_s"]
        out.append(table(headers, srows, right=[0, 3, 4, 5], indent="  "))
        if len(stalls) > _STALLS_SHOWN:
            out.append(f"  ... and {len(stalls) - _STALLS_SHOWN:,} more")
    else:
        out.append(f"stalls: none (open longer than {view.stall_after:g} s)")
    stop = view.last_stop()
    if stop is None:
        out.append("last stop: none yet")
    else:
        stopped_run = stop.stopped_run[:8] if stop.stopped_run else "unknown"
        out.append(
            f"last stop: run {stopped_run} stopped, run {stop.restored_run[:8]} restored: "
            f"downtime {fmt_num(stop.downtime_s, 1)} s, restore {fmt_num(stop.restore_s, 1)} s, "
            f"in flight {fmt_num(stop.in_flight)}; resumed {fmt_num(stop.resumed)}, restarted "
            f"{fmt_num(stop.restarted)}, redone {fmt_num(stop.redone)}; "
            f"lost {fmt_num(stop.lost_s, 1)} s"
        )
    twice = sum(r.read_twice for r in runs)
    if twice:
        out.append(f"lines read twice (two sinks or a copy; counted once): {twice:,}")
    if view.bad_lines or view.follower.damaged:
        out.append(_bad_lines(view, damaged=True))
    return "\n".join(out)


def _bad_lines(view: LiveView, *, damaged: bool) -> str:
    """The reader's bad lines (as ``summary`` counts them: torn, invalid, gzip damage),
    and ``damaged``: the gzip files with damaged bytes."""
    out = f"lines that are no trace event: {view.bad_lines:,}"
    if damaged:
        out += (
            "; gzip files with damaged bytes (skipped to the next member): "
            f"{view.follower.damaged:,}"
        )
    return out


def _run(args: argparse.Namespace) -> int:
    view = LiveView(args.paths, args.stall_after)
    try:
        view.poll()
    except TraceReadError as exc:
        print(f"rollout-trace watch: error: {exc}", file=sys.stderr)
        return 2
    if args.once:
        print(frame(view, time.time()))
        return 1 if view.stalls() else 0
    live = sys.stdout.isatty()
    try:
        while True:
            text = frame(view, time.time(), args.interval)
            sys.stdout.write((_CLEAR + text + "\n") if live else (text + "\n\n"))
            sys.stdout.flush()
            time.sleep(args.interval)
            view.poll()
    except KeyboardInterrupt:
        return 0


COMMAND = Command(
    name="watch",
    help="follow a trace set being written: runs, tries in flight, seals, stalls, last stop",
    description="Follow a trace set as it is written and redraw a terminal view.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
