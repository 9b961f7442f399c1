"""The checks behind ``rollout-trace validate``: every line and run against the README's Reference.

The rules are those of its sections Wire format, Lifecycle events and Rollout events.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from .._reading.reader import ReadProblem
from .._schema.decoding import UnknownEvent
from .._schema.events import Event, TraceClosed, TraceOpened
from .runstats import RunStats

__all__ = ["Finding", "Validator"]

_RUN_ID = re.compile(r"[0-9a-f]{32}")

Severity = Literal["error", "warning"]
_Say = Callable[[Severity, str], None]


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with a trace set; ``line`` is None for a whole-run finding."""

    severity: Severity
    file: str
    line: int | None
    reason: str
    run_id: str | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        run = f"run {self.run_id}: " if self.run_id and self.line is None else ""
        return f"{where}: {self.severity}: {run}{self.reason}"


class Validator:
    """Feed it the reader's problems and located events; ``finish`` gives the findings."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.runs: dict[str, RunStats] = {}
        self.lines = 0
        self._problems: list[ReadProblem] = []

    def problem(self, p: ReadProblem) -> None:
        # A killed writer's torn last line is what a reader must expect (README:
        # Reference > Wire format), so it is a warning; any other undecodable line is an error.
        self.lines += 1
        self._problems.append(p)
        severity: Severity = "warning" if p.torn else "error"
        reason = f"torn last line: {p.reason}" if p.torn else p.reason
        self.findings.append(
            Finding(severity=severity, file=p.file, line=p.line, reason=reason, run_id=p.run_id)
        )

    def add(self, path: str, events: Sequence[Event | UnknownEvent], lines: Sequence[int]) -> None:
        self.lines += len(events)
        runs = self.runs
        for ev, line in zip(events, lines, strict=True):
            run_id = ev.run_id
            stats = runs.get(run_id)
            if stats is None:
                stats = runs[run_id] = RunStats(run_id)
                if not _RUN_ID.fullmatch(run_id):
                    self._error(path, line, f"run_id {run_id!r} is not 32 lowercase hex chars")
            stats.files[path] = None
            if ev.seq < 0:
                self._error(path, line, f"seq {ev.seq} is negative; seqs count from 0")
            if not stats.add(ev):
                self._error(path, line, f"duplicate seq {ev.seq} in run {run_id}")
            if isinstance(ev, TraceOpened) and ev.seq != 0:
                self._error(path, line, f"trace_opened has seq {ev.seq}; it must be seq 0")

    def _error(self, path: str, line: int, reason: str) -> None:
        self.findings.append(Finding(severity="error", file=path, line=line, reason=reason))

    def finish(self) -> list[Finding]:
        # Bad lines are charged to their runs only now: the reader reports a
        # line before the events of its block reach `add`.
        for p in self._problems:
            stats = self.runs.get(p.run_id) if p.run_id is not None else None
            if stats is None:
                continue
            if p.seq is not None:
                stats.seqs.add(p.seq)  # the seq was used, by the line reported
            if p.torn:
                stats.torn_lines += 1
            else:
                stats.invalid_lines += 1
        for stats in self.runs.values():
            self._check_run(stats)
        return self.findings

    def _check_run(self, stats: RunStats) -> None:
        file = next(iter(stats.files))

        def say(severity: Severity, reason: str) -> None:
            self.findings.append(
                Finding(severity=severity, file=file, line=None, reason=reason, run_id=stats.run_id)
            )

        if stats.opened is None:
            say("error", "no trace_opened (seq 0)")
        closed = stats.closed
        gaps = stats.seqs.gaps()
        missing = sum(hi - lo + 1 for lo, hi in gaps)
        if closed is None:
            say("warning", "no trace_closed: the run was killed or crashed")
        else:
            self._check_counts(stats, closed, say)
        if gaps:
            shown = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in gaps[:10])
            more = f" and {len(gaps) - 10} more ranges" if len(gaps) > 10 else ""
            text = f"seq gap: {missing} seq(s) missing ({shown}{more})"
            if closed is not None and missing == closed.dropped + closed.invalid:
                say("warning", f"{text}, as many as trace_closed counts dropped + invalid")
            else:
                say("error", text)

    @staticmethod
    def _check_counts(stats: RunStats, closed: TraceClosed, say: _Say) -> None:
        c = closed
        if c.emitted != c.written + c.dropped + c.invalid:
            say(
                "error",
                f"trace_closed counts do not add up: emitted={c.emitted} but "
                f"written + dropped + invalid = {c.written + c.dropped + c.invalid}",
            )
        if stats.seqs.max > c.seq:
            say("error", f"events after trace_closed (seq {c.seq}), up to seq {stats.seqs.max}")
        lifecycle = (stats.opened is not None) + 1
        held = stats.seqs.count - lifecycle
        if held != c.written:
            say(
                "error",
                f"trace_closed says written={c.written} but the trace set holds {held} "
                "of the run's events (a sink failed, or a file is missing)",
            )
