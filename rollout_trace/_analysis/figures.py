"""The figures of one stop, from the folded state of two runs (``fold.RunFold``).

Each is defined in the README, section Reference > Restore-cost figures.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any

import msgspec

from .._reading.lean import LeanRestoreStarted
from .._schema.events import RestoreStarted
from .fold import RunFold, SiblingKey

__all__ = ["FIGURES", "FIGURE_ROWS", "StopCost", "stop_cost"]

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


class StopCost(msgspec.Struct, kw_only=True):
    """The figures of one stop; ``None`` where one cannot be computed.

    ``reasons`` says, by figure name, why a figure is ``None``;
    ``captured_from`` says where ``captured_at`` came from
    (``"snapshot_published"`` or ``"trainer_checkpoint_published"``).
    Neither is part of the JSON form, which holds exactly the figures named in
    the README, section Reference > Restore-cost figures.
    """

    stopped_run: str
    restored_run: str
    stop_time: float
    downtime_s: float
    restore_s: float | None
    restored_step: int
    captured_at: float | None
    in_flight: int
    resumed: int
    restarted: int
    thrown_away_s: float
    redone: int | None
    redone_s: float | None
    lost_s: float | None
    lost_steps: int
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


def stop_cost(a: RunFold, b: RunFold, restore: RestoreStarted | LeanRestoreStarted) -> StopCost:
    reasons: dict[str, str] = {}
    stop_time = a.last_time
    if b.restore_finished_at is not None:
        restore_s: float | None = b.restore_finished_at - restore.time
    else:
        restore_s = None
        reasons["restore_s"] = f"run {b.run_id} has no restore_finished"

    captured_from: str | None = None
    captured_at: float | None = a.snapshots.get(restore.path)
    if captured_at is not None:
        captured_from = "snapshot_published"
    else:
        captured_at = a.checkpoints.get(restore.path)
        if captured_at is not None:
            captured_from = "trainer_checkpoint_published"
        else:
            reasons["captured_at"] = (
                f"run {a.run_id} has no snapshot_published or trainer_checkpoint_published "
                f"with path {restore.path!r}, the path run {b.run_id} restored from"
            )

    in_flight = a.open
    resumed = sum(1 for key in in_flight if key in b.resumed)
    thrown_away_s = sum(
        stop_time - start for key, (_, start) in in_flight.items() if key not in b.resumed
    )

    redone: int | None = None
    redone_s: float | None = None
    if captured_at is None:
        for name in ("redone", "redone_s", "lost_s"):
            reasons[name] = "captured_at is unknown"
    else:
        redone, redone_s, unstarted = _redone(a, captured_at)
        if unstarted:
            reasons["redone_s"] = reasons["lost_s"] = (
                f"{unstarted} redone sibling(s) have an attempt_sealed in run {a.run_id} "
                "for an attempt not running then (its dispatch or resume is missing, "
                "or it had already ended)"
            )
            redone_s = None

    last_kept: float | None = a.opened_at
    lost_steps = 0
    for step, time in a.steps:
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

    return StopCost(
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


def _redone(a: RunFold, captured_at: float) -> tuple[int, float, int]:
    """Siblings not in flight whose last seal in A is later than ``captured_at``.

    Returns the count, the sum of their spans, and how many had no known start.
    """
    times, spans, keys = a.seal_times, a.seal_spans, a.seal_keys
    # Seals come in seq order, so their times almost always rise; then the
    # scan can stop at the first one at or before the capture.
    in_order = all(map(operator.le, times, itertools.islice(times, 1, None)))
    seen: set[SiblingKey] = set()
    count = 0
    total = 0.0
    unstarted = 0
    for i in range(len(times) - 1, -1, -1):
        if times[i] <= captured_at:
            if in_order:
                break
            continue
        key = keys[i]
        if key in seen:
            continue
        seen.add(key)
        if key in a.open:
            continue
        count += 1
        if math.isnan(spans[i]):
            unstarted += 1
        else:
            total += spans[i]
    return count, total, unstarted
