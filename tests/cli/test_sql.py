"""``rollout-trace sql`` and ``rt.analyze``: the user's own questions over the one model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from scenario import disp, make_run, seal, step

import rollout_trace as rt
from rollout_trace._cli.main import main

EXAMPLE = Path(__file__).parents[1] / "data" / "example"
PATHS = sorted(str(p) for p in EXAMPLE.glob("*.jsonl"))


def _sql(capsys: pytest.CaptureFixture[str], query: str, *flags: str) -> tuple[int, Any]:
    code = main(["sql", *PATHS, query, "--json", *flags])
    out = capsys.readouterr().out
    return code, json.loads(out) if code == 0 else None


def test_the_stops_view_holds_the_figures_cost_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--json", *PATHS]) == 0
    cost = json.loads(capsys.readouterr().out)["stops"]
    code, rows = _sql(capsys, "select * from stops order by stop")
    assert code == 0
    assert [{k: r[k] for k in c} for r, c in zip(rows, cost, strict=True)] == cost


def test_the_tries_view_is_the_attempts_table_and_open_is_reports_stall_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, rows = _sql(capsys, "select * from tries")
    assert code == 0
    attempts = [msgspec.to_builtins(r) for r in rt.attempts(PATHS)]
    assert [{k: r[k] for k in a} for r, a in zip(rows, attempts, strict=True)] == attempts
    # A stall is an open try older than --stall-after: with 0, every open try.
    report = rt.health_report(PATHS, stall_after=0)
    stalled = sorted(
        (s.prompt_id, s.generation_index, s.attempt) for r in report.runs for s in r.stalls
    )
    opened = sorted(
        (r["prompt_id"], r["generation_index"], r["attempt"]) for r in rows if r["open"]
    )
    assert opened == stalled and opened


def test_events_steps_and_runs_count_what_the_files_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = [json.loads(x) for p in PATHS for x in Path(p).read_text().splitlines()]
    code, rows = _sql(capsys, "select event, count(*) as n from events group by event")
    assert code == 0
    by_name: dict[str, int] = {}
    for line in lines:
        by_name[line["event"]] = by_name.get(line["event"], 0) + 1
    assert {r["event"]: r["n"] for r in rows} == by_name
    _, steps = _sql(capsys, "select run_id, seq, step from steps")
    written = [x for x in lines if x["event"] == "step_trained"]
    assert sorted((r["run_id"], r["seq"], r["step"]) for r in steps) == sorted(
        (x["run_id"], x["seq"], x["step"]) for x in written
    )
    _, runs = _sql(capsys, "select run_id, events from runs order by run")
    assert sorted(r["events"] for r in runs) == sorted(
        sum(1 for x in lines if x["run_id"] == r["run_id"]) for r in runs
    )


def test_a_query_duckdb_refuses_says_why_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", *PATHS, "select nope from tries"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rollout-trace sql: error: the query failed:") and "nope" in err


def test_without_duckdb_the_command_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "duckdb", None)
    assert main(["sql", *PATHS, "select 1"]) == 2
    assert "pip install 'rollout-trace[sql]'" in capsys.readouterr().err


def test_no_other_command_imports_duckdb_or_pyarrow() -> None:
    # The sql and parquet extras are optional: importing the package and running
    # every other reading command must not load them.
    code = (
        "import sys, contextlib, io\n"
        "import rollout_trace\n"
        "from rollout_trace._cli.main import main\n"
        f"paths = {PATHS!r}\n"
        "for words in (['cost'], ['summary'], ['validate'], ['report'], ['watch', '--once']):\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        main([*words, *paths])\n"
        "print(sorted(m for m in ('duckdb', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_analyze_answers_what_every_command_does() -> None:
    ts = rt.analyze(PATHS)
    assert [s.to_dict() for s in ts.stops] == [
        s.to_dict() for s in rt.restore_costs(rt.read(PATHS))
    ]
    assert msgspec.to_builtins(ts.health()) == msgspec.to_builtins(rt.health_report(PATHS))
    assert ts.attempts() == rt.attempts(PATHS)
    assert ts.timeline_document() == rt.timeline_document(rt.read(PATHS))
    assert ts.to_arrow("tries").num_rows == len(ts.attempts())
    with pytest.raises(ValueError, match="no table 'trys': the tables are events, tries"):
        ts.to_arrow("trys")


def test_the_steps_view_has_the_version_the_report_judges_lag_by(tmp_path: Path) -> None:
    # One run with no weights_synced before its first step: that step takes the
    # highest version dispatched before it (3, then 1), as report's staleness
    # does; one after a sync, that.
    first = rt.AttemptDispatched(
        group_id="g", prompt_id=1, generation_index=0, attempt=0, weight_version=3
    )
    run = make_run(
        1,
        100.0,
        [
            (101.0, first),
            (102.0, disp(2, 0)),
            (103.0, seal(2, 0)),
            (104.0, step(1)),
            (105.0, rt.WeightsSynced(weight_version=4)),
            (106.0, step(2)),
        ],
    )
    ts = rt.analyze(run)
    steps = ts.to_arrow("steps").to_pylist()
    assert [(s["step"], s["weight_version"]) for s in steps] == [(1, 3), (2, 4)]
    assert [s.weight_version for s in ts.health().runs[0].staleness.steps] == [3, 4]
