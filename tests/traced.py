"""Trace sets with known answers, written through the SDK with a ``clock=``.

A run is ``(time, event)`` pairs emitted through ``rt.sync_tracer`` whose
clock reads the pair's time, so every figure of a report is known in
advance. A killed run is the file as it stood after a ``flush()`` (copied
before the close writes ``trace_closed``); a closed run is closed at
``closed_at``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from operator import getitem
from pathlib import Path

import rollout_trace as rt


@dataclass
class Run:
    timed: Sequence[tuple[float, rt.Event]]
    closed_at: float | None = None  # None: killed after its last event


def write_runs(folder: Path, runs: Sequence[Run]) -> list[Path]:
    """Write each run through the SDK into ``folder``; its files, in run order."""
    folder.mkdir(parents=True, exist_ok=True)
    live = folder / "live"
    live.mkdir()
    out = []
    for i, run in enumerate(runs):
        # When trace_opened is stamped: a second before the first event, but
        # after 0 (a reader skips a line whose time is not > 0).
        first = run.timed[0][0]
        now = [first - 1.0 if first > 2.0 else first / 2]
        tracer = rt.sync_tracer(f"jsonl://{live}/run-{i}.jsonl", clock=partial(getitem, now, 0))
        dest = folder / f"run-{i}.jsonl"
        with tracer as t:
            for when, ev in run.timed:
                now[0] = when
                t.emit(ev)
            assert t.flush(timeout=10)
            if run.closed_at is None:
                shutil.copyfile(live / f"run-{i}.jsonl", dest)
            else:
                now[0] = run.closed_at
        if run.closed_at is not None:
            shutil.copyfile(live / f"run-{i}.jsonl", dest)
        out.append(dest)
    shutil.rmtree(live)
    return out


# --- events with the fields a report reads --------------------------------------


def d(p: int, a: int, wv: int, group: str) -> rt.AttemptDispatched:
    return rt.AttemptDispatched(
        group_id=group, prompt_id=p, generation_index=0, attempt=a, weight_version=wv
    )


def sealed(p: int, a: int, group: str) -> rt.AttemptSealed:
    return rt.AttemptSealed(group_id=group, prompt_id=p, generation_index=0, attempt=a)


def failed(p: int, a: int, group: str) -> rt.AttemptAbandoned:
    return rt.AttemptAbandoned(
        group_id=group, prompt_id=p, generation_index=0, attempt=a, reason="failed"
    )


def synced(v: int) -> rt.WeightsSynced:
    return rt.WeightsSynced(weight_version=v)


def trained(step: int, *groups: str) -> rt.StepTrained:
    return rt.StepTrained(step=step, group_ids=list(groups))


# Sibling 1 tried twice, 2 once, 3 three times, 4 left open from t=40.
KNOWN: list[tuple[float, rt.Event]] = [
    (10.0, synced(5)),
    (11.0, d(1, 0, 3, "g1")),
    (12.0, d(2, 0, 4, "g1")),
    (13.0, failed(1, 0, "g1")),  # 2 s
    (14.0, d(1, 1, 5, "g1")),
    (16.0, sealed(2, 0, "g1")),  # 4 s
    (21.0, sealed(1, 1, "g1")),  # 7 s
    (22.0, d(3, 0, 5, "g2")),
    (23.0, failed(3, 0, "g2")),  # 1 s
    (24.0, d(3, 1, 5, "g2")),
    (26.0, failed(3, 1, "g2")),  # 2 s
    (27.0, d(3, 2, 5, "g2")),
    (30.0, sealed(3, 2, "g2")),  # 3 s
    (31.0, synced(7)),
    (32.0, trained(1, "g1")),  # lags 7-4, 7-5
    (40.0, d(4, 0, 7, "g3")),
    (42.0, trained(2, "g2")),  # lag 7-5
    (60.0, trained(3)),
    (1000.0, synced(8)),
]
