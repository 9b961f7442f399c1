"""Build runs of events with explicit times, and write them as trace files.

Tests describe a run as ``(time, event)`` pairs; the builder stamps ``run_id``
and ``seq`` the way a tracer does, so tests do not depend on a tracer.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

import rollout_trace as rt

_encode = msgspec.json.Encoder().encode


def run_id(n: int) -> str:
    """A valid run id (32 lowercase hex chars) that is easy to tell apart."""
    return f"{n:032x}"


def disp(p: int | str, g: int, a: int = 0) -> rt.AttemptDispatched:
    return rt.AttemptDispatched(
        group_id=f"grp-{p}", prompt_id=p, generation_index=g, attempt=a, weight_version=1
    )


def seal(p: int | str, g: int, a: int = 0) -> rt.AttemptSealed:
    return rt.AttemptSealed(group_id=f"grp-{p}", prompt_id=p, generation_index=g, attempt=a)


def resume(p: int | str, g: int, a: int = 0, turn: int = 1) -> rt.AttemptResumed:
    return rt.AttemptResumed(
        group_id=f"grp-{p}", prompt_id=p, generation_index=g, attempt=a, turn=turn
    )


def abandon(p: int | str, g: int, a: int = 0, reason: str = "failed") -> rt.AttemptAbandoned:
    return rt.AttemptAbandoned(
        group_id=f"grp-{p}",
        prompt_id=p,
        generation_index=g,
        attempt=a,
        reason=reason,  # type: ignore[arg-type]
    )


def refuse(p: int | str, g: int, a: int = 0) -> rt.AttemptRefused:
    return rt.AttemptRefused(
        group_id=f"grp-{p}", prompt_id=p, generation_index=g, attempt=a, reason="stale"
    )


def step(n: int) -> rt.StepTrained:
    return rt.StepTrained(step=n, group_ids=[])


def snapshot(step: int, path: str, captured_at: float) -> rt.SnapshotPublished:
    return rt.SnapshotPublished(step=step, path=path, captured_at=captured_at)


def checkpoint(step: int, path: str) -> rt.TrainerCheckpointPublished:
    return rt.TrainerCheckpointPublished(step=step, path=path)


def restore(path: str, step: int) -> rt.RestoreStarted:
    return rt.RestoreStarted(path=path, step=step)


def restored(step: int) -> rt.RestoreFinished:
    return rt.RestoreFinished(step=step, unfinished_groups=[])


def make_run(
    n: int,
    opened: float,
    timed: Iterable[tuple[float, rt.Event]],
    *,
    closed: float | None = None,
    pid: int = 1000,
) -> list[rt.Event]:
    """A run: ``trace_opened`` at ``opened``, the events, and ``trace_closed`` at ``closed``.

    ``closed=None`` leaves the run without ``trace_closed`` (a killed process).
    """
    rid = run_id(n)
    opened_ev = rt.TraceOpened(sdk_version="0", pid=pid, host="node-1")
    events: list[rt.Event] = [_stamp(opened_ev, opened, rid, 0)]
    for t, ev in timed:
        events.append(_stamp(ev, t, rid, len(events)))
    if closed is not None:
        body = len(events) - 1
        close = rt.TraceClosed(emitted=body, written=body, dropped=0, invalid=0)
        events.append(_stamp(close, closed, rid, len(events)))
    return events


def _stamp(ev: rt.Event, t: float, rid: str, seq: int) -> rt.Event:
    # Events are frozen in use only by convention; a copy keeps helpers reusable.
    out = msgspec.structs.replace(ev)
    out.time = t
    out.run_id = rid
    out.seq = seq
    return out


def lines(events: Iterable[rt.Event]) -> bytes:
    return b"".join(_encode(ev) + b"\n" for ev in events)


def write(path: Path, events: Iterable[rt.Event], *, gz: bool = False) -> Path:
    data = lines(events)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def interleave(runs: Sequence[Sequence[rt.Event]], seed: int) -> list[rt.Event]:
    """Runs' events merged in a random order that keeps each run's own order."""
    rng = random.Random(seed)
    queues = [list(r) for r in runs if r]
    out: list[rt.Event] = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


def captured_stop(sealed_at: float = 120.0) -> list[rt.Event]:
    """Run 1 snapshots ``/s`` at C = 110 (published 111), dispatches prompts 1 and 2
    (100, 112), seals 2 at 118 and 1 at ``sealed_at``, trains step 1 ten seconds
    later; run 2, 20 s after that seal, restores ``/s`` and resumes prompt 1.

    With the defaults, the stop resumes prompt 1 (lost from C to its seal,
    half its try) and redoes prompt 2 (all of it).
    """
    a = make_run(
        1,
        90.0,
        [
            (100.0, disp(1, 0)),
            (111.0, snapshot(1, "/s", captured_at=110.0)),
            (112.0, disp(2, 0)),
            (118.0, seal(2, 0)),
            (sealed_at, seal(1, 0)),
            (sealed_at + 10, step(1)),
        ],
    )
    t = sealed_at + 20
    b = make_run(2, t, [(t + 1, restore("/s", 1)), (t + 2, resume(1, 0)), (t + 3, restored(1))])
    return a + b
