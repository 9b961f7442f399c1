"""``rollout-trace validate``: check every line and every run against the schema."""

from __future__ import annotations

import argparse

from .._analysis.validate import Validator
from .command import Command
from .common import add_paths, blocks

__all__ = ["COMMAND"]

_EPILOG = """\
examples:
  rollout-trace validate runs/*.jsonl
  rollout-trace validate trace.jsonl.gz && echo valid

Errors: lines that are not JSON, miss an envelope field or have a field of the
wrong type; a bad run_id; duplicate seqs; seq gaps; trace_closed counts that do
not add up. Warnings: a run without trace_closed (killed), a torn last line,
seq gaps that trace_closed accounts for as dropped or invalid. The rules: the
README, section Reference > Wire format, Lifecycle events and Rollout events.
Exit status: 0 no errors (warnings allowed), 1 errors, 2 wrong usage or a
missing file.
"""


def _run(args: argparse.Namespace) -> int:
    validator = Validator()
    files: set[str] = set()
    for path, events, lines in blocks(args.paths, validator.problem):
        files.add(path)
        validator.add(path, events, lines)
    findings = validator.finish()
    for f in sorted(findings, key=lambda f: (f.file, f.line or 0)):
        print(f)
    errors = sum(f.severity == "error" for f in findings)
    warnings = len(findings) - errors
    verdict = "valid" if not errors else "not valid"
    print(
        f"{verdict}: {validator.lines:,} lines, {len(validator.runs)} runs: "
        f"{errors} error(s), {warnings} warning(s)"
    )
    return 1 if errors else 0


COMMAND = Command(
    name="validate",
    help="check every line against the schema; exit 1 on bad data",
    description="Check every line and every run of a trace set against the schema.",
    epilog=_EPILOG,
    add_arguments=add_paths,
    run=_run,
)
