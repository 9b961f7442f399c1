"""``rollout-trace validate``: check every line, run and file against the schema."""

from __future__ import annotations

import argparse

import msgspec

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
attempt of the same sibling started; a file none of whose lines is an event
(one finding for the whole file, naming its first bad line).
Warnings: a run without trace_closed (killed), a torn last line, seq gaps that
trace_closed accounts for as dropped or invalid, an unknown schema version,
times that are not Unix seconds, a captured_at later than its line's time, an
empty file. Notes: a run read from two
files (two sinks, a copy), counted once; but two lines of one run_id and seq
that differ (a conflicting copy, in one file or two) are an error. Each file is
read once; lines and files may come in any order. The rules: the docs,
section Reference > Wire format, Lifecycle events and Rollout events, and
section Instrumenting a controller.
Exit status: 0 no errors (warnings allowed), 1 errors or not a trace at all,
2 wrong usage or a missing file.
"""


# The most line findings held for one file before it shows an event; past
# that they are counted, and said in one finding if the file turns out a trace.
_HELD_MAX = 4096


class _Said:
    """Prints the findings, and counts what it printed.

    A file's line findings are held until the file shows an event: a file
    that holds none (the log of another program, say) is no trace, and gets
    one finding for the whole file instead of one a line.
    """

    def __init__(self) -> None:
        self.errors = 0
        self.warnings = 0
        self.notes = 0
        self._traces: set[str] = set()
        self._held: dict[str, list[Finding]] = {}
        # Per file that held too many: its first event's line, and the line
        # findings before it not listed.
        self._overflow: dict[str, list[int]] = {}

    def finding(self, f: Finding) -> None:
        over = self._overflow.get(f.file)
        if f.line is not None and over is not None and f.line < over[0]:
            over[1] += 1
            return
        if f.file not in self._traces:
            if f.line is not None:
                held = self._held.setdefault(f.file, [])
                if len(held) < _HELD_MAX:
                    held.append(f)
                else:
                    self._overflow.setdefault(f.file, [0, 0])[1] += 1
                return
            held = self._held.pop(f.file, [])
            self._overflow.pop(f.file, None)
            if held:  # the verdict on a file without an event: name its first bad line
                first = held[0]
                f = msgspec.structs.replace(
                    f, reason=f"{f.reason}; line {first.line}: {first.reason}"
                )
        self._print(f)

    def is_a_trace(self, path: str, first_line: int) -> None:
        """``path`` holds an event, the first at ``first_line``: its findings are its own."""
        if path in self._traces:
            return
        self._traces.add(path)
        for f in self._held.pop(path, []):
            self._print(f)
        over = self._overflow.get(path)
        if over is not None:
            over[0] = first_line

    def rest(self) -> None:
        """What is still held (nothing, once the checker judged every file), and
        the bad lines not listed before a file's first event."""
        for path in list(self._held):
            self.is_a_trace(path, 0)
        for path, (first_line, unlisted) in self._overflow.items():
            self._print(
                Finding(
                    severity="error",
                    file=path,
                    line=None,
                    reason=f"{unlisted:,} more lines before its first event (line "
                    f"{first_line:,}) are no events either; not listed one by one",
                )
            )
        self._overflow.clear()

    def _print(self, f: Finding) -> None:
        if f.severity == "error":
            self.errors += 1
        elif f.severity == "warning":
            self.warnings += 1
        else:
            self.notes += 1
        print(f)


def verdict(said: _Said, v: Checker, files: int) -> str:
    """The last line: valid or not, and the counts it rests on."""
    counts = f"{said.errors} error(s), {said.warnings} warning(s)"
    if said.notes:
        counts += f", {said.notes} note(s)"
    if not v.events:
        if not v.lines:
            return f"not valid: not a trace: the {files} file(s) hold no line: {counts}"
        return (
            f"not valid: not a trace: no line of the {files} file(s) is an event "
            f"({v.lines:,} line(s)): {counts}"
        )
    ok = "valid" if not said.errors else "not valid"
    return f"{ok}: {v.lines:,} lines, {v.runs} runs: {counts}"


def _run(args: argparse.Namespace) -> int:
    files = trace_files(args.paths)
    said = _Said()
    checker = Checker(files, out=said.finding)
    # Millions of small acyclic records: the cyclic collector would walk them
    # all, again and again, for nothing.
    with gc_paused():
        for path, events, lines in blocks(files, checker.problem):
            if events:
                said.is_a_trace(path, lines[0])
            checker.add(path, events, lines)
        checker.finish()
    said.rest()
    print(verdict(said, checker, len(files)))
    return 1 if said.errors or not checker.events else 0


COMMAND = Command(
    name="validate",
    help="check every line against the schema; exit 1 on bad data",
    description="Check every line, run and file of a trace set against the schema.",
    epilog=_EPILOG,
    add_arguments=add_paths,
    run=_run,
)
