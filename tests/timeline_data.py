"""Large, realistic trace sets for the timeline's scale tests and benchmark.

``many_attempts(n)`` simulates a controller with a fixed number of rollout
slots, stopped once and restored: run A dispatches tries into free slots
(most seal, a few fail, are dropped, refused, cancelled or taken down with
their group), trains a step every few groups, publishes a snapshot every few
steps and is killed with tries in flight; run B restores the last snapshot,
resumes half of those tries, restarts the rest and goes on. Seeded, so the
same ``n`` gives the same events.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator

from scenario import make_run, run_id

import rollout_trace as rt
from rollout_trace._schema.decoding import AnyEvent

GROUP = 8
GROUPS_PER_STEP = 16
SNAPSHOT_EVERY = 5
# Outcome of a try that does not seal, and how often (the rest seal).
_ENDS = [("failed", 0.03), ("dropped", 0.02), ("refused", 0.01), ("cancelled", 0.01)]


def _end(rng: random.Random, gid: str, p: int, g: int, a: int) -> rt.Event:
    r = rng.random()
    for reason, share in _ENDS:
        if r < share:
            if reason == "refused":
                return rt.AttemptRefused(
                    group_id=gid, prompt_id=p, generation_index=g, attempt=a, reason="stale"
                )
            return rt.AttemptAbandoned(
                group_id=gid,
                prompt_id=p,
                generation_index=g,
                attempt=a,
                reason=reason,  # type: ignore[arg-type]
            )
        r -= share
    return rt.AttemptSealed(group_id=gid, prompt_id=p, generation_index=g, attempt=a)


def _simulate(
    rng: random.Random, attempts: int, t0: float, slots: int, first_prompt: int, *, kill: bool
) -> tuple[list[tuple[float, rt.Event]], list[tuple[str, int, int, int]], float]:
    """A run's timed events; the tries still open at its end; its end time."""
    free = [(t0, s) for s in range(slots)]
    heapq.heapify(free)
    timed: list[tuple[float, rt.Event]] = []
    ends: list[float] = []
    open_at_end: list[tuple[str, int, int, int]] = []
    step = 0
    made = 0
    prompt = first_prompt
    while made < attempts:
        gid = f"g{prompt}"
        t = free[0][0]
        timed.append(
            (t, rt.GroupReserved(group_id=gid, prompt_id=prompt, size=GROUP, weight_version=step))
        )
        for g in range(GROUP):
            start, slot = heapq.heappop(free)
            start += rng.uniform(0.0, 0.05)
            end = start + rng.uniform(2.0, 30.0)
            timed.append(
                (
                    start,
                    rt.AttemptDispatched(
                        group_id=gid,
                        prompt_id=prompt,
                        generation_index=g,
                        attempt=0,
                        weight_version=step,
                    ),
                )
            )
            timed.append((end, _end(rng, gid, prompt, g, 0)))
            ends.append(end)
            heapq.heappush(free, (end, slot))
            made += 1
        timed.append((max(ends[-GROUP:]), rt.GroupSealed(group_id=gid, prompt_id=prompt)))
        prompt += 1
        if (prompt - first_prompt) % GROUPS_PER_STEP == 0:
            step += 1
            at = max(ends[-GROUP * GROUPS_PER_STEP :]) + 0.5
            timed.append((at, rt.StepTrained(step=step, group_ids=[])))
            timed.append((at + 0.2, rt.WeightsSynced(weight_version=step)))
            if step % SNAPSHOT_EVERY == 0:
                timed.append(
                    (
                        at + 1.0,
                        rt.SnapshotPublished(
                            step=step, path=f"/ckpt/s{step}", captured_at=at + 0.3
                        ),
                    )
                )
    # The kill: what comes after the stop is lost; tries running then stay open.
    stop = sorted(ends)[int(len(ends) * 0.97)] if kill else max(ends)
    kept = sorted(((t, ev) for t, ev in timed if t <= stop), key=lambda pair: pair[0])
    ended = set()
    started = []
    for _, ev in kept:
        if isinstance(ev, rt.AttemptDispatched):
            started.append((ev.group_id, ev.prompt_id, ev.generation_index, ev.attempt))
        elif isinstance(ev, (rt.AttemptSealed, rt.AttemptAbandoned, rt.AttemptRefused)):
            ended.add((ev.group_id, ev.prompt_id, ev.generation_index, ev.attempt))
    open_at_end = [k for k in started if k not in ended]
    return kept, open_at_end, stop


def many_attempts(n: int, *, slots: int = 64, seed: int = 7) -> list[rt.Event]:
    """About ``n`` attempts over two runs (a stop and a restore), as events."""
    rng = random.Random(seed)
    t0 = 1_780_000_000.0
    a_timed, in_flight, stop = _simulate(rng, n * 2 // 3, t0 + 1.0, slots, 0, kill=True)
    in_a = sum(isinstance(ev, rt.AttemptDispatched) for _, ev in a_timed)
    snapshots = [ev for _, ev in a_timed if isinstance(ev, rt.SnapshotPublished)]
    restored = (
        snapshots[-1]
        if snapshots
        else rt.SnapshotPublished(step=0, path="/ckpt/s0", captured_at=t0)
    )
    b_open = stop + 30.0
    t = b_open + 5.0
    b_timed: list[tuple[float, rt.Event]] = [
        (t, rt.RestoreStarted(path=restored.path, step=restored.step)),
        (t + 4.0, rt.RestoreFinished(step=restored.step, unfinished_groups=[])),
    ]
    t += 4.0
    for i, (gid, p, g, a) in enumerate(in_flight):
        if i % 2:
            b_timed.append(
                (
                    t,
                    rt.AttemptResumed(
                        group_id=gid, prompt_id=p, generation_index=g, attempt=a, turn=1
                    ),
                )
            )
            b_timed.append(
                (
                    t + rng.uniform(1.0, 10.0),
                    rt.AttemptSealed(group_id=gid, prompt_id=p, generation_index=g, attempt=a),
                )
            )
        else:
            b_timed.append(
                (
                    t,
                    rt.AttemptAbandoned(
                        group_id=gid, prompt_id=p, generation_index=g, attempt=a, reason="restart"
                    ),
                )
            )
    rest, _, _ = _simulate(rng, n - in_a - len(in_flight), t + 0.1, slots, 10_000_000, kill=False)
    b_timed = sorted(b_timed + rest, key=lambda pair: pair[0])
    run_a = make_run(1, t0, a_timed, pid=101)
    run_b = make_run(2, b_open, b_timed, closed=b_timed[-1][0] + 1.0, pid=202)
    return run_a + run_b


T0 = 1_780_000_000.0


def every_kind(group_id: str = "grp-1", host: str = "node-1") -> list[rt.Event | rt.UnknownEvent]:
    """Two runs with every event type and every outcome, at round times from ``T0``.

    Run A (killed at T0+20): prompt 1's siblings seal, fail, are dropped,
    cancelled, refused and taken down with their group; prompt 2's two tries
    are in flight at the stop. Run B restores A's snapshot, resumes sibling
    (2, 0), restarts (2, 1) and closes cleanly. ``group_id`` and ``host`` are
    used as given, so a test can make them hostile.
    """

    def ab(g: int, reason: str) -> rt.AttemptAbandoned:
        return rt.AttemptAbandoned(
            group_id=group_id,
            prompt_id=1,
            generation_index=g,
            attempt=0,
            reason=reason,  # type: ignore[arg-type]
        )

    def sib(cls: type[rt.Event], p: int, g: int, **kw: object) -> rt.Event:
        return cls(group_id=group_id, prompt_id=p, generation_index=g, attempt=0, **kw)

    a = make_run(
        1,
        T0,
        [
            (T0 + 1.0, rt.GroupReserved(group_id=group_id, prompt_id=1, size=6, weight_version=0)),
            (T0 + 1.0, rt.GroupAdmitted(group_id=group_id, prompt_id=1)),
            *((T0 + 1.5, sib(rt.AttemptDispatched, 1, g, weight_version=0)) for g in range(6)),
            (T0 + 4.0, sib(rt.AttemptSealed, 1, 0)),
            (T0 + 5.0, ab(1, "failed")),
            (T0 + 5.5, ab(2, "dropped")),
            (T0 + 6.0, ab(3, "cancelled")),
            (T0 + 6.5, sib(rt.AttemptRefused, 1, 4, reason="stale")),
            (T0 + 7.0, ab(5, "whole_group")),
            (T0 + 7.0, rt.GroupDiscarded(group_id=group_id, prompt_id=1, reason="failed try")),
            (T0 + 8.0, rt.StepTrained(step=1, group_ids=[group_id])),
            (T0 + 8.5, rt.WeightsSynced(weight_version=1)),
            (T0 + 9.0, rt.TrainerCheckpointPublished(step=1, path="/ckpt/t1")),
            (T0 + 10.0, sib(rt.AttemptDispatched, 2, 0, weight_version=1)),
            (T0 + 11.0, sib(rt.AttemptDispatched, 2, 1, weight_version=1)),
            (T0 + 12.0, rt.SnapshotPublished(step=1, path="/ckpt/s1", captured_at=T0 + 9.5)),
            (T0 + 13.0, rt.GroupSealed(group_id=group_id, prompt_id=1)),
            (T0 + 20.0, rt.StepTrained(step=2, group_ids=[])),
        ],
    )
    b = make_run(
        2,
        T0 + 30.0,
        [
            (T0 + 32.0, rt.RestoreStarted(path="/ckpt/s1", step=1)),
            (T0 + 35.0, rt.RestoreFinished(step=1, unfinished_groups=[group_id])),
            (T0 + 35.0, sib(rt.AttemptResumed, 2, 0, turn=1)),
            (T0 + 35.0, sib(rt.AttemptAbandoned, 2, 1, reason="restart")),
            (T0 + 38.0, sib(rt.AttemptSealed, 2, 0)),
        ],
        closed=T0 + 40.0,
        pid=2000,
    )
    for ev in a:
        if isinstance(ev, rt.TraceOpened):
            ev.host = host
    # A user's event this process has no class for: kept as an UnknownEvent.
    other = rt.UnknownEvent(
        event="gpu_memory_sampled",
        time=T0 + 36.0,
        run_id=b[0].run_id,
        seq=len(b),
        fields={"gib": 3},
    )
    return [*a, *b, other]


def crowded() -> list[rt.Event]:
    """Two runs whose labels would overprint one another if drawn where their marks are.

    Run A (T0 to T0+50) trains steps 1-12 half a second apart, steps 20 and 21
    a second apart, and step 22 half a second before its last event, where the
    stop's label goes; it publishes a snapshot and has one try in flight at the
    stop. Run B restores that snapshot (a restore wide enough for its label),
    resumes the try, trains steps 22-26 a third of a second apart and closes.
    """
    sib = {"group_id": "g", "prompt_id": 1, "generation_index": 0, "attempt": 0}
    a_timed: list[tuple[float, rt.Event]] = [
        (T0 + 1.0, rt.AttemptDispatched(**sib, weight_version=0)),
        (T0 + 5.0, rt.AttemptSealed(**sib)),
        *((T0 + 10.0 + 0.5 * i, rt.StepTrained(step=i + 1, group_ids=[])) for i in range(12)),
        (T0 + 40.0, rt.StepTrained(step=20, group_ids=[])),
        (T0 + 41.0, rt.StepTrained(step=21, group_ids=[])),
        (T0 + 42.0, rt.SnapshotPublished(step=21, path="/ckpt/s21", captured_at=T0 + 41.5)),
        (T0 + 45.0, rt.AttemptDispatched(**{**sib, "prompt_id": 2}, weight_version=21)),
        (T0 + 49.5, rt.StepTrained(step=22, group_ids=[])),
        (T0 + 50.0, rt.WeightsSynced(weight_version=22)),
    ]
    b_timed: list[tuple[float, rt.Event]] = [
        (T0 + 53.0, rt.RestoreStarted(path="/ckpt/s21", step=21)),
        (T0 + 80.0, rt.RestoreFinished(step=21, unfinished_groups=[])),
        (T0 + 80.0, rt.AttemptResumed(**{**sib, "prompt_id": 2}, turn=1)),
        (T0 + 90.0, rt.AttemptSealed(**{**sib, "prompt_id": 2})),
        *((T0 + 81.0 + i / 3, rt.StepTrained(step=22 + i, group_ids=[])) for i in range(5)),
    ]
    b_timed.sort(key=lambda pair: pair[0])
    return [*make_run(1, T0, a_timed), *make_run(2, T0 + 52.0, b_timed, closed=T0 + 100.0)]


def stream(attempts: int, *, user_every: int = 0, t0: float = T0) -> Iterator[AnyEvent]:
    """One run of ``attempts`` tries in groups of 8, made one event at a time.

    With ``user_every`` N, N events of a kind the timeline does not draw
    (``gpu_memory_sampled``, as read back by a process with no class for it)
    follow every try. Nothing is held: a consumer that keeps no event keeps
    no memory for them.
    """
    rid = run_id(9)
    seq = 0

    def stamp(ev: rt.Event, t: float) -> rt.Event:
        nonlocal seq
        ev.time, ev.run_id, ev.seq = t, rid, seq
        seq += 1
        return ev

    yield stamp(rt.TraceOpened(sdk_version="0", pid=1, host="node-1"), t0)
    t = t0
    for n in range(attempts):
        prompt, g = divmod(n, GROUP)
        gid = f"group-{prompt:08d}"
        sib = {"group_id": gid, "prompt_id": prompt, "generation_index": g, "attempt": 0}
        if g == 0:
            reserved = rt.GroupReserved(
                group_id=gid, prompt_id=prompt, size=GROUP, weight_version=0
            )
            yield stamp(reserved, t)
        t += 0.01
        yield stamp(rt.AttemptDispatched(**sib, weight_version=0), t)
        yield stamp(rt.AttemptSealed(**sib), t + 1.0)
        for _ in range(user_every):
            yield rt.UnknownEvent(
                event="gpu_memory_sampled",
                time=t,
                run_id=rid,
                seq=seq,
                fields={"device": seq % 8, "allocated_bytes": 3 << 30, "note": f"sample {seq}"},
            )
            seq += 1
        if g == GROUP - 1:
            yield stamp(rt.GroupSealed(group_id=gid, prompt_id=prompt), t + 1.0)
