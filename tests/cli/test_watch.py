"""``rollout-trace watch``: following files as they grow, and the live view in a real terminal."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from scenario import (
    disp,
    lines,
    make_run,
    restore,
    restored,
    resume,
    run_id,
    seal,
    snapshot,
    step,
    write,
)
from traced import KNOWN, Run, write_runs

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._cli.watch import frame
from rollout_trace._model import traceset
from rollout_trace._reading.reader import ReadProblem, iter_blocks
from rollout_trace._report.live import Follower, LiveView


@pytest.mark.parametrize(
    ("stall_after", "status", "shown"),
    [
        # Sibling 4 open 960 s at the run's last event: a stall, exit 1.
        ("600", 1, "stalls: 1 (open longer than 600 s"),
        # Not yet one.
        ("1000", 0, "stalls: none (open longer than 1000 s)"),
    ],
)
def test_once_prints_one_frame(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stall_after: str,
    status: int,
    shown: str,
) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    assert main(["watch", str(files[0].parent), "--once", "--stall-after", stall_after]) == status
    out = capsys.readouterr().out
    assert shown in out
    [row] = [line for line in out.splitlines() if line.endswith(("open", "closed"))]
    # in_flight 1 (sibling 4), sealed 3, open (killed: no trace_closed).
    cells = row.split()
    assert (cells[-5], cells[-4], cells[-1]) == ("1", "3", "open")


def _lines(follower: Follower) -> list[bytes]:
    return list(follower.lines())


def test_a_torn_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":')
    follower = Follower([str(path)])
    assert _lines(follower) == [b'{"a":1}']
    assert _lines(follower) == []  # nothing new
    with path.open("ab") as f:
        f.write(b'2}\n{"c":3}\n')
    assert _lines(follower) == [b'{"b":2}', b'{"c":3}']


def test_files_that_appear_are_followed(tmp_path: Path) -> None:
    follower = Follower([str(tmp_path), str(tmp_path / "later-*.jsonl")])
    assert _lines(follower) == []
    (tmp_path / "a.jsonl").write_bytes(b"1\n")
    (tmp_path / "later-1.jsonl").write_bytes(b"2\n")
    assert sorted(_lines(follower)) == [b"1", b"2"]


def test_a_growing_gzip_file_gives_each_line_once(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b"1\n2\n"))
    follower = Follower([str(path)])
    assert _lines(follower) == [b"1", b"2"]
    with path.open("ab") as f:  # a new member, as the jsonl sink appends them
        f.write(gzip.compress(b"3\n"))
    assert _lines(follower) == [b"3"]
    with path.open("ab") as f:  # half a member: written so far
        f.write(gzip.compress(b"4\n5\n")[:12])
    assert _lines(follower) == []


def test_a_gzip_member_cut_short_does_not_hold_up_the_next(tmp_path: Path) -> None:
    # A writer killed in the middle of a write, then a restored run appending
    # its own members: their lines are read, the torn line alone.
    path = tmp_path / "t.jsonl.gz"
    killed = gzip.compress(b'{"a":1}\n{"a":2}\n{"a":3}\n' * 50)
    path.write_bytes(killed[: len(killed) // 2])
    follower = Follower([str(path)])
    got = _lines(follower)
    assert got and all(line == b'{"a":%d}' % (i % 3 + 1) for i, line in enumerate(got))
    with path.open("ab") as f:
        f.write(gzip.compress(b'{"b":1}\n'))
        f.write(gzip.compress(b'{"b":2}\n'))
    more = _lines(follower)
    assert more[-2:] == [b'{"b":1}', b'{"b":2}']
    assert all(b"b" not in line for line in more[:-2])  # nothing glued on a torn line
    assert follower.damaged == 0


def test_a_plain_path_that_does_not_exist_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", str(tmp_path / "nothing.jsonl"), "--once"]) == 2
    assert "nothing.jsonl" in capsys.readouterr().err


def test_a_run_read_from_two_files_counts_once(tmp_path: Path) -> None:
    [written] = write_runs(tmp_path / "set", [Run(KNOWN)])
    shutil.copyfile(written, tmp_path / "set" / "copy.jsonl")
    view = LiveView([str(tmp_path / "set")], 600.0)
    view.poll()
    [run] = view.ordered()
    assert run.events == len(written.read_bytes().splitlines())
    assert len(run.seals) == 3 and len(run.open_tries()) == 1
    assert run.read_twice == run.events


def test_a_gzip_trace_still_being_written_is_read_as_far_as_it_is_flushed(
    tmp_path: Path,
) -> None:
    # The sink writes each batch as a whole gzip member: what was flushed is
    # read while the run goes on.
    view = LiveView([str(tmp_path)], 600.0)
    with rt.sync_tracer(f"jsonl://{tmp_path}/live.jsonl.gz") as t:
        for p in range(50):
            t.emit(rt.AttemptDispatched(group_id="g", prompt_id=p, generation_index=0,
                                        attempt=0, weight_version=1))  # fmt: skip
        assert t.flush(timeout=10)
        view.poll()
        [run] = view.ordered()
        assert (run.events, len(run.open_tries())) == (51, 50)  # trace_opened and 50
        for p in range(30):
            t.emit(rt.AttemptSealed(group_id="g", prompt_id=p, generation_index=0, attempt=0))
        assert t.flush(timeout=10)
        view.poll()
        assert (run.events, len(run.open_tries()), len(run.seals)) == (81, 20, 30)
    view.poll()
    assert run.closed and run.events == 82 and view.follower.damaged == 0


@pytest.mark.parametrize(
    "how",
    [
        "renamed",  # rotated away, a new file at the path
        "truncated",  # cut short and written again, longer than before
    ],
)
def test_a_file_replaced_at_its_path_is_read_from_its_start(tmp_path: Path, how: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(b'{"old":%d}\n' % i for i in range(5)))
    follower = Follower([str(path)])
    assert len(_lines(follower)) == 5
    if how == "renamed":
        path.rename(tmp_path / "t.jsonl.1")
    new = b"".join(b'{"new":%d}\n' % i for i in range(16))
    path.write_bytes(new)
    assert _lines(follower) == new.splitlines()


def _copies(tmp_path: Path) -> list[Path]:
    # One run in two files whose lines differ (a conflicting copy): one holds
    # a later seal and a later last event than the other.
    [a] = write_runs(tmp_path / "a", [Run(KNOWN)])
    lines = a.read_bytes().splitlines(keepends=True)
    b = tmp_path / "b.jsonl"
    b.write_bytes(b"".join(lines[:-1]) + lines[-1].replace(b"1000.0", b"2000.0"))
    return [a, b]


def test_the_frame_is_the_same_in_any_order_of_files(tmp_path: Path) -> None:
    a, b = _copies(tmp_path)
    frames = []
    for order in ([a, b], [b, a]):
        view = LiveView([str(p) for p in order], 600.0)
        view.poll()
        frames.append(frame(view, 3000.0).split("\n", 1)[1])
    assert frames[0] == frames[1]
    assert "lines read twice" in frames[0]


def test_a_stopped_run_has_nothing_in_flight_and_a_closed_one_shows_its_phantoms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = rt.SnapshotPublished(step=0, path="/s", captured_at=10.5)
    a = Run([(10.0, rt.AttemptDispatched(group_id="g", prompt_id=1, generation_index=0,
                                         attempt=0, weight_version=1)), (11.0, snap)])  # fmt: skip
    b = Run(
        [(20.0, rt.RestoreStarted(path="/s", step=0)),
         (21.0, rt.RestoreFinished(step=0, unfinished_groups=["g"])),
         (22.0, rt.AttemptDispatched(group_id="g", prompt_id=2, generation_index=0, attempt=0,
                                     weight_version=1))],
        closed_at=23.0,
    )  # fmt: skip
    files = write_runs(tmp_path / "set", [a, b])
    assert main(["watch", str(files[0].parent), "--once"]) == 1
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.endswith(("stopped", "closed"))]
    assert [(r[-5], r[-1]) for r in rows] == [("0", "stopped"), ("1", "closed")]
    assert "open_at_close" in out and "open_too_long" not in out


def test_the_last_stop_line_counts_the_classes_cost_counts(tmp_path: Path) -> None:
    # The worked example (C = 100, stop at 130): two tries open at the stop, one
    # resumed and one restarted; one sealed after the capture and resumed, one
    # sealed after it and redone; 93 s lost in all.
    a = make_run(
        1,
        50.0,
        [
            (90.0, disp(1, 0)),
            (92.0, disp(4, 0)),
            (95.0, disp(2, 0)),
            (101.0, snapshot(3, "/s/3", captured_at=100.0)),
            (105.0, disp(3, 0)),
            (110.0, seal(2, 0)),
            (120.0, seal(3, 0)),
            (130.0, step(1)),
        ],
    )
    b = make_run(2, 140.0, [(150.0, restore("/s/3", 3)), (151.0, resume(1, 0)),
                            (152.0, resume(2, 0)), (153.0, restored(3))])  # fmt: skip
    write(tmp_path / "a.jsonl", a)
    write(tmp_path / "b.jsonl", b)
    view = LiveView([str(tmp_path)], 600.0)
    view.poll()
    [line] = [x for x in frame(view, 200.0).splitlines() if x.startswith("last stop:")]
    assert line.endswith("in flight 2; resumed 2, restarted 1, redone 1; lost 93.0 s"), line


def test_bad_lines_are_counted_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "junk.jsonl").write_bytes(b"not json\n{}\n")
    assert main(["watch", str(tmp_path), "--once"]) == 0
    assert "lines that are no trace event: 2" in capsys.readouterr().out


# --- in a real terminal -----------------------------------------------------------

_WRITER = r"""
import sys, time
from pathlib import Path
import rollout_trace as rt

out, go = Path(sys.argv[1]), Path(sys.argv[2])

def wait(step):
    while not (go / step).exists():
        time.sleep(0.02)

def disp(p):
    return rt.AttemptDispatched(group_id="g", prompt_id=p, generation_index=0, attempt=0,
                                weight_version=1)

with rt.sync_tracer(f"jsonl://{out}/live-{{run_id}}.jsonl") as t:
    for p in range(5):
        t.emit(disp(p))
    t.flush()
    wait("seal")
    for p in range(3):
        t.emit(rt.AttemptSealed(group_id="g", prompt_id=p, generation_index=0, attempt=0))
    t.flush()
    wait("close")
"""


def _pane(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def _until(session: str, ok: Callable[[str], bool], timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _pane(session)
        if ok(screen):
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"the pane never showed it; it shows:\n{screen}")
        time.sleep(0.1)


def _row(screen: str) -> list[str]:
    rows = [line.split() for line in screen.splitlines() if line.endswith(("open", "closed"))]
    return rows[0] if rows else []


@pytest.fixture
def tmux_session(tmp_path: Path) -> Iterator[str]:
    # Skipped only where tmux is truly missing; CI installs it (.ci/run), so
    # there a missing tmux fails instead of skipping.
    if shutil.which("tmux") is None and not os.environ.get("CI"):
        pytest.skip("tmux is not installed (apt-get install tmux)")
    session = f"rt-watch-{os.getpid()}"
    yield session
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_watch_redraws_as_another_process_writes(tmp_path: Path, tmux_session: str) -> None:
    out, go = tmp_path / "traces", tmp_path / "go"
    out.mkdir()
    go.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(out), str(go)], env=env)
    try:
        command = (
            f"{sys.executable} -m rollout_trace watch {out} --interval 0.2; "
            "echo watch-exited-$?; sleep 30"
        )
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", tmux_session, "-x", "200", "-y", "40", command],
            check=True,
            env=env,
        )
        # Five tries dispatched, none sealed, the run open.
        screen = _until(tmux_session, lambda s: _row(s)[-5:-3] == ["5", "0"])
        assert _row(screen)[-1] == "open" and "last stop: none yet" in screen
        (go / "seal").touch()
        screen = _until(tmux_session, lambda s: _row(s)[-5:-3] == ["2", "3"])
        (go / "close").touch()
        assert writer.wait(timeout=20) == 0
        screen = _until(tmux_session, lambda s: _row(s)[-1:] == ["closed"])
        assert _row(screen)[-5:-3] == ["2", "3"]
        # A frame replaces the last: one header on the screen.
        assert screen.count("rollout-trace watch:") == 1
        subprocess.run(["tmux", "send-keys", "-t", tmux_session, "C-c"], check=True)
        _until(tmux_session, lambda s: "watch-exited-0" in s)
    finally:
        writer.kill()
        writer.wait()


# --- watch answers from the model of the set (issue #26) --------------------------


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().out


def _report(paths: list[str], capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    rc, out = _cli(["report", "--json", *flags, *paths], capsys)
    doc: dict[str, Any] = json.loads(out)
    doc["rc"] = rc
    return doc


def test_the_issues_case_watch_agrees_with_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Dispatched, resumed while open, sealed, a step later: the first try is
    # superseded (not open), the second sealed. No stall, exit 0, for both.
    run = make_run(
        26, 100.0, [(101.0, disp(2, 0)), (102.0, resume(2, 0)), (103.0, seal(2, 0)),
                    (110.0, step(1))],
    )  # fmt: skip
    path = str(write(tmp_path / "run.jsonl", run))
    report = _report([path], capsys, "--stall-after", "1")
    assert (report["stalls"], report["rc"]) == (0, 0)
    rc, out = _cli(["watch", "--once", "--stall-after", "1", path], capsys)
    assert rc == 0
    assert "stalls: none (open longer than 1 s)" in out
    [row] = [line.split() for line in out.splitlines() if line.endswith("open")]
    assert (row[-5], row[-4], row[-2]) == ("0", "1", "0")  # in flight, sealed, stalls


def test_a_try_left_open_in_a_stopped_run_that_closed_is_a_stall_as_report_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Run 1 has two tries of one sibling open (attempts 0 and 1) and closes cleanly;
    # run 2 restores it. The stop takes up the sibling's last try (attempt 1), not
    # attempt 0: that one is open at a clean close, a stall of any age (``report``).
    # The old watch took no stopped run's close for one, and exited 0.
    body = [(101.0, disp(1, 0, 0)), (102.0, disp(1, 0, 1)), (103.0, snapshot(1, "/s", 103.0))]
    a = make_run(1, 100.0, body, closed=104.0)
    b = make_run(2, 200.0, [(201.0, restore("/s", 1)), (202.0, restored(1))])
    paths = [str(write(tmp_path / "a.jsonl", a)), str(write(tmp_path / "b.jsonl", b))]
    report = _report(paths, capsys)
    [stall] = report["runs"][0]["stalls"]
    assert (stall["kind"], stall["attempt"], report["rc"]) == ("open_at_close", 0, 1)
    rc, out = _cli(["watch", "--once", *paths], capsys)
    assert rc == 1
    assert "stalls: 1 (open longer than 600 s" in out
    [shown] = [line.split() for line in out.splitlines() if "open_at_close" in line]
    assert shown == ["1", "open_at_close", "1", "0", "0", "3.0"]


def test_runs_are_in_the_run_order_with_their_last_event_by_seq(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Run 1's clock stepped back: an event before its trace_opened, and its last
    # event (by seq) earlier than the one before it. The run order goes by
    # trace_opened (run 2 first), and a run's last event is its highest seq's, as
    # report has them; the old watch went by the earliest and the latest times.
    a = make_run(1, 100.0, [(50.0, disp(1, 0)), (130.0, seal(1, 0)), (120.0, step(1))])
    b = make_run(2, 80.0, [(81.0, disp(1, 0))])
    paths = [str(write(tmp_path / "a.jsonl", a)), str(write(tmp_path / "b.jsonl", b))]
    report = _report(paths, capsys)
    assert [r["run_id"] for r in report["runs"]] == [run_id(2), run_id(1)]
    view = LiveView(paths, 600.0)
    view.poll()
    runs = view.ordered()
    assert [r.run_id for r in runs] == [run_id(2), run_id(1)]
    assert [r.last_time for r in runs] == [r["last_time"] for r in report["runs"]] == [81.0, 120.0]


def test_each_version_of_a_seq_counts_as_summary_counts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two copies of a run whose last line differs (a conflicting copy): summary
    # counts each version; the old watch counted the seq once.
    run = make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, step(1))])
    other = [*run[:-1], msgspec.structs.replace(run[-1], time=103.0)]
    paths = [str(write(tmp_path / "a.jsonl", run)), str(write(tmp_path / "b.jsonl", other))]
    _, out = _cli(["summary", "--json", *paths], capsys)
    [summary] = json.loads(out)["runs"]
    view = LiveView(paths, 600.0)
    view.poll()
    [live] = view.ordered()
    assert live.events == summary["events"] == 4
    assert live.read_twice == 3


def _damaged(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    for i in range(at, at + 40):
        out[i] ^= 0xFF
    return bytes(out)


def _trace_lines(runs: int = 2, tries: int = 150) -> bytes:
    events = []
    for n in range(1, runs + 1):
        body = []
        t = 1000.0 * n
        for p in range(tries):
            body += [(t + 2 * p + 1, disp(p, 0)), (t + 2 * p + 2, seal(p, 0))]
        events += make_run(n, 1000.0 * n, body, closed=t + 2 * tries + 1)
    return lines(events)


@pytest.mark.parametrize(
    "where",
    [
        # 40 bytes flipped a third of the way into a file gzipped whole: the lines
        # they inflate to are bad, and so is the damage, found in the last member.
        "a third in",
        # In the first bytes of the only member: not one whole line comes out (the
        # old watch showed "no trace event yet", exit 0, no word of the damage).
        "at the start",
    ],
)
def test_a_damaged_gzip_file_counts_its_bad_lines_as_summary_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    packed = gzip.compress(_trace_lines(), mtime=0)
    at = len(packed) // 3 if where == "a third in" else 12
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(_damaged(packed, at))
    _, out = _cli(["summary", "--json", str(path)], capsys)
    summary = json.loads(out)
    assert summary["bad_lines"] >= 1
    rc, out = _cli(["watch", "--once", str(path)], capsys)
    assert rc == 0
    assert f": {len(summary['runs'])} run(s) in 1 file(s), " in out  # the runs it could read
    assert (
        f"lines that are no trace event: {summary['bad_lines']:,}; gzip files with damaged "
        "bytes (skipped to the next member): 1"
    ) in out
    events = int(out.split(" events,")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert events == sum(r["events"] for r in summary["runs"])


def test_damage_in_the_last_member_is_said_before_the_file_ends_and_once(tmp_path: Path) -> None:
    # A gzip file still being written whose last member is damaged: the walk finds
    # the damage at once, and says it where the next member begins; it is counted
    # when it is found, and not again when the next member comes.
    first, second = _trace_lines(1, 20), _trace_lines(1, 30)
    damaged = _damaged(gzip.compress(first, mtime=0), 60)
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(damaged)
    view = LiveView([str(path)], 600.0)
    view.poll()
    found = view.bad_lines
    assert found >= 1 and view.follower.damaged == 1
    with path.open("ab") as f:
        f.write(gzip.compress(second, mtime=0))
    assert view.poll() == len(second.splitlines())
    assert (view.bad_lines, view.follower.damaged) == (found, 1)
    problems: list[ReadProblem] = []
    assert sum(len(evs) for _, evs, _ in iter_blocks(str(path), problems)) == sum(
        r.events + r.read_twice for r in view.ordered()
    )
    assert len(problems) == found


def test_a_torn_last_line_is_no_bad_line_while_it_may_still_be_written(tmp_path: Path) -> None:
    run = lines(make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))]))
    path = tmp_path / "t.jsonl"
    cut = len(run) - 20
    path.write_bytes(run[:cut])
    view = LiveView([str(path)], 600.0)
    assert view.poll() == 2
    assert view.bad_lines == 0  # the reader would count it (the end of the file): watch waits
    with path.open("ab") as f:
        f.write(run[cut:] + b"not an event\n")
    assert view.poll() == 1
    [live] = view.ordered()
    assert (live.events, len(live.seals), view.bad_lines) == (3, 1, 1)
    assert "not JSON" in view.problems[0].reason and view.problems[0].line == 4


def test_a_frame_after_one_run_grew_builds_that_run_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = traceset.normalize

    def counting(run: str, *args: Any) -> Any:
        calls.append(run)
        return real(run, *args)

    monkeypatch.setattr(traceset, "normalize", counting)
    paths = []
    for n in range(1, 4):
        run = make_run(n, 100.0 * n, [(100.0 * n + 1, disp(1, 0))])
        paths.append(write(tmp_path / f"run-{n}.jsonl", run))
    view = LiveView([str(tmp_path)], 600.0)
    view.poll()
    frame(view, 1000.0)
    assert sorted(calls) == [run_id(1), run_id(2), run_id(3)]
    calls.clear()
    assert view.poll() == 0
    frame(view, 1000.0)
    assert calls == []  # nothing new: not even the stops are costed again
    with paths[1].open("ab") as f:
        f.write(lines([_stamped(seal(1, 0), 205.0, run_id(2), 2)]))
    assert view.poll() == 1
    text = frame(view, 1000.0)
    assert calls == [run_id(2)]
    rows = [line.split() for line in text.splitlines() if line.endswith("open")]
    assert [(r[-5], r[-4]) for r in rows] == [("1", "0"), ("0", "1"), ("1", "0")]


def _stamped(ev: rt.Event, t: float, rid: str, seq: int) -> rt.Event:
    return msgspec.structs.replace(ev, time=t, run_id=rid, seq=seq)
