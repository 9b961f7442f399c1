"""``rollout-trace validate``: check every line, run and file against the schema."""

from __future__ import annotations

import argparse

from .._model.checks import Checker, Finding
from .._model.traceset import gc_paused
from .command import Command
from .common import add_paths, blocks, trace_files

__all__ = ["COMMAND", "verdict"]

_EPILOG = """\
examples:
  rollout-trace validate runs/*.jsonl
  rollout-trace validate trace.jsonl.gz && echo valid

Errors: lines that are not JSON, miss an envelope field or have a field of the
wrong type; a bad run_id; a seq twice in one file; seq gaps; trace_closed
counts that do not add up; a negative time, seq, attempt, generation_index,
size or count; a captured_at on another clock than the event times; an
attempt dispatched again while open, after it was resumed, or after a higher
attempt of the same sibling started; a file none of whose lines is an event.
Warnings: a run without trace_closed (killed), a torn last line, seq gaps that
trace_closed accounts for as dropped or invalid, an unknown schema version,
times that are not Unix seconds, an empty file. Notes: a run read from two
files (two sinks, a copy), counted once; but two lines of one run_id and seq
that differ (a conflicting copy, in one file or two) are an error. Each file is
read once; lines and files may come in any order. The rules: the README,
section Reference > Wire format, Lifecycle events and Rollout events, and
section Instrumenting a controller.
Exit status: 0 no errors (warnings allowed), 1 errors or not a trace at all,
2 wrong usage or a missing file.
"""


def verdict(v: Checker, files: int) -> str:
    """The last line: valid or not, and the counts it rests on."""
    counts = f"{v.errors} error(s), {v.warnings} warning(s)"
    if v.notes:
        counts += f", {v.notes} note(s)"
    if not v.events:
        if not v.lines:
            return f"not valid: not a trace: the {files} file(s) hold no line: {counts}"
        return (
            f"not valid: not a trace: not one of the {v.lines:,} lines in {files} file(s) "
            f"is an event: {counts}"
        )
    ok = "valid" if not v.errors else "not valid"
    return f"{ok}: {v.lines:,} lines, {v.runs} runs: {counts}"


def _run(args: argparse.Namespace) -> int:
    files = trace_files(args.paths)

    def out(f: Finding) -> None:
        print(f)

    checker = Checker(files, out=out)
    # Millions of small acyclic records: the cyclic collector would walk them
    # all, again and again, for nothing.
    with gc_paused():
        for path, events, lines in blocks(files, checker.problem):
            checker.add(path, events, lines)
        checker.finish()
    print(verdict(checker, len(files)))
    return 1 if checker.errors or not checker.events else 0


COMMAND = Command(
    name="validate",
    help="check every line against the schema; exit 1 on bad data",
    description="Check every line, run and file of a trace set against the schema.",
    epilog=_EPILOG,
    add_arguments=add_paths,
    run=_run,
)
