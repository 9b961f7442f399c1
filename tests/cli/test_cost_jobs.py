"""``rollout-trace cost --jobs N`` and ``--ray``: the output of a read in one process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from scenario import abandon, disp, lines, make_run, restore, restored, resume, seal, snapshot, step
from scenario import write as write_run

import rollout_trace as rt
from rollout_trace._cli import jobs as jobs_module
from rollout_trace._cli.main import main
from rollout_trace._reading import pieces

ROOT = Path(__file__).resolve().parents[2]


def _run_a(n: int, opened: float, siblings: int, *, restore_from: str | None) -> list[rt.Event]:
    """A run with ``siblings`` tries, a snapshot, and a restore first when ``restore_from``."""
    timed: list[tuple[float, rt.Event]] = []
    t = opened + 1.0
    if restore_from is not None:
        timed += [(t, restore(restore_from, 2)), (t + 1.0, restored(2))]
        timed += [(t + 1.5, resume(n * 1000 - 1, 0)), (t + 1.6, seal(n * 1000 - 1, 0))]
        t += 2.0
    for i in range(siblings):
        p = n * 1000 + i
        timed.append((t, disp(p, 0)))
        if i % 7 == 3:
            timed += [(t + 0.1, abandon(p, 0)), (t + 0.2, disp(p, 0, 1)), (t + 0.5, seal(p, 0, 1))]
        elif i < siblings - 3:  # the last few are in flight at the stop
            timed.append((t + 0.5, seal(p, 0)))
        t += 0.01
        if i % 50 == 49:
            timed.append((t, step(i // 50 + 1)))
    timed.append((t + 0.1, snapshot(2, f"/s/{n}", t)))
    return make_run(n, opened, timed)


def _set(folder: Path) -> list[Path]:
    """Three runs, two stops: plain files large enough to cut, and a gzip one."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        write_run(folder / "a.jsonl", _run_a(1, 100.0, 200, restore_from=None)),
        write_run(folder / "b.jsonl", _run_a(2, 200.0, 150, restore_from="/s/1")),
        write_run(folder / "c.jsonl.gz", _run_a(3, 300.0, 100, restore_from="/s/2"), gz=True),
    ]


def _torn(folder: Path) -> list[Path]:
    files = _set(folder)
    with files[0].open("ab") as f:
        f.write(b'{"event": "attempt_sealed", "time": 1')  # a torn last line
    return files


def _bad_lines(folder: Path) -> list[Path]:
    """Bad lines all through a file that is cut in ranges, and more than are shown."""
    files = _set(folder)
    body = files[1].read_bytes().split(b"\n")
    for at in range(5, len(body), 23):
        body.insert(at, b"not json" if at % 2 else b"")
    files[1].write_bytes(b"\n".join(body))
    return files


def _conflict(folder: Path) -> list[Path]:
    """Run 2 read from two files, one line of the copy different: a conflicting copy."""
    files = _set(folder)
    copy = folder / "b-copy.jsonl"
    body = files[1].read_bytes().split(b"\n")
    body[40] = body[40].replace(b'"time":', b'"time":1', 1)
    copy.write_bytes(b"\n".join(body))
    return [*files, copy]


def _read_twice(folder: Path) -> list[Path]:
    """A whole copy of a run (two sinks of one tracer): counted once, noted."""
    files = _set(folder)
    shutil.copy(files[0], folder / "a-copy.jsonl")
    return [*files, folder / "a-copy.jsonl"]


SETS: list[tuple[str, Callable[[Path], list[Path]], int]] = [
    # Several runs and stops, a gzip file among them.
    ("stops", _set, 0),
    # A torn last line in a file cut into ranges.
    ("torn", _torn, 0),
    # Bad lines with their line numbers, in a file cut into ranges.
    ("bad_lines", _bad_lines, 0),
    # A conflicting copy across files: noted, exit 1.
    ("conflict", _conflict, 1),
    # A run read twice from two files.
    ("read_twice", _read_twice, 0),
]


def _cost(files: list[Path], capsys: pytest.CaptureFixture[str], *flags: str) -> tuple:
    code = main(["cost", *map(str, files), "--json", *flags])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pieces of a few hundred bytes: the files of a test set are cut into many
    # ranges and tasks (the plan is made in this process; the workers only read).
    monkeypatch.setattr(pieces, "_MIN_PIECE", 256)


@pytest.mark.parametrize(("name", "build", "status"), SETS, ids=[s[0] for s in SETS])
@pytest.mark.usefixtures("small_pieces")
def test_every_jobs_gives_the_output_of_one_process(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    build: Callable[[Path], list[Path]],
    status: int,
) -> None:
    files = build(tmp_path / name)
    one = _cost(files, capsys, "--jobs", "1")
    assert one[0] == status
    if name == "bad_lines":
        assert "b.jsonl:6: skipped" in one[2] and "more bad line(s)" in one[2]
    if name == "torn":
        assert "a.jsonl:" in one[2] and "torn last line" in one[2]
    if name == "conflict":
        assert "conflicting_copies" in one[1]
    for jobs in ("2", "3"):
        # The files in their order and the other way round: a trace set is a set.
        assert _cost(files, capsys, "--jobs", jobs) == one
        backwards = _cost(files[::-1], capsys, "--jobs", jobs)
        assert backwards[:2] == one[:2]
        assert backwards == _cost(files[::-1], capsys, "--jobs", "1")


@pytest.mark.usefixtures("small_pieces")
def test_a_conflicting_copy_across_pieces_is_found_in_either_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two files with the same run and one line that differs, each read by
    # its own worker: the second read still compares the copies.
    run = _run_a(1, 100.0, 60, restore_from=None)
    first = write_run(tmp_path / "one.jsonl", run)
    body = lines(run).split(b"\n")
    body[20] = body[20].replace(b'"time":', b'"time":1', 1)
    second = tmp_path / "two.jsonl"
    second.write_bytes(b"\n".join(body))
    for files in ([first, second], [second, first]):
        code, out, _ = _cost(files, capsys, "--jobs", "2")
        assert code == 1
        assert '"kind": "conflicting_copies"' in out
        assert (code, out) == _cost(files, capsys, "--jobs", "1")[:2]


@pytest.mark.parametrize(
    "value",
    [
        "0",  # no worker at all
        "-2",  # negative
        "two",  # not a number
    ],
)
def test_jobs_below_one_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    files = _set(tmp_path)
    assert main(["cost", str(files[0]), f"--jobs={value}"]) == 2
    err = capsys.readouterr().err
    assert f"argument --jobs: {value!r} is not a number of worker processes" in err
    assert "1 or more" in err


def test_a_worker_that_dies_stops_the_command_with_an_error_naming_its_piece(
    tmp_path: Path,
) -> None:
    files = _set(tmp_path)
    big = tmp_path / "big.jsonl"
    big.write_bytes(files[0].read_bytes() * 2000)  # cut into ranges by default pieces
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        jobs_module._DIE_ON: "b.jsonl",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "rollout_trace", "cost", str(big), *map(str, files), "--jobs", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error: a worker process ended before it was done" in proc.stderr
    assert str(files[1]) in proc.stderr
    assert proc.stdout == ""


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ray_gives_the_output_of_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    files = _conflict(tmp_path)
    monkeypatch.setattr(pieces, "_MIN_PIECE", 1024)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # The workers of the local cluster import this checkout.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    one = _cost(files, capsys, "--jobs", "1")
    assert one[0] == 1 and "conflicting_copies" in one[1]
    assert _cost(files, capsys, "--ray") == one


def test_ray_missing_is_a_usage_error_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    files = _set(tmp_path)
    assert main(["cost", str(files[0]), "--ray"]) == 2
    assert "pip install 'rollout-trace[ray]'" in capsys.readouterr().err
