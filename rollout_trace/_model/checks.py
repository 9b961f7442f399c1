"""The checks behind ``rollout-trace validate``: every line, run and file, against the model.

The rules are the docs', Reference: Wire format, Lifecycle events and Rollout
events (Reference), and Instrumenting a controller. The set is read once: the
reader's bad lines come to ``Checker.problem``, its blocks to ``add``, which
gathers them with their lines (``runs.Collector``). ``finish`` then reads the
model of each run (``runs.normalize``, ``tries.pass_run``):

- the lines it keeps are the lines checked one at a time: the first line of
  each seq, and each version of a seq whose lines differ (an error naming the
  first line of the seq);
- a line whose seq its own file already held is a duplicate (an error); one
  whose seq another file held first is the same event read twice (a note for
  the run);
- the tries of each sibling give the attempt rules (``dispatch_breaks``).

The findings come in the order of the two-read validate they replace, which
users and tests know: line findings in the order read, a block at a time,
the bad lines reported before their block's events joined to it and sorted
by line with it (so that the bad lines of a file with no event after them go
with the next block); then the versions of seqs read twice, in the order
read; then per run (in the order first read) and per file.

Lines whose seq no tracer gives (``terms.usable``) are left out of the model;
they are settled here by the model's rule for copies (``LeftOut``), so that
their seqs, duplicates and line checks are reported, but they take no part
in the attempt rules.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple

import msgspec

from .._reading.reader import ReadProblem
from .._schema.decoding import UnknownEvent
from .._schema.events import (
    SCHEMA_VERSION,
    Event,
    SnapshotPublished,
    TraceClosed,
)
from .runs import Collector, RunEvents, normalize, settle
from .terms import (
    ABANDONED,
    CLOSED,
    DISPATCHED,
    END_OF_KIND,
    GROUP_RESERVED,
    OPENED,
    REFUSED,
    RESUMED,
    SEALED,
    SNAPSHOT,
    EndKind,
    is_attempt,
    kind_of,
)
from .tries import Tries, pass_run

__all__ = [
    "UNIX_MAX",
    "UNIX_MIN",
    "Checker",
    "Finding",
    "LeftOut",
    "Problem",
    "clock_of",
    "dispatch_breaks",
    "seq_gaps",
    "seq_ranges",
]

# --- the rules of one event (docs: Reference) --------------------------------------

# Unix seconds of a trace written this century: 2001-09-09 to the year 5138.
# Below is a monotonic clock or a time since start; above, milliseconds.
UNIX_MIN = 1e9
UNIX_MAX = 1e11

# The fields each event has that count from 0, and why (docs: Identity and
# Reference > Rollout events and Lifecycle events). A step, a turn or a weight
# version may be any integer: the docs give them no lower bound.
_FROM_ZERO: dict[int, tuple[tuple[str, str], ...]] = {
    GROUP_RESERVED: (("size", "how many generations the group has"),),
    CLOSED: tuple(
        (name, "a count of the run's events")
        for name in ("emitted", "written", "dropped", "invalid")
    ),
}
_SIBLING_FIELDS: tuple[tuple[str, str], ...] = (
    ("generation_index", "a sibling's slot in its group, from 0 to size - 1"),
    ("attempt", "a sibling's tries counted from 0"),
)

# The kinds ``line_problems`` has rules for, besides the attempt events
# (which break one only with a negative attempt or generation_index).
_CHECKED_KINDS = (GROUP_RESERVED, SNAPSHOT, OPENED, CLOSED)

Severity = Literal["error", "warning", "note"]


class Problem(NamedTuple):
    """One rule an event breaks: ``error`` or ``warning``, and what is wrong."""

    severity: Literal["error", "warning"]
    reason: str


def clock_of(t: float) -> str | None:
    """None for Unix seconds; else what the number looks like instead."""
    if t < UNIX_MIN:
        return "a monotonic clock or a time since start (before 2001)"
    if t > UNIX_MAX:
        return "milliseconds (after the year 5000 in seconds)"
    return None


def line_problems(ev: Any) -> list[Problem]:
    """What is wrong with one line's event on its own, whatever the rest of its run
    holds: a negative count or number, a ``trace_opened`` that is not seq 0, ...

    Only attempt events and those of ``_CHECKED_KINDS`` can have a problem here.
    """
    kind = kind_of(ev)
    attempt = is_attempt(kind)
    if not attempt and kind not in _CHECKED_KINDS:
        return []
    out: list[Problem] = []
    if kind == OPENED and ev.seq != 0:
        out.append(Problem("error", f"trace_opened has seq {ev.seq}; it must be seq 0"))
    for name, meaning in _SIBLING_FIELDS if attempt else _FROM_ZERO.get(kind, ()):
        value = getattr(ev, name)
        if value < 0:
            out.append(Problem("error", f"{name} {value} is negative; it is {meaning}, from 0"))
    if kind == CLOSED:
        for i, sink in enumerate(ev.sinks):
            if sink.written < 0:
                out.append(
                    Problem(
                        "error",
                        f"sinks[{i}].written {sink.written} is negative; it counts the lines "
                        f"sink {sink.uri!r} wrote, from 0",
                    )
                )
    elif kind == OPENED and ev.schema != SCHEMA_VERSION:
        out.append(
            Problem(
                "warning",
                f"trace_opened says schema {ev.schema!r}; this reader knows schema "
                f"{SCHEMA_VERSION} only and checks the run against it",
            )
        )
    elif kind == SNAPSHOT:
        out.extend(_captured_at_problems(ev))
    return out


def _captured_at_problems(ev: SnapshotPublished) -> list[Problem]:
    c = ev.captured_at
    if c < 0:
        return [Problem("error", f"captured_at {c!r} is negative; expected Unix seconds")]
    looks, time_looks = clock_of(c), clock_of(ev.time)
    if looks == time_looks:
        # Both on one clock: Unix seconds, or a tracer's own clock= that the
        # controller used for captured_at too; the figures compare them. A
        # snapshot is published once captured, so a later capture means the
        # clocks disagree; after the stop, a restore's cost cannot be judged.
        if c > ev.time:
            return [
                Problem(
                    "warning",
                    f"captured_at {c!r} is {c - ev.time:.3f} s after the event's time "
                    f"{ev.time!r}, though a snapshot is published after it is captured: is "
                    "the capturing host's clock ahead of the tracer's? The restore-cost "
                    "figures judge a stop against captured_at, and cannot where it is "
                    "after the stop",
                )
            ]
        return []
    said = f"looks like {looks}" if looks else "is Unix seconds"
    time_said = f"looks like {time_looks}" if time_looks else "is Unix seconds"
    return [
        Problem(
            "error",
            f"captured_at {c!r} {said} but the event's time {ev.time!r} {time_said}: "
            "captured_at is the wall-clock time in Unix seconds, on the clock of the "
            "event times, which the redone figure compares it with",
        )
    ]


# --- findings ---------------------------------------------------------------------


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


# --- the lines of a run, as the model settles them ---------------------------------

# Where a line is: its file (the collector's index: files in the order read) and line.
Place = tuple[int, int]


class LeftOut:
    """A run's lines that the model leaves out for their seq (``RunEvents.left_out``),
    settled by the model's own rule (``runs.normalize``): the same fields, seqs in a list."""

    __slots__ = (
        "copies",
        "events",
        "kind",
        "line",
        "other_file",
        "same_file",
        "seq",
        "src",
        "time",
        "versions",
    )

    def __init__(self, run: RunEvents) -> None:
        self.events: list[Any] = []
        self.seq: list[int] = []
        self.src: list[int] = []
        self.line: list[int] = []
        items = run.left_out
        evs = [ev for ev, _, _ in items]
        srcs = [s for _, s, _ in items]
        lines = [n for _, _, n in items]
        counts = RunEvents(run.run_id)
        order = sorted(range(len(evs)), key=lambda i: evs[i].seq)
        for seq, same in itertools.groupby(order, key=lambda i: evs[i].seq):
            group = list(same)
            if len(group) > 1:
                group = settle(counts, seq, group, evs, srcs, lines, base=len(self.events))
            for x in group:
                self.events.append(evs[x])
                self.seq.append(seq)
                self.src.append(srcs[x])
                self.line.append(lines[x])
        self.kind = bytes(map(kind_of, self.events))
        self.time = [ev.time for ev in self.events]
        self.copies = counts.copies
        self.same_file = counts.same_file
        self.other_file = counts.other_file
        self.versions = counts.versions


# What the line checks read of a run's settled lines: the same fields in either.
_Settled = RunEvents | LeftOut


def seq_ranges(ranges: Iterable[tuple[int, int]], *seqs: Iterable[int]) -> list[tuple[int, int]]:
    """``ranges`` (inclusive ``(lo, hi)``) and the seqs of ``seqs``, as ranges."""
    out: list[tuple[int, int]] = []
    every = itertools.chain(ranges, ((s, s) for s in itertools.chain(*seqs)))
    for lo, hi in sorted(every):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def seq_gaps(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The seqs missing from ``ranges`` (``seq_ranges``) between 0, where a tracer
    begins, and the highest, as ranges."""
    out = [(0, ranges[0][0] - 1)] if ranges and ranges[0][0] > 0 else []
    return out + [(a[1] + 1, b[0] - 1) for a, b in itertools.pairwise(ranges)]


class _Roles:
    """Of a run's settled lines: which kept ones are versions (with the first line of
    their seq), and which lines repeat a seq of their own file (with the seq)."""

    __slots__ = ("duplicates", "first", "line", "src", "versions")

    def __init__(self, run: _Settled) -> None:
        self.versions: dict[int, Place] = {}
        self.duplicates: list[tuple[Place, int]] = []
        src, line = run.src, run.line
        assert src is not None
        assert line is not None
        self.src, self.line = src, line
        seq = run.seq
        # The first line read of the run: a kept one (a copy comes after its own).
        self.first: Place | None = min(zip(src, line, strict=True), default=None)
        if not run.same_file and not run.versions:
            return  # copies in other files only (two sinks): each the same event again
        copies: dict[int, list[tuple[int, int, int]]] = {}
        for k, s, n in run.copies:
            copies.setdefault(seq[k], []).append((s, n, k))
        for s in sorted({*run.versions, *copies}):
            lo, hi = bisect.bisect_left(seq, s), bisect.bisect_right(seq, s)
            held = sorted([*((src[k], line[k], k) for k in range(lo, hi)), *copies.get(s, [])])
            head = held[0]
            for k in range(lo, hi):
                if k != head[2]:
                    self.versions[k] = (head[0], head[1])
            for before, this in itertools.pairwise(held):
                if this[0] == before[0]:
                    self.duplicates.append(((this[0], this[1]), s))

    def place_of(self, k: int) -> Place:
        return (self.src[k], self.line[k])


# --- the attempt rules, read off a run's tries -----------------------------------------

# The kind of the event that ends a try, by how it ends.
_END_EVENT = {int(end): kind for kind, end in END_OF_KIND.items()}


class _Events:
    """Which kept event is a try's start or end (the event index in the run)."""

    def __init__(self, run: RunEvents, tries: Tries) -> None:
        self.run, self.tries = run, tries

    def start(self, j: int) -> int:
        t = self.tries
        return self._find(j, t.start_seq, t.start_kind, t.start_kind[j])

    def end(self, j: int) -> int:
        t = self.tries
        return self._find(j, t.end_seq, t.end_kind, _END_EVENT[t.end_kind[j]])

    def _find(self, j: int, seqs: Sequence[int], codes: Sequence[int], kind: int) -> int:
        """The event of kind ``kind`` that is try ``j``'s at ``seqs[j]`` (its start's
        or its end's, as ``codes`` tells them)."""
        run, t = self.run, self.tries
        seq, code = seqs[j], codes[j]
        lo, hi = bisect.bisect_left(run.seq, seq), bisect.bisect_right(run.seq, seq)
        if hi - lo == 1:
            return lo

        def key_of(x: int) -> tuple[Any, int, int]:
            return (t.prompt_id[x], t.generation_index[x], t.attempt[x])

        def same(i: int) -> bool:
            ev = run.events[i]
            return run.kind[i] == kind and (ev.prompt_id, ev.generation_index, ev.attempt) == key

        # Versions of one seq: the n-th try with an event of this seq, kind and attempt
        # has the n-th such event (the pass takes them in the run's order).
        key = key_of(j)
        n = sum(1 for x in range(j) if seqs[x] == seq and codes[x] == code and key_of(x) == key)
        return [i for i in range(lo, hi) if same(i)][n]


class _Sibling:
    __slots__ = ("last", "started", "top", "top_try")

    def __init__(self) -> None:
        self.top = -1  # the highest attempt started, and its first try
        self.top_try = -1
        self.last: dict[int, int] = {}  # attempt -> its latest try
        self.started: dict[int, int] = {}  # attempt -> its latest try with a start


def dispatch_breaks(
    run: RunEvents, tries: Tries, place: Callable[[int], str]
) -> Iterator[tuple[int, str, Literal["error", "warning"], str]]:
    """Each dispatch that breaks the attempt rules (docs: Instrument your controller),
    read off the run's tries: the index of its event, the sibling, how badly, and why.

    ``place`` names an event (by index) for the messages, e.g. ``file:line``.
    A dispatch breaks them when the latest earlier start of its attempt was a
    resume (an error), when it supersedes an open try of its attempt (an
    error), when a higher attempt of its sibling started before it (an
    error), or when its attempt ended before it (a warning).
    """
    t = tries
    at = _Events(run, tries)
    siblings: dict[tuple[Any, int], _Sibling] = {}
    columns = zip(t.prompt_id, t.generation_index, t.attempt, t.start_kind, strict=True)
    for j, (prompt, gen, attempt, kind) in enumerate(columns):
        sib = siblings.get((prompt, gen))
        if sib is None:
            # A sibling's first try breaks no rule.
            sib = siblings[prompt, gen] = _Sibling()
        elif kind == DISPATCHED:
            found = _dispatch_break(attempt, sib, t, at, place)
            if found is not None:
                text = f"prompt_id {prompt!r}, generation_index {gen}"
                yield at.start(j), text, found[0], found[1]
        if kind:
            sib.started[attempt] = j
            if attempt > sib.top or sib.top_try < 0:
                sib.top, sib.top_try = attempt, j
        sib.last[attempt] = j


def _dispatch_break(
    attempt: int, sib: _Sibling, t: Tries, at: _Events, place: Callable[[int], str]
) -> tuple[Literal["error", "warning"], str] | None:
    """What is wrong with dispatching ``attempt`` now, if anything, and how badly."""
    started = sib.started.get(attempt, -1)
    last = sib.last.get(attempt, -1)
    if started >= 0 and t.start_kind[started] == RESUMED:
        return "error", (
            f"attempt {attempt} dispatched after attempt_resumed of the same attempt "
            f"(at {place(at.start(started))}); a resumed try goes on without a new dispatch, "
            "and one that starts over is abandoned (reason restart) and dispatched with the "
            "next number"
        )
    if last >= 0 and t.end_kind[last] == EndKind.SUPERSEDED:
        return "error", (
            f"attempt {attempt} dispatched again while it is open (at "
            f"{place(at.start(started))}, with no attempt_sealed, attempt_refused or "
            "attempt_abandoned since); expected the try to end first, and a retry to take the "
            "next number"
        )
    if sib.top_try >= 0 and sib.top > attempt:
        return "error", (
            f"attempt numbers go back: attempt {attempt} dispatched after attempt {sib.top} "
            f"started (at {place(at.start(sib.top_try))}); a retry takes the next number, "
            f"{sib.top + 1}"
        )
    if last >= 0:
        # A warning: a controller that numbers tries per group from 0 does this
        # when a later epoch reserves the same prompt again (the docs' own
        # example does), which only a new group_id tells apart from a reuse.
        return "warning", (
            f"attempt {attempt} dispatched again after it ended (at {place(at.end(last))}); "
            f"a retry takes the next number, {max(sib.top, attempt) + 1} (unless this is a new "
            "group of the same prompt, e.g. in a later epoch)"
        )
    return None


# --- the checker ---------------------------------------------------------------------

_RUN_ID = re.compile(r"[0-9a-f]{32}")
# Bad lines reported with no block since are given together, in line order, up to
# this many: the grouping of the line findings (see the module).
_PENDING_MAX = 4096


class _Run:
    """What the checks read of one run: its model, and what its lines say."""

    __slots__ = ("events", "file", "left_out", "off_clock", "off_clock_first", "run_id", "tries")

    def __init__(self, run_id: str, events: RunEvents, file: str) -> None:
        self.run_id = run_id
        self.events = events
        self.tries, _ = pass_run(events)
        self.left_out = LeftOut(events) if events.left_out else None
        self.file = file  # the first file it was read from
        self.off_clock = 0  # event times that are not Unix seconds
        self.off_clock_first: tuple[float, Place] | None = None  # the first read: time, place

    def views(self) -> list[_Settled]:
        return [self.events] if self.left_out is None else [self.events, self.left_out]

    def repeats(self) -> bool:
        """Whether a seq of the run was read more than once."""
        left = self.left_out
        return bool(self.events.repeats or (left and (left.copies or len(left.versions))))

    def read_twice(self) -> int:
        return sum(v.other_file for v in self.views())

    def conflicts(self) -> int:
        return sum(len(v.versions) for v in self.views())

    def opened(self) -> bool:
        return any(OPENED in v.kind for v in self.views())

    def closed(self) -> TraceClosed | None:
        """The highest-seq ``trace_closed``; of versions of one seq, the first in the
        model's order."""
        for view in reversed(self.views()):
            kinds = view.kind
            i = kinds.rfind(CLOSED)
            if i >= 0:
                first = kinds.index(CLOSED, bisect.bisect_left(view.seq, view.seq[i]))
                closed: TraceClosed = view.events[first]
                return closed
        return None


class Checker:
    """Feed it the reader's problems and blocks; ``finish`` gives the findings.

    Every finding goes to ``out``, in the order the module gives. ``files``
    are the trace set's files, so that one without a line is reported too.
    ``lines``, ``events`` and ``runs`` count what was read.
    """

    def __init__(self, files: Sequence[str], out: Callable[[Finding], None]) -> None:
        self._emit = out
        self.lines = 0
        self.events = 0
        self.runs = 0
        # Per file: lines read, events among them.
        self._files: dict[str, list[int]] = {f: [0, 0] for f in files}
        self._collector = Collector(lines=True)
        self._src: dict[str, int] = {}
        # The line findings' groups: a block closes one, and so do _PENDING_MAX
        # bad lines with no block since.
        self._group = 0
        self._since = 0
        self._problems: list[tuple[int, Finding]] = []  # (group, finding), as reported
        self._block_at: list[Place] = []  # where each block begins
        self._block_group: list[int] = []
        # Per run: the seqs of its bad lines (used, by the line reported).
        self._charged: dict[str, set[int]] = {}

    def _tally(self, path: str) -> list[int]:
        tally = self._files.get(path)
        if tally is None:
            tally = self._files[path] = [0, 0]
        return tally

    # --- the read ----------------------------------------------------------------------

    def problem(self, p: ReadProblem) -> None:
        """A bad line (the reader's ``problems``)."""
        # A killed writer's torn last line is what a reader must expect (docs:
        # Reference > Wire format), so it is a warning; any other undecodable line is an error.
        self.lines += 1
        self._tally(p.file)[0] += 1
        severity: Severity = "warning" if p.torn else "error"
        reason = f"torn last line: {p.reason}" if p.torn else p.reason
        finding = Finding(
            severity=severity, file=p.file, line=p.line, reason=reason, run_id=p.run_id
        )
        self._problems.append((self._group, finding))
        if p.run_id is not None and p.seq is not None:
            self._charged.setdefault(p.run_id, set()).add(p.seq)
        self._since += 1
        if self._since >= _PENDING_MAX:
            if not self._block_at:
                # No block yet, so nothing comes before these: give them now, and
                # a file that is no trace costs no memory.
                for f in sorted((f for _, f in self._problems), key=_line_of):
                    self._emit(f)
                self._problems.clear()
            self._group += 1
            self._since = 0

    def add(self, path: str, events: Sequence[Event | UnknownEvent], lines: Sequence[int]) -> None:
        """A block of events read from ``path``, and their lines."""
        if not events:
            self._group += 1
            self._since = 0
            return
        tally = self._tally(path)
        tally[0] += len(events)
        tally[1] += len(events)
        self.lines += len(events)
        self.events += len(events)
        self._collector.add(events, path, lines)
        src = self._src.get(path)
        if src is None:
            src = self._src[path] = self._collector.files.index(path)
        self._block_at.append((src, lines[0]))
        self._block_group.append(self._group)
        self._group += 1
        self._since = 0

    # --- the model, and the findings ----------------------------------------------------

    def finish(self) -> None:
        """Every finding, once every line is in."""
        collector = self._collector
        assert collector.lines is not None
        names = collector.files
        runs: list[_Run] = []
        first_read: dict[Place, list[Finding]] = {}
        second_read: dict[Place, list[Finding]] = {}
        for run_id, (evs, srcs) in collector.runs.items():
            model = normalize(run_id, evs, srcs, collector.lines[run_id])
            run = _Run(run_id, model, names[srcs[0]])
            runs.append(run)
            self._lines_of(run, names, first_read, second_read)
        collector.runs.clear()
        self.runs = len(runs)
        self._give_lines(runs, first_read, second_read)
        for run in runs:
            self._check_run(run, names)
        self._check_files()

    def _lines_of(
        self,
        run: _Run,
        names: list[str],
        first_read: dict[Place, list[Finding]],
        second_read: dict[Place, list[Finding]],
    ) -> None:
        """The line findings of a run: the first read's (its first line, the kept lines,
        the duplicates) and the versions'."""
        first: Place | None = None
        new_off: list[tuple[Place, float]] = []
        version_off: list[tuple[Place, float]] = []
        for view in run.views():
            roles = _Roles(view)
            if roles.first is not None and (first is None or roles.first < first):
                first = roles.first
            for (s, n), seq in roles.duplicates:
                first_read.setdefault((s, n), []).append(
                    _line_finding(
                        "error",
                        names[s],
                        n,
                        f"duplicate seq {seq} in run {run.run_id}: this file holds it "
                        "already; a seq is used once in a run",
                    )
                )
            for k, head in roles.versions.items():
                ev = view.events[k]
                at = roles.place_of(k)
                second_read[at] = [
                    _line_finding(
                        "error",
                        names[at[0]],
                        at[1],
                        f"run {run.run_id}, seq {ev.seq}: this {_tag(ev)} differs from the line "
                        f"at {names[head[0]]}:{head[1]} with the same run_id and seq (a "
                        "conflicting copy: an edited copy, a file torn and written again, or "
                        "two writers with one run_id); a seq is used once in a run, and every "
                        "copy of a line must be the same",
                    )
                ]
            for k in _to_check(view, run.tries):
                at = roles.place_of(k)
                found = line_problems(view.events[k])
                if found:
                    into = second_read if k in roles.versions else first_read
                    into.setdefault(at, []).extend(
                        _line_finding(p.severity, names[at[0]], at[1], p.reason) for p in found
                    )
            times = view.time
            if times and (min(times) < UNIX_MIN or max(times) > UNIX_MAX):
                for k, t in enumerate(times):
                    if not UNIX_MIN <= t <= UNIX_MAX:
                        off = version_off if k in roles.versions else new_off
                        off.append((roles.place_of(k), t))
        if first is not None and not _RUN_ID.fullmatch(run.run_id):
            first_read.setdefault(first, []).insert(
                0,
                _line_finding(
                    "error",
                    names[first[0]],
                    first[1],
                    f"run_id {run.run_id!r} is not 32 lowercase hex chars",
                ),
            )
        run.off_clock = len(new_off) + len(version_off)
        if run.off_clock:
            at, t = min(new_off or version_off)
            run.off_clock_first = (t, at)

    def _give_lines(
        self,
        runs: list[_Run],
        first_read: dict[Place, list[Finding]],
        second_read: dict[Place, list[Finding]],
    ) -> None:
        """The line findings, in the order of the module: the groups of the first read,
        then the versions (the bad lines after the last block with the first of them)."""
        blocks, groups = self._block_at, self._block_group
        keyed: list[tuple[int, int, int, int, Finding]] = []
        late: list[Finding] = []
        for order, (group, f) in enumerate(self._problems):
            if group == self._group:
                late.append(f)
            else:
                keyed.append((group, _line_of(f), 0, order, f))
        self._problems.clear()
        for at, found in first_read.items():
            group = groups[bisect.bisect_right(blocks, at) - 1]
            keyed.extend((group, at[1], 1, k, f) for k, f in enumerate(found))
        keyed.sort(key=lambda x: x[:4])
        for *_, f in keyed:
            self._emit(f)
        again = [r for r in runs if r.repeats()]
        if not again:
            for f in sorted(late, key=_line_of):
                self._emit(f)
            return
        # The second read began with the first block of the first file holding a
        # run read twice: the bad lines left over went with that block's versions.
        src = min(s for r in again for s in r.events.sources if s >= 0)
        b = bisect.bisect_left(blocks, (src, -1))
        end = blocks[b + 1][1] if b + 1 < len(blocks) and blocks[b + 1][0] == src else None

        def in_head(at: Place) -> bool:
            return at[0] == src and (end is None or at[1] < end)

        versions = sorted(second_read.items())
        head = [(_line_of(f), 0, f) for f in late]
        head += [(at[1], 1, f) for at, found in versions if in_head(at) for f in found]
        head.sort(key=lambda x: x[:2])
        for *_, f in head:
            self._emit(f)
        for at, found in versions:
            if not in_head(at):
                for f in found:
                    self._emit(f)

    def _check_run(self, run: _Run, names: list[str]) -> None:
        def say(severity: Severity, reason: str) -> None:
            self._emit(
                Finding(
                    severity=severity, file=run.file, line=None, reason=reason, run_id=run.run_id
                )
            )

        if not run.opened():
            say("error", "no trace_opened (seq 0)")
        left = run.left_out
        ranges = seq_ranges(
            run.events.ranges(),
            left.seq if left else (),
            self._charged.get(run.run_id, ()),
        )
        gaps = seq_gaps(ranges)
        missing = sum(hi - lo + 1 for lo, hi in gaps)
        closed = run.closed()
        if closed is None:
            say("warning", "no trace_closed: the run was killed or crashed")
        else:
            self._check_counts(run, closed, ranges, say)
        if gaps:
            shown = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in gaps[:10])
            more = f" and {len(gaps) - 10} more ranges" if len(gaps) > 10 else ""
            text = f"seq gap: {missing} seq(s) missing ({shown}{more})"
            if closed is not None and missing == closed.dropped + closed.invalid:
                say("warning", f"{text}, as many as trace_closed counts dropped + invalid")
            else:
                say("error", text)
        if run.off_clock_first is not None:
            # A warning, not an error: the docs let a tracer take another
            # clock (`clock=`); but then no time of the run is a date.
            t, (s, n) = run.off_clock_first
            say(
                "warning",
                f"{run.off_clock:,} event time(s) are not Unix seconds, e.g. {t!r} at "
                f"{names[s]}:{n}, which looks like {clock_of(t)}; expected Unix seconds "
                "(1e9 to 1e11) unless the tracer was given such a clock=",
            )
        read_twice = run.read_twice()
        if read_twice:
            differ = run.conflicts()
            but = f", but for the lines of {differ:,} seq(s) that differ (errors)" if differ else ""
            say(
                "note",
                f"read from {len(run.events.sources)} files: {read_twice:,} line(s) were events "
                "read already from another file (the same run read twice, e.g. by two file "
                f"sinks) and count once{but}",
            )
        self._check_attempts(run, names)

    def _check_attempts(self, run: _Run, names: list[str]) -> None:
        model = run.events
        if not len(run.tries):
            return
        src, line = model.src, model.line
        assert src is not None
        assert line is not None

        def place(i: int) -> str:
            return f"{names[src[i]]}:{line[i]}"

        breaks = [
            ((src[i], line[i]), sibling, severity, reason)
            for i, sibling, severity, reason in dispatch_breaks(model, run.tries, place)
        ]
        for (s, n), sibling, severity, reason in sorted(breaks):
            self._emit(
                Finding(
                    severity=severity,
                    file=names[s],
                    line=n,
                    reason=f"run {run.run_id}, sibling ({sibling}): {reason}",
                    run_id=run.run_id,
                )
            )

    @staticmethod
    def _check_counts(
        run: _Run,
        closed: TraceClosed,
        ranges: list[tuple[int, int]],
        say: Callable[[Severity, str], None],
    ) -> None:
        c = closed
        if c.emitted != c.written + c.dropped + c.invalid:
            say(
                "error",
                f"trace_closed counts do not add up: emitted={c.emitted} but "
                f"written + dropped + invalid = {c.written + c.dropped + c.invalid}",
            )
        top = ranges[-1][1]
        if top > c.seq:
            say("error", f"events after trace_closed (seq {c.seq}), up to seq {top}")
        lifecycle = run.opened() + 1
        held = sum(hi - lo + 1 for lo, hi in ranges) - lifecycle
        if held != c.written:
            say(
                "error",
                f"trace_closed says written={c.written} but the trace set holds {held} "
                "of the run's events (a sink failed, or a file is missing)",
            )

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


def _line_finding(severity: Severity, file: str, line: int, reason: str) -> Finding:
    return Finding(severity=severity, file=file, line=line, reason=reason)


def _line_of(f: Finding) -> int:
    return f.line or 0


def _to_check(view: _Settled, tries: Tries) -> list[int]:
    """The kept events a line rule may apply to: ``_CHECKED_KINDS`` ones, and attempt events
    where one has a negative number (``tries``: the run's)."""
    if not isinstance(view, RunEvents):
        return list(range(len(view.events)))
    codes = list(_CHECKED_KINDS)
    if min(tries.attempt, default=0) < 0 or min(tries.generation_index, default=0) < 0:
        codes += [DISPATCHED, RESUMED, SEALED, REFUSED, ABANDONED]
    kinds = view.kind
    out = []
    for code in codes:
        i = kinds.find(code)
        while i >= 0:
            out.append(i)
            i = kinds.find(code, i + 1)
    return sorted(out)


def _tag(ev: Event | UnknownEvent) -> str:
    if isinstance(ev, UnknownEvent):
        return ev.event
    tag = type(ev).__struct_config__.tag
    return tag if isinstance(tag, str) else type(ev).__name__
