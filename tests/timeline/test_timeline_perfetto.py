"""The document as Perfetto's JSON importer reads it: async tries, flows, counters, epoch times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import timeline_data as td
from perfetto_rules import check_trace_events, flows
from scenario import (
    abandon,
    disp,
    make_run,
    refuse,
    restore,
    restored,
    resume,
    seal,
    snapshot,
    write,
)
from traced import Run, d, sealed, synced, trained, write_runs

import rollout_trace as rt
from rollout_trace._cli import timeline as timeline_cli
from rollout_trace._cli.main import main
from rollout_trace._timeline.document import MAX_US

EXAMPLE = Path(__file__).parents[1] / "data" / "example"
T0 = td.T0


def _doc(events: list[Any]) -> dict[str, Any]:
    doc = rt.timeline_document(events)
    check_trace_events(doc)
    return doc


@pytest.mark.parametrize(
    "events",
    [
        pytest.param(td.every_kind(), id="every-kind"),  # every event type and outcome, a stop
        pytest.param(list(rt.read(EXAMPLE)), id="example"),  # the shipped example trace set
        pytest.param(td.many_attempts(3000), id="many"),  # 64 slots, retries, a stop
        pytest.param(td.crowded(), id="crowded"),  # steps close together, a resumed try
    ],
)
def test_the_document_follows_the_importers_rules(events: list[Any]) -> None:
    doc = _doc(events)
    tries = [e for e in doc["traceEvents"] if e.get("cat") == "attempt"]
    assert len(tries) == 2 * doc["otherData"]["attempts"]  # a `b` and an `e` each
    assert not [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "attempt"]


# --- times ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "ts"),
    [
        (1_780_000_000.5, 1_780_000_000_500_000),  # the example: exact
        (1_780_000_000.25, 1_780_000_000_250_000),  # a quarter second: exact too
        (1_780_000_000.0, 1_780_000_000_000_000),  # a whole second
        (100.0, 100_000_000),  # near the epoch, as tests and simulations write
        (-5.0, 0),  # before the epoch: written at it
        (1e300, MAX_US),  # past the year 2255: written at the last time a float holds
    ],
)
def test_timestamps_are_microseconds_since_the_epoch(t: float, ts: float) -> None:
    doc = _doc(make_run(1, t, [(t, disp(1, 0)), (t, seal(1, 0))]))
    [begin] = [e for e in doc["traceEvents"] if e["ph"] == "b"]
    assert begin["ts"] == ts
    assert doc["otherData"]["time_origin_unix_s"] == t


def test_a_time_keeps_its_microseconds() -> None:
    # 1.78e15 µs is held by a float to a quarter of a microsecond.
    t = 1_780_000_000.123456
    doc = _doc(make_run(1, t, [(t, disp(1, 0))]))
    [begin] = [e for e in doc["traceEvents"] if e["ph"] == "b"]
    assert abs(begin["ts"] - 1_780_000_000_123_456) <= 0.25


# --- attempts as async slices ------------------------------------------------------------


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return _doc(td.every_kind())


def test_attempt_ids_are_unique_in_the_document(doc: dict[str, Any]) -> None:
    ids = [e["id2"]["local"] for e in doc["traceEvents"] if e["ph"] == "b"]
    assert len(ids) == len(set(ids)) == doc["otherData"]["attempts"] == 10


def test_tracks_are_named_and_stops_are_global(doc: dict[str, Any]) -> None:
    events = doc["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert set(processes) == {1, 2}
    threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] != "M"} <= threads
    [stop] = [e for e in events if e["name"] == "stop 1"]
    assert (stop["ph"], stop["s"], stop["ts"]) == ("i", "g", (T0 + 20) * 1e6)


# --- flows -------------------------------------------------------------------------------


def _sib(p: int, g: int, a: int = 0) -> dict[str, Any]:
    return {"group_id": f"grp-{p}", "prompt_id": p, "generation_index": g, "attempt": a}


def _step(n: int, *groups: str) -> rt.StepTrained:
    return rt.StepTrained(step=n, group_ids=list(groups))


def _stopped_and_restarted() -> list[rt.Event]:
    # A is stopped with (1, 0) in flight; B abandons it for restart and tries again.
    a = make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, snapshot(0, "/s", 101.5))])
    b = make_run(
        2,
        110.0,
        [
            (111.0, restore("/s", 0)),
            (112.0, restored(0)),
            (112.0, abandon(1, 0, 0, "restart")),
            (113.0, disp(1, 0, 1)),
            (114.0, seal(1, 0, 1)),
            (115.0, _step(1, "grp-1")),
        ],
        closed=116.0,
    )
    return a + b


# A slice as a test names it: ("try", pid, prompt, gen, attempt) or ("step", pid, step).
Slice = tuple[Any, ...]

FLOW_CASES: dict[str, tuple[list[Any], set[tuple[Slice, Slice]]]] = {
    # a failed try hands on to the sibling's next try in its run
    "failed-then-retried": (
        make_run(
            1,
            100.0,
            [
                (101.0, disp(1, 0)),
                (102.0, abandon(1, 0)),
                (103.0, disp(1, 0, 1)),
                (104.0, seal(1, 0, 1)),
            ],
        ),
        {(("try", 1, 1, 0, 0), ("try", 1, 1, 0, 1))},
    ),
    # a refused try too; another sibling's try is not its next one
    "refused-then-retried": (
        make_run(
            1,
            100.0,
            [
                (101.0, disp(1, 0)),
                (101.5, disp(1, 1)),
                (102.0, refuse(1, 0)),
                (103.0, disp(1, 0, 1)),
            ],
        ),
        {(("try", 1, 1, 0, 0), ("try", 1, 1, 0, 1))},
    ),
    # a try sealed before a stop flows to the step of the restored run that
    # trains its group (the same tries as report's staleness)
    "sealed-then-trained-after-a-restore": (
        make_run(
            1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0)), (103.0, snapshot(0, "/s", 102.5))]
        )
        + make_run(
            2, 110.0, [(111.0, restore("/s", 0)), (112.0, restored(0)), (113.0, _step(1, "grp-1"))]
        ),
        {(("try", 1, 1, 0, 0), ("step", 2, 1))},
    ),
    # a hedge begun before the seal is no retry of the sealed try, and the
    # cancelled hedge does not flow into a later use of its sibling (the
    # prompt come round again in another group): no flow at all
    "hedge-then-a-new-use": (
        make_run(
            1,
            100.0,
            [
                (101.0, disp(1, 0)),
                (101.5, disp(1, 0, 1)),
                (102.0, seal(1, 0)),
                (103.0, abandon(1, 0, 1, "cancelled")),
                (
                    500.0,
                    rt.AttemptDispatched(
                        group_id="epoch2",
                        prompt_id=1,
                        generation_index=0,
                        attempt=0,
                        weight_version=1,
                    ),
                ),
            ],
        ),
        set(),
    ),
    # a seal thrown away (its whole group tried again) flows to the retry
    "seal-thrown-away": (
        make_run(
            1,
            100.0,
            [
                (101.0, disp(1, 0)),
                (102.0, seal(1, 0)),
                (103.0, disp(1, 0, 1)),
                (104.0, seal(1, 0, 1)),
            ],
        ),
        {(("try", 1, 1, 0, 0), ("try", 1, 1, 0, 1))},
    ),
    # a sealed try flows to the step that names its group
    "sealed-then-trained": (
        make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0)), (103.0, _step(1, "grp-1"))]),
        {(("try", 1, 1, 0, 0), ("step", 1, 1))},
    ),
    # fail, retry, seal, train: one chain
    "a-chain": (
        make_run(
            1,
            100.0,
            [
                (101.0, disp(1, 0)),
                (102.0, abandon(1, 0, 0, "dropped")),
                (103.0, disp(1, 0, 1)),
                (104.0, seal(1, 0, 1)),
                (105.0, _step(1, "grp-1")),
            ],
        ),
        {
            (("try", 1, 1, 0, 0), ("try", 1, 1, 0, 1)),
            (("try", 1, 1, 0, 1), ("step", 1, 1)),
        },
    ),
    # a step that names other groups trains none of these
    "step-of-another-group": (
        make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0)), (103.0, _step(1, "grp-2"))]),
        set(),
    ),
    # a try sealed after a step is trained by the next step that names its group
    "sealed-after-a-step": (
        make_run(
            1,
            100.0,
            [
                (101.0, disp(1, 0)),
                (102.0, _step(1, "grp-1")),
                (103.0, seal(1, 0)),
                (104.0, _step(2, "grp-1")),
                (105.0, _step(3, "grp-1")),
            ],
        ),
        {(("try", 1, 1, 0, 0), ("step", 1, 2))},
    ),
    # across the stop: A's tries in flight go to B's resumed and restarted ones
    "every-kind": (
        td.every_kind(),
        {
            (("try", 1, 1, 0, 0), ("step", 1, 1)),
            (("try", 1, 2, 0, 0), ("try", 2, 2, 0, 0)),
            (("try", 1, 2, 1, 0), ("try", 2, 2, 1, 0)),
        },
    ),
    # in flight at the stop, abandoned for restart by B, tried again, trained
    "restarted-in-the-next-run": (
        _stopped_and_restarted(),
        {
            (("try", 1, 1, 0, 0), ("try", 2, 1, 0, 0)),
            (("try", 2, 1, 0, 0), ("try", 2, 1, 0, 1)),
            (("try", 2, 1, 0, 1), ("step", 2, 1)),
        },
    ),
    # sealed after the capture the restored run got back, and done again there
    # (redone): the seal was thrown away, so it flows to the retry
    "redone-in-the-next-run": (
        make_run(
            1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0)), (103.0, snapshot(0, "/s", 101.5))]
        )
        + make_run(2, 110.0, [(111.0, restore("/s", 0)), (112.0, disp(1, 0)), (113.0, seal(1, 0))]),
        {(("try", 1, 1, 0, 0), ("try", 2, 1, 0, 0))},
    ),
    # sealed before the capture: the restored state holds the result, so a try
    # of the sibling in the next run begins a new use, and no flow leads to it
    "kept-then-a-new-use-in-the-next-run": (
        make_run(
            1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0)), (103.0, snapshot(0, "/s", 102.5))]
        )
        + make_run(2, 110.0, [(111.0, restore("/s", 0)), (112.0, disp(1, 0)), (113.0, seal(1, 0))]),
        set(),
    ),
    # a clock that went back: the next try starts before the failed one, which
    # the importer would bind to the wrong slice, so no flow is drawn
    "clock-went-back": (
        make_run(
            1,
            100.0,
            [(105.0, disp(1, 0)), (106.0, abandon(1, 0)), (104.0, disp(1, 0, 1))],
        ),
        set(),
    ),
    # no next try: nothing to point at
    "failed-for-good": (
        make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, abandon(1, 0))]),
        set(),
    ),
}


def _name(ev: dict[str, Any]) -> Slice:
    a = ev["args"]
    if ev["cat"] == "attempt":
        return ("try", ev["pid"], a["prompt_id"], a["generation_index"], a["attempt"])
    assert ev["cat"] == "trained", ev
    return ("step", ev["pid"], a["step"])


@pytest.mark.parametrize("case", FLOW_CASES)
def test_flows_link_retries_and_trained_steps(case: str) -> None:
    events, expected = FLOW_CASES[case]
    doc = _doc(events)
    trace = doc["traceEvents"]
    drawn = {(_name(trace[f.source]), _name(trace[f.target])) for f in flows(trace)}
    assert drawn == expected


def test_a_chain_is_one_flow_id_stepped_on() -> None:
    events, _ = FLOW_CASES["a-chain"]
    trace = _doc(events)["traceEvents"]
    chain = flows(trace)
    assert len(chain) == 2 and len({f.id for f in chain}) == 1
    middle = trace[chain[0].target]
    assert middle["flow_in"] and middle["flow_out"] and middle["name"] == "sealed"


def test_a_trained_flow_ends_at_its_step() -> None:
    events, _ = FLOW_CASES["sealed-after-a-step"]
    trace = _doc(events)["traceEvents"]
    [flow] = flows(trace)
    target = trace[flow.target]
    [mark] = [e for e in trace if e["ph"] == "i" and e["name"] == "step 2"]
    assert (target["name"], target["ts"], target["pid"]) == ("step 2", mark["ts"], mark["pid"])
    assert target["args"]["group_id"] == "grp-1" and 2 in [target["args"]["step"]]
    assert (target["ph"], target["dur"]) == ("X", 0)


# --- counters ------------------------------------------------------------------------------


def _series(doc: dict[str, Any], name: str, pid: int = 1) -> list[tuple[float, float]]:
    return [
        (e["ts"], *e["args"].values())
        for e in doc["traceEvents"]
        if e["ph"] == "C" and e["name"] == name and e["pid"] == pid
    ]


@pytest.mark.parametrize(
    ("timed", "expected"),
    [
        # two overlap, a third starts where the first ends
        (
            [
                (101.0, disp(1, 0)),
                (102.0, disp(1, 1)),
                (103.0, seal(1, 0)),
                (103.0, disp(1, 2)),
                (104.0, seal(1, 1)),
                (105.0, seal(1, 2)),
            ],
            [(101, 1), (102, 2), (103, 2), (104, 1), (105, 0)],
        ),
        # a try of no length (an end with no start in the run) adds nothing
        (
            [(101.0, disp(1, 0)), (102.0, abandon(2, 0, 0, "restart")), (103.0, seal(1, 0))],
            [(101, 1), (102, 1), (103, 0)],
        ),
        # a try with no end runs until the run's last event
        (
            [(101.0, disp(1, 0)), (102.0, disp(1, 1)), (103.0, seal(1, 0)), (110.0, _step(1))],
            [(101, 1), (102, 2), (103, 1), (110, 0)],
        ),
        # a resumed try starts where it is resumed
        ([(104.0, resume(1, 0)), (106.0, seal(1, 0))], [(104, 1), (106, 0)]),
    ],
)
def test_attempts_in_flight_counts_by_hand(
    timed: list[tuple[float, rt.Event]], expected: list[tuple[float, int]]
) -> None:
    doc = _doc(make_run(1, 100.0, timed))
    assert _series(doc, "in flight") == [(t * 1e6, n) for t, n in expected]


def _dispatched(p: int, g: int, version: int) -> rt.AttemptDispatched:
    return rt.AttemptDispatched(**_sib(p, g), weight_version=version)


@pytest.mark.parametrize(
    ("synced", "versions", "after", "lag"),
    [
        ([2], [0], [], (2, 2)),  # one try
        ([2], [0, 0, 1], [], (2, 2)),  # lags 2, 2, 1
        ([3], [3, 1, 0, 2], [], (3, 1.5)),  # lags 0, 2, 3, 1: p50 linear, as report's
        ([1, 4], [2, 4], [], (2, 1.0)),  # the latest sync before the step counts
        ([1], [1], [9], (0, 0)),  # a sync after the step does not
        # no sync before the step: the highest version dispatched before it (1)
        # counts: lags 1 and 0 (they were 0 and -1, against the first dispatch's)
        ([], [0, 1], [2], (1, 0.5)),
    ],
)
def test_policy_lag_of_a_step_by_hand(
    synced: list[int], versions: list[int], after: list[int], lag: tuple[int, int] | None
) -> None:
    timed: list[tuple[float, rt.Event]] = [
        (100.1 + 0.1 * i, rt.WeightsSynced(weight_version=v)) for i, v in enumerate(synced)
    ]
    timed += [(101.0, _dispatched(1, g, v)) for g, v in enumerate(versions)]
    timed += [(102.0, seal(1, g)) for g in range(len(versions))]
    timed.append((103.0, _step(1, "grp-1")))
    timed += [(104.0, rt.WeightsSynced(weight_version=v)) for v in after]
    doc = _doc(make_run(1, 100.0, timed))
    expected_max = [] if lag is None else [(103e6, lag[0])]
    expected_p50 = [] if lag is None else [(103e6, lag[1])]
    assert _series(doc, "policy lag (max)") == expected_max
    assert _series(doc, "policy lag (p50)") == expected_p50


def test_a_resumed_try_lags_from_its_dispatch_in_the_run_before() -> None:
    # Dispatched with version 1 in A; resumed and sealed in B, which syncs
    # version 4 and trains it: a lag of 3, though B never dispatched it.
    a = make_run(
        1,
        100.0,
        [
            (101.0, _dispatched(1, 0, 1)),
            (101.5, _dispatched(1, 1, 2)),
            (102.0, snapshot(0, "/s", 101.8)),
        ],
    )
    b = make_run(
        2,
        110.0,
        [
            (111.0, restore("/s", 0)),
            (112.0, restored(0)),
            (112.0, resume(1, 0)),
            (112.0, resume(1, 1)),
            (113.0, seal(1, 0)),
            (113.0, seal(1, 1)),
            (113.5, rt.WeightsSynced(weight_version=4)),
            (114.0, _step(1, "grp-1")),
        ],
        closed=115.0,
    )
    doc = _doc(a + b)
    assert _series(doc, "policy lag (max)", pid=2) == [(114e6, 3)]
    assert _series(doc, "policy lag (p50)", pid=2) == [(114e6, 2.5)]
    # The same figures as the report's staleness for that step.
    [step] = rt.health_report(a + b).runs[1].staleness.steps
    assert (step.max, step.p50) == (3.0, 2.5)


def test_a_step_that_trains_many_tries_gives_each_flow_a_slice_of_its_own() -> None:
    # 600 tries trained by one step: their flows' ends must not nest (the
    # importer drops slices past 512 deep and binds their flows elsewhere).
    body: list[tuple[float, rt.Event]] = []
    for g in range(600):
        body += [(101.0, disp(1, g)), (102.0, seal(1, g))]
    body.append((103.0, _step(1, "grp-1")))
    doc = _doc(make_run(1, 100.0, body))
    trace = doc["traceEvents"]
    ends = {trace[f.target]["args"]["generation_index"] for f in flows(trace)}
    assert ends == set(range(600))
    starts = sorted(ev["ts"] for ev in trace if ev.get("cat") == "trained")
    assert starts[0] == 103e6 and starts[-1] == 103e6 + 599


def test_a_weight_version_too_large_for_a_float_is_an_unknown_lag(tmp_path: Path) -> None:
    # Valid JSON and valid to the schema, but 10**330 - 1 is no float.
    huge = 10**330
    events = make_run(
        1,
        100.0,
        [
            (101.0, rt.WeightsSynced(weight_version=huge)),
            (102.0, _dispatched(1, 0, 1)),
            (103.0, seal(1, 0)),
            (104.0, _step(1, "grp-1")),
        ],
    )
    path = write(tmp_path / "t.jsonl", events)
    out = tmp_path / "t.json"
    assert main(["timeline", str(path), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert _series(doc, "policy lag (max)") == []
    [run] = rt.health_report(path).runs
    assert (run.staleness.attempts, run.staleness.unknown) == (0, 1)


def test_a_write_that_fails_leaves_the_earlier_output_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "t.jsonl", make_run(1, 100.0, [(101.0, disp(1, 0))]))
    out = tmp_path / "t.json"
    assert main(["timeline", str(path), "-o", str(out)]) == 0
    before = out.read_bytes()

    def broken(tl: Any, f: Any, merge: Any) -> int:
        f.write(b'{"traceEvents":[')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(timeline_cli, "write_document", broken)
    assert main(["timeline", str(path), "-o", str(out)]) == 2
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.jsonl"]


def test_flows_and_lags_of_a_stop_written_through_the_sdk(tmp_path: Path) -> None:
    # Through the SDK with a clock (tests/traced.py): A dispatches sibling 5
    # at version 2 and is killed; B restores, resumes and seals it, syncs
    # version 4 and trains it. One arrow from A's try to B's resumed try, one
    # from that try to step 2, and a lag of 2 at step 2's time, as report says.
    a = Run([(10.0, synced(2)), (11.0, d(5, 0, 2, "g5")),
             (12.0, rt.SnapshotPublished(step=1, path="/s/1", captured_at=11.5))])  # fmt: skip
    b = Run(
        [(20.0, rt.RestoreStarted(path="/s/1", step=1)),
         (21.0, rt.RestoreFinished(step=1, unfinished_groups=["g5"])),
         (22.0, rt.AttemptResumed(group_id="g5", prompt_id=5, generation_index=0, attempt=0,
                                  turn=1)),
         (25.0, sealed(5, 0, "g5")), (26.0, synced(4)), (27.0, trained(2, "g5"))],
        closed_at=28.0,
    )  # fmt: skip
    files = write_runs(tmp_path / "set", [a, b])
    out = tmp_path / "t.json"
    assert main(["timeline", *map(str, files), "-o", str(out)]) == 0
    trace = check_trace_events(json.loads(out.read_text()))
    drawn = {(_name(trace[f.source]), _name(trace[f.target])) for f in flows(trace)}
    assert drawn == {
        (("try", 1, 5, 0, 0), ("try", 2, 5, 0, 0)),
        (("try", 2, 5, 0, 0), ("step", 2, 2)),
    }
    doc = json.loads(out.read_text())
    assert _series(doc, "policy lag (max)", pid=2) == [(27e6, 2)]
    [step] = rt.health_report(files).runs[1].staleness.steps
    assert (step.max, step.p50) == (2.0, 2.0)
