"""``rollout-trace watch``: following files as they grow, and the live view in a real terminal."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from traced import KNOWN, Run, write_runs

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._cli.watch import frame
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
