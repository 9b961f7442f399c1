"""``rollout-trace demo``: a simulated controller, really killed and restored, end to end."""

from __future__ import annotations

import asyncio
import glob
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from rollout_trace._cli.common import fmt_num, fmt_time
from rollout_trace._cli.main import main
from rollout_trace._demo.sim import Sim

# Run ids are new in every run; every other figure is the seed's.
_IDS = ("stopped_run", "restored_run")


class Demo(NamedTuple):
    status: int
    stdout: str
    stderr: str
    traces: list[Path]  # the killed run's first, by trace_opened time
    runs: list[list[dict[str, Any]]]  # each trace's events
    cost: dict[str, Any]  # what `rollout-trace cost --json` says of the traces


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_trace", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_demo(out: Path, seed: int, *extra: str) -> Demo:
    proc = run_cli("demo", "--out", str(out), "--seed", str(seed), *extra)
    assert proc.returncode == 0, proc.stderr
    runs = []
    for path in out.glob("trace-*.jsonl"):
        runs.append((path, [json.loads(line) for line in path.read_text().splitlines()]))
    runs.sort(key=lambda r: r[1][0]["time"])
    cost = run_cli("cost", "--json", *(str(p) for p, _ in runs))
    assert cost.returncode == 0, cost.stderr
    return Demo(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        [p for p, _ in runs],
        [events for _, events in runs],
        json.loads(cost.stdout),
    )


_demos: dict[int, Demo] = {}


def demo_of(seed: int, tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """One demo run per seed for the whole module: each test reads it."""
    if seed not in _demos:
        _demos[seed] = run_demo(tmp_path_factory.mktemp(f"demo-seed{seed}"), seed)
    return _demos[seed]


def figures(demo: Demo) -> dict[str, Any]:
    (stop,) = demo.cost["stops"]
    return {k: v for k, v in stop.items() if k not in _IDS}


def printed_figures(stdout: str) -> dict[str, str]:
    """The figure rows of the first stop's table in the demo's output."""
    rows: dict[str, str] = {}
    lines = iter(stdout.splitlines())
    for line in lines:
        if line.startswith("stop 1 of 1:"):
            break
    next(lines), next(lines)  # header and rule
    for line in lines:
        if not line.strip():
            break
        figure, value, *_ = re.split(r"\s{2,}", line.strip())
        rows[figure] = value
    return rows


def test_demo_runs_end_to_end_and_prints_what_cost_computes(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    demo = demo_of(1, tmp_path_factory)
    assert len(demo.traces) == 2
    check = run_cli("validate", *map(str, demo.traces))
    assert check.returncode == 0, check.stdout + check.stderr

    expected = {
        k: fmt_time(v) if k in ("stop_time", "captured_at") else fmt_num(v)
        for k, v in figures(demo).items()
    }
    assert printed_figures(demo.stdout) == expected
    (stop,) = demo.cost["stops"]
    assert f"run {stop['stopped_run']} stopped; run {stop['restored_run']} restored" in demo.stdout
    for command in ("rollout-trace cost", "rollout-trace summary"):
        assert command in demo.stdout


def test_every_command_the_demo_points_at_runs_on_its_traces(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    demo = demo_of(1, tmp_path_factory)
    after = demo.stdout.split("\nnext:\n", 1)[1]
    commands = [
        shlex.split(line.split("#")[0])
        for line in after.splitlines()
        if line.strip().startswith("rollout-trace ")
    ]
    names = [c[1] for c in commands]
    assert names == ["report", "attempts", "watch", "cost", "summary", "validate"]
    for command in commands:
        args = [glob.glob(a) if "*" in a else [a] for a in command[1:]]
        flat = [x for group in args for x in group]
        if command[1] == "attempts":
            flat[flat.index("-o") + 1] = str(tmp_path / "attempts.csv")
        if command[1] == "watch":
            flat.append("--once")
        proc = run_cli(*flat)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
    # The demo's stop has tries in flight: the report shows them, with no stall.
    report = run_cli("report", "--json", *map(str, demo.traces))
    doc = json.loads(report.stdout)
    assert doc["stalls"] == 0 and doc["runs"][0]["attempts"]["unended"] > 0
    # A run's sealed uses are at most its seals (a use sealed before the
    # stop is the stopped run's, not counted again by the restored run).
    for run in doc["runs"]:
        uses = sum(n for k, n in run["tries"].items() if k != "unsealed")
        assert 0 < uses <= run["attempts"]["sealed"], run["tries"]
    set_uses = sum(n for k, n in doc["tries"].items() if k != "unsealed")
    assert set_uses <= sum(r["attempts"]["sealed"] for r in doc["runs"])


def test_the_first_run_was_killed_and_the_second_closed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    killed, restored = demo_of(1, tmp_path_factory).runs
    # SIGKILL gives the tracer no chance to close: no trace_closed, and the
    # flush before the kill left every line whole (json.loads read them all).
    assert [e["event"] for e in killed].count("trace_closed") == 0
    assert restored[-1]["event"] == "trace_closed"
    assert restored[-1]["dropped"] == restored[-1]["invalid"] == 0
    first_rollout = next(e for e in restored if e["event"] != "trace_opened")
    assert first_rollout["event"] == "restore_started"
    assert killed[0]["pid"] != restored[0]["pid"]  # two processes


def _count(run: list[dict[str, Any]], event: str, **fields: Any) -> int:
    return sum(
        1 for e in run if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
    )


@pytest.mark.parametrize(
    ("what", "holds"),
    [
        # tries open at the kill that the restored run resumed, with their turn
        ("resumed", lambda f, a, b: f["resumed"] > 0 and _count(b, "attempt_resumed") > 0),
        # tries open at the kill that had to start over
        ("restarted", lambda f, a, b: f["restarted"] > 0 and f["thrown_away_s"] > 0),
        # the restore reports the tries it starts over as abandoned for `restart`
        ("restart", lambda f, a, b: _count(b, "attempt_abandoned", reason="restart") > 0),
        # work sealed after the snapshot's capture, done again
        ("redone", lambda f, a, b: f["redone"] > 0 and f["redone_s"] > 0),
        # steps trained after the restored step
        ("lost_steps", lambda f, a, b: f["lost_steps"] > 0),
        # a try failed before the stop: it counts nowhere in the figures
        ("failed", lambda f, a, b: _count(a, "attempt_abandoned", reason="failed") > 0),
        # the run starts at the snapshot's step, not from scratch
        ("restored_step", lambda f, a, b: f["restored_step"] > 0),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_stop_costs_something_of_every_kind(
    seed: int, what: str, holds: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    demo = demo_of(seed, tmp_path_factory)
    killed, restored = demo.runs
    assert holds(figures(demo), killed, restored), (what, figures(demo))


def _without_ids(run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("run_id", "pid")} for e in run]


@pytest.mark.parametrize(
    ("other_seed", "same"),
    [
        (1, True),  # the same seed again: the same figures, event for event
        (2, False),  # another seed: other figures
    ],
)
def test_a_seed_decides_the_figures(
    other_seed: int, same: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    first = demo_of(1, tmp_path_factory)
    # Into the first run's folder: the demo replaces the files it wrote there.
    again = run_demo(first.traces[0].parent, other_seed)
    assert len(again.traces) == 2
    assert (figures(again) == figures(first)) is same
    assert ([_without_ids(r) for r in again.runs] == [_without_ids(r) for r in first.runs]) is same


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_ray_workers_give_the_figures_of_asyncio_workers(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pytest.importorskip("ray")
    demo = run_demo(tmp_path, 1, "--ray")
    check = run_cli("validate", *map(str, demo.traces))
    assert check.returncode == 0, check.stdout + check.stderr
    assert [r[0]["meta"]["workers"] for r in demo.runs] == ["ray", "ray"]
    assert figures(demo) == figures(demo_of(1, tmp_path_factory))


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        # Ray missing: name the extra that brings it
        ("no-ray", ["--ray"], "pip install 'rollout-trace[ray]'"),
        # --out names a file
        ("file", [], "is a file, not a folder"),
        # --out holds a trace no demo wrote: never replace it
        ("foreign-trace", [], "trace-1.jsonl, which no demo wrote"),
    ],
)
def test_usage_errors_exit_2_and_say_why(
    setup: str,
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    if setup == "no-ray":
        monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    elif setup == "file":
        out.write_text("")
    elif setup == "foreign-trace":
        out.mkdir()
        (out / "trace-1.jsonl").write_text('{"event": "trace_opened", "meta": {}}\n')
    assert main(["demo", "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    if setup == "foreign-trace":
        assert (out / "trace-1.jsonl").exists()


async def test_the_clock_orders_tasks_by_simulated_time_not_real_time() -> None:
    # A task that awaits something real (a Ray call) holds the clock: the
    # other task cannot act at a later simulated time meanwhile.
    sim = Sim(100.0)
    log: list[tuple[str, float]] = []

    async def slow_then_early() -> None:
        await asyncio.sleep(0.05)  # real time, like an actor call
        await sim.sleep(1.0)
        log.append(("slow", sim.now()))

    async def fast_then_late() -> None:
        await sim.sleep(2.0)
        log.append(("fast", sim.now()))

    sim.spawn(fast_then_late(), "fast")
    sim.spawn(slow_then_early(), "slow")
    await sim.run(float("inf"), lambda: len(log) == 2)
    assert log == [("slow", 101.0), ("fast", 102.0)]


def test_the_demo_will_not_overwrite_files_no_demo_wrote(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    mine = tmp_path / "checkpoints" / "step-100.json"
    mine.write_text("precious")
    (tmp_path / "timeline.html").write_text("precious")
    proc = subprocess.run(
        [sys.executable, "-m", "rollout_trace", "demo", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "would overwrite" in proc.stderr
    assert mine.read_text() == "precious"
    assert (tmp_path / "timeline.html").read_text() == "precious"
