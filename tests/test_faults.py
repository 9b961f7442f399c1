"""Faults injected for real (no mocks of the file system or the OS), through the public API."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from samples import dispatched
from tracecheck import check_runs, only_run

import rollout_trace as rt
from sinks import MemorySink

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


def _python(code: str, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=120, **kwargs
    )  # type: ignore[call-overload]


# --- a sink whose writes fail: /dev/full gives ENOSPC on every write ---------


@needs_dev_full
def test_disk_full_in_the_sync_tracer(tmp_path: Path, trace_log: pytest.LogCaptureFixture) -> None:
    good = tmp_path / "good.jsonl"
    with rt.sync_tracer("jsonl:///dev/full", str(good), batch_size=64) as t:
        for i in range(5_000):
            t.emit(dispatched(i))
    run = only_run(good.read_bytes())
    assert run.closed is not None and run.closed["written"] == 5_000
    reports = [r.getMessage() for r in trace_log.records]
    assert len(reports) == 1, reports
    assert "jsonl:///dev/full" in reports[0] and "No space left on device" in reports[0]


@needs_dev_full
async def test_disk_full_in_the_async_tracer_keeps_the_loop_running(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.002)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    async with rt.tracer("jsonl:///dev/full", "memory://", batch_size=256) as t:
        for i in range(20_000):
            t.emit(dispatched(i))
            if i % 500 == 0:
                await asyncio.sleep(0)
        good = t.sinks[1]
    stop.set()
    await tick
    assert isinstance(good, MemorySink)
    run = only_run(good.getvalue())
    assert run.closed is not None and run.closed["written"] == 20_000
    reports = [r.getMessage() for r in trace_log.records]
    assert len(reports) == 1 and "No space left on device" in reports[0], reports
    # The loop never stalled on the failing file: each tick came within 0.5 s.
    assert len(gaps) > 5 and max(gaps) < 0.5, max(gaps)


@needs_dev_full
def test_disk_full_leaves_the_exit_code_alone() -> None:
    proc = _python(
        """
        import rollout_trace as rt
        with rt.sync_tracer("jsonl:///dev/full") as t:
            for i in range(1000):
                t.emit(rt.WeightsSynced(weight_version=i))
        print("done")
        """
    )
    assert proc.returncode == 0
    assert proc.stdout == b"done\n"
    assert len(proc.stderr.splitlines()) <= 2, proc.stderr  # one warning, no traceback


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
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_sink_that_cannot_open_leaves_nothing_behind(
    make_uri: object, error: type[Exception], words: list[str], kind: str, tmp_path: Path
) -> None:
    uri = make_uri(tmp_path)  # type: ignore[operator]
    first = tmp_path / "new" / "first.jsonl"  # opened before the bad one
    before = sorted(tmp_path.rglob("*"))
    threads = threading.active_count()
    with pytest.raises(error) as info:
        if kind == "sync":
            rt.sync_tracer(str(first), uri).open()
        else:

            async def main() -> None:
                async with rt.tracer(str(first), uri):
                    pytest.fail("must not open")

            asyncio.run(main())
    assert isinstance(info.value, rt.RolloutTraceError)
    assert uri in str(info.value)
    for word in words:
        assert word in str(info.value)
    assert sorted(tmp_path.rglob("*")) == before  # no file, no folder left
    assert threading.active_count() == threads  # no thread left


# --- standard output closed by its reader --------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_stdout_closed_by_its_reader_exits_zero_quietly(kind: str) -> None:
    body = {
        "sync": """
            with rt.sync_tracer("stdout://") as t:
                for i in range(200_000):
                    t.emit(rt.WeightsSynced(weight_version=i))
                    if i % 10_000 == 0:
                        t.flush()
            """,
        "async": """
            import asyncio
            async def main():
                async with rt.tracer("stdout://") as t:
                    for i in range(200_000):
                        t.emit(rt.WeightsSynced(weight_version=i))
                        if i % 10_000 == 0:
                            await t.flush()
            asyncio.run(main())
            """,
    }[kind]
    code = "import rollout_trace as rt\n" + textwrap.dedent(body) + "print('still printing')\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
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


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigkill_keeps_every_event_before_the_last_returned_flush(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "killed.jsonl"
    loop = {
        "sync": """
            t = rt.sync_tracer(PATH, flush_interval=60).open()
            i = 0
            while True:
                t.emit(rt.WeightsSynced(weight_version=i))
                i += 1
                if i % 997 == 0:
                    t.flush()
                    ack(i)
            """,
        "async": """
            import asyncio
            async def main():
                async with rt.tracer(PATH, flush_interval=60) as t:
                    i = 0
                    while True:
                        t.emit(rt.WeightsSynced(weight_version=i))
                        i += 1
                        if i % 997 == 0:
                            await t.flush()
                            ack(i)
            asyncio.run(main())
            """,
    }[kind]
    code = (
        "import os, sys\nimport rollout_trace as rt\n"
        f"PATH = {str(path)!r}\n"
        "def ack(n):\n    os.write(1, b'%d\\n' % n)\n" + textwrap.dedent(loop)
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as proc:
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
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_slow_reader_keeps_memory_bounded_and_counts_drops(kind: str) -> None:
    run = {
        "sync": """
            t = rt.sync_tracer("stdout://", close_timeout=2.0).open()
            for i in range(N):
                t.emit(rt.WeightsSynced(weight_version=i))
                if i in MARKS: mark(i)
            t0 = time.monotonic(); t.close(); closing = time.monotonic() - t0
            report(t.counts, closing)
            """,
        "async": """
            import asyncio
            async def main():
                async with rt.tracer("stdout://", close_timeout=2.0) as t:
                    for i in range(N):
                        t.emit(rt.WeightsSynced(weight_version=i))
                        if i % 1000 == 0: await asyncio.sleep(0)
                        if i in MARKS: mark(i)
                    t0 = time.monotonic()
                await asyncio.sleep(0)
                return t, time.monotonic() - t0
            t, closing = asyncio.run(main())
            report(t.counts, closing)
            """,
    }[kind]
    code = textwrap.dedent(
        """
        import json, os, resource, sys, time
        import rollout_trace as rt
        N = 2_000_000
        MARKS = {200_000, 1_000_000, N - 1}
        rss = {}
        start = time.perf_counter()
        def mark(i):
            rss[i] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        def report(counts, closing):
            elapsed = time.perf_counter() - start
            sys.stderr.write(json.dumps({"rss": rss, "counts": counts._asdict(),
                                         "closing": closing, "elapsed": elapsed}) + "\\n")
        """
    ) + textwrap.dedent(run)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
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
        report = json.loads(proc.stderr.read().splitlines()[-1])
    counts = report["counts"]
    assert counts["emitted"] == 2_000_000
    assert counts["written"] + counts["dropped"] + counts["invalid"] == counts["emitted"]
    assert counts["dropped"] > 0  # the reader could not keep up
    rss = {int(k): v for k, v in report["rss"].items()}
    # Memory is bounded by the buffer: flat from 200k events to 2M (KiB).
    assert rss[1_999_999] - rss[200_000] < 64 * 1024, rss
    assert report["closing"] < 3.5  # close() honours its 2 s deadline
    assert got > 0


# --- bad events ----------------------------------------------------------------


def test_bad_events_in_the_sync_tracer(tmp_path: Path, trace_log: pytest.LogCaptureFixture) -> None:
    class Weird(rt.Event, tag="weird"):
        value: object

    path = tmp_path / "bad.jsonl"
    with rt.sync_tracer(str(path)) as t:
        t.emit(dispatched(0))
        for _ in range(3):
            t.emit(Weird(value=object()))
        with pytest.raises(TypeError):
            t.emit(dispatched)  # type: ignore[arg-type]
        t.emit(dispatched(1))
    t.emit(dispatched(2))
    t.close()
    assert t.flush() is True
    run = only_run(path.read_bytes(), allow_drops=True)
    assert run.closed is not None
    assert (run.closed["emitted"], run.closed["written"], run.closed["invalid"]) == (5, 2, 3)
    assert [e["seq"] for e in run.events] == [1, 5]
    assert len([r for r in trace_log.records if "weird" in r.getMessage()]) == 1


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


@pytest.mark.usefixtures("plugins")
async def test_a_hung_sink_is_stopped_and_the_others_keep_everything(
    trace_log: pytest.LogCaptureFixture,
) -> None:
    async with rt.tracer("stuck://?ok=1", "memory://", batch_size=64, close_timeout=1) as t:
        for i in range(3_000):
            t.emit(dispatched(i))
            if i % 100 == 0:
                await asyncio.sleep(0)
        await t.flush()
        good = t.sinks[1]
    assert isinstance(good, MemorySink)
    run = only_run(good.getvalue())
    assert run.closed is not None and run.closed["written"] == 3_000
    reports = [r.getMessage() for r in trace_log.records]
    assert len(reports) == 1 and "stuck://?ok=1" in reports[0] and "keep up" in reports[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_sink_that_never_opens_times_out_and_the_process_exits(kind: str, tmp_path: Path) -> None:
    fifo = tmp_path / "nobody-reads.jsonl"
    os.mkfifo(fifo)  # opening it for writing blocks until a reader comes
    body = {
        "sync": f"rt.sync_tracer({str(fifo)!r}, close_timeout=1).open()",
        "async": textwrap.dedent(
            f"""
            import asyncio
            async def main():
                async with rt.tracer({str(fifo)!r}, close_timeout=1):
                    pass
            asyncio.run(main())
            """
        ),
    }[kind]
    code = (
        "import rollout_trace as rt\ntry:\n"
        + textwrap.indent(body, "    ")
        + ("\nexcept rt.SinkOpenError as exc:\n    print(exc)\n")
    )
    start = time.monotonic()
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert b"did not open within 1 s" in proc.stdout
    assert time.monotonic() - start < 30
