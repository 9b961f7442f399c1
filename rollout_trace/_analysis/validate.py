"""The checks behind ``rollout-trace validate``: every line, run and file against the README.

The rules are those of its sections Wire format, Lifecycle events and Rollout
events (Reference), and Instrumenting a controller. Findings about single
lines are given as the lines are read, a block at a time, so that memory does
not grow with the bad lines of a file that is no trace at all; findings about
runs, their attempts and whole files come at the end, once every line is in
(lines and files may come in any order).

Lines whose ``(run_id, seq)`` was seen already are compared on a second read
of the files that hold them (``compare``): a line that differs from those
before it with its seq (a conflicting copy) is an error, and is checked as
a line of its own, so that the findings do not depend on which came first.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from .._reading.lean import ATTEMPT_KIND
from .._reading.reader import ReadProblem
from .._schema.decoding import UnknownEvent
from .._schema.events import Event, TraceClosed, TraceOpened
from .copies import VERSION, CopyCheck
from .protocol import (
    CHECKED,
    UNIX_MAX,
    UNIX_MIN,
    AttemptLog,
    clock_of,
    event_problems,
    split_where,
    where_of,
)
from .runstats import DUPLICATE, RunStats
from .seqs import SeqSet

__all__ = ["Finding", "Validator"]

_RUN_ID = re.compile(r"[0-9a-f]{32}")
# Line findings wait for the rest of their block (to be given in line order)
# up to this many.
_PENDING_MAX = 4096

# "note": something worth knowing that is not wrong (a run read from two sinks).
Severity = Literal["error", "warning", "note"]
_Say = Callable[[Severity, str], None]


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with a trace set; ``line`` is None for a whole-run or whole-file finding."""

    severity: Severity
    file: str
    line: int | None
    reason: str
    run_id: str | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        run = f"run {self.run_id}: " if self.run_id and self.line is None else ""
        return f"{where}: {self.severity}: {run}{self.reason}"


class _Run:
    """What the checks keep of one run."""

    __slots__ = ("attempts", "off_clock", "off_clock_first", "stats")

    def __init__(self, run_id: str) -> None:
        self.stats = RunStats(run_id)
        self.attempts = AttemptLog()
        self.off_clock = 0  # event times that are not Unix seconds
        self.off_clock_first: tuple[float, int] | None = None  # the first: time, place


class Validator:
    """Feed it the reader's problems and located events; ``finish`` gives the rest.

    Every finding goes to ``out`` as it is made (default: ``findings``).
    ``files`` are the trace set's files, so that one without a line is
    reported too.
    """

    def __init__(
        self, files: Sequence[str] = (), out: Callable[[Finding], None] | None = None
    ) -> None:
        self.findings: list[Finding] = []
        self._out = self.findings.append if out is None else out
        self.errors = 0
        self.warnings = 0
        self.notes = 0
        self.runs: dict[str, _Run] = {}
        self.lines = 0
        self.events = 0
        # Per file: lines read, events among them.
        self._files: dict[str, list[int]] = {}
        self._index: dict[str, int] = {}
        self._names: list[str] = []
        self._pending: list[Finding] = []
        # Bad lines that name a run, charged to it at the end (the reader
        # reports a line before the events of its block reach `add`): how
        # many per run and kind (torn or not), and the seqs they name.
        self._charges: Counter[tuple[str, bool]] = Counter()
        self._charged_seqs: dict[str, SeqSet] = {}
        for f in files:
            self._tally(f)

    def _tally(self, path: str) -> list[int]:
        tally = self._files.get(path)
        if tally is None:
            tally = self._files[path] = [0, 0]
            self._index[path] = len(self._names)
            self._names.append(path)
        return tally

    def _place(self, where: int) -> str:
        index, line = split_where(where)
        return f"{self._names[index]}:{line}"

    def _emit(self, finding: Finding) -> None:
        if finding.severity == "error":
            self.errors += 1
        elif finding.severity == "warning":
            self.warnings += 1
        else:
            self.notes += 1
        self._out(finding)

    def _flush(self) -> None:
        pending = self._pending
        pending.sort(key=lambda f: f.line or 0)
        for f in pending:
            self._emit(f)
        pending.clear()

    def problem(self, p: ReadProblem) -> None:
        # A killed writer's torn last line is what a reader must expect (README:
        # Reference > Wire format), so it is a warning; any other undecodable line is an error.
        self.lines += 1
        self._tally(p.file)[0] += 1
        severity: Severity = "warning" if p.torn else "error"
        reason = f"torn last line: {p.reason}" if p.torn else p.reason
        self._pending.append(
            Finding(severity=severity, file=p.file, line=p.line, reason=reason, run_id=p.run_id)
        )
        if p.run_id is not None:
            self._charges[p.run_id, p.torn] += 1
            if p.seq is not None:
                seqs = self._charged_seqs.get(p.run_id)
                if seqs is None:
                    seqs = self._charged_seqs[p.run_id] = SeqSet()
                seqs.add(p.seq)
        if len(self._pending) >= _PENDING_MAX:
            self._flush()

    def add(self, path: str, events: Sequence[Event | UnknownEvent], lines: Sequence[int]) -> None:
        tally = self._tally(path)
        tally[0] += len(events)
        tally[1] += len(events)
        self.lines += len(events)
        self.events += len(events)
        base = where_of(self._index[path], 0)  # | line: the place of a line
        runs = self.runs
        for ev, line in zip(events, lines, strict=True):
            run_id = ev.run_id
            run = runs.get(run_id)
            if run is None:
                run = runs[run_id] = _Run(run_id)
                if not _RUN_ID.fullmatch(run_id):
                    self._error(path, line, f"run_id {run_id!r} is not 32 lowercase hex chars")
            status = run.stats.add(ev, path)
            if status:
                if status == DUPLICATE:
                    self._error(
                        path,
                        line,
                        f"duplicate seq {ev.seq} in run {run_id}: this file holds it already; "
                        "a seq is used once in a run",
                    )
                continue  # a COPY: the same event, read from another file too
            self._check_line(run, ev, path, line, base)
        self._flush()

    def _check_line(
        self, run: _Run, ev: Event | UnknownEvent, path: str, line: int, base: int
    ) -> None:
        cls = type(ev)
        kind = ATTEMPT_KIND.get(cls)
        if kind is not None:
            if ev.attempt < 0 or ev.generation_index < 0:  # type: ignore[union-attr]
                self._problems_of(ev, path, line)
            run.attempts.add(kind, ev, base | line)
        elif cls in CHECKED:
            if cls is TraceOpened and ev.seq != 0:
                self._error(path, line, f"trace_opened has seq {ev.seq}; it must be seq 0")
            self._problems_of(ev, path, line)
        t = ev.time
        if not UNIX_MIN <= t <= UNIX_MAX:
            run.off_clock += 1
            if run.off_clock_first is None:
                run.off_clock_first = (t, base | line)

    # --- the second read: lines that share a seq, compared ----------------------

    def copy_check(self) -> tuple[CopyCheck, list[str]] | None:
        """What to compare on a second read and the files to read; None: no seq seen twice."""
        again = {
            run_id: seqs for run_id, r in self.runs.items() if (seqs := r.stats.again) is not None
        }
        if not again:
            return None
        wanted = {f for run_id in again for f in self.runs[run_id].stats.files}
        return CopyCheck(again, places=True), [f for f in self._names if f in wanted]

    def compare(
        self,
        check: CopyCheck,
        path: str,
        events: Sequence[Event | UnknownEvent],
        lines: Sequence[int],
    ) -> None:
        """A block of the second read: each line that differs from those before it with its seq."""
        base = where_of(self._index[path], 0)
        for ev, line in zip(events, lines, strict=True):
            if check.check(ev, base | line) != VERSION:
                continue
            run = self.runs[ev.run_id]
            run.stats.add_version(ev)
            self._error(
                path,
                line,
                f"run {ev.run_id}, seq {ev.seq}: this {_tag(ev)} differs from the line at "
                f"{self._place(check.first_place(ev))} with the same run_id and seq (a "
                "conflicting copy: an edited copy, a file torn and written again, or two "
                "writers with one run_id); a seq is used once in a run, and every copy of a "
                "line must be the same",
            )
            self._check_line(run, ev, path, line, base)
        self._flush()
        for run_id, conflicts in check.conflicts().items():
            self.runs[run_id].stats.conflicts = conflicts

    def _problems_of(self, ev: Event | UnknownEvent, path: str, line: int) -> None:
        for severity, reason in event_problems(ev):
            self._pending.append(Finding(severity=severity, file=path, line=line, reason=reason))

    def _error(self, path: str, line: int, reason: str) -> None:
        self._pending.append(Finding(severity="error", file=path, line=line, reason=reason))

    def finish(self) -> None:
        """The findings about runs and files, once every line is in."""
        self._flush()
        for (run_id, torn), n in self._charges.items():
            run = self.runs.get(run_id)
            if run is None:
                continue
            if torn:
                run.stats.torn_lines += n
            else:
                run.stats.invalid_lines += n
        for run_id, charged in self._charged_seqs.items():
            run = self.runs.get(run_id)
            if run is not None:
                for lo, hi in charged.ranges():
                    for seq in range(lo, hi + 1):
                        run.stats.seqs.add(seq)  # the seq was used, by the line reported
        self._charges.clear()
        self._charged_seqs.clear()
        for run in self.runs.values():
            self._check_run(run)
        self._check_files()

    def _check_files(self) -> None:
        # A file none of whose lines is an event is no trace (plain text, a
        # binary, a file of NULs); an empty one is no trace either unless
        # others in the set hold one (a sink that opened, then its process died).
        for path, (lines, events) in self._files.items():
            if events:
                continue
            if lines:
                self._emit(
                    Finding(
                        severity="error",
                        file=path,
                        line=None,
                        reason=f"not a trace: none of its {lines:,} line(s) is an event",
                    )
                )
            else:
                severity: Severity = "warning" if self.events else "error"
                self._emit(
                    Finding(severity=severity, file=path, line=None, reason="empty file: no line")
                )

    def _check_run(self, run: _Run) -> None:
        stats = run.stats
        file = next(iter(stats.files))

        def say(severity: Severity, reason: str) -> None:
            self._emit(
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
        if run.off_clock_first is not None:
            # A warning, not an error: the README lets a tracer take another
            # clock (`clock=`); but then no time of the run is a date.
            t, where = run.off_clock_first
            say(
                "warning",
                f"{run.off_clock:,} event time(s) are not Unix seconds, e.g. {t!r} at "
                f"{self._place(where)}, which looks like {clock_of(t)}; expected Unix seconds "
                "(1e9 to 1e11) unless the tracer was given such a clock=",
            )
        if stats.read_twice:
            differ = stats.conflicts.count
            but = f", but for the lines of {differ:,} seq(s) that differ (errors)" if differ else ""
            say(
                "note",
                f"read from {len(stats.files)} files: {stats.read_twice:,} line(s) were events "
                "read already from another file (the same run read twice, e.g. by two file "
                f"sinks) and count once{but}",
            )
        breaks = sorted(run.attempts.check(self._place, ties=stats.again is not None))
        for where, sibling, severity, reason in breaks:
            index, line = split_where(where)
            self._emit(
                Finding(
                    severity="error" if severity == "error" else "warning",
                    file=self._names[index],
                    line=line,
                    reason=f"run {stats.run_id}, sibling ({sibling}): {reason}",
                    run_id=stats.run_id,
                )
            )

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


def _tag(ev: Event | UnknownEvent) -> str:
    if isinstance(ev, UnknownEvent):
        return ev.event
    tag = type(ev).__struct_config__.tag
    return tag if isinstance(tag, str) else type(ev).__name__
