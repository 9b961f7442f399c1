"""``rt.health_report`` (``_report.health``) on trace sets with known answers.

Each set is written through the SDK with a ``clock=`` (``traced.write_runs``),
so every duration, stall, lag and interval below is worked out by hand from
the times and versions in the table of events.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from traced import KNOWN, Run, d, sealed, synced, trained, write_runs

import rollout_trace as rt
from rollout_trace._cli.main import main


def _report(tmp_path: Path, runs: list[Run], stall_after: float = 600.0) -> rt.HealthReport:
    return rt.health_report(write_runs(tmp_path / "set", runs), stall_after=stall_after)


def test_outcomes_tries_durations_staleness_and_intervals_of_a_known_run(tmp_path: Path) -> None:
    report = _report(tmp_path, [Run(KNOWN)])
    [run] = report.runs
    assert {k: v for k, v in run.attempts.items() if v} == {"sealed": 3, "failed": 3, "unended": 1}
    assert run.tries == {"1": 1, "2": 1, "3+": 1, "unsealed": 1}
    # Durations 1, 2, 2, 3, 4, 7: linear between ranks.
    assert msgspec.to_builtins(run.duration_s) == {
        "count": 6, "p50": 2.5, "p90": 5.5, "p99": pytest.approx(6.85), "max": 7.0,
    }  # fmt: skip
    lag = run.staleness
    assert (lag.attempts, lag.unknown, lag.p50, lag.max) == (3, 0, 2.0, 3.0)
    steps = [(s.step, s.weight_version, s.attempts, s.p50, s.max) for s in lag.steps]
    assert steps == [(1, 7, 2, 2.5, 3.0), (2, 7, 1, 2.0, 2.0), (3, 7, 0, None, None)]
    assert (run.step_interval_s.count, run.step_interval_s.p50, run.step_interval_s.max) == (
        2, 14.0, 18.0,
    )  # fmt: skip
    assert (run.weight_sync_interval_s.p50, run.weight_sync_interval_s.max) == (495.0, 969.0)
    # 991 s from trace_opened (t=9) to the last event: 34 buckets of 30 s;
    # the three seals (16, 21, 30) fall in the first.
    rate = run.sealed_per_s
    assert (rate.start, rate.bucket_s, len(rate.per_s)) == (9.0, 30.0, 34)
    assert rate.per_s[0] == pytest.approx(0.1) and not any(rate.per_s[1:])
    assert report.attempts == run.attempts and report.tries == run.tries


@pytest.mark.parametrize(
    ("stall_after", "closed_at", "expected"),
    [
        # Sibling 4 open 960 s at the run's last event (t=1000), killed run.
        (600.0, None, [("open_too_long", 960.0)]),
        # Not open long enough.
        (1000.0, None, []),
        # Closed cleanly with it open and no stop after: a phantom, whatever its age.
        (1000.0, 1001.0, [("open_at_close", 961.0)]),
    ],
)
def test_stalls(
    tmp_path: Path, stall_after: float, closed_at: float | None, expected: list[Any]
) -> None:
    report = _report(tmp_path, [Run(KNOWN, closed_at)], stall_after)
    [run] = report.runs
    got = [(s.kind, s.open_s) for s in run.stalls]
    assert got == expected
    assert report.stalls == len(expected)
    for s in run.stalls:
        assert (s.prompt_id, s.generation_index, s.attempt, s.group_id) == (4, 0, 0, "g3")
        assert s.started_at == 40.0


def _stopped_and_restored(closed_at: float | None, resume: bool) -> list[Run]:
    # Run A dispatches sibling 5 at weight version 2 and stops with it open;
    # run B restores, then resumes it (or restarts it) and trains it.
    a = Run(
        [
            (10.0, synced(2)),
            (11.0, d(5, 0, 2, "g5")),
            (12.0, rt.SnapshotPublished(step=1, path="/s/1", captured_at=11.5)),
            (13.0, synced(3)),
        ],
        closed_at,
    )
    again: list[tuple[float, rt.Event]] = [
        (22.0, rt.AttemptResumed(group_id="g5", prompt_id=5, generation_index=0, attempt=0, turn=1))
        if resume
        else (22.0, d(5, 1, 3, "g5")),
        (25.0, sealed(5, 0 if resume else 1, "g5")),
    ]
    b = Run(
        [
            (20.0, rt.RestoreStarted(path="/s/1", step=1)),
            (21.0, rt.RestoreFinished(step=1, unfinished_groups=["g5"])),
            *again,
            (26.0, synced(4)),
            (27.0, trained(2, "g5")),
        ]
    )
    return [a, b]


@pytest.mark.parametrize(
    ("closed_at", "resume", "lag"),
    [
        # Killed, then resumed: the lag comes from the dispatch in the run before.
        (None, True, 2.0),
        # Closed cleanly at the stop, then resumed: in flight at a stop, no phantom.
        (14.0, True, 2.0),
        # Closed cleanly, then restarted as attempt 1 at version 3.
        (14.0, False, 1.0),
    ],
)
def test_a_try_in_flight_at_a_stop_is_no_stall_and_keeps_its_version(
    tmp_path: Path, closed_at: float | None, resume: bool, lag: float
) -> None:
    report = _report(tmp_path, _stopped_and_restored(closed_at, resume))
    a, b = report.runs
    assert a.stopped and not b.stopped
    assert report.stalls == 0
    assert (b.staleness.attempts, b.staleness.unknown, b.staleness.max) == (1, 0, lag)


def _layouts(files: list[Path], out: Path, seed: int) -> list[list[Path]]:
    """The same lines as other sets of files: the reverse, split and shuffled, gzip."""
    lines = [ln for f in files for ln in f.read_bytes().splitlines(keepends=True)]
    sets = []
    reverse = out / "reverse"
    reverse.mkdir(parents=True)
    sets.append([_put(reverse / f"{i}.jsonl", f.read_bytes()) for i, f in enumerate(files[::-1])])
    shuffled = out / "shuffled"
    shuffled.mkdir()
    rng = random.Random(seed)
    mixed = rng.sample(lines, len(lines))
    thirds = [mixed[i::3] for i in range(3)]
    sets.append([_put(shuffled / f"{i}.jsonl", b"".join(part)) for i, part in enumerate(thirds)])
    zipped = out / "gzip"
    zipped.mkdir()
    sets.append([_put(zipped / "all.jsonl.gz", gzip.compress(b"".join(lines[::-1])))])
    return sets


def _put(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("seed", [1, 2])
def test_the_report_is_the_same_in_any_layout(tmp_path: Path, seed: int) -> None:
    runs = [Run(KNOWN, None), *_stopped_and_restored(None, True)]
    files = write_runs(tmp_path / "set", runs)
    want = msgspec.to_builtins(rt.health_report(files, stall_after=600.0))
    for layout in _layouts(files, tmp_path / "layouts", seed):
        assert msgspec.to_builtins(rt.health_report(layout, stall_after=600.0)) == want


def test_events_and_paths_give_the_same_report(tmp_path: Path) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    assert rt.health_report(list(rt.read(files))) == rt.health_report(files)
    assert rt.health_report(files[0]) == rt.health_report([str(files[0])])


def test_lines_that_are_no_event_are_counted(tmp_path: Path) -> None:
    [written] = write_runs(tmp_path / "set", [Run(KNOWN)])
    with written.open("ab") as f:
        f.write(b"not json\n{}\n")
    report = rt.health_report(written)
    assert report.bad_lines == 2 and report.runs[0].attempts["sealed"] == 3


def test_the_whole_set_pools_the_intervals_and_rates_of_its_runs(tmp_path: Path) -> None:
    runs = [Run(KNOWN), *_stopped_and_restored(None, True)]
    report = rt.health_report(write_runs(tmp_path / "set", runs))
    # Steps: KNOWN's gaps 10 and 18; B trains one step (no gap).
    assert (report.step_interval_s.count, report.step_interval_s.max) == (2, 18.0)
    assert sum(report.sealed_per_s.per_s) * report.sealed_per_s.bucket_s == pytest.approx(4)


def test_the_api_reports_what_the_command_reports_of_conflicting_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run written twice, one line of the copy edited: the note names both files,
    # from rt.health_report(paths) as from `rollout-trace report` and rt.analyze.
    [first] = write_runs(tmp_path / "set", [Run(KNOWN)])
    lines = first.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b'"attempt":0', b'"attempt":5', 1)
    assert b'"attempt":5' in lines[3]
    copy = first.with_name("copy.jsonl")
    copy.write_bytes(b"".join(lines))
    report = rt.health_report([first, copy])
    note = report.notes[0]
    assert "copies of the run disagree" in note and f"{copy}, {first}" in note
    assert report.notes == rt.analyze([first, copy]).health().notes
    assert main(["report", str(first), str(copy), "--json"]) == (1 if report.stalls else 0)
    assert json.loads(capsys.readouterr().out)["notes"] == report.notes
