"""The restore-cost rules, once: stops, each sibling's class at a stop, figures, notes.

The rules are the docs' (Reference > Restore-cost figures).

``pair_stops`` walks the runs in the run order: a run whose first rollout
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
needs C is None with the reason. Sums are correctly rounded
(``math.fsum``); a figure that is not finite is None, with the reason.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgspec

from .terms import CHECKPOINT, RESTORE_STARTED, SNAPSHOT, WEIGHTS, EndKind
from .tries import Run

__all__ = [
    "CLASSES",
    "FIGURES",
    "FIGURE_ROWS",
    "Counted",
    "Note",
    "Stop",
    "StopClasses",
    "StopCost",
    "classify",
    "cost_of",
    "captured",
    "orphan_cost",
    "pair_stops",
    "run_notes",
    "start_versions",
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
    ``negative_downtime``, ``overlap``, ``resumed_not_in_flight``,
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


class Stop(msgspec.Struct, frozen=True):
    """A stop: run ``a`` (None: no earlier run with rollout events) restored by ``b``.

    ``restore`` is the index, in ``b``'s events, of its first rollout event,
    the ``restore_started``.
    """

    a: Run | None
    b: Run
    restore: int


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


def pair_stops(runs: list[Run]) -> Iterator[Stop]:
    """The stops among ``runs`` (in the run order): each run whose first rollout
    event is ``restore_started``, with the latest earlier run that has rollout events."""
    previous: Run | None = None
    for run in runs:
        first = run.events.first_rollout()
        if first is None:
            continue
        if run.events.kind[first] == RESTORE_STARTED:
            yield Stop(previous, run, first)
        previous = run


def stops_of(
    runs: list[Run], files: list[str]
) -> tuple[list[StopCost], list[Note], list[StopClasses | None]]:
    """The stops of ``runs`` (in the run order) with their figures, the notes, and
    each stop's classes (None for an orphan stop).

    Notes go per run in the run order: the run's own, then its clock-skew note,
    then the orphan note or the stop's notes.
    """
    published: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        paths = {*run.events.published(SNAPSHOT), *run.events.published(CHECKPOINT)}
        for path in paths:
            published.setdefault(path, []).append(i)
    by_restored = {id(stop.b): stop for stop in pair_stops(runs)}
    costs: list[StopCost] = []
    notes: list[Note] = []
    classes: list[StopClasses | None] = []
    for i, run in enumerate(runs):
        notes.extend(run_notes(run, files))
        stop = by_restored.get(id(run))
        if stop is None:
            continue
        restore = run.events.events[stop.restore]
        notes.extend(_skew_notes(run, restore, i, runs, published))
        if stop.a is None:
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
            cost, cls = cost_of(stop.a, run, restore)
            costs.append(cost)
            classes.append(cls)
            notes.extend(stop_notes(stop.a, run, cost, cls))
    return costs, notes, classes


def start_versions(runs: list[Run], costs: list[StopCost]) -> list[int | None]:
    """The weight version each run (in the run order) started with: the version a
    step of the run is judged against until its first ``weights_synced``.

    A run that begins with a restore takes the version of the state it
    restored: the stopped run's latest ``weights_synced`` (by seq) among those
    at or before C, else the version that run started with. Failing that (no
    stopped run, C unknown, no version there), and for every other run, the
    ``weight_version`` of its first ``attempt_dispatched`` by seq. None where
    neither is known.
    """
    place = {run.run_id: i for i, run in enumerate(runs)}
    restored_from = {
        c.restored_run: (place[c.stopped_run], c.captured_at)
        for c in costs
        if c.stopped_run is not None and c.stopped_run in place
    }
    out: list[int | None] = []
    for run in runs:
        version: int | None = None
        held = restored_from.get(run.run_id)
        if held is not None and held[1] is not None:
            a, c = runs[held[0]].events, held[1]
            version = out[held[0]]
            for i, k in enumerate(a.kind):
                if k == WEIGHTS and a.time[i] <= c:
                    version = a.events[i].weight_version
        if version is None:
            # Tries come in the order of their first event, and only a dispatch
            # gives one a version: the first with one is the first dispatch.
            version = next((v for v in run.tries.weight_version if v is not None), None)
        out.append(version)
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
    restore, finished = ev.restores()
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
    ranges: list[tuple[int, int]] = []
    for s in seqs:
        if ranges and s == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], s)
        else:
            ranges.append((s, s))
    shown = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges[:_SHOWN])
    more = f" and {len(ranges) - _SHOWN} more ranges" if len(ranges) > _SHOWN else ""
    return f"seqs {shown}{more} ({len(seqs):,} in all)"


def captured(a: Run, path: str) -> tuple[float | None, str | None]:
    """C for a restore of ``path`` from ``a``, and where it came from."""
    snapshots = a.events.published(SNAPSHOT)
    if path in snapshots:
        return snapshots[path], "snapshot_published"
    checkpoints = a.events.published(CHECKPOINT)
    if path in checkpoints:
        return checkpoints[path], "trainer_checkpoint_published"
    return None, None


def classify(a: Run, b: Run, captured_at: float | None) -> StopClasses:
    """The one place that decides each sibling's class at a stop of ``a`` restored by ``b``
    (see the module's rules), C being ``captured_at``."""
    tries = a.tries
    stop_time = a.events.last_time
    resumed_by_b = b.sib.resumed
    in_flight: dict[SiblingKey, int] = {}
    counted: dict[SiblingKey, Counted] = {}
    kept: set[SiblingKey] | None = None if captured_at is None else set()
    why_not: dict[SiblingKey, str] = {}
    c = math.nan if captured_at is None else captured_at
    for key, i in a.sib.last_start.items():
        end = tries.end_kind[i]
        t0 = tries.start_time[i]
        resumed = key in resumed_by_b
        # The lost part of a resumed try begins at the capture, or at its start if later;
        # written so that a NaN time stays NaN rather than be taken as the larger.
        after_c = c if t0 < c else (t0 if captured_at is not None else math.nan)
        if end == EndKind.OPEN:
            in_flight[key] = i
            if resumed:
                counted[key] = Counted("resumed", i, after_c, stop_time)
            else:
                counted[key] = Counted("restarted", i, t0, stop_time)
        elif end == EndKind.SEALED:
            if kept is None:
                continue  # sealed before or after C: cannot be told
            t1 = tries.end_time[i]
            if t1 <= c:
                kept.add(key)
                why_not[key] = "kept"
            elif resumed:
                counted[key] = Counted("resumed", i, after_c, t1)
            else:
                counted[key] = Counted("redone", i, t0, t1)
        elif end == EndKind.ABANDONED:
            why_not[key] = "abandoned"
        elif end == EndKind.REFUSED:
            why_not[key] = "refused"
    strangers: dict[SiblingKey, str] = {}
    for key in resumed_by_b:
        if key in counted:
            continue
        if key not in a.sib.last_start:
            strangers[key] = "never_tried"
        elif key in why_not:
            strangers[key] = why_not[key]
    return StopClasses(
        captured_at=captured_at,
        in_flight=in_flight,
        counted=counted,
        kept=kept,
        strangers=strangers,
    )


def _restore_s(b: Run, restore: Any, reasons: dict[str, str]) -> float | None:
    _, finished = b.events.restores()
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
    captured_at, captured_from = captured(a, restore.path)
    if captured_at is None:
        reasons["captured_at"] = (
            f"run {a.run_id} has no snapshot_published or trainer_checkpoint_published "
            f"with path {restore.path!r}, the path run {b.run_id} restored from"
        )
    classes = classify(a, b, captured_at)
    restarted = classes.of("restarted")
    thrown_away_s = _exact_sum([c.lost_s for c in restarted])
    resumed: int | None = None
    resumed_s: float | None = None
    redone: int | None = None
    redone_s: float | None = None
    lost_s: float | None = None
    if captured_at is None:
        for name in ("resumed", "resumed_s", "redone", "redone_s", "lost_s"):
            reasons[name] = "captured_at is unknown"
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
    strangers = classes.strangers
    if strangers:
        listed = sorted(strangers.items(), key=lambda kv: repr(kv[0]))
        shown = ", ".join(f"{_key(k)} {_WHY_NOT[why]}" for k, why in listed[:5])
        more = f" and {len(strangers) - 5} more" if len(strangers) > 5 else ""
        yield Note(
            kind="resumed_not_in_flight",
            run_id=b.run_id,
            text=f"run {b.run_id} resumed {len(strangers)} sibling(s) that the stop counts "
            f"nowhere, as run {a.run_id} neither had them open at its stop nor sealed them "
            f"after the capture: {shown}{more}",
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


# Why a sibling the restored run resumed is counted nowhere, as a note says it.
_WHY_NOT = {
    "never_tried": "(never tried)",
    "kept": "(sealed at or before the capture)",
    "abandoned": "(abandoned before the stop)",
    "refused": "(refused before the stop)",
}


def _key(key: Any) -> str:
    prompt, index = key
    return f"(prompt_id {prompt!r}, generation_index {index})"
