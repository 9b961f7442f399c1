"""``rollout-trace timeline``: attempts, steps, checkpoints and restores on one time axis."""

from __future__ import annotations

import argparse
import os
import sys
from typing import BinaryIO

from .._model.traceset import gc_paused
from .._timeline.document import write_document
from .._timeline.merge import Foreign, load_foreign
from .._timeline.model import Timeline
from .._timeline.page import html_of
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

# Output suffix -> what is written there.
SUFFIXES = {
    ".json": "Chrome trace-event format (opens in https://ui.perfetto.dev and chrome://tracing)",
    ".html": "a self-contained page (no network; open it in any browser)",
}

_EPILOG = """\
examples:
  rollout-trace timeline runs/*.jsonl -o timeline.html
  rollout-trace timeline 'logs/**/*.jsonl.gz' -o timeline.json
  rollout-trace timeline runs/*.jsonl --merge ray-timeline.json -o timeline.json

The kind of output follows the suffix of -o: .json is a Chrome trace-event
document for Perfetto with every attempt (one process per run, attempts as
async slices coloured by outcome, flows from a retried try to the next one
and from a sealed try to the step that trained it, counters of the tries in
flight and of the policy lag, timestamps in microseconds since the Unix
epoch); .html is one page with the runs on a shared time axis and the
restore-cost figures of each stop. --merge folds another trace-event
document into the .json, each of its processes renumbered after the runs:
what `ray timeline` writes (it says where) or `ray.timeline(filename=...)`.
Exit status: 0 written, 2 wrong usage, a missing file, a --merge file that
is not a trace-event document, or an output that cannot be written.
"""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_paths(p)
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="where to write: OUT.json (trace-event format) or OUT.html (a page)",
    )
    p.add_argument(
        "--merge",
        action="append",
        default=[],
        metavar="RAY_TIMELINE.json",
        help="fold this trace-event document (the output of `ray timeline`) into OUT.json; "
        "may be given more than once",
    )


def _run(args: argparse.Namespace) -> int:
    # Checked before reading, so a long read is not wasted on a typo.
    wrong = output_error(args.output, SUFFIXES, ())
    if wrong is not None:
        print(f"rollout-trace timeline: error: {wrong}", file=sys.stderr)
        return 2
    if args.merge and not args.output.lower().endswith(".json"):
        print(
            "rollout-trace timeline: error: --merge adds trace events to a .json output; "
            f"{args.output!r} is a page",
            file=sys.stderr,
        )
        return 2
    files = trace_files(args.paths)
    # Read before the traces, so that a wrong --merge file is said at once.
    merge = [load_foreign(path) for path in args.merge]
    wrong = output_error(args.output, SUFFIXES, files)
    if wrong is not None:
        print(f"rollout-trace timeline: error: {wrong}", file=sys.stderr)
        return 2
    if os.path.exists(args.output) and any(
        os.path.exists(m) and os.path.samefile(args.output, m) for m in args.merge
    ):
        print(
            f"rollout-trace timeline: error: output {args.output!r} is a --merge file; "
            "writing it would destroy it: choose another -o",
            file=sys.stderr,
        )
        return 2
    # Counted, the first few kept: a text log given by mistake is millions of them.
    problems = BadLines()
    tl = fold_timeline(files, problems)
    report_problems(problems.first, problems.count)
    for note in tl.notes:
        print(f"rollout-trace: note: {note}", file=sys.stderr)
    try:
        with gc_paused():
            size = _write(tl, args.output, merge)
    except OSError as exc:
        print(
            f"rollout-trace timeline: error: cannot write {args.output!r}: {exc}", file=sys.stderr
        )
        return 2
    merged = sum(len(f.events) for f in merge)
    print(
        f"rollout-trace: wrote {args.output} ({len(tl.runs)} run(s), "
        f"{tl.attempt_count:,} attempts, {len(tl.stops)} stop(s), "
        + (f"{merged:,} merged events, " if merge else "")
        + f"{size:,} bytes)",
        file=sys.stderr,
    )
    return 0


def _write(tl: Timeline, out: str, merge: list[Foreign]) -> int:
    """Write the output that ``out``'s suffix names, whole or not at all; the bytes written."""

    def write(f: BinaryIO) -> int:
        if out.lower().endswith(".json"):
            # Written as it is encoded: every attempt is in it, and a
            # document of millions of attempts is not held whole.
            return write_document(tl, f, merge)
        data = html_of(tl).encode("utf-8")
        f.write(data)
        return len(data)

    return write_whole(out, write)


COMMAND = Command(
    name="timeline",
    help="a timeline of attempts, steps, checkpoints and restores (.json or .html)",
    description="Draw a trace set's timeline as Perfetto JSON or a self-contained HTML page.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
