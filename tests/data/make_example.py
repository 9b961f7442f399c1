"""Make the shipped example trace set, ``tests/data/example/``, through the real SDK.

Two controller runs of a small GRPO-style loop (groups of 4 generations):

- run A trains steps 1-4, publishes a trainer checkpoint at step 2 and a
  rollout snapshot at step 3, goes on into step 5 and is killed (no
  ``trace_closed``) with some tries still running, some sealed after the
  snapshot was captured, and one that had already failed;
- run B restores the step-3 snapshot, resumes two of the running tries,
  restarts the rest (and reports the already-failed one as a restart again,
  which must not count), redoes steps 4 and 5 and closes cleanly.

Each run is a real process writing through ``rt.sync_tracer``; run A ends with
``os._exit`` after a flush, as a killed process would. The tracer's clock is
the plan's simulated clock, so every line is exactly as the SDK wrote it and
the times are those of the plan, which is drawn from a fixed seed: the cost
figures are the same on every run (run ids and file names are new each time).

    python tests/data/make_example.py            # writes tests/data/example/
    python tests/data/make_example.py --out DIR
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path

import rollout_trace as rt

SEED = 20261105
T0 = 1_780_000_000.0  # simulated wall clock of run A's start
GROUP = 4
SNAPSHOT = "/ckpt/rollout-snapshot-step3"
CHECKPOINT = "/ckpt/trainer-step2"

Plan = list[tuple[float, rt.Event]]


def _sibling(ev: type[rt.Event], gid: str, prompt: int, index: int, attempt: int, **kw: object):  # type: ignore[no-untyped-def]
    return ev(group_id=gid, prompt_id=prompt, generation_index=index, attempt=attempt, **kw)


def plan(seed: int = SEED) -> tuple[Plan, Plan]:
    """The two runs' events, each with the simulated time it is emitted at."""
    rng = random.Random(seed)
    a: Plan = []
    t = T0 + 2.0
    weight = 0
    open_at_stop: list[tuple[str, int, int, int]] = []
    for step in range(1, 6):
        groups = [(f"a-s{step}-g{g}", 100 * step + g) for g in range(2)]
        seals: list[tuple[float, rt.Event]] = []
        for gid, prompt in groups:
            a.append(
                (
                    t,
                    rt.GroupReserved(
                        group_id=gid,
                        prompt_id=prompt,
                        size=GROUP,
                        weight_version=weight,
                        target_step=step,
                    ),
                )
            )
            a.append((t, rt.GroupAdmitted(group_id=gid, prompt_id=prompt)))
            for index in range(GROUP):
                a.append(
                    (
                        t,
                        _sibling(
                            rt.AttemptDispatched, gid, prompt, index, 0, weight_version=weight
                        ),
                    )
                )
                done = t + rng.uniform(4.0, 20.0)
                seals.append((done, _sibling(rt.AttemptSealed, gid, prompt, index, 0)))
            t += 0.2
        seals.sort(key=lambda pair: pair[0])
        if step == 2:
            # A try raises and is dispatched again.
            done, failed = seals.pop(3)
            gid, prompt, index = failed.group_id, failed.prompt_id, failed.generation_index  # type: ignore[attr-defined]
            a.append(
                (done - 2.0, _sibling(rt.AttemptAbandoned, gid, prompt, index, 0, reason="failed"))
            )
            a.append(
                (
                    done - 2.0,
                    _sibling(rt.AttemptDispatched, gid, prompt, index, 1, weight_version=weight),
                )
            )
            seals.append((done + 6.0, _sibling(rt.AttemptSealed, gid, prompt, index, 1)))
            seals.sort(key=lambda pair: pair[0])
        if step == 5:
            # The stop: five tries sealed, one failed, the other two still running.
            a.extend(seals[:5])
            done, failed = seals[5]
            a.append(
                (
                    done,
                    _sibling(
                        rt.AttemptAbandoned,
                        failed.group_id,
                        failed.prompt_id,  # type: ignore[attr-defined]
                        failed.generation_index,
                        0,
                        reason="failed",
                    ),
                )
            )  # type: ignore[attr-defined]
            open_at_stop = [
                (e.group_id, e.prompt_id, e.generation_index, 0)  # type: ignore[attr-defined]
                for _, e in seals[6:]
            ]
            a.append((done + 1.5, rt.WeightsSynced(weight_version=weight)))
            break
        a.extend(seals)
        t = seals[-1][0] + 0.3
        for gid, prompt in groups:
            a.append((t, rt.GroupSealed(group_id=gid, prompt_id=prompt)))
        t += 1.2
        a.append((t, rt.StepTrained(step=step, group_ids=[g for g, _ in groups])))
        weight = step  # the trained step's weights
        t += 0.4
        a.append((t, rt.WeightsSynced(weight_version=weight)))
        if step == 2:
            a.append((t + 0.5, rt.TrainerCheckpointPublished(step=2, path=CHECKPOINT)))
        if step == 3:
            # Captured while step 4's first groups were being admitted.
            a.append((t + 9.0, rt.SnapshotPublished(step=3, path=SNAPSHOT, captured_at=t + 1.0)))
        t += 0.5

    # Run B: up 40 s after A was killed.
    b: Plan = []
    t = a[-1][0] + 40.0
    b.append((t, rt.RestoreStarted(path=SNAPSHOT, step=3)))
    t += 6.5
    unfinished = sorted({gid for gid, *_ in open_at_stop})
    b.append((t, rt.RestoreFinished(step=3, unfinished_groups=unfinished)))
    failed_before = a[-2][1]
    b.append(
        (
            t,
            _sibling(
                rt.AttemptAbandoned,
                failed_before.group_id,
                failed_before.prompt_id,  # type: ignore[attr-defined]
                failed_before.generation_index,
                0,
                reason="restart",
            ),
        )
    )  # type: ignore[attr-defined]
    for i, (gid, prompt, index, attempt) in enumerate(open_at_stop):
        if i == 0:
            b.append(
                (t, _sibling(rt.AttemptAbandoned, gid, prompt, index, attempt, reason="restart"))
            )
            b.append(
                (
                    t,
                    _sibling(
                        rt.AttemptDispatched, gid, prompt, index, attempt + 1, weight_version=3
                    ),
                )
            )
            b.append(
                (
                    t + rng.uniform(5, 12),
                    _sibling(rt.AttemptSealed, gid, prompt, index, attempt + 1),
                )
            )
        else:
            b.append((t, _sibling(rt.AttemptResumed, gid, prompt, index, attempt, turn=2)))
            b.append(
                (t + rng.uniform(2, 6), _sibling(rt.AttemptSealed, gid, prompt, index, attempt))
            )
    b.sort(key=lambda pair: pair[0])
    t = b[-1][0] + 1.0
    b.append((t, rt.StepTrained(step=4, group_ids=unfinished)))
    t += 0.4
    b.append((t, rt.WeightsSynced(weight_version=4)))
    return a, b


def _emit(which: str, out: Path) -> None:
    """Child process: write one run through the SDK; run A dies without closing."""
    a, b = plan()
    timed = a if which == "a" else b
    now = [T0 if which == "a" else b[0][0] - 5.0]  # when trace_opened is written
    tracer = rt.sync_tracer(
        f"jsonl://{out.resolve()}/run-{{run_id}}.jsonl",
        meta={"example": "rollout_trace", "run": which},
        clock=lambda: now[0],
    )
    with tracer as t:
        for when, ev in timed:
            now[0] = when
            t.emit(ev)
        t.flush()
        if which == "a":
            os._exit(0)  # killed: no trace_closed
        now[0] += 0.5  # trace_closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "example")
    parser.add_argument("--emit-run", choices=["a", "b"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.emit_run:
        _emit(args.emit_run, args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("run-*.jsonl"):
        old.unlink()
    for which in "ab":
        subprocess.run(
            [sys.executable, __file__, "--emit-run", which, "--out", str(args.out)], check=True
        )
    print(f"wrote {len(list(args.out.glob('run-*.jsonl')))} runs to {args.out}")


if __name__ == "__main__":
    main()
