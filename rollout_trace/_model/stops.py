"""The restore-cost rules, once: stops, each sibling's class at a stop, figures, notes.

The rules are the docs' (Reference > Restore-cost figures).

``stops_of`` walks the runs in the run order: a run whose first rollout
event is ``restore_started`` is a stop of the latest earlier run with rollout
events (an orphan stop when there is none). ``classify`` is the one place
that decides what a stop did to each sibling of the stopped run; the figures
(``cost_of``), the notes (``stop_notes``), the fates of tries
(``StopClasses.fates``) and the uses that a restore carries on
(``StopClasses.kept``) are all read off its answer, so they cannot disagree.

A stop is judged against the state the restored run got back, captured at C
(``captured``), not against the state at the stop. Per sibling, T is the
stopped run's last started try of it, t0 its start and t1 its seal, or the
stop time when T is open at the stop:

- T abandoned or refused, or sealed at or before C: counted nowhere (a seal
  at or before C is in the restored state: it is *kept*);
- B resumes the sibling (an ``attempt_resumed`` anywhere in B): ``resumed``,
  losing ``t1 - max(t0, C)``, what A did after the capture;
- else T open at the stop: ``restarted``, losing ``stop_time - t0``;
- else (sealed after C): ``redone``, losing ``t1 - t0``.

With C unknown only the open siblings can be classed; every figure that
needs C is None with the reason. So it is with a C later than the stop (a
capturing host's clock ahead, or C not in seconds): no work of A comes after
such a capture, and taken as given it would make lost times negative; it is
noted (``captured_after_stop``), as is a C later than the line that published
it (``captured_after_published``), which the figures take as given. Sums are
correctly rounded (``math.fsum``); a figure that is not finite is None, with
the reason.

``step_versions`` is the one place that says which weight version a step is
judged against (the staleness of ``report`` and the ``steps`` table).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from array import array
from collections.abc import Iterator, Sequence
from itertools import compress
from typing import Any, NamedTuple

import msgspec

from .checks import seq_ranges
from .runs import RunEvents
from .terms import (
    CHECKPOINT,
    DISPATCHED,
    END_ABANDONED,
    END_OPEN,
    END_REFUSED,
    END_SEALED,
    OPEN_FLAGS,
    RESTORE_FINISHED,
    RESTORE_STARTED,
    RESUMED,
    SNAPSHOT,
    STEP,
    WEIGHTS,
)
from .tries import Run

__all__ = [
    "CLASSES",
    "FIGURES",
    "Capture",
    "FIGURE_ROWS",
    "Counted",
    "Note",
    "StopClasses",
    "StopCost",
    "classify",
    "cost_of",
    "captured",
    "orphan_cost",
    "run_notes",
    "step_versions",
    "stops_of",
    "stop_notes",
]

# The classes a stop counts a sibling in, each the name of the figure that counts it.
CLASSES = ("resumed", "restarted", "redone")

FIGURES = (
    "stop_time",
    "downtime_s",
    "restore_s",
    "restored_step",
    "captured_at",
    "in_flight",
    "resumed",
    "resumed_s",
    "restarted",
    "thrown_away_s",
    "redone",
    "redone_s",
    "lost_s",
    "lost_steps",
    "lost_steps_s",
)

# figure -> (unit, what it is), in the order of ``FIGURES`` (the docs'
# Reference > Restore-cost figures): the rows of ``rollout-trace cost`` and of
# the timeline page's stop cards.
FIGURE_ROWS: dict[str, tuple[str, str]] = {
    "stop_time": ("", "last event of the stopped run"),
    "downtime_s": ("s", "stop to restore_started"),
    "restore_s": ("s", "restore_started to restore_finished"),
    "restored_step": ("step", "step of what was restored"),
    "captured_at": ("", "when the restored state was captured"),
    "in_flight": ("siblings", "open tries at the stop"),
    "resumed": ("siblings", "resumed by the restored run: open, or sealed after the capture"),
    "resumed_s": ("s", "work of the resumed tries after the capture"),
    "restarted": ("siblings", "open at the stop, started over"),
    "thrown_away_s": ("s", "work of the restarted tries"),
    "redone": ("siblings", "sealed after the capture, not resumed: done again"),
    "redone_s": ("s", "work of the redone tries"),
    "lost_s": ("s", "resumed_s + thrown_away_s + redone_s"),
    "lost_steps": ("steps", "trained after the restored step"),
    "lost_steps_s": ("s", "stop minus the last kept step"),
}


class Note(msgspec.Struct, frozen=True, kw_only=True):
    """Something about a trace set that bears on its figures without making one n/a.

    ``kind`` names the case (``read_twice``, ``bad_seq``, ``restore_not_first``,
    ``restore_started_missing``, ``no_stopped_run``, ``clock_skew``,
    ``negative_downtime``, ``overlap``, ``captured_after_stop``,
    ``captured_after_published``, ``resumed_not_in_flight``,
    ``prompt_id_types``); ``text`` says it in words.
    """

    kind: str
    run_id: str
    text: str

    def __str__(self) -> str:
        return self.text


class StopCost(msgspec.Struct, kw_only=True):
    """The figures of one stop; ``None`` where one cannot be computed.

    ``reasons`` says, by figure name, why a figure is ``None``;
    ``captured_from`` says where ``captured_at`` came from
    (``"snapshot_published"`` or ``"trainer_checkpoint_published"``).
    ``stopped_run`` is ``None`` when the trace set holds no run before the
    restored one: every figure that needs it is ``None`` then. Every time is
    a finite number or ``None``.
    """

    stopped_run: str | None
    restored_run: str
    stop_time: float | None
    downtime_s: float | None
    restore_s: float | None
    restored_step: int
    captured_at: float | None
    in_flight: int | None
    resumed: int | None
    resumed_s: float | None
    restarted: int | None
    thrown_away_s: float | None
    redone: int | None
    redone_s: float | None
    lost_s: float | None
    lost_steps: int | None
    lost_steps_s: float | None
    restore_path: str = ""
    captured_from: str | None = None
    reasons: dict[str, str] = {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``stopped_run``, ``restored_run`` and the figures, by name."""
        out: dict[str, Any] = {"stopped_run": self.stopped_run, "restored_run": self.restored_run}
        for name in FIGURES:
            out[name] = getattr(self, name)
        return out

    @property
    def complete(self) -> bool:
        """Whether every figure could be computed (``reasons`` is empty)."""
        return not self.reasons


SiblingKey = tuple[Any, int]


class Counted(NamedTuple):
    """A sibling a stop counts: its class (one of ``CLASSES``), A's try T of it
    (``at``, an index into A's tries), and the part of T's work the stop lost, from
    ``lost_from`` (``max(t0, C)`` for a resumed sibling, else t0; NaN where C
    is unknown) to ``lost_to`` (t1)."""

    fate: str
    at: int
    lost_from: float
    lost_to: float

    @property
    def lost_s(self) -> float:
        """The seconds lost: ``lost_to - lost_from`` (NaN where C is unknown)."""
        return self.lost_to - self.lost_from


class StopClasses(msgspec.Struct, kw_only=True):
    """What one stop did to the siblings of its stopped run (``classify``).

    ``captured_at`` is the C it was judged against: None where C is unknown
    or cannot be judged (later than the stop), as the figures have it.
    ``in_flight`` maps each sibling whose T is open at the stop to T;
    ``counted`` each sibling the stop counts to its ``Counted`` (with C
    unknown, only the open ones). ``kept`` holds the siblings whose T was
    sealed at or before C, so the restored state holds their result (None:
    C unknown). ``strangers`` maps each sibling B resumes that the stop counts
    nowhere to why (``never_tried``, ``kept``, ``abandoned``, ``refused``);
    with C unknown, siblings sealed in A are left out of it.
    """

    captured_at: float | None
    in_flight: dict[SiblingKey, int]
    counted: dict[SiblingKey, Counted]
    kept: set[SiblingKey] | None
    strangers: dict[SiblingKey, str]

    def of(self, fate: str) -> list[Counted]:
        """The siblings counted in one class."""
        return [c for c in self.counted.values() if c.fate == fate]

    def fates(self) -> Iterator[tuple[int, Counted]]:
        """``(A's try index, how it is counted)`` for each try this stop counts."""
        for counted in self.counted.values():
            yield counted.at, counted


def stops_of(
    runs: list[Run], files: list[str]
) -> tuple[list[StopCost], list[Note], list[StopClasses | None]]:
    """The stops of ``runs`` (in the run order) with their figures, the notes, and
    each stop's classes (None for an orphan stop).

    A stop is a run whose first rollout event is ``restore_started``, restoring
    the latest earlier run that has rollout events (an orphan stop: none).

    Notes go per run in the run order: the run's own, then its clock-skew note,
    then the orphan note or the stop's notes.
    """
    published: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        ev = run.events
        for path in set(ev.events.values("path", ev.where(SNAPSHOT, CHECKPOINT))):
            published.setdefault(path, []).append(i)
    costs: list[StopCost] = []
    notes: list[Note] = []
    classes: list[StopClasses | None] = []
    previous: Run | None = None
    for i, run in enumerate(runs):
        notes.extend(run_notes(run, files))
        first = run.events.first_rollout()
        if first is None:
            continue
        stopped, previous = previous, run
        if run.events.kind[first] != RESTORE_STARTED:
            continue
        restore = run.events.events[first]
        notes.extend(_skew_notes(run, restore, i, runs, published))
        if stopped is None:
            costs.append(orphan_cost(run, restore))
            classes.append(None)
            notes.append(
                Note(
                    kind="no_stopped_run",
                    run_id=run.run_id,
                    text=f"run {run.run_id} begins with a restore from "
                    f"{restore.path!r} but no earlier run with rollout events is in "
                    "the trace set: the figures of the stopped run are n/a",
                )
            )
        else:
            cost, cls = cost_of(stopped, run, restore)
            costs.append(cost)
            classes.append(cls)
            notes.extend(stop_notes(stopped, run, cost, cls))
    return costs, notes, classes


def step_versions(
    runs: list[Run], costs: list[StopCost], classes: list[StopClasses | None]
) -> list[dict[int, int | None]]:
    """The weight version each step of each run (in the run order) is judged
    against, by the step's seq (None: not known).

    It is the version of the run's latest ``weights_synced`` before the step.
    Before the run's first one, it is the highest ``weight_version`` dispatched
    in the run before the step, and, for a run that begins with a restore, at
    least the version of the state it restored (``_restored_version``).
    Everything is read by seq: a step sees the events of lower seqs only.
    """
    place = {run.run_id: i for i, run in enumerate(runs)}
    restored_from: dict[str, tuple[int, float]] = {}
    for cost, cls in zip(costs, classes, strict=True):
        a = place.get(cost.stopped_run) if cost.stopped_run is not None else None
        if a is not None and cls is not None and cls.captured_at is not None:
            restored_from[cost.restored_run] = (a, cls.captured_at)
    starts: list[int | None] = []
    out: list[dict[int, int | None]] = []
    for i, run in enumerate(runs):
        start: int | None = None
        held = restored_from.get(run.run_id)
        if held is not None and held[0] < i:
            start = _restored_version(runs[held[0]].events, starts[held[0]], held[1])
        starts.append(start)
        out.append(_versions_of_steps(run.events, start))
    return out


def _higher(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


def _top(start: int | None, versions: list[int | None]) -> int | None:
    """``_higher`` folded over ``start`` and ``versions`` in order; in C where every
    version is an int or None (``max`` keeps the first of the highest, as the fold)."""
    if all(map(isinstance, versions, _INT_OR_NONE)):
        known: Iterator[int] = filter(_KNOWN, versions)  # type: ignore[arg-type]
        return _higher(start, max(known, default=None))
    return functools.reduce(_higher, versions, start)


_KNOWN = functools.partial(operator.is_not, None)
_INT_OR_NONE = itertools.repeat((int, type(None)))


def _top_by_seq(
    top: int | None, sent: list[int | None], seqs: Sequence[int], lo: int, hi: int
) -> int | None:
    """``top`` with the dispatches ``lo:hi`` (in seq order) taken in: each seq's
    folded on its own (lines of one seq do not see each other), then into ``top``.
    Where every version is an int or None, one ``_top`` gives the same."""
    versions = sent[lo:hi]
    if all(map(isinstance, versions, _INT_OR_NONE)):
        return _top(top, versions)
    for _, same in itertools.groupby(range(lo, hi), key=seqs.__getitem__):
        top = _higher(top, functools.reduce(_higher, map(sent.__getitem__, same), None))
    return top


def _restored_version(a: RunEvents, start: int | None, c: float) -> int | None:
    """The version of the state captured at ``c`` in run ``a`` (that started with
    ``start``): A's latest ``weights_synced`` (by seq) at or before C, else the
    highest of ``start`` and the versions A dispatched at or before C."""
    synced = _before(a, a.where(WEIGHTS), c)
    if synced:
        version: int | None = a.events.values("weight_version", synced[-1:])[0]
        return version
    return _top(start, a.events.values("weight_version", _before(a, a.where(DISPATCHED), c)))


def _before(a: RunEvents, at: list[int], c: float) -> list[int]:
    """The events of ``at`` whose time is at or before ``c``."""
    return list(compress(at, map(operator.le, map(a.time.__getitem__, at), itertools.repeat(c))))


def _versions_of_steps(ev: RunEvents, start: int | None) -> dict[int, int | None]:
    """Step seq -> the version it is judged against (see ``step_versions``): a step
    sees the events of lower seqs only (lines of one seq that differ do not see
    each other)."""
    steps = ev.where(STEP)
    if not steps:
        return {}
    seqs = ev.seq
    syncs, sends = ev.where(WEIGHTS), ev.where(DISPATCHED)
    sync_seq = array("q", list(map(seqs.__getitem__, syncs)))
    send_seq = array("q", list(map(seqs.__getitem__, sends)))
    synced = ev.events.values("weight_version", syncs)
    sent = ev.events.values("weight_version", sends)
    out: dict[int, int | None] = {}
    top, seen = start, 0
    for i in steps:
        seq = seqs[i]
        k = bisect.bisect_left(sync_seq, seq)
        if k:
            out[seq] = synced[k - 1]
            continue
        j = bisect.bisect_left(send_seq, seq)
        if j > seen:
            top, seen = _top_by_seq(top, sent, send_seq, seen, j), j
        out[seq] = top
    return out


def run_notes(run: Run, files: list[str]) -> Iterator[Note]:
    """What one run's own events say that bears on the figures."""
    ev = run.events
    if ev.versions:
        names = sorted(files[s] for s in ev.sources if s >= 0)
        where = f" (in {', '.join(names)})" if names else ""
        yield Note(
            kind="conflicting_copies",
            run_id=run.run_id,
            text=f"run {run.run_id}: lines that differ share {_describe(ev.versions)}{where}: "
            "copies of the run disagree (an edited copy, a file torn and written again, or "
            "two writers with one run_id); each figure counts every version of such a line, "
            "the same in any order, but may not be what the run did",
        )
    if ev.repeats:
        yield Note(
            kind="read_twice",
            run_id=run.run_id,
            text=f"run {run.run_id}: {ev.repeats:,} event(s) seen twice were counted once "
            "(the same run read from two files, such as two sinks of one tracer)",
        )
    if ev.unusable:
        yield Note(
            kind="bad_seq",
            run_id=run.run_id,
            text=f"run {run.run_id}: {ev.unusable:,} event(s) with a seq below 0 or above "
            "2**62 were left out (corrupt data)",
        )
    first = ev.first_rollout()
    restore, finished = ev.first_of(RESTORE_STARTED), ev.first_of(RESTORE_FINISHED)
    if finished is not None and first is not None and ev.seq[finished] == ev.seq[first]:
        yield Note(
            kind="restore_started_missing",
            run_id=run.run_id,
            text=f"run {run.run_id}'s first rollout event is restore_finished (seq "
            f"{ev.seq[finished]}) with no restore_started before it (lost to a gap in the "
            "seqs?): it may be a restored run, but no stop can be counted for it",
        )
    if restore is not None and first is not None and ev.seq[restore] != ev.seq[first]:
        tag = ev.events[first].__struct_config__.tag
        yield Note(
            kind="restore_not_first",
            run_id=run.run_id,
            text=f"run {run.run_id}: restore_started at seq {ev.seq[restore]} comes after its "
            f"first rollout event ({tag} at seq {ev.seq[first]}), so the run does not begin "
            "with a restore and no stop is counted for it",
        )


def _skew_notes(
    run: Run, restore: Any, place: int, ordered: list[Run], published: dict[str, list[int]]
) -> Iterator[Note]:
    """A run that opened after the restoring one but published what it restored."""
    places = published.get(restore.path, [])
    later = bisect.bisect_right(places, place)
    if later < len(places):
        other = ordered[places[later]]
        yield Note(
            kind="clock_skew",
            run_id=run.run_id,
            text=f"run {run.run_id} restores {restore.path!r}, which run {other.run_id} "
            f"published, but run {other.run_id} opened later ({other.events.order[0]:.6f} "
            f"against {run.events.order[0]:.6f}), so it is not the run the stop is counted "
            "against: do the clocks of their hosts disagree?",
        )


# Seqs named in a message before the rest are only counted.
_SHOWN = 5


def _describe(seqs: list[int]) -> str:
    """``seq 7``, or ``seqs 2, 7, 9-12 (6 in all)``: the first few ranges, then a count."""
    if len(seqs) == 1:
        return f"seq {seqs[0]}"
    ranges = seq_ranges((), seqs)
    shown = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges[:_SHOWN])
    more = f" and {len(ranges) - _SHOWN} more ranges" if len(ranges) > _SHOWN else ""
    return f"seqs {shown}{more} ({len(seqs):,} in all)"


class Capture(NamedTuple):
    """C for a restore (``at``), the event it came from (``source``) and that
    event's own time (``published``)."""

    at: float | None
    source: str | None
    published: float | None


def captured(a: Run, path: str) -> Capture:
    """C for a restore of ``path`` from ``a``: the latest (by seq) line that published it."""
    ev = a.events
    for kind, source in (
        (SNAPSHOT, "snapshot_published"),
        (CHECKPOINT, "trainer_checkpoint_published"),
    ):
        found = [i for i in ev.where(kind) if ev.events[i].path == path]
        if found:
            i = found[-1]
            at = ev.events[i].captured_at if kind == SNAPSHOT else ev.time[i]
            return Capture(at, source, ev.time[i])
    return Capture(None, None, None)


def classify(a: Run, b: Run, captured_at: float | None) -> StopClasses:
    """The one place that decides each sibling's class at a stop of ``a`` restored by ``b``
    (see the module's rules), C being ``captured_at``."""
    tries = a.tries
    stop_time = a.events.last_time
    resumed_by_b = b.sib.resumed
    last = a.sib.last_start
    # Per sibling (in ``last``'s order): its T and how T ended, taken in C; the
    # loop below sees only the siblings the stop counts.
    keys, at = list(last), list(last.values())
    ends = bytes(map(tries.end_kind.__getitem__, at))
    opened = list(compress(range(len(keys)), ends.translate(OPEN_FLAGS)))
    kept: set[SiblingKey] | None = None
    sealed_late: list[int] = []
    c = math.nan if captured_at is None else captured_at
    if captured_at is not None:
        sealed = list(compress(range(len(keys)), ends.translate(_SEALED_FLAGS)))
        t1s = map(tries.end_time.__getitem__, map(at.__getitem__, sealed))
        in_state = list(map(operator.le, t1s, itertools.repeat(c)))
        kept = set(map(keys.__getitem__, compress(sealed, in_state)))
        sealed_late = list(compress(sealed, map(operator.not_, in_state)))
    in_flight = {keys[k]: at[k] for k in opened}
    counted: dict[SiblingKey, Counted] = {}
    start_time, end_time = tries.start_time, tries.end_time
    for k in sorted(opened + sealed_late):
        key, i = keys[k], at[k]
        t0 = start_time[i]
        # T ends at the stop when open, else at its seal.
        t1 = stop_time if ends[k] == END_OPEN else end_time[i]
        if key in resumed_by_b:
            # The lost part of a resumed try begins at the capture, or at its start if
            # later; written so that a NaN time stays NaN rather than be taken as the larger.
            after_c = c if t0 < c else (t0 if captured_at is not None else math.nan)
            counted[key] = Counted("resumed", i, after_c, t1)
        else:
            counted[key] = Counted("restarted" if ends[k] == END_OPEN else "redone", i, t0, t1)
    strangers: dict[SiblingKey, str] = {}
    for key in resumed_by_b:
        if key in counted:
            continue
        t = last.get(key)
        if t is None:
            strangers[key] = "never_tried"
            continue
        why = _NOT_COUNTED.get(tries.end_kind[t])
        if why is None and kept is not None and key in kept:
            why = "kept"
        if why is not None:
            strangers[key] = why
    return StopClasses(
        captured_at=captured_at,
        in_flight=in_flight,
        counted=counted,
        kept=kept,
        strangers=strangers,
    )


# End kind -> 1 for a sealed try only (``bytes.translate``).
_SEALED_FLAGS = bytes(1 if k == END_SEALED else 0 for k in range(256))
# Why a sibling whose T ended so is counted nowhere.
_NOT_COUNTED = {END_ABANDONED: "abandoned", END_REFUSED: "refused"}


def _restore_s(b: Run, restore: Any, reasons: dict[str, str]) -> float | None:
    finished = b.events.first_of(RESTORE_FINISHED)
    if finished is not None:
        return float(b.events.time[finished] - restore.time)
    reasons["restore_s"] = f"run {b.run_id} has no restore_finished"
    return None


def orphan_cost(b: Run, restore: Any) -> StopCost:
    """A restore with no run before it in the trace set: what can be said of it."""
    reasons: dict[str, str] = {}
    restore_s = _restore_s(b, restore, reasons)
    why = (
        f"no run before run {b.run_id} in the trace set has rollout events, "
        "so the stopped run is unknown"
    )
    unknown = [f for f in FIGURES if f not in ("restore_s", "restored_step")]
    reasons.update(dict.fromkeys(unknown, why))
    values: dict[str, Any] = dict.fromkeys(unknown)
    return _finite(
        StopCost(
            stopped_run=None,
            restored_run=b.run_id,
            restore_s=restore_s,
            restored_step=restore.step,
            restore_path=restore.path,
            reasons=reasons,
            **values,
        )
    )


def cost_of(a: Run, b: Run, restore: Any) -> tuple[StopCost, StopClasses]:
    """The figures of the stop of ``a`` restored by ``b`` (``restore``: its ``restore_started``)."""
    reasons: dict[str, str] = {}
    stop_time = a.events.last_time
    restore_s = _restore_s(b, restore, reasons)
    captured_at, captured_from, _ = captured(a, restore.path)
    # The C the stop is judged against: none where it is unknown, or later than
    # the stop, where no work of A comes after it and the times lost would be
    # negative (a capturing host's clock ahead, or captured_at not in seconds).
    judged = captured_at
    why_not_judged = "captured_at is unknown"
    if captured_at is None:
        reasons["captured_at"] = (
            f"run {a.run_id} has no snapshot_published or trainer_checkpoint_published "
            f"with path {restore.path!r}, the path run {b.run_id} restored from"
        )
    elif captured_at > stop_time:
        judged = None
        why_not_judged = (
            f"captured_at is {captured_at - stop_time:.3f} s after the stop: a capture "
            "after the stop cannot be judged"
        )
    classes = classify(a, b, judged)
    restarted = classes.of("restarted")
    thrown_away_s = _exact_sum([c.lost_s for c in restarted])
    resumed: int | None = None
    resumed_s: float | None = None
    redone: int | None = None
    redone_s: float | None = None
    lost_s: float | None = None
    if judged is None:
        for name in ("resumed", "resumed_s", "redone", "redone_s", "lost_s"):
            reasons[name] = why_not_judged
    else:
        kept_on = classes.of("resumed")
        done_again = classes.of("redone")
        resumed, redone = len(kept_on), len(done_again)
        resumed_s = _exact_sum([c.lost_s for c in kept_on])
        redone_s = _exact_sum([c.lost_s for c in done_again])
        lost_s = resumed_s + thrown_away_s + redone_s

    last_kept: float | None = a.events.opened_at
    lost_steps = 0
    for step, time in a.events.steps():
        if step > restore.step:
            lost_steps += 1
        else:
            last_kept = time
    if last_kept is not None:
        lost_steps_s: float | None = stop_time - last_kept
    else:
        lost_steps_s = None
        reasons["lost_steps_s"] = (
            f"run {a.run_id} has no trace_opened and no step_trained at or before "
            f"step {restore.step}"
        )
    cost = _finite(
        StopCost(
            stopped_run=a.run_id,
            restored_run=b.run_id,
            stop_time=stop_time,
            downtime_s=restore.time - stop_time,
            restore_s=restore_s,
            restored_step=restore.step,
            captured_at=captured_at,
            in_flight=len(classes.in_flight),
            resumed=resumed,
            resumed_s=resumed_s,
            restarted=len(restarted),
            thrown_away_s=thrown_away_s,
            redone=redone,
            redone_s=redone_s,
            lost_s=lost_s,
            lost_steps=lost_steps,
            lost_steps_s=lost_steps_s,
            restore_path=restore.path,
            captured_from=captured_from,
            reasons=reasons,
        )
    )
    return cost, classes


def _exact_sum(values: list[float]) -> float:
    """The correctly rounded sum, so that no order of the terms changes its last digit.

    A float, 0.0 for no terms. Where the sum overflows, fsum raises; the
    plain sum is then infinite or NaN, which ``_finite`` turns into None.
    """
    try:
        return math.fsum(values)
    except OverflowError:
        return sum(values, 0.0)


def _finite(cost: StopCost) -> StopCost:
    """Make a time that overflowed (times at the edge of the float range) None, with why."""
    for name in FIGURES:
        value = getattr(cost, name)
        if isinstance(value, float) and not math.isfinite(value):
            setattr(cost, name, None)
            cost.reasons[name] = (
                f"{name} is not a finite number ({value}): the times it is computed from "
                "are at the edge of the float range"
            )
    return cost


def stop_notes(a: Run, b: Run, cost: StopCost, classes: StopClasses) -> Iterator[Note]:
    """What looks wrong about one stop without making a figure n/a."""
    stop_time = a.events.last_time
    opened_b = b.events.opened_at
    if cost.downtime_s is not None and cost.downtime_s < 0:
        yield Note(
            kind="negative_downtime",
            run_id=b.run_id,
            text=f"run {b.run_id} started its restore {-cost.downtime_s:.3f} s before run "
            f"{a.run_id}'s last event: the runs overlap, or their hosts' clocks disagree",
        )
    elif opened_b is not None and opened_b < stop_time:
        yield Note(
            kind="overlap",
            run_id=b.run_id,
            text=f"run {b.run_id} opened {stop_time - opened_b:.3f} s before run "
            f"{a.run_id}'s last event: two controllers at once, or clocks that disagree",
        )
    yield from _capture_notes(a, b, cost, classes)
    strangers = classes.strangers
    if strangers:
        listed = sorted(strangers.items(), key=lambda kv: repr(kv[0]))
        resumes: dict[SiblingKey, list[int]] = {}
        bt = b.tries
        for i in range(len(bt)):
            if bt.start_kind[i] == RESUMED:
                got = resumes.setdefault((bt.prompt_id[i], bt.generation_index[i]), [])
                if bt.attempt[i] not in got:
                    got.append(bt.attempt[i])
        shown = "; ".join(
            _why_not(a, b, key, why, resumes.get(key, [])) for key, why in listed[:_SHOWN]
        )
        more = f"; and {len(strangers) - _SHOWN} more" if len(strangers) > _SHOWN else ""
        yield Note(
            kind="resumed_not_in_flight",
            run_id=b.run_id,
            text=f"run {b.run_id} resumed {len(strangers)} sibling(s) that the stop counts "
            f"nowhere, each judged by run {a.run_id}'s last try of it: {shown}{more}",
        )
        # Siblings match by (prompt_id, generation_index) with the JSON type
        # of the prompt id: 7 and "7" are two siblings.
        as_text = {(str(p), g): (p, g) for p, g in a.sib.last_start}
        retyped = [
            (as_text[(str(p), g)], (p, g))
            for (p, g), why in listed
            if why == "never_tried" and (str(p), g) in as_text
        ]
        if retyped:
            (pa, ga), (pb, _) = retyped[0]
            yield Note(
                kind="prompt_id_types",
                run_id=b.run_id,
                text=f"{len(retyped)} sibling(s) differ only in the JSON type of prompt_id, "
                f"e.g. {pa!r} ({type(pa).__name__}) in run {a.run_id} and {pb!r} "
                f"({type(pb).__name__}) in run {b.run_id}, generation {ga}: they count as "
                "different siblings; emit prompt ids of one type",
            )


# Why a sibling the restored run resumed is counted nowhere: what A's last try of it did.
_WHY_NOT = {
    "kept": "sealed at or before the capture",
    "abandoned": "abandoned before the stop",
    "refused": "refused before the stop",
}


def _why_not(a: Run, b: Run, key: SiblingKey, why: str, resumed: list[int]) -> str:
    """One sibling of a ``resumed_not_in_flight`` note: what A's last try T of it did,
    and which attempt B resumed where that is not T's."""
    if why == "never_tried":
        return f"{_key(key)}: never tried in run {a.run_id}"
    attempt = a.tries.attempt[a.sib.last_start[key]]
    out = f"{_key(key)}: its last try, attempt {attempt}, was {_WHY_NOT[why]}"
    if resumed and resumed != [attempt]:
        which = ", ".join(map(str, resumed))
        out += f" (run {b.run_id} resumed attempt{'s' if len(resumed) > 1 else ''} {which})"
    return out


def _capture_notes(a: Run, b: Run, cost: StopCost, classes: StopClasses) -> Iterator[Note]:
    """A capture later than the stop (not judged), or than the line that published it."""
    c = cost.captured_at
    if c is None:
        return
    source = cost.captured_from or "snapshot_published"
    stop_time = a.events.last_time
    if classes.captured_at is None:
        yield Note(
            kind="captured_after_stop",
            run_id=b.run_id,
            text=f"run {b.run_id} restores {cost.restore_path!r}, which run {a.run_id}'s "
            f"{source} says was captured at {c:.3f}, {c - stop_time:.3f} s after the stop "
            f"(its last event, at {stop_time:.3f}): no work of the run comes after such a "
            "capture, so the figures that need it are n/a; is the capturing host's clock "
            "ahead, or captured_at not in Unix seconds?",
        )
        return
    published = captured(a, cost.restore_path).published
    if published is not None and c > published:
        yield Note(
            kind="captured_after_published",
            run_id=b.run_id,
            text=f"run {b.run_id} restores {cost.restore_path!r}, which run {a.run_id}'s "
            f"{source} says was captured at {c:.3f}, {c - published:.3f} s after the line "
            f"that published it (at {published:.3f}): a snapshot is published after it is "
            "captured, so a clock is off (the capturing host's ahead?); the stop is judged "
            "against captured_at as given",
        )


def _key(key: Any) -> str:
    prompt, index = key
    return f"(prompt_id {prompt!r}, generation_index {index})"
