"""Across a stop (``_report.lineage``): the tries a step trained, and a sibling's tries.

Each row is a trace set written through the SDK with known times and
versions, and the figures it must give, worked out by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from traced import Run, d, sealed, synced, trained, write_runs

import rollout_trace as rt


def ab(p: int, a: int, group: str, reason: str) -> rt.AttemptAbandoned:
    return rt.AttemptAbandoned(
        group_id=group,
        prompt_id=p,
        generation_index=0,
        attempt=a,
        reason=reason,  # type: ignore[arg-type]
    )


def resumed(p: int, a: int, group: str) -> rt.AttemptResumed:
    return rt.AttemptResumed(group_id=group, prompt_id=p, generation_index=0, attempt=a, turn=1)


SNAP = rt.SnapshotPublished(step=0, path="/s", captured_at=3.5)
RESTORE: list[tuple[float, rt.Event]] = [
    (101.0, rt.RestoreStarted(path="/s", step=0)),
    (102.0, rt.RestoreFinished(step=0, unfinished_groups=[])),
]

CASES: dict[str, tuple[list[Run], dict[str, Any]]] = {
    # A seals group G at version 1 and is killed; B restores, syncs 3 and
    # trains G: one trained try, lag 2 (it was counted nowhere).
    "trained_after_a_restore": (
        [
            Run([(1.0, synced(1)), (2.0, d(1, 0, 1, "G")), (3.0, sealed(1, 0, "G")), (4.0, SNAP)]),
            Run([*RESTORE, (103.0, synced(3)), (104.0, trained(1, "G"))], closed_at=105.0),
        ],
        {"lags": [(0, 0, None, None), (1, 0, 2.0, 2.0)], "set_tries": {"1": 1}},
    ),
    # A fails attempt 0 and is killed with attempt 1 open; B resumes and
    # seals it: one sibling, two tries (it was 1 try and 1 unsealed).
    "tries_across_a_stop": (
        [
            Run(
                [
                    (1.0, d(1, 0, 1, "G")),
                    (2.0, ab(1, 0, "G", "failed")),
                    (3.0, d(1, 1, 1, "G")),
                    (4.0, SNAP),
                ]
            ),
            Run(
                [*RESTORE, (103.0, resumed(1, 1, "G")), (110.0, sealed(1, 1, "G"))], closed_at=120.0
            ),
        ],
        {"run_tries": [{"unsealed": 1}, {"2": 1}], "set_tries": {"2": 1}},
    ),
    # B seals A's open try with no attempt_resumed (the worker carried on).
    "sealed_with_no_resume": (
        [
            Run([(1.0, d(1, 0, 1, "G")), (4.0, SNAP)]),
            Run([*RESTORE, (110.0, sealed(1, 0, "G"))], closed_at=120.0),
        ],
        {"run_tries": [{"unsealed": 1}, {"1": 1}], "set_tries": {"1": 1}},
    ),
    # Hedged: attempts 0 and 1 at once, 0 seals, 1 is cancelled after: one
    # sibling, two tries (it was one sealed and one unsealed).
    "hedged_tries": (
        [
            Run(
                [
                    (1.0, d(1, 0, 1, "G")),
                    (2.0, d(1, 1, 1, "G")),
                    (3.0, sealed(1, 0, "G")),
                    (4.0, ab(1, 1, "G", "cancelled")),
                ],
                closed_at=5.0,
            ),
        ],
        {"set_tries": {"2": 1}},
    ),
    # A whole group restarted: sibling 0 sealed, sibling 1 failed, both tried
    # again at version 2 and sealed; step 1 trains the two seals that stand
    # (lags 1 and 1), not the one thrown away. Two siblings, two tries each.
    "whole_group_restart": (
        [
            Run(
                [
                    (2.0, synced(1)),
                    (3.0, d(9, 0, 1, "G")),
                    (
                        4.0,
                        rt.AttemptDispatched(
                            group_id="G",
                            prompt_id=9,
                            generation_index=1,
                            attempt=0,
                            weight_version=1,
                        ),
                    ),
                    (5.0, sealed(9, 0, "G")),
                    (
                        6.0,
                        rt.AttemptAbandoned(
                            group_id="G",
                            prompt_id=9,
                            generation_index=1,
                            attempt=0,
                            reason="failed",
                        ),
                    ),
                    (7.0, synced(2)),
                    (8.0, d(9, 1, 2, "G")),
                    (
                        9.0,
                        rt.AttemptDispatched(
                            group_id="G",
                            prompt_id=9,
                            generation_index=1,
                            attempt=1,
                            weight_version=2,
                        ),
                    ),
                    (10.0, sealed(9, 1, "G")),
                    (
                        11.0,
                        rt.AttemptSealed(group_id="G", prompt_id=9, generation_index=1, attempt=1),
                    ),
                    (12.0, synced(3)),
                    (13.0, trained(1, "G")),
                ],
                closed_at=14.0,
            ),
        ],
        {"lags": [(2, 0, 1.0, 1.0)], "set_tries": {"2": 2}},
    ),
    # No weights_synced in the run: a step is judged against the highest version
    # dispatched before it (3): lag 0 (it was unknown).
    "no_sync_the_first_dispatch_gives_the_version": (
        [Run([(1.0, d(1, 0, 3, "G")), (2.0, sealed(1, 0, "G")), (3.0, trained(1, "G"))])],
        {"lags": [(1, 0, 0.0, 0.0)], "set_tries": {"1": 1}},
    ),
    # A restored run with no weights_synced starts with the version of the state
    # it restored: A's latest sync at or before the capture (1), not the one A
    # synced after it (2). B trains G (lag 0); then B dispatches at 5, so the
    # weights are at 5 at least: G trained again has lag 4.
    "no_sync_after_a_restore_the_restored_version": (
        [
            Run(
                [
                    (1.0, synced(1)),
                    (2.0, d(1, 0, 1, "G")),
                    (3.0, sealed(1, 0, "G")),
                    (4.0, SNAP),
                    (5.0, synced(2)),
                ]
            ),
            Run(
                [
                    *RESTORE,
                    (103.0, trained(1, "G")),
                    (104.0, d(2, 0, 5, "H")),
                    (105.0, trained(2, "G")),
                ],
                closed_at=106.0,
            ),
        ],
        {
            "lags": [(0, 0, None, None), (2, 0, 2.0, 4.0)],
            "versions": [[1, 5]],
            "set_tries": {"1": 1, "unsealed": 1},
        },
    ),
    # No weights_synced anywhere, and the dispatches' versions advance: A
    # dispatches at 1, 2 and 3, training each group after it; a step is judged
    # against the highest version dispatched before it, so every lag is 0 (they
    # were -1 and -2 against the first dispatch's). B restores a capture taken
    # after A's last dispatch, so it starts at 3, dispatches at 3 and trains
    # G3 and G4: lags 0 (they were -2).
    "no_sync_the_highest_dispatch_gives_the_version": (
        [
            Run(
                [
                    (10.0, d(1, 0, 1, "G1")),
                    (11.0, sealed(1, 0, "G1")),
                    (12.0, trained(1, "G1")),
                    (40.0, d(2, 0, 2, "G2")),
                    (41.0, sealed(2, 0, "G2")),
                    (42.0, trained(2, "G2")),
                    (70.0, d(3, 0, 3, "G3")),
                    (71.0, sealed(3, 0, "G3")),
                    (72.0, trained(3, "G3")),
                    (101.0, rt.SnapshotPublished(step=3, path="/s", captured_at=100.0)),
                ]
            ),
            Run(
                [
                    *RESTORE,
                    (103.0, trained(4, "G3")),
                    (104.0, d(4, 0, 3, "G4")),
                    (105.0, sealed(4, 0, "G4")),
                    (106.0, trained(5, "G3", "G4")),
                ],
                closed_at=107.0,
            ),
        ],
        {
            "lags": [(3, 0, 0.0, 0.0), (3, 0, 0.0, 0.0)],
            "versions": [[1, 2, 3], [3, 3]],
            "set_tries": {"1": 4},
        },
    ),
    # Captured at 50, before A dispatched at 3: B starts with the highest
    # version A had dispatched by then (2), so G2 trained in B has lag 0 (it
    # was -1 against A's first dispatch's).
    "no_sync_after_a_restore_the_highest_dispatch_before_the_capture": (
        [
            Run(
                [
                    (10.0, d(1, 0, 1, "G1")),
                    (11.0, sealed(1, 0, "G1")),
                    (40.0, d(2, 0, 2, "G2")),
                    (41.0, sealed(2, 0, "G2")),
                    (51.0, rt.SnapshotPublished(step=0, path="/s", captured_at=50.0)),
                    (70.0, d(3, 0, 3, "G3")),
                    (71.0, sealed(3, 0, "G3")),
                ]
            ),
            Run([*RESTORE, (103.0, trained(1, "G2"))], closed_at=104.0),
        ],
        {"lags": [(0, 0, None, None), (1, 0, 0.0, 0.0)], "versions": [[2]], "set_tries": {"1": 3}},
    ),
    # A sealed the sibling at 3, before the capture at 3.5: the restored state
    # holds it, so B trying it again begins a new use (it was one use, 2 tries).
    "a_seal_the_restored_state_holds_ends_its_use": (
        [
            Run([(1.0, d(1, 0, 1, "G")), (3.0, sealed(1, 0, "G")), (4.0, SNAP)]),
            Run([*RESTORE, (103.0, d(1, 0, 1, "G")), (104.0, sealed(1, 0, "G"))], closed_at=105.0),
        ],
        {"run_tries": [{"1": 1}, {"1": 1}], "set_tries": {"1": 2}},
    ),
    # Sealed at 3.8, after the capture (3.5 here): B does it again, the same use.
    "a_seal_after_the_capture_is_redone_in_the_same_use": (
        [
            Run(
                [
                    (1.0, d(1, 0, 1, "G")),
                    (3.8, sealed(1, 0, "G")),
                    (4.0, SNAP),
                ]
            ),
            Run([*RESTORE, (103.0, d(1, 0, 1, "G")), (104.0, sealed(1, 0, "G"))], closed_at=105.0),
        ],
        {"run_tries": [{}, {"2": 1}], "set_tries": {"2": 1}},
    ),
    # A group named twice in one step is trained once; a group with no seal
    # anywhere is counted as missing.
    "group_named_twice_and_one_missing": (
        [
            Run(
                [
                    (2.0, synced(1)),
                    (3.0, d(1, 0, 1, "G")),
                    (4.0, sealed(1, 0, "G")),
                    (5.0, synced(2)),
                    (6.0, trained(1, "G", "G", "nowhere")),
                ],
                closed_at=7.0,
            ),
        ],
        {"lags": [(1, 0, 1.0, 1.0)], "missing": [1], "set_tries": {"1": 1}},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_crosses_a_stop(tmp_path: Path, case: str) -> None:
    runs, want = CASES[case]
    report = rt.health_report(write_runs(tmp_path / "set", runs))
    if "lags" in want:
        got = [
            (r.staleness.attempts, r.staleness.unknown, r.staleness.p50, r.staleness.max)
            for r in report.runs
        ]
        assert got == want["lags"]
    if "versions" in want:
        # The steps view says the version each step is judged against, as the report does.
        ts = rt.analyze(write_runs(tmp_path / "again", runs))
        by_run = [
            [s["weight_version"] for s in ts.to_arrow("steps").to_pylist() if s["run"] == n]
            for n in range(1, len(runs) + 1)
        ]
        in_report = [[s.weight_version for s in r.staleness.steps] for r in report.runs]
        assert [v for v in by_run if v] == [v for v in in_report if v] == want["versions"]
    if "missing" in want:
        assert [s.missing_groups for r in report.runs for s in r.staleness.steps] == want["missing"]
    if "run_tries" in want:
        assert [{k: v for k, v in r.tries.items() if v} for r in report.runs] == want["run_tries"]
    assert {k: v for k, v in report.tries.items() if v} == want["set_tries"]


def test_a_trained_try_sealed_before_the_stop_has_its_step_in_the_table(tmp_path: Path) -> None:
    runs, _ = CASES["trained_after_a_restore"]
    [row] = rt.attempts(write_runs(tmp_path / "set", runs))
    assert (row.run, row.outcome, row.trained_step) == (1, "sealed", 1)


@pytest.mark.parametrize(
    "bad",
    [
        float("nan"),  # a time no clock gives
        float("inf"),  # nor this
    ],
)
def test_events_built_in_python_with_a_time_that_is_not_finite_do_not_crash(bad: float) -> None:
    opened = rt.TraceOpened(sdk_version="0", pid=1, host="h")
    disp = d(1, 0, 1, "G")
    seal = sealed(1, 0, "G")
    for seq, ev in enumerate([opened, disp, seal]):
        ev.run_id, ev.seq, ev.time = "0" * 32, seq, 1.0 + seq
    seal.time = bad
    report = rt.health_report([opened, disp, seal])
    assert report.runs[0].attempts["sealed"] == 1
