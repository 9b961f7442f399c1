"""``rollout-trace timeline``: attempts, steps, checkpoints and restores on one time axis."""

from __future__ import annotations

import argparse
import os
import sys

from .._analysis.cost import gc_paused
from .._timeline.document import write_document
from .._timeline.fold import TimelineFold
from .._timeline.model import Timeline
from .._timeline.page import html_of
from .command import Command
from .common import BadLines, add_paths, blocks, compare_copies, report_problems, trace_files

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

The kind of output follows the suffix of -o: .json is a Chrome trace-event
document with every attempt, one process per run and one track per lane;
.html is one page with the runs on a shared time axis and the restore-cost
figures of each stop. Exit status: 0 written, 2 wrong usage, a missing file
or an output that cannot be written.
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


def _suffix_error(out: str) -> str | None:
    suffix = os.path.splitext(out)[1].lower()
    if suffix in SUFFIXES:
        return None
    allowed = "; ".join(f"{s} for {what}" for s, what in SUFFIXES.items())
    shown = f"suffix {suffix!r}" if suffix else "no suffix"
    return f"output {out!r} has {shown}; the output kind follows the suffix: {allowed}"


def _run(args: argparse.Namespace) -> int:
    # Checked before reading, so a long read is not wasted on a typo.
    wrong = _suffix_error(args.output)
    if wrong is not None:
        print(f"rollout-trace timeline: error: {wrong}", file=sys.stderr)
        return 2
    files = trace_files(args.paths)
    if os.path.exists(args.output) and any(os.path.samefile(args.output, f) for f in files):
        print(
            f"rollout-trace timeline: error: output {args.output!r} is one of the trace files "
            "read; writing it would destroy that trace: choose another -o",
            file=sys.stderr,
        )
        return 2
    # Counted, the first few kept: a text log given by mistake is millions of them.
    problems = BadLines()
    # Each block is folded as it is read and then let go: what the timeline
    # keeps is what it draws, never the events.
    fold = TimelineFold(copies_later=True)
    # Millions of small acyclic records: the cyclic collector would walk them
    # all, again and again, for nothing.
    with gc_paused():
        for path, block, _ in blocks(files, problems):
            fold.add(block, source=path)
        again = fold.cost.seen_again()
        if again:
            # Lines of one (run_id, seq) that differ are drawn the same in any
            # order; this finds them, for the figures and the notes.
            fold.cost.conflicts = compare_copies(
                again, fold.cost.files_to_compare(files), fold.cost.add_version
            )
        tl = fold.timeline()
    report_problems(problems.first, problems.count)
    for note in tl.notes:
        print(f"rollout-trace: note: {note}", file=sys.stderr)
    try:
        with gc_paused():
            size = _write(tl, args.output)
    except OSError as exc:
        print(
            f"rollout-trace timeline: error: cannot write {args.output!r}: {exc}", file=sys.stderr
        )
        return 2
    print(
        f"rollout-trace: wrote {args.output} ({len(tl.runs)} run(s), "
        f"{tl.attempt_count:,} attempts, {len(tl.stops)} stop(s), {size:,} bytes)",
        file=sys.stderr,
    )
    return 0


def _write(tl: Timeline, out: str) -> int:
    """Write the output that ``out``'s suffix names; the bytes written."""
    if out.lower().endswith(".json"):
        # Written as it is encoded: every attempt is in it, and a document
        # of millions of attempts is not held whole.
        with open(out, "wb") as f:
            return write_document(tl, f)
    data = html_of(tl).encode("utf-8")
    with open(out, "wb") as f:
        f.write(data)
    return len(data)


COMMAND = Command(
    name="timeline",
    help="a timeline of attempts, steps, checkpoints and restores (.json or .html)",
    description="Draw a trace set's timeline as Perfetto JSON or a self-contained HTML page.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
