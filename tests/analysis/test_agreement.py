"""report, watch --once, attempts, cost and the timeline agree on one trace set (issue #26).

On the differential run's random sets (``differential.sets``, in one file per
run) the commands are run here, in this process, and must agree on:

- tries: the attempts table's rows, the report's outcomes summed, and the
  attempt slices of the timeline document;
- stalls: the report's (``--stall-after 1``) and watch's, and their exit
  statuses;
- tries in flight: watch's per run, and the attempts table's open tries
  (none in a run a later run was restored from, as watch documents);
- stop figures: cost's in_flight, resumed, restarted and redone per stop, the
  attempts table's rows with that fate and stop number (with their lost_s
  adding up to the stop's time figures), and the timeline's marks of them.

Before the one model, report and watch disagreed on stalls in about a
quarter of these sets (a try resumed or dispatched again while open was a
stall to report and none to watch; an older try left open in a stopped run
that closed cleanly was one to report only).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from differential.layouts import in_order
from differential.outputs import attempt_rows, open_rows, parse_watch
from differential.sets import AnyEvent, random_trace_set
from scenario import disp, resume, seal

import rollout_trace as rt
from rollout_trace._cli.main import main

# The quick tier's sets.
SEEDS = range(25)


def _cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue()


@dataclass
class Outputs:
    report: dict[str, Any]
    report_rc: int
    watch: str
    watch_rc: int
    rows: list[dict[str, str]]
    cost: dict[str, Any]
    timeline: dict[str, Any]


def outputs_of(runs: list[list[AnyEvent]], folder: Path) -> Outputs:
    """Each command's answer for ``runs``, written one file per run into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = in_order(runs, random.Random(0), folder)
    report_rc, report = _cli(["report", "--json", "--stall-after", "1", *paths])
    watch_rc, watch = _cli(["watch", "--once", "--stall-after", "1", *paths])
    _, cost = _cli(["cost", "--json", *paths])
    csv_path, json_path = folder / "a.csv", folder / "t.json"
    assert _cli(["attempts", *paths, "-o", str(csv_path)])[0] == 0
    assert _cli(["timeline", *paths, "-o", str(json_path)])[0] == 0
    return Outputs(
        report=json.loads(report),
        report_rc=report_rc,
        watch=watch,
        watch_rc=watch_rc,
        rows=attempt_rows(csv_path.read_text()),
        cost=json.loads(cost),
        timeline=json.loads(json_path.read_text()),
    )


_cache: dict[int, Outputs] = {}


@pytest.fixture
def got(case: int, tmp_path_factory: pytest.TempPathFactory) -> Outputs:
    if case not in _cache:
        runs = random_trace_set(random.Random(case))
        _cache[case] = outputs_of(runs, tmp_path_factory.mktemp(f"agree-{case}"))
    return _cache[case]


@pytest.fixture(params=SEEDS, ids=[f"case-{k}" for k in SEEDS])
def case(request: pytest.FixtureRequest) -> int:
    seed: int = request.param
    return seed


# --- tries -----------------------------------------------------------------------


def _slices(timeline: dict[str, Any]) -> list[dict[str, Any]]:
    """The timeline's attempt slices (their opening events)."""
    return [e for e in timeline["traceEvents"] if e.get("cat") == "attempt" and e["ph"] == "b"]


def test_tries_agree(got: Outputs) -> None:
    outcomes = sum(got.report["attempts"].values())
    assert len(got.rows) == outcomes == len(_slices(got.timeline))
    per_run = Counter(r["run_id"] for r in got.rows)
    assert per_run == {
        r["run_id"]: n for r in got.report["runs"] if (n := sum(r["attempts"].values()))
    }


# --- stalls ------------------------------------------------------------------------


def _shown(prompt: Any) -> str:
    return repr(prompt)


def _report_stalls(report: dict[str, Any]) -> Counter[tuple[str, ...]]:
    return Counter(
        (
            r["run_id"][:8],
            s["kind"],
            _shown(s["prompt_id"]),
            str(s["generation_index"]),
            str(s["attempt"]),
            f"{s['open_s']:,.1f}",
        )
        for r in report["runs"]
        for s in r["stalls"]
    )


def _watch_stalls(watch: str) -> tuple[int, Counter[tuple[str, ...]], dict[str, int]]:
    """Watch's count of stalls, the rows it shows (at most ten), and its count per run."""
    frame = parse_watch(watch)
    ids = frame.run_ids()
    rows: Counter[tuple[str, ...]] = Counter(
        (ids[s["run"]], s["kind"], s["prompt_id"], s["generation"], s["attempt"], s["open_s"])
        for s in frame.stalls
    )
    per_run = {r["run_id"]: int(r["stalls"].replace(",", "")) for r in frame.runs}
    return frame.stall_count, rows, per_run


def _agree(report: dict[str, Any], report_rc: int, watch: str, watch_rc: int) -> None:
    """That a report (as JSON) and a watch frame show the same stalls."""
    count, shown, per_run = _watch_stalls(watch)
    stalls = _report_stalls(report)
    assert count == report["stalls"] == sum(stalls.values())
    assert per_run == {r["run_id"][:8]: len(r["stalls"]) for r in report["runs"]}
    # Watch lists the ten oldest: all of them when there are no more.
    if count <= len(shown):
        assert shown == stalls
    else:
        assert not shown - stalls
    assert watch_rc == report_rc == (1 if count else 0)


def test_stalls_agree(got: Outputs) -> None:
    _agree(got.report, got.report_rc, got.watch, got.watch_rc)


def test_the_issues_case_report_and_watch_agree(tmp_path: Path) -> None:
    # trace_opened; a try dispatched, resumed while open, sealed; a step later.
    rid = f"{26:032x}"
    timed: list[tuple[float, AnyEvent]] = [
        (100.0, rt.TraceOpened(sdk_version="0", pid=1, host="node-1")),
        (101.0, disp(2, 0, 0)),
        (102.0, resume(2, 0, 0)),
        (103.0, seal(2, 0, 0)),
        (110.0, rt.StepTrained(step=1, group_ids=[])),
    ]
    run = [
        msgspec.structs.replace(ev, time=t, run_id=rid, seq=i) for i, (t, ev) in enumerate(timed)
    ]
    got = outputs_of([run], tmp_path)
    count, shown, _ = _watch_stalls(got.watch)
    assert (got.report["stalls"], got.report_rc) == (count, got.watch_rc) == (0, 0)
    assert shown == _report_stalls(got.report)
    # The attempts table: the dispatched try unended (superseded: not open, no
    # try in flight), the resumed one sealed; as the report counts them.
    assert [(r["attempt"], r["outcome"], r["ended_at"]) for r in got.rows] == [
        ("0", "unended", ""),
        ("0", "sealed", "103.0"),
    ]
    assert {k: v for k, v in got.report["attempts"].items() if v} == {"unended": 1, "sealed": 1}
    assert open_rows(got.rows) == []
    test_in_flight_agrees(got)
    test_tries_agree(got)


# --- tries in flight -------------------------------------------------------------------


def test_in_flight_agrees(got: Outputs) -> None:
    frame = parse_watch(got.watch)
    stopped = {r["run_id"][:8] for r in got.report["runs"] if r["stopped"]}
    assert {r["run_id"] for r in frame.runs if r["state"] == "stopped"} == stopped
    open_now = Counter(got.rows[i]["run_id"][:8] for i in open_rows(got.rows))
    watch = {r["run_id"]: int(r["in_flight"].replace(",", "")) for r in frame.runs}
    assert watch == {r: 0 if r in stopped else open_now[r] for r in watch}


# --- stop figures ----------------------------------------------------------------------

_FATE = re.compile(r"^(resumed|restarted) by run \d+ at stop (\d+) \((in flight|sealed) ")
_REDONE = re.compile(r" at stop (\d+) was captured")


def _timeline_fates(timeline: dict[str, Any]) -> Counter[tuple[str, int]]:
    """(fate, stop) of each attempt slice the timeline marks with one."""
    found: Counter[tuple[str, int]] = Counter()
    for e in _slices(timeline):
        args = e["args"]
        if "after_stop" in args:
            m = _FATE.match(args["after_stop"])
            assert m, args["after_stop"]
            found[m.group(1), int(m.group(2))] += 1
            # Only a resumed try may have been sealed before the stop (after the capture).
            assert m.group(3) == "in flight" or m.group(1) == "resumed"
        if "redone" in args:
            m = _REDONE.search(args["redone"])
            assert m, args["redone"]
            found["redone", int(m.group(1))] += 1
    return found


def test_stop_figures_agree(got: Outputs) -> None:
    stops = got.cost["stops"]
    fates: Counter[tuple[str, int]] = Counter(
        (r["fate"], int(r["stop"])) for r in got.rows if r["fate"]
    )
    runs_of: dict[int, set[str]] = {}
    for r in got.rows:
        if r["fate"]:
            runs_of.setdefault(int(r["stop"]), set()).add(r["run_id"])
    assert _timeline_fates(got.timeline) == fates
    instants = {
        int(e["name"].split()[1]): e["args"]
        for e in got.timeline["traceEvents"]
        if e.get("cat") == "stop" and e["ph"] == "i"
    }
    for number, stop in enumerate(stops, 1):
        marked = {f: fates[f, number] for f in ("resumed", "restarted", "redone")}
        # The rows so marked are the stopped run's tries, and only its.
        assert runs_of.get(number, set()) <= {stop["stopped_run"]}
        if stop["stopped_run"] is None:
            assert not any(marked.values())
            continue
        mine = [r for r in got.rows if r["stop"] == str(number)]
        open_marked = sum(1 for r in mine if r["ended_at"] == "")
        assert stop["in_flight"] == open_marked
        assert stop["restarted"] == marked["restarted"]
        assert all(r["ended_at"] == "" for r in mine if r["fate"] == "restarted")
        assert all(r["outcome"] == "sealed" for r in mine if r["fate"] == "redone")
        if stop["captured_at"] is None:
            # Only the open siblings are classed; the figures that need C are null.
            assert stop["resumed"] is None and stop["redone"] is None
            assert not marked["redone"] and open_marked == len(mine)
        else:
            assert stop["resumed"] == marked["resumed"]
            assert stop["redone"] == marked["redone"]
            for fate, figure in (
                ("resumed", "resumed_s"),
                ("restarted", "thrown_away_s"),
                ("redone", "redone_s"),
            ):
                lost = [float(r["lost_s"]) for r in mine if r["fate"] == fate]
                if stop[figure] is not None:
                    assert stop[figure] == pytest.approx(math.fsum(lost)), figure
        if number in instants:
            args = instants[number]
            for figure in ("in_flight", "resumed", "restarted", "redone"):
                assert args[figure] == stop[figure], figure
