"""Process hooks: SIGTERM, fork and multiprocessing, and nothing until the first open.

Each scenario runs in a fresh interpreter (the hooks are per process and are
decided at the first open), except the fork test, which forks this one.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from samples import dispatched
from tracecheck import check_runs, only_run

import rollout_trace as rt

pytestmark = pytest.mark.timeout(120)

# The child processes import the package these tests import (a checkout
# other than the installed one, too).
_PACKAGE_ROOT = str(Path(rt.__file__).resolve().parent.parent)
_EXAMPLE = Path(__file__).resolve().parent.parent / "data" / "example"
N = 5_000


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


# Every child script begins with these. A signal that lands just before the
# main thread blocks in a system call is handled only when the call returns
# (CPython runs handlers between bytecodes, and nothing wakes the call): so a
# child that waits for the test's signal waits in slices.
_PRELUDE = """
import time as _time

def nap():
    for _ in range(600):
        _time.sleep(0.1)

async def anap():
    import asyncio
    for _ in range(600):
        await asyncio.sleep(0.1)
"""


def _start(tmp_path: Path, code: str) -> subprocess.Popen[bytes]:
    script = tmp_path / "child.py"
    script.write_text(_PRELUDE + textwrap.dedent(code))
    return subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        cwd=tmp_path,
    )


def _line(proc: subprocess.Popen[bytes]) -> str:
    """The child's next line on stdout; its stderr if it ended instead."""
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        raise AssertionError(f"the child ended ({proc.returncode}): {proc.stderr.read()!r}")
    return line.decode().strip()


def _terminate(proc: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    """SIGTERM, then the exit status and stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


# --- SIGTERM ------------------------------------------------------------------

# The deadlines' clock in the children never moves: a close that waited for
# close_timeout would never end (``_terminate`` fails it).
_SYNC_SLEEPING = """
    import time
    import rollout_trace as rt
    from rollout_trace.testing import MockClock
    # nothing written until the close
    t = rt.sync_tracer({path!r}, flush_interval=60, deadline_clock=MockClock())
    t.open()
    for i in range({n}):
        t.emit(rt.WeightsSynced(weight_version=i))
    print("ready", {n}, flush=True)
    nap()
"""

_SYNC_BUSY = """
    import rollout_trace as rt
    from rollout_trace.testing import MockClock
    t = rt.sync_tracer({path!r}, buffer=10_000_000, deadline_clock=MockClock())
    t.open()
    i = 0
    while True:  # the main thread never blocks: the handler runs between two emits
        t.emit(rt.WeightsSynced(weight_version=i))
        i += 1
        if i == {n}:
            print("ready", i, flush=True)
"""

_ASYNC_SLEEPING = """
    import asyncio
    import rollout_trace as rt
    from rollout_trace.testing import MockClock

    async def main():
        async with rt.tracer({path!r}, flush_interval=60, deadline_clock=MockClock()) as t:
            for i in range({n}):
                t.emit(rt.WeightsSynced(weight_version=i))
            print("ready", {n}, flush=True)
            await anap()  # the loop waits in select() when the signal comes

    asyncio.run(main())
"""

_ASYNC_BUSY = """
    import asyncio
    import rollout_trace as rt
    from rollout_trace.testing import MockClock

    async def main():
        async with rt.tracer({path!r}, deadline_clock=MockClock()) as t:
            i = 0
            while True:  # CPU-bound on the loop: the pump never runs, the buffer fills
                t.emit(rt.WeightsSynced(weight_version=i))
                i += 1
                if i == {n}:
                    print("ready", i, flush=True)

    asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("code", "busy"),
    [
        pytest.param(_SYNC_SLEEPING, False, id="sync-sleeping"),
        pytest.param(_SYNC_BUSY, True, id="sync-busy"),
        pytest.param(_ASYNC_SLEEPING, False, id="async-sleeping"),
        pytest.param(_ASYNC_BUSY, True, id="async-busy"),
    ],
)
def test_sigterm_closes_the_run_then_the_process_dies_of_sigterm(
    code: str, busy: bool, tmp_path: Path
) -> None:
    path = tmp_path / "run.jsonl"
    proc = _start(tmp_path, code.format(path=str(path), n=N))
    assert _line(proc) == f"ready {N}"
    status, err = _terminate(proc)
    assert status == -signal.SIGTERM, err  # killed by signal 15, as without the hook
    run = only_run(path.read_bytes(), allow_drops=busy)  # lines == trace_closed's written
    assert run.closed is not None, "no trace_closed"
    seqs = [e["seq"] for e in run.events]
    assert seqs[:N] == list(range(1, N + 1))  # every event emitted before the signal
    if not busy:
        assert err == b""
        assert run.closed["emitted"] == run.closed["written"] == N
    else:
        # Emits went on until the handler ran; what the close could not take
        # (a full buffer, an emit the signal interrupted) is counted as dropped.
        assert run.closed["written"] == len(run.events) >= N


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_sigterm_in_the_middle_of_an_emit_writes_no_event_twice(kind: str, tmp_path: Path) -> None:
    # The handler runs between two bytecodes of the emitting thread: here
    # inside emit, after the clock stamped an event and before it is queued
    # (the clock is called from emit). The close must neither take that
    # event twice nor wait for a lock the interrupted emit holds.
    path = tmp_path / "run.jsonl"
    proc = _start(
        tmp_path,
        f"""
        import asyncio, signal, time
        import rollout_trace as rt

        calls = [0]

        def clock():
            calls[0] += 1
            if calls[0] == 50:
                signal.raise_signal(signal.SIGTERM)
            return time.time()

        def body(t):
            i = 0
            while True:
                t.emit(rt.WeightsSynced(weight_version=i))
                i += 1

        if {kind!r} == "async":
            async def main():
                async with rt.tracer({str(path)!r}, batch_size=1, clock=clock) as t:
                    body(t)
            asyncio.run(main())
        else:
            with rt.sync_tracer({str(path)!r}, batch_size=1, clock=clock) as t:
                body(t)
        """,
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    run = only_run(path.read_bytes(), allow_drops=True)  # each seq once; lines == written
    assert run.closed is not None and run.closed["dropped"] >= 0
    assert [e["seq"] for e in run.events][:3] == [1, 2, 3]
    # Closed at once: the body of emit holds no lock a close needs, so the
    # handler does not wait for the program to stop emitting (once it waited
    # the close timeouts, while the loop wrote hundreds of MB).
    assert run.closed["emitted"] < 1_000, run.closed


@pytest.mark.parametrize("tracer", ["sync-on-a-thread", "async"])
def test_sigterm_while_a_close_is_under_way_lets_it_finish(tracer: str, tmp_path: Path) -> None:
    # Plenty to write when the close begins, so that SIGTERM comes in the
    # middle of it: the process may only die once trace_closed is written.
    path = tmp_path / "run.jsonl"
    n = 300_000
    proc = _start(
        tmp_path,
        f"""
        import asyncio, threading, time
        import rollout_trace as rt
        options = dict(flush_interval=60, buffer=2 * {n})
        if {tracer!r} == "async":
            async def main():
                async with rt.tracer({str(path)!r}, **options) as t:
                    for i in range({n}):
                        t.emit(rt.WeightsSynced(weight_version=i))
                    print("ready", flush=True)  # and leave the block: the close begins
                nap()
            asyncio.run(main())
        else:
            t = rt.sync_tracer({str(path)!r}, batch_size=2 * {n}, **options)
            t.open()
            for i in range({n}):
                t.emit(rt.WeightsSynced(weight_version=i))
            threading.Thread(target=t.close).start()
            while t.state != "closing":
                time.sleep(0.001)
            print("ready", flush=True)
            nap()
        """,
    )
    assert _line(proc) == "ready"
    status, err = _terminate(proc)
    assert status == -signal.SIGTERM, err
    run = only_run(path.read_bytes())
    assert run.closed is not None and run.closed["written"] == n


@pytest.mark.parametrize("tracer", ["sync", "async"])
def test_no_thread_of_the_tracer_takes_a_sigterm_meant_for_the_program(
    tracer: str, tmp_path: Path
) -> None:
    # The kernel gives a signal sent to the process to any thread that does
    # not block it, and Python then runs the handler on the main thread
    # whatever that thread's mask says. A program that blocks SIGTERM on its
    # main thread for a while (a critical section) must not have it taken by
    # a thread of ours: our handler would close the runs and the process die
    # in the middle of that section. It stays pending until the program
    # unblocks it.
    path = tmp_path / "run.jsonl"
    proc = _start(
        tmp_path,
        f"""
        import asyncio, os, signal, time
        import rollout_trace as rt

        def probe(t):
            signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            untouched = t.state == "open" and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            print("untouched", untouched, signal.SIGTERM in signal.sigpending(), flush=True)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
            time.sleep(30)

        if {tracer!r} == "sync":
            t = rt.sync_tracer({str(path)!r})
            t.open()
            t.emit(rt.WeightsSynced(weight_version=1))
            probe(t)
        else:
            async def main():
                async with rt.tracer({str(path)!r}) as t:
                    t.emit(rt.WeightsSynced(weight_version=1))
                    probe(t)
            asyncio.run(main())
        """,
    )
    out, err = proc.communicate(timeout=60)
    assert out.split() == [b"untouched", b"True", b"True"], err  # still pending, for us
    assert proc.returncode == -signal.SIGTERM, err
    run = only_run(path.read_bytes())
    assert run.closed is not None and run.closed["written"] == 1


@pytest.mark.parametrize("tracer", ["sync", "async"])
def test_a_sigterm_handler_of_the_program_is_never_replaced(tracer: str, tmp_path: Path) -> None:
    # Installed before the tracer opens: SIGTERM runs it, and only it.
    path = tmp_path / "run.jsonl"
    proc = _start(
        tmp_path,
        f"""
        import asyncio, os, signal, sys, time
        import rollout_trace as rt

        def mine(signum, frame):
            print("mine", flush=True)
            os._exit(7)

        signal.signal(signal.SIGTERM, mine)
        if {tracer!r} == "sync":
            t = rt.sync_tracer({str(path)!r})
            t.open()
            t.emit(rt.WeightsSynced(weight_version=1))
            assert t.flush(timeout=10)
            print("ready", signal.getsignal(signal.SIGTERM) is mine, flush=True)
            nap()
        else:
            async def main():
                async with rt.tracer({str(path)!r}) as t:
                    t.emit(rt.WeightsSynced(weight_version=1))
                    assert await t.flush()
                    print("ready", signal.getsignal(signal.SIGTERM) is mine, flush=True)
                    await anap()
            asyncio.run(main())
        """,
    )
    assert _line(proc) == "ready True"
    status, err = _terminate(proc)
    assert status == 7, err
    assert proc.stdout is not None
    run = only_run(path.read_bytes())
    assert run.closed is None  # the program's handler ran; ours did not close the run
    assert [e["weight_version"] for e in run.events] == [1]


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    proc = _start(
        tmp_path,
        f"""
        import signal, sys
        import rollout_trace as rt
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        t = rt.sync_tracer({str(path)!r})
        t.open()
        t.emit(rt.WeightsSynced(weight_version=1))
        print("ready", signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, flush=True)
        sys.stdin.read()  # until the test closes our stdin; then exit: atexit closes the run
        """,
    )
    assert _line(proc) == "ready True"
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.poll() is None  # ignored, as the program asked
    _, err = proc.communicate(b"", timeout=60)
    assert proc.returncode == 0, err
    run = only_run(path.read_bytes())
    assert run.closed is not None and run.closed["written"] == 1


@pytest.mark.parametrize("then_main", [False, True], ids=["thread-only", "then-main-thread"])
def test_a_first_open_off_the_main_thread_and_sigterm(then_main: bool, tmp_path: Path) -> None:
    # Only the main thread may install a signal handler. A tracer first built
    # and opened in another thread leaves SIGTERM at its default, so SIGTERM
    # kills the process at once (no atexit hook runs either) and the run stays
    # unclosed; the next tracer built or opened on the main thread installs
    # the handler, which then closes every open run, the thread's too.
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    proc = _start(
        tmp_path,
        f"""
        import signal, threading, time
        import rollout_trace as rt

        tracers = []

        def work():  # built and opened here: no hook could be installed yet
            a = rt.sync_tracer({str(a)!r})
            tracers.append(a)
            a.open()
            a.emit(rt.WeightsSynced(weight_version=1))
            assert a.flush(timeout=10)

        th = threading.Thread(target=work)
        th.start()
        th.join()
        print("after thread", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
        if {then_main!r}:
            b = rt.sync_tracer({str(b)!r})
            b.open()
            b.emit(rt.WeightsSynced(weight_version=2))
            handler = signal.getsignal(signal.SIGTERM)
            print("after main", handler.__module__, flush=True)
        print("ready", flush=True)
        nap()
        """,
    )
    assert _line(proc) == "after thread True"
    if then_main:
        assert _line(proc) == "after main rollout_trace._writing.hooks"
    assert _line(proc) == "ready"
    status, err = _terminate(proc)
    assert status == -signal.SIGTERM, err
    run_a = only_run(a.read_bytes())
    assert [e["weight_version"] for e in run_a.events] == [1]
    if not then_main:
        assert run_a.closed is None  # documented: nothing could run
        assert not b.exists()
    else:
        assert run_a.closed is not None and run_a.closed["written"] == 1
        run_b = only_run(b.read_bytes())
        assert run_b.closed is not None and run_b.closed["written"] == 1


# --- fork and multiprocessing ---------------------------------------------------


def _emit_in_multiprocessing_child(t: rt.SyncTracer, n: int) -> None:
    for i in range(n):
        t.emit(rt.WeightsSynced(weight_version=i))
    # and return: multiprocessing ends the child with os._exit()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forked_children_write_runs_of_their_own_and_the_parents_once(tmp_path: Path) -> None:
    # One file for the three runs, and the parent's events still queued
    # (unwritten) at both forks: a child that wrote any of them would show
    # here as a seq twice in the parent's run.
    path = tmp_path / "shared.jsonl"
    t = rt.sync_tracer(str(path), flush_interval=60, batch_size=1_000_000)
    t.open()
    for i in range(100):
        t.emit(dispatched(i))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for i in range(10):
                t.emit(rt.WeightsSynced(weight_version=i))
            t.close(timeout=10)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child = multiprocessing.get_context("fork").Process(
        target=_emit_in_multiprocessing_child, args=(t, 20)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    for i in range(100, 200):
        t.emit(dispatched(i))
    parent_run = t.run_id
    t.close()

    runs = check_runs(path.read_bytes())  # every run: each seq once, counts == lines
    assert len(runs) == 3
    parent = runs.pop(str(parent_run))
    assert parent.closed is not None and parent.closed["written"] == 200
    assert [(e["prompt_id"], e["generation_index"]) for e in parent.events] == [
        (ev.prompt_id, ev.generation_index) for ev in map(dispatched, range(200))
    ]
    by_pid = {r.opened["pid"]: r for r in runs.values()}
    assert set(by_pid) == {pid, child.pid}
    for child_pid, n in ((pid, 10), (child.pid, 20)):
        run = by_pid[child_pid]
        assert run.closed is not None and run.closed["written"] == n
        assert [e["weight_version"] for e in run.events] == list(range(n))


_C_FORK = """
import asyncio, ctypes, json, os, sys, threading, time
import rollout_trace as rt
from rollout_trace._writing import engine, hooks

KIND, PATH = sys.argv[1], sys.argv[2]
# The writer thread stops inside its next batch, holding the tracer's lock
# and the hooks' (as it holds them for a moment while it looks for a flush's
# mark, or gives up a run that did not open), until the fork is made.
armed, inside, go_on = [], threading.Event(), threading.Event()
real_process = engine.Engine.process

def process(self, *args, **kwargs):
    if armed:
        armed.clear()
        with tracer._lock, hooks._lock:
            inside.set()
            go_on.wait()
    return real_process(self, *args, **kwargs)

engine.Engine.process = process

def emit(first, n):
    for i in range(first, first + n):
        tracer.emit(rt.WeightsSynced(weight_version=i))

def fork():
    armed.append(True)
    emit(10, 100)  # a full batch: the writer takes it and stops inside
    inside.wait()
    emit(110, 30)  # queued; the first woke the writer, which cannot clear it
    # A fork that runs no at-fork hooks (PyDLL: with the GIL held, as os.fork
    # calls fork(); CDLL lets it go, and another thread that takes it then
    # leaves the child's GIL held by a thread that is not there).
    return ctypes.PyDLL(None).fork()

def in_the_child(counts, flushed):
    print(json.dumps({"outside_run": counts.outside_run, "emitted": counts.emitted,
                      "flushed": flushed, "state": tracer.state}), flush=True)
    sys.exit(0)  # the block closes the tracer, then the exit hooks run

def wait_for(pid):
    go_on.set()
    deadline = time.monotonic() + 30  # only a hung child takes this long
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"

def in_the_parent(status):
    print(json.dumps({"child": status, "run_id": tracer.run_id}), flush=True)

if KIND == "sync":
    with rt.sync_tracer(PATH, flush_interval=60, batch_size=100) as tracer:
        emit(0, 10)
        tracer.flush()
        pid = fork()
        if pid == 0:
            emit(1000, 250)
            in_the_child(tracer.counts, tracer.flush(timeout=5))
        status = wait_for(pid)
        emit(140, 100)
else:
    async def main():
        global tracer
        async with rt.tracer(PATH, flush_interval=60, batch_size=100) as tracer:
            emit(0, 10)
            await tracer.flush()
            pid = fork()
            if pid == 0:
                emit(1000, 250)
                in_the_child(tracer.counts, await tracer.flush())
            status = wait_for(pid)
            emit(140, 100)
        return status
    status = asyncio.run(main())
in_the_parent(status)
print(json.dumps(tracer.counts.written), flush=True)
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_child_forked_without_fork_hooks_exits_at_once_and_leaves_the_parent_whole(
    kind: str, tmp_path: Path
) -> None:
    # A C-level fork (ctypes' fork(), a C extension's) runs none of Python's
    # at-fork hooks. The child hung for good at exit: the exit hook waited for
    # locks a thread of the parent held at the fork. And its emits went into
    # the copy of the parent's queue, which nothing writes: uncounted, while
    # flush() said True.
    path = tmp_path / "shared.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _C_FORK, kind, str(path)],
        capture_output=True,
        env=_env(),
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    child, parent, written = (json.loads(line) for line in proc.stdout.splitlines())
    assert parent["child"] == 0, proc.stderr  # exited, and not hung
    # The child notices at its first emit that fills a batch (100 in the
    # queue, the parent's 30 included): that event and every later one are
    # counted outside any run; the 69 before it cannot be told from the
    # parent's, so flush() says False.
    assert child == {"outside_run": 181, "emitted": 0, "flushed": False, "state": "closed"}
    # The parent's run is whole and alone in the file: no line of the child's,
    # torn or copied; its counts are the lines in the file.
    run = only_run(path.read_bytes(), uri=str(path))
    assert run.run_id == parent["run_id"]
    assert run.closed is not None and run.closed["written"] == written == 240
    assert [e["weight_version"] for e in run.events] == list(range(240))


def test_a_multiprocessing_child_stopped_with_terminate_closes_its_run(tmp_path: Path) -> None:
    # Process.terminate() is SIGTERM; the child inherits the handler the
    # parent's first open installed.
    proc = _start(
        tmp_path,
        f"""
        import multiprocessing as mp, time
        import rollout_trace as rt
        t = rt.sync_tracer({str(tmp_path)!r} + "/{{pid}}.jsonl")

        def work(ready):
            for i in range(50):
                t.emit(rt.WeightsSynced(weight_version=i))
            ready.set()
            nap()

        if __name__ == "__main__":
            t.open()
            t.emit(rt.WeightsSynced(weight_version=-1))
            ctx = mp.get_context("fork")
            ready = ctx.Event()
            p = ctx.Process(target=work, args=(ready,))
            p.start()
            assert ready.wait(30)
            p.terminate()
            p.join(30)
            t.close()
            print(p.pid, p.exitcode, flush=True)
        """,
    )
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    child_pid, exitcode = map(int, out.split())
    assert exitcode == -signal.SIGTERM
    child = only_run((tmp_path / f"{child_pid}.jsonl").read_bytes())
    assert child.closed is not None and child.closed["written"] == 50
    parent = only_run((tmp_path / f"{proc.pid}.jsonl").read_bytes())
    assert parent.closed is not None and [e["weight_version"] for e in parent.events] == [-1]


# --- registered at the first open, not at import ---------------------------------


def test_importing_and_reading_register_no_hook_and_the_first_open_does(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    proc = _start(
        tmp_path,
        f"""
        import atexit, json, os, signal, sys

        calls = []

        def spy(kind, real):
            def wrapper(*args, **kwargs):
                calls.append([kind, sys._getframe(1).f_globals.get("__name__", "")])
                return real(*args, **kwargs)
            return wrapper

        # In place before the package is imported, so that nothing it does is missed.
        atexit.register = spy("atexit", atexit.register)
        os.register_at_fork = spy("fork", os.register_at_fork)
        signal.signal = spy("signal", signal.signal)

        def ours():
            return sorted({{kind for kind, module in calls if module.startswith("rollout_trace")}})

        def report(when):
            handler = signal.getsignal(signal.SIGTERM)
            name = handler.__module__ if callable(handler) else repr(handler)
            print(json.dumps([when, ours(), name]), flush=True)

        import rollout_trace as rt
        report("import")
        costs = rt.restore_costs(rt.read([{str(_EXAMPLE)!r} + "/*.jsonl"]))
        assert costs, "the example has a stop"
        report("read")
        t = rt.sync_tracer({str(path)!r})
        report("built")
        t.open()
        report("opened")
        t.close()
        """,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    steps: dict[str, Any] = {
        when: (kinds, handler) for when, kinds, handler in map(json.loads, out.splitlines())
    }
    default = repr(signal.SIG_DFL)
    assert steps["import"] == ([], default)
    assert steps["read"] == ([], default)
    # The first enabled tracer built may already register them (a tracer first
    # opened by an exit hook of the program must still be closed at exit).
    assert set(steps["built"][0]) <= {"atexit", "fork", "signal"}
    assert steps["opened"] == (["atexit", "fork", "signal"], "rollout_trace._writing.hooks")


_C_FORK_OPEN = """
import ctypes, json, os, sys, threading, time
import rollout_trace as rt

MODE, FOLDER = sys.argv[1], sys.argv[2]
t = rt.sync_tracer(FOLDER + "/{pid}.jsonl", flush_interval=60)
if MODE == "open":
    t.open()
    t.emit(rt.WeightsSynced(weight_version=0))
    t.flush()
parent_run = t.run_id
pid = ctypes.PyDLL(None).fork()  # no at-fork hooks
if pid == 0:
    if MODE == "open":
        t.open()  # the parent's run is not this process's: a new one
        out = {"state": t.state, "new_run": t.run_id not in (None, parent_run)}
        t.emit(rt.WeightsSynced(weight_version=7))
        t.close()
    else:  # never opened in the parent: the first emit would open it lazily
        for i in range(5):
            t.emit(rt.WeightsSynced(weight_version=i))
        out = {"state": t.state, "outside_run": t.counts.outside_run,
               "threads": threading.active_count()}
    print(json.dumps(out), flush=True)
    os._exit(0)
deadline = time.monotonic() + 30  # only a hung child takes this long
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print(json.dumps("hung"), flush=True)
t.close()
print(json.dumps({"parent_run": parent_run, "child": pid}), flush=True)
"""


@pytest.mark.parametrize("mode", ["open", "new"])
def test_a_child_forked_without_fork_hooks_opens_only_when_told(mode: str, tmp_path: Path) -> None:
    # open() in such a child returned the parent's run as its own ("already
    # open"), and its events then went nowhere; a tracer not yet open at the
    # fork opened lazily there, starting a thread CPython is not ready for.
    proc = subprocess.run(
        [sys.executable, "-c", _C_FORK_OPEN, mode, str(tmp_path)],
        capture_output=True,
        env=_env(),
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    child, parent = (json.loads(line) for line in proc.stdout.splitlines())
    if mode == "open":
        assert child == {"state": "open", "new_run": True}
        (mine,) = [p for p in tmp_path.iterdir() if p.name != f"{parent['child']}.jsonl"]
        for path, run_id in ((tmp_path / f"{parent['child']}.jsonl", None), (mine, "parent")):
            run = only_run(path.read_bytes())
            assert run.closed is not None and run.closed["written"] == 1
            assert (run.run_id == parent["parent_run"]) is (run_id == "parent")
    else:
        assert child == {"state": "closed", "outside_run": 5, "threads": 1}
        assert not (tmp_path / f"{parent['child']}.jsonl").exists()
        # Quietly: a thread of the parent may have held logging's locks.
        assert b"rollout_trace" not in proc.stderr, proc.stderr
