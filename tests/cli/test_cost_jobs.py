"""``rollout-trace cost --jobs N`` and ``--ray``: the output of a read in one process."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from scenario import abandon, disp, lines, make_run, restore, restored, resume, seal, snapshot, step
from scenario import write as write_run

import rollout_trace as rt
from rollout_trace._cli import cost as cost_module
from rollout_trace._cli import jobs as jobs_module
from rollout_trace._cli.main import main, program
from rollout_trace._reading import pieces
from rollout_trace._reading import reader as reader_module

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


def _conflict_dropped(folder: Path) -> list[Path]:
    """A conflicting copy of a run whose prompt comes round again, tries of one
    attempt number: the fold drops the starts the later tries supersede."""
    folder.mkdir(parents=True, exist_ok=True)
    timed = []
    for i in range(150):
        timed += [(100.0 + i, disp(7, 0)), (100.5 + i, seal(7, 0))]
    timed.append((300.0, snapshot(1, "/s/1", 300.0)))
    run_b = make_run(2, 400.0, [(401.0, restore("/s/1", 1)), (402.0, restored(1))])
    files = [
        write_run(folder / "a.jsonl", make_run(1, 99.0, timed)),
        write_run(folder / "b.jsonl", run_b),
    ]
    copy = folder / "a-copy.jsonl"
    body = files[0].read_bytes().split(b"\n")
    body[40] = body[40].replace(b'"time":', b'"time":1', 1)
    copy.write_bytes(b"\n".join(body))
    return [*files, copy]


def _conflict_dropped_at_the_end(folder: Path) -> list[Path]:
    """A conflicting copy of a run whose sibling was tried twice with one attempt
    number: too few tries for a compaction while folding, so the start the
    second try supersedes is dropped only when the figures are computed."""
    folder.mkdir(parents=True, exist_ok=True)
    timed = [(100.0, disp(7, 0, 1)), (100.5, seal(7, 0, 1))]
    timed += [(101.0, disp(7, 0, 1)), (101.5, seal(7, 0, 1))]
    timed.append((111.0, snapshot(1, "/s/1", 111.0)))
    run_a = make_run(1, 99.0, timed)
    run_b = make_run(2, 400.0, [(401.0, restore("/s/1", 1)), (402.0, restored(1))])
    copy = list(run_a)
    last = max(i for i, ev in enumerate(copy) if isinstance(ev, rt.AttemptDispatched))
    copy[last] = msgspec.structs.replace(copy[last], attempt=0)
    return [
        write_run(folder / "a.jsonl", run_a),
        write_run(folder / "b.jsonl", run_b),
        write_run(folder / "a-copy.jsonl", copy),
    ]


def _read_twice(folder: Path) -> list[Path]:
    """A whole copy of a run (two sinks of one tracer): counted once, noted."""
    files = _set(folder)
    shutil.copy(files[0], folder / "a-copy.jsonl")
    return [*files, folder / "a-copy.jsonl"]


def _str_prompts(folder: Path) -> list[Path]:
    """A few siblings with str prompt ids, each tried in one range of the file
    and tried again and sealed in another: a worker's hash of such a key is not
    the command's (hash randomization), and the merge must still join the two."""
    folder.mkdir(parents=True, exist_ok=True)
    timed = [(100.5 + i / 100, disp(f"k{i}", 0)) for i in range(8)]
    timed += [(101.0 + i / 100, step(i + 1)) for i in range(60)]  # lines between them
    timed += [(102.0 + i / 100, disp(f"k{i}", 0, 1)) for i in range(8)]
    timed += [(102.005 + i / 100, seal(f"k{i}", 0, 1)) for i in range(8)]
    timed.append((104.0, snapshot(1, "/s/1", 104.0)))
    run_b = make_run(2, 200.0, [(201.0, restore("/s/1", 1)), (202.0, restored(1))])
    return [
        write_run(folder / "a.jsonl", make_run(1, 100.0, timed)),
        write_run(folder / "b.jsonl", run_b),
    ]


SETS: list[tuple[str, Callable[[Path], list[Path]], int]] = [
    # Siblings with str prompt ids, their tries in different ranges.
    ("str_prompts", _str_prompts, 0),
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


def test_reads_are_merged_in_piece_order_whatever_order_they_finish_in(tmp_path: Path) -> None:
    # A run cut into ranges read by several workers is in seq order again once
    # merged, so the model takes it as it is (no sort, no row made again).
    run = _run_a(1, 100.0, 60, restore_from=None)
    path = write_run(tmp_path / "one.jsonl", run)
    size = path.stat().st_size
    cuts = [0, size // 3, 2 * size // 3, size]
    ps = [pieces.Piece(str(path), lo, hi) for lo, hi in itertools.pairwise(cuts)]
    tasks = [[2], [0], [1]]  # as the workers finish: the last range first
    merge = jobs_module._Merge(ps)
    for task in tasks:
        merge.add(task, jobs_module.read_pieces([(i, ps[i]) for i in task]))
    ((cols, _),) = merge.builder._collector.runs.values()
    assert list(cols.seq) == sorted(cols.seq) == [ev.seq for ev in run]
    (built,) = merge.builder.build().runs
    assert built.events.events is cols


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


# --- the command line, a program that calls main, and where workers cannot run --------------

# A program that runs the command line as the console script does, with pieces of
# a few hundred bytes so that a small set is cut into many tasks.
_PROGRAM = """\
import sys
from rollout_trace._cli.main import program
from rollout_trace._reading import pieces
if __name__ == "__main__":
    pieces._MIN_PIECE = 256
    sys.exit(program())
"""

# A user's script that calls main() at its top level, no `if __name__ == "__main__":`.
_UNGUARDED = """\
import sys
from rollout_trace._cli.main import main
from rollout_trace._reading import pieces
pieces._MIN_PIECE = 256
print("code", main(["cost", *sys.argv[1:], "--json"]), file=sys.stderr)
"""


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def _script(tmp_path: Path, text: str) -> str:
    script = tmp_path / "prog.py"
    script.write_text(text)
    return str(script)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def test_the_console_script_is_the_program() -> None:
    # (tomllib is 3.11 and later)
    text = (ROOT / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]\n", 1)[1].split("\n\n", 1)[0]
    assert scripts.splitlines() == ['rollout-trace = "rollout_trace._cli.main:program"']


@pytest.mark.parametrize(
    ("entry", "flags", "started"),
    [
        # Another program's main([...]): its __main__ may start workers at import.
        ("main", [], None),
        # ... unless it asks for them.
        ("main", ["--jobs", "3"], 3),
        # The command line itself: one worker per usable core.
        ("program", [], 4),
        # ... and --jobs 1 reads in the command's process.
        ("program", ["--jobs", "1"], None),
    ],
)
def test_default_jobs_are_the_cores_only_for_the_command_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    entry: str,
    flags: list[str],
    started: int | None,
) -> None:
    files = [str(f) for f in _set(tmp_path)]
    asked: list[int] = []

    def record(_: object, jobs: int) -> None:
        asked.append(jobs)

    monkeypatch.setattr(cost_module, "read_in_processes", record)
    monkeypatch.setattr(cost_module, "_usable_cores", lambda: 4)
    words = ["cost", *files, "--json", *flags]
    if entry == "main":
        code = main(words)
    else:
        monkeypatch.setattr(sys, "argv", ["rollout-trace", *words])
        code = program()
    assert code == 0, capsys.readouterr().err
    assert asked == ([] if started is None else [started])


def test_a_script_without_a_main_guard_reads_in_its_own_process(tmp_path: Path) -> None:
    # Workers would run the script again on import, and fail.
    files = [str(f) for f in _set(tmp_path / "set")]
    proc = subprocess.run(
        [sys.executable, _script(tmp_path, _UNGUARDED), *files],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == "code 0"
    one = subprocess.run(
        [sys.executable, "-m", "rollout_trace", "cost", *files, "--json", "--jobs", "1"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        check=True,
    )
    assert proc.stdout == one.stdout


@pytest.mark.skipif(_cores() < 2, reason="the default is one process on one core")
def test_the_command_line_reads_in_workers_by_default(tmp_path: Path) -> None:
    # The worker that reads b.jsonl dies: only a worker can.
    files = [str(f) for f in _set(tmp_path / "set")]
    proc = subprocess.run(
        [sys.executable, _script(tmp_path, _PROGRAM), "cost", *files],
        capture_output=True,
        text=True,
        env=_env(**{jobs_module._DIE_ON: "b.jsonl"}),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "error: a worker process ended before it was done" in proc.stderr


def _feed(data: bytes) -> Callable[[int], None]:
    """A writer of ``data`` to a pipe's write end, in a thread of its own."""

    def write(fd: int) -> None:
        def run() -> None:
            with contextlib.suppress(OSError), os.fdopen(fd, "wb") as f:
                f.write(data)

        threading.Thread(target=run, daemon=True).start()

    return write


def _special_cost(tmp_path: Path, how: str, data: bytes, others: list[str], jobs: str) -> tuple:
    """``cost`` (pieces of 256 bytes) with ``data`` given by a path only it can open."""
    argv = [sys.executable, _script(tmp_path, _PROGRAM), "cost"]
    tail = [*others, "--json", "--jobs", jobs]
    if how == "stdin":
        source = tmp_path / "stdin.jsonl"
        source.write_bytes(data)
        with source.open("rb") as stdin:
            proc = subprocess.run(
                [*argv, "/dev/stdin", *tail], stdin=stdin, capture_output=True, env=_env(),
                timeout=120, check=False,
            )  # fmt: skip
    elif how == "pipe":
        r, w = os.pipe()
        _feed(data)(w)
        try:
            proc = subprocess.run(
                [*argv, f"/dev/fd/{r}", *tail], pass_fds=(r,), capture_output=True, env=_env(),
                timeout=120, check=False,
            )  # fmt: skip
        finally:
            os.close(r)
    else:  # a named pipe
        fifo = tmp_path / f"fifo-{jobs}"
        os.mkfifo(fifo)

        def fill() -> None:
            with contextlib.suppress(OSError), fifo.open("wb") as f:
                f.write(data)

        threading.Thread(target=fill, daemon=True).start()
        proc = subprocess.run(
            [*argv, str(fifo), *tail], capture_output=True, env=_env(), timeout=120, check=False
        )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/fd and /dev/stdin")
@pytest.mark.parametrize(
    "how",
    [
        # `cost <(cat a.jsonl)`: /dev/fd/N, which no other process has.
        "pipe",
        # `cost /dev/stdin < a.jsonl`: a regular file here, /dev/null in a worker.
        "stdin",
        # A named FIFO: its bytes can be read once.
        "fifo",
    ],
)
def test_a_path_only_this_process_can_open_is_read_in_it(tmp_path: Path, how: str) -> None:
    files = _set(tmp_path / "set")
    data = files[0].read_bytes()
    others = [str(f) for f in files[1:]]
    one = _special_cost(tmp_path, how, data, others, "1")
    assert one[0] == 0, one[2]
    assert _special_cost(tmp_path, how, data, others, "2") == one


class _Broken:
    """A multiprocessing context whose ``what`` raises ``error`` when called."""

    def __init__(self, real: object, what: str, error: BaseException) -> None:
        self._real, self._what, self._error = real, what, error

    def __getattr__(self, name: str) -> object:
        if name == self._what:

            def fail(*_: object, **__: object) -> None:
                raise self._error

            return fail
        return getattr(self._real, name)


@pytest.mark.parametrize(
    ("what", "error"),
    [
        # A read-only /dev/shm: the shared state cannot be made.
        ("Array", OSError(errno.EROFS, "Read-only file system", "/dev/shm/pym-1")),
        # A full one.
        ("Value", OSError(errno.ENOSPC, "No space left on device")),
        # A platform without sem_open: the pool's queues cannot be made.
        ("SimpleQueue", ImportError("This platform lacks a functioning sem_open")),
        # A process limit reached: the workers cannot be started.
        ("Process", OSError(errno.EAGAIN, "Resource temporarily unavailable")),
    ],
)
@pytest.mark.usefixtures("small_pieces")
def test_where_workers_cannot_start_the_command_reads_in_its_process(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    error: BaseException,
) -> None:
    files = _bad_lines(tmp_path)
    one = _cost(files, capsys, "--jobs", "1")
    real = jobs_module._context
    monkeypatch.setattr(jobs_module, "_context", lambda: _Broken(real(), what, error))
    code, out, err = _cost(files, capsys, "--jobs", "2")
    assert (code, out) == one[:2]
    warning, rest = err.split("\n", 1)
    assert rest == one[2]
    assert warning.startswith("rollout-trace cost: warning: cannot start worker processes (")
    assert warning.endswith("); reading in this process, as --jobs 1 does")


@pytest.mark.parametrize(
    "flags",
    [
        # --jobs is for worker processes, which --ray does not start.
        ["--ray", "--jobs", "3"],
        # In either order.
        ["--jobs=2", "--ray"],
    ],
)
def test_ray_and_jobs_are_one_or_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    files = _set(tmp_path)
    assert main(["cost", str(files[0]), *flags]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _delete_after(target: object, name: str, gone: Path) -> Callable[..., object]:
    real = getattr(target, name)

    def call(*args: object, **kwargs: object) -> object:
        out = real(*args, **kwargs)
        gone.unlink()
        return out

    return call


@pytest.mark.parametrize(
    ("jobs", "when"),
    [
        # One process: the file is gone when its read begins.
        ("1", "listed"),
        # Workers: gone before the plan stats it.
        ("2", "listed"),
        # Workers: gone after the plan, before its worker opens it.
        ("2", "planned"),
    ],
)
@pytest.mark.usefixtures("small_pieces")
def test_a_file_gone_before_its_read_is_a_missing_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    jobs: str,
    when: str,
) -> None:
    files = _set(tmp_path)
    if when == "listed":
        monkeypatch.setattr(
            cost_module, "trace_files", _delete_after(cost_module, "trace_files", files[1])
        )
    else:
        monkeypatch.setattr(jobs_module, "plan", _delete_after(jobs_module, "plan", files[1]))
    code, out, err = _cost(files, capsys, "--jobs", jobs)
    assert (code, out) == (2, "")
    assert err.startswith("rollout-trace cost: error: ") and err.count("\n") == 1
    assert str(files[1]) in err
    assert "no such trace file" in err or "No such file" in err


# --- a parent killed: its workers, forkserver and resource tracker go too -------------------


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _processes() -> dict[int, list[str]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(int(name))) is not None:
            out[int(name)] = fields
    return out


def _descendants(pid: int) -> set[tuple[int, str]]:
    """Every process below ``pid``, as (pid, start time): a pid may be used again."""
    table = _processes()
    found: set[tuple[int, str]] = set()
    parents = {pid}
    while parents:
        children = {p for p, f in table.items() if int(f[1]) in parents}
        parents = children - {p for p, _ in found}
        found |= {(p, table[p][19]) for p in children}
    return found


def _alive(processes: set[tuple[int, str]]) -> set[tuple[int, str]]:
    left = set()
    for pid, started in processes:
        fields = _stat(pid)
        if fields is not None and fields[19] == started and fields[0] != "Z":
            left.add((pid, started))
    return left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "sig",
    [
        # What subprocess.run(timeout=) and an OOM killer send.
        signal.SIGKILL,
        # What `kill PID` and Popen.terminate() send.
        signal.SIGTERM,
    ],
)
@pytest.mark.timeout(180)
def test_a_parent_killed_takes_its_workers_with_it(tmp_path: Path, sig: signal.Signals) -> None:
    files = [str(f) for f in _set(tmp_path / "set")[:2]]
    files += [shutil.copy(files[0], tmp_path / "set" / "d.jsonl")]
    # Every worker stays at its first .jsonl piece until it is ended.
    proc = subprocess.Popen(
        [sys.executable, _script(tmp_path, _PROGRAM), "cost", *files, "--jobs", "2"],
        env=_env(**{jobs_module._HOLD_ON: ".jsonl"}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # The resource tracker, the forkserver and two workers.
        deadline = time.monotonic() + 120
        while len(below := _descendants(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(below) >= 4, below
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 20
        while _alive(below) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(below)
    finally:
        # Whatever this test started and left: its session.
        for pid, fields in _processes().items():
            if int(fields[3]) == proc.pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=60)


@pytest.mark.parametrize(
    ("path", "shared"),
    [
        # A file: any process opens it by its path.
        ("file", True),
        # A link to one.
        ("link", True),
        # /dev/stdin, through /proc/self/fd/0: each process has its own.
        ("/dev/stdin", False),
        # <(...): /dev/fd/N.
        ("/dev/fd/0", False),
        # A folder (not a file at all).
        ("folder", False),
        # Gone: read in this process, which says so.
        ("missing", False),
    ],
)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/fd and /proc")
def test_shared_tells_the_paths_another_process_opens_alike(
    tmp_path: Path, path: str, shared: bool
) -> None:
    (tmp_path / "file").write_bytes(b"{}\n")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "folder").mkdir()
    given = path if path.startswith("/") else str(tmp_path / path)
    if path.startswith("/dev/"):
        with (tmp_path / "file").open("rb") as f:  # a regular file behind fd 0 of a child
            proc = subprocess.run(
                [sys.executable, "-c", f"from rollout_trace._cli.jobs import shared; "
                 f"print(shared({given!r}))"],
                stdin=f, capture_output=True, text=True, env=_env(), timeout=60, check=True,
            )  # fmt: skip
        assert proc.stdout.strip() == str(shared)
    else:
        assert jobs_module.shared(given) is shared


def _closed_port() -> tuple[socket.socket, int]:
    """A port bound and not listening: a connection to it is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize(
    ("address", "said"),
    [
        # Not an address at all.
        ("garbage", "is not a Ray cluster address"),
        # No port.
        ("127.0.0.1", "is not a Ray cluster address"),
        # A port that is not a number.
        ("head:port", "is not a Ray cluster address"),
        # Nothing listens there: ray.init would retry for many minutes, deaf to Ctrl-C.
        ("127.0.0.1:{port}", "cannot reach the Ray cluster at RAY_ADDRESS='127.0.0.1:"),
        # A host that does not resolve.
        ("nosuchhost.invalid:6379", "cannot reach the Ray cluster at RAY_ADDRESS='nosuchhost"),
        # Ray Client, nothing listening.
        ("ray://127.0.0.1:{port}", "cannot reach the Ray cluster at RAY_ADDRESS='ray://"),
    ],
)
@pytest.mark.timeout(120)
def test_a_ray_address_that_cannot_serve_is_a_usage_error_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    address: str,
    said: str,
) -> None:
    ray = pytest.importorskip("ray")
    files = _set(tmp_path)
    sock, port = _closed_port()
    with sock:
        monkeypatch.setenv("RAY_ADDRESS", address.format(port=port))
        assert main(["cost", str(files[0]), "--ray"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rollout-trace cost: error: --ray: ") and err.count("\n") == 1, err
    assert said in err
    assert not ray.is_initialized()


@pytest.mark.parametrize(
    "error",
    [
        # ray:// without ray[client] installed.
        ValueError("Ray Client requires pip package `ray[client]`. If you installed ..."),
        # RAY_ADDRESS=auto with no cluster running.
        ConnectionError("Could not find any running Ray instance. Please specify ..."),
        # A cluster that answers and turns the driver away, over several lines.
        RuntimeError("Failed to connect to GCS. Last connection error:\nTraceback ..."),
    ],
)
def test_what_ray_init_raises_is_said_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    ray = pytest.importorskip("ray")
    files = _set(tmp_path)
    sock = socket.create_server(("127.0.0.1", 0))  # something answers
    with sock:
        address = f"ray://127.0.0.1:{sock.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)

        def init(**_: object) -> None:
            raise error

        monkeypatch.setattr(ray, "init", init)
        assert main(["cost", str(files[0]), "--ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    first = str(error).splitlines()[0]
    assert err == (
        f"rollout-trace cost: error: --ray: cannot connect to the Ray cluster at "
        f"RAY_ADDRESS={address!r}: {first}\n"
    )


@pytest.mark.parametrize(
    "build",
    [_read_twice, _conflict, _conflict_dropped, _conflict_dropped_at_the_end],
    ids=["copies", "conflict", "conflict_dropped", "conflict_dropped_at_the_end"],
)
def test_cost_reads_every_file_once_whatever_its_copies_hold(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    build: Callable[[Path], list[Path]],
) -> None:
    # Copies and conflicting copies are told apart as the set is gathered:
    # no file is read a second time (cost once read a set up to four times).
    files = build(tmp_path / "set")
    opened: list[str] = []
    real = reader_module._chunks

    def chunks(path: str, on_bytes: Any) -> Any:
        opened.append(path)
        return real(path, on_bytes)

    monkeypatch.setattr(reader_module, "_chunks", chunks)
    _cost(files, capsys, "--jobs", "1")
    assert sorted(opened) == sorted(str(f) for f in files)
