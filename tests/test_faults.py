"""Faults injected for real (no mocks of the file system or the OS), through the public
API, under every driver: the async tracer under asyncio, uvloop and trio, and the
sync tracer (tests/writing/harness.py)."""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import pickle
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from samples import dispatched
from tracecheck import check_runs, only_run
from writing.harness import (
    ASYNC_DRIVERS,
    DRIVERS,
    IDS,
    Driver,
    Handle,
    child_code,
    child_env,
    run_child,
)

import rollout_trace as rt
from rollout_trace.sinks import JsonlSink, MemorySink
from rollout_trace.testing import MockClock

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
drivers = pytest.mark.parametrize("driver", DRIVERS, ids=IDS)


def _popen(driver: Driver, uris: list[str], body: str, **kwargs: str) -> subprocess.Popen[bytes]:
    """``driver`` in a child process, its standard streams piped to the test."""
    return subprocess.Popen(
        [sys.executable, "-c", child_code(driver, uris, body, **kwargs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )


# --- a sink whose writes fail: /dev/full gives ENOSPC on every write ---------


@needs_dev_full
@pytest.mark.parametrize("driver", ASYNC_DRIVERS, ids=[d.name for d in ASYNC_DRIVERS])
def test_disk_full_keeps_the_event_loop_running(
    driver: Driver, trace_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (That the other sinks keep every event and the counts are what the
    # sinks acknowledged is in tests/writing/test_promises.py.)
    writers: set[int] = set()  # the threads the failing file was written from
    write = JsonlSink.write

    def watched(sink: JsonlSink, data: bytes) -> None:
        writers.add(threading.get_ident())
        write(sink, data)

    monkeypatch.setattr(JsonlSink, "write", watched)

    async def scenario(h: Handle) -> tuple[MemorySink, int]:
        for i in range(20_000):
            h.emit(dispatched(i))
            if i % 500 == 0:
                await anyio.sleep(0)
        await h.flush()
        good = h.tracer.sinks[1]
        assert isinstance(good, MemorySink)
        return good, threading.get_ident()

    out = driver.run(["jsonl:///dev/full", "memory://"], scenario, batch_size=256)
    good, loop = out.value
    run = only_run(good.getvalue(), uri="memory://")
    assert run.closed is not None and len(run.events) == 20_000
    reports = [r.getMessage() for r in trace_log.records]
    assert len(reports) == 1 and "No space left on device" in reports[0], reports
    # The loop never stalled on the failing file: it never wrote to it (the
    # sink's own thread did, every time).
    assert writers and loop not in writers, (writers, loop)


@needs_dev_full
@drivers
def test_disk_full_leaves_the_exit_code_alone(driver: Driver) -> None:
    proc = run_child(
        driver,
        ["jsonl:///dev/full"],
        """
        for i in range(1000):
            h.emit(rt.WeightsSynced(weight_version=i))
        """,
        then="print('done')",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"done\n"
    assert len(proc.stderr.splitlines()) <= 2, proc.stderr  # one warning, no traceback
    assert b"Traceback" not in proc.stderr


# --- sinks that cannot be opened ---------------------------------------------


def _parent_is_a_file(tmp: Path) -> str:
    (tmp / "afile").write_text("x")
    return f"jsonl://{tmp}/afile/sub/t.jsonl"


@pytest.mark.parametrize(
    ("make_uri", "error", "words"),
    [
        (_parent_is_a_file, rt.SinkOpenError, ["afile", "Not a directory"]),  # parent is a file
        (lambda tmp: f"jsonl://{tmp}", rt.SinkOpenError, ["Is a directory"]),  # a folder
        (lambda tmp: "gopher://x", rt.UnknownSchemeError, ["'gopher'", "known:"]),  # scheme
        (lambda tmp: f"jsonl://{tmp}/t.jsonl?sync=1", rt.SinkOptionError, ["'sync'", "fsync"]),
    ],
    ids=["parent-is-a-file", "path-is-a-folder", "unknown-scheme", "unknown-option"],
)
@drivers
def test_a_sink_that_cannot_open_leaves_nothing_behind(
    make_uri: Callable[[Path], str],
    error: type[Exception],
    words: list[str],
    driver: Driver,
    tmp_path: Path,
) -> None:
    uri = make_uri(tmp_path)
    first = tmp_path / "new" / "first.jsonl"  # opened before the bad one
    before = sorted(tmp_path.rglob("*"))
    threads = threading.active_count()

    async def scenario(h: Handle) -> None:
        pytest.fail("must not open")

    with pytest.raises(error) as info:
        driver.run([str(first), uri], scenario)
    assert isinstance(info.value, rt.RolloutTraceError)
    assert uri in str(info.value)
    for word in words:
        assert word in str(info.value)
    assert sorted(tmp_path.rglob("*")) == before  # no file, no folder left
    assert threading.active_count() == threads  # no thread left


# --- standard output closed by its reader --------------------------------------


@drivers
def test_stdout_closed_by_its_reader_exits_zero_quietly(driver: Driver) -> None:
    proc = _popen(
        driver,
        ["stdout://"],
        """
        for i in range(200_000):
            h.emit(rt.WeightsSynced(weight_version=i))
            if i % 10_000 == 0:
                await h.flush()
        """,
        then="print('still printing')",
    )
    with proc:
        assert proc.stdout is not None and proc.stderr is not None
        head = proc.stdout.read(100)  # `| head -c 100`
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, err
    assert len(head) == 100 and head.startswith(b'{"event":"trace_opened"')
    assert len(err.splitlines()) <= 3, err  # one warning about stdout://, no traceback
    assert b"Traceback" not in err


# --- SIGKILL: what a returned flush() promised is on disk ----------------------


@drivers
def test_sigkill_keeps_every_event_before_the_last_returned_flush(
    driver: Driver, tmp_path: Path
) -> None:
    path = tmp_path / "killed.jsonl"
    proc = _popen(
        driver,
        [str(path)],
        """
        i = 0
        while True:
            h.emit(rt.WeightsSynced(weight_version=i))
            i += 1
            if i % 997 == 0:
                await h.flush()
                os.write(1, b"%d\\n" % i)  # everything below i is written
        """,
        kwargs="flush_interval=60",
    )
    with proc:
        assert proc.stdout is not None
        acked = 0
        while acked < 30_000:
            line = proc.stdout.readline()
            assert line, "the child died"
            acked = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for line in proc.stdout:  # acks the child printed before it died
            acked = max(acked, int(line))
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    versions = {json.loads(line).get("weight_version") for line in whole.splitlines()}
    missing = [v for v in range(acked) if v not in versions]
    assert missing == []
    (run,) = check_runs(whole, allow_drops=True).values()
    assert run.closed is None  # killed: no trace_closed
    if whole != data:  # a torn last line: the reader skips and reports it
        problems: list[object] = []
        events = list(rt.read(str(path), problems=problems.append))  # type: ignore[attr-defined]
        assert len(events) == len(whole.splitlines())
        assert len(problems) == 1


# --- a sink slower than the producer -------------------------------------------


@pytest.mark.slow
@drivers
def test_a_slow_reader_keeps_memory_bounded_and_counts_drops(driver: Driver) -> None:
    proc = _popen(
        driver,
        ["stdout://"],
        """
        for i in range(N):
            h.emit(rt.WeightsSynced(weight_version=i))
            if i % 1000 == 0:
                await h.sleep(0)
            if i in MARKS:
                rss[i] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        """,
        # The close honours its 2 s deadline: it waits for the clock to reach
        # it (the reader is too slow to drain the buffer before), then gives
        # the run up, without the clock going further.
        kwargs="close_timeout=2.0, deadline_clock=clock, "
        "closing=lambda: advancing(clock, 2.0, early=False)",
        prelude="""
        import json, resource
        from deadlines import WatchedClock, advancing
        clock = WatchedClock()
        N = 2_000_000
        MARKS = {200_000, 1_000_000, N - 1}
        rss = {}
        """,
        then="""
        report = {"rss": rss, "counts": out.counts._asdict()}
        sys.stderr.write(json.dumps(report) + "\\n")
        """,
    )
    with proc:
        assert proc.stdout is not None and proc.stderr is not None
        got = 0
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            chunk = proc.stdout.read1(8192)  # a slow reader: 8 KiB every 5 ms
            got += len(chunk)
            time.sleep(0.005)
        got += len(proc.stdout.read())
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
        report = json.loads(err.splitlines()[-1])
    # The close gave the run up at its deadline, with the reader still behind.
    assert b"took longer than its deadline" in err, err[-2000:]
    counts = report["counts"]
    assert counts["emitted"] == 2_000_000
    assert counts["written"] + counts["dropped"] + counts["invalid"] == counts["emitted"]
    assert counts["dropped"] > 0  # the reader could not keep up
    rss = {int(k): v for k, v in report["rss"].items()}
    # Memory is bounded by the buffer: flat from 200k events to 2M (KiB).
    assert rss[1_999_999] - rss[200_000] < 64 * 1024, rss
    assert got > 0


# --- fork and pickling under load ------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_pickling_and_forking_while_threads_emit(tmp_path: Path) -> None:
    t = rt.sync_tracer(f"{tmp_path}/{{pid}}-{{run_id}}.jsonl", buffer=2_000_000)
    stop = threading.Event()

    def spin(k: int) -> None:
        i = 0
        while not stop.is_set():
            t.emit(dispatched(k * 10_000_000 + i))
            i += 1

    threads = [threading.Thread(target=spin, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    blobs = [pickle.dumps(t) for _ in range(50)]  # pickled while it is busy
    children = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                clone = pickle.loads(blobs[0])
                clone.emit(rt.WeightsSynced(weight_version=1))
                clone.close()
                t.emit(rt.WeightsSynced(weight_version=2))
                t.close()
            finally:
                os._exit(0)
        children.append(pid)
    stop.set()
    for th in threads:
        th.join()
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    t.close()
    for path in tmp_path.glob("*.jsonl"):
        run = only_run(path.read_bytes())
        assert run.closed is not None
    assert len(list(tmp_path.glob("*.jsonl"))) == 1 + 3 * 2  # parent, and two runs per child


# --- a sink that hangs ----------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@drivers
def test_a_pipe_nobody_reads_is_given_up_and_the_others_keep_everything(
    driver: Driver, tmp_path: Path, trace_log: pytest.LogCaptureFixture
) -> None:
    fifo = tmp_path / "nobody-reads.jsonl"
    os.mkfifo(fifo)
    # A reader that opens the pipe and never reads: writes block once the
    # pipe's buffer (64 KiB) is full, as on a hung mount.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    good = tmp_path / "good.jsonl"
    clock = MockClock()
    done = threading.Event()
    moved: list[float] = []

    def held() -> int:
        buf = bytearray(4)
        fcntl.ioctl(reader, termios.FIONREAD, buf)
        return int.from_bytes(buf, sys.byteorder)

    def move_once_blocked() -> None:
        # Once the pipe is full (its last page taken: a write waits for a
        # whole free page), the sink's write blocks (begun, so timed): the
        # clock moves past close_timeout, and the next poll of the flush that
        # waits on it gives the sink up. (Moved again only if the write that
        # filled the pipe had just returned: the next one began after it.)
        size = getattr(fcntl, "F_GETPIPE_SZ", None)
        capacity = fcntl.fcntl(reader, size) if size is not None else None
        last = -1
        while not done.wait(0.05 if capacity is None else 0.002):
            now = held()
            if capacity is not None:
                full = now > capacity - mmap.PAGESIZE and now == last
            else:
                full = now == last and now > 0
            last = now
            if full and not [r for r in trace_log.records if "stopped" in r.getMessage()]:
                clock.advance(1.0 + 1e-6)
                moved.append(1.0 + 1e-6)
                done.wait(0.25)

    mover = threading.Thread(target=move_once_blocked, name="test clock", daemon=True)
    mover.start()
    try:

        async def scenario(h: Handle) -> None:
            for i in range(20_000):
                h.emit(dispatched(i))
                if i % 1_000 == 999:
                    await h.flush()
            done.set()  # the clock stands still from here: the close waits for no deadline

        driver.run(
            [str(fifo), str(good)],
            scenario,
            batch_size=256,
            close_timeout=1,
            deadline_clock=clock,
        )
    finally:
        done.set()
        mover.join(5)
        os.close(reader)  # the blocked write fails now and its thread ends
    assert moved, "the pipe never filled"
    run = only_run(good.read_bytes(), uri=str(good))
    assert [e["seq"] for e in run.events] == list(range(1, 20_001))
    assert run.closed is not None
    (hung,) = [s for s in run.closed["sinks"] if s["uri"] == str(fifo)]
    assert "longer than 1 s" in hung["error"], hung
    assert [m for m in (r.getMessage() for r in trace_log.records) if "stopped" in m]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@drivers
def test_a_sink_that_never_opens_times_out_and_the_process_exits(
    driver: Driver, tmp_path: Path
) -> None:
    fifo = tmp_path / "nobody-reads.jsonl"
    os.mkfifo(fifo)  # opening it for writing blocks until a reader comes
    # The open waits (on the tracer's writer thread, once the sink's thread
    # began the open) on a clock the child moves past close_timeout: it must
    # still wait just short of it. Then the process exits, its sink's thread
    # still stuck in the open. (The run's timeout is a hang guard.)
    code = (
        "import threading\n"
        "import rollout_trace as rt\n"
        "from deadlines import WatchedClock, advancing\n"
        "from harness import BY_NAME\n"
        "async def scenario(h):\n"
        "    raise AssertionError('must not open')\n"
        "clock = WatchedClock()\n"
        "def opening():\n"
        "    return any(t.name.startswith('rollout_trace sink') for t in threading.enumerate())\n"
        "try:\n"
        "    with advancing(clock, 1.0, ready=opening, by='rollout_trace writer'):\n"
        f"        BY_NAME[{driver.name!r}].run(\n"
        f"            [{str(fifo)!r}], scenario, close_timeout=1, deadline_clock=clock\n"
        "        )\n"
        "except rt.SinkOpenError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=120, env=child_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert b"did not open within 1 s" in proc.stdout
