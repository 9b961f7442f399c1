"""``rollout-trace report``: its exit status gates a job, its JSON names, its arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from traced import KNOWN, Run, write_runs

from rollout_trace._cli.main import main


@pytest.mark.parametrize(
    ("stall_after", "status", "stalls"),
    [
        # Sibling 4 is open 960 s at the run's end.
        ("600", 1, 1),
        ("959.5", 1, 1),
        # Not yet a stall.
        ("960.5", 0, 0),
    ],
)
def test_a_stall_fails_the_command(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stall_after: str,
    status: int,
    stalls: int,
) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    args = ["report", *map(str, files), "--json", "--stall-after", stall_after]
    assert main(args) == status
    doc = json.loads(capsys.readouterr().out)
    [run] = doc["runs"]
    assert len(run["stalls"]) == stalls == doc["stalls"]
    for s in run["stalls"]:
        assert (s["prompt_id"], s["generation_index"], s["attempt"]) == (4, 0, 0)
        assert s["open_s"] == 960.0
    assert (run["staleness"]["p50"], run["staleness"]["max"]) == (2.0, 3.0)
    assert run["attempts"]["sealed"] == 3 and run["attempts"]["failed"] == 3
    assert doc["files"] == [str(f) for f in files] and doc["bad_lines"] == 0


def test_the_text_report_names_the_stalled_try(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    assert main(["report", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert "open_too_long" in out and "960.0" in out
    assert "policy lag p50 2.0  max 3.0  (3 attempts)" in out
    assert "1: 1,  2: 1,  3+: 1 sealed siblings;  1 unsealed" in out


@pytest.mark.parametrize(
    "value",
    [
        "0",  # not above 0
        "-5",  # negative
        "nan",  # not a number of seconds
        "inf",  # never
        "soon",  # not a number
    ],
)
def test_a_bad_stall_after_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    assert main(["report", *map(str, files), f"--stall-after={value}"]) == 2
    err = capsys.readouterr().err
    assert f"{value!r} is not a number of seconds" in err and "above 0" in err
