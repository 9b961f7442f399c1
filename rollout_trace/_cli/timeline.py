"""``rollout-trace timeline``: attempts, steps, checkpoints and restores on one time axis."""

from __future__ import annotations

import argparse
import json
import os
import sys

import orjson

from .._reading.reader import ReadProblem
from .._schema.decoding import AnyEvent
from .._timeline.document import document_of
from .._timeline.model import build_timeline
from .._timeline.page import html_of
from .command import Command
from .common import add_paths, blocks

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
    problems: list[ReadProblem] = []
    events: list[AnyEvent] = []
    for _, block, _ in blocks(args.paths, problems):
        events.extend(block)
    for p in problems:
        print(f"rollout-trace: {p}", file=sys.stderr)
    tl = build_timeline(events)
    del events
    if args.output.lower().endswith(".json"):
        doc = document_of(tl)
        try:
            data = orjson.dumps(doc)
        except TypeError:  # an integer wider than 64 bits, which orjson refuses
            data = json.dumps(doc).encode()
    else:
        data = html_of(tl).encode("utf-8")
    try:
        with open(args.output, "wb") as f:
            f.write(data)
    except OSError as exc:
        print(
            f"rollout-trace timeline: error: cannot write {args.output!r}: {exc}", file=sys.stderr
        )
        return 2
    print(
        f"rollout-trace: wrote {args.output} ({len(tl.runs)} run(s), "
        f"{tl.attempt_count:,} attempts, {len(tl.stops)} stop(s), {len(data):,} bytes)",
        file=sys.stderr,
    )
    return 0


COMMAND = Command(
    name="timeline",
    help="a timeline of attempts, steps, checkpoints and restores (.json or .html)",
    description="Draw a trace set's timeline as Perfetto JSON or a self-contained HTML page.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
