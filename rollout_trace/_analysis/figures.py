"""The figures of one stop, from the folded state of two runs (``fold.RunFold``).

Each is defined in the README, section Reference > Restore-cost figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import msgspec

from .._reading.lean import LeanRestoreStarted
from .._schema.events import RestoreStarted
from .fold import RunFold
from .siblings import Siblings, pack_key

__all__ = ["FIGURES", "FIGURE_ROWS", "Note", "StopCost", "orphan_cost", "stop_cost", "stop_notes"]

FIGURES = (
    "stop_time",
    "downtime_s",
    "restore_s",
    "restored_step",
    "captured_at",
    "in_flight",
    "resumed",
    "restarted",
    "thrown_away_s",
    "redone",
    "redone_s",
    "lost_s",
    "lost_steps",
    "lost_steps_s",
)

# figure -> (unit, what it is), in the order of ``FIGURES`` (the README's
# Reference > Restore-cost figures): the rows of ``rollout-trace cost`` and of
# the timeline page's stop cards.
FIGURE_ROWS: dict[str, tuple[str, str]] = {
    "stop_time": ("", "last event of the stopped run"),
    "downtime_s": ("s", "stop to restore_started"),
    "restore_s": ("s", "restore_started to restore_finished"),
    "restored_step": ("step", "step of what was restored"),
    "captured_at": ("", "when the restored state was captured"),
    "in_flight": ("siblings", "open tries at the stop"),
    "resumed": ("siblings", "open tries the restored run resumed"),
    "restarted": ("siblings", "open tries started over"),
    "thrown_away_s": ("s", "work of the restarted tries"),
    "redone": ("siblings", "sealed after the capture, so done again"),
    "redone_s": ("s", "work of the redone tries"),
    "lost_s": ("s", "thrown_away_s + redone_s"),
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
        return not self.reasons


def _restore_s(b: RunFold, restore: Any, reasons: dict[str, str]) -> float | None:
    if b.restore_finished is not None:
        return float(b.restore_finished.event.time - restore.time)
    reasons["restore_s"] = f"run {b.run_id} has no restore_finished"
    return None


def orphan_cost(b: RunFold, restore: RestoreStarted | LeanRestoreStarted) -> StopCost:
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


def stop_cost(a: RunFold, b: RunFold, restore: RestoreStarted | LeanRestoreStarted) -> StopCost:
    reasons: dict[str, str] = {}
    stop_time = a.last_time
    restore_s = _restore_s(b, restore, reasons)

    captured_from: str | None = None
    captured_at: float | None = None
    if restore.path in a.snapshots:
        captured_at = a.snapshots[restore.path][1]
        captured_from = "snapshot_published"
    elif restore.path in a.checkpoints:
        captured_at = a.checkpoints[restore.path][1]
        captured_from = "trainer_checkpoint_published"
    else:
        reasons["captured_at"] = (
            f"run {a.run_id} has no snapshot_published or trainer_checkpoint_published "
            f"with path {restore.path!r}, the path run {b.run_id} restored from"
        )

    siblings = a.siblings()
    in_flight = siblings.open
    resumed = sum(1 for key in in_flight if key in b.resumed)
    thrown_away_s = _exact_sum(
        [stop_time - start for key, start in in_flight.items() if key not in b.resumed]
    )

    redone: int | None = None
    redone_s: float | None = None
    if captured_at is None:
        for name in ("redone", "redone_s", "lost_s"):
            reasons[name] = "captured_at is unknown"
    else:
        redone, redone_s, unstarted = _redone(siblings, captured_at)
        if unstarted:
            reasons["redone_s"] = reasons["lost_s"] = (
                f"{unstarted} redone sibling(s) have an attempt_sealed in run {a.run_id} "
                "for an attempt the run did not start before it (its dispatch or resume "
                "is missing)"
            )
            redone_s = None

    last_kept: float | None = a.opened_at
    lost_steps = 0
    for step, time in a.steps_in_order():
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

    return _finite(
        StopCost(
            stopped_run=a.run_id,
            restored_run=b.run_id,
            stop_time=stop_time,
            downtime_s=restore.time - stop_time,
            restore_s=restore_s,
            restored_step=restore.step,
            captured_at=captured_at,
            in_flight=len(in_flight),
            resumed=resumed,
            restarted=len(in_flight) - resumed,
            thrown_away_s=thrown_away_s,
            redone=redone,
            redone_s=redone_s,
            lost_s=None if redone_s is None else thrown_away_s + redone_s,
            lost_steps=lost_steps,
            lost_steps_s=lost_steps_s,
            restore_path=restore.path,
            captured_from=captured_from,
            reasons=reasons,
        )
    )


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


def _redone(siblings: Siblings, captured_at: float) -> tuple[int, float, int]:
    """Siblings not in flight whose last seal is later than ``captured_at``.

    Returns the count, the sum of their spans, and how many had no known start.
    """
    count = 0
    spans: list[float] = []
    unstarted = 0
    in_flight = {pack_key(key) for key in siblings.open}
    for key, sealed_at, span in zip(
        siblings.seal_keys, siblings.seal_times, siblings.seal_spans, strict=True
    ):
        if sealed_at <= captured_at or key in in_flight:
            continue
        count += 1
        if math.isnan(span):
            unstarted += 1
        else:
            spans.append(span)
    return count, _exact_sum(spans), unstarted


def stop_notes(a: RunFold, b: RunFold, cost: StopCost) -> Iterator[Note]:
    """What looks wrong about one stop without making a figure n/a."""
    if cost.downtime_s is not None and cost.downtime_s < 0:
        yield Note(
            kind="negative_downtime",
            run_id=b.run_id,
            text=f"run {b.run_id} started its restore {-cost.downtime_s:.3f} s before run "
            f"{a.run_id}'s last event: the runs overlap, or their hosts' clocks disagree",
        )
    elif b.opened_at is not None and b.opened_at < a.last_time:
        yield Note(
            kind="overlap",
            run_id=b.run_id,
            text=f"run {b.run_id} opened {a.last_time - b.opened_at:.3f} s before run "
            f"{a.run_id}'s last event: two controllers at once, or clocks that disagree",
        )
    siblings = a.siblings()
    in_flight = siblings.open
    # A sibling in flight when the restored state was captured and sealed by A
    # after it is redone, and B rightly resumes it from that state.
    redone: set[Any] = set()
    if cost.captured_at is not None:
        redone = {
            key
            for key, sealed_at in zip(siblings.seal_keys, siblings.seal_times, strict=True)
            if sealed_at > cost.captured_at
        }
    strangers = [key for key in b.resumed if key not in in_flight and pack_key(key) not in redone]
    if strangers:
        shown = ", ".join(_key(k) for k in sorted(strangers, key=repr)[:5])
        more = f" and {len(strangers) - 5} more" if len(strangers) > 5 else ""
        yield Note(
            kind="resumed_not_in_flight",
            run_id=b.run_id,
            text=f"run {b.run_id} resumed {len(strangers)} sibling(s) that run {a.run_id} did "
            f"not have in flight at its stop, nor sealed after the capture: {shown}{more}",
        )
        # Siblings match by (prompt_id, generation_index) with the JSON type
        # of the prompt id: 7 and "7" are two siblings.
        as_text = {(str(p), g): (p, g) for p, g in in_flight}
        retyped = [(as_text[(str(p), g)], (p, g)) for p, g in strangers if (str(p), g) in as_text]
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


def _key(key: Any) -> str:
    prompt, index = key
    return f"(prompt_id {prompt!r}, generation_index {index})"
