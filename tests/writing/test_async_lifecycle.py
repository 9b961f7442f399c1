"""The async tracer's lifecycle under faults injected for real.

Native double cancels, ``asyncio.run`` ending with the tracer held by a
background task, Ctrl-C, sinks that raise what a sink should never raise, an
encoder that fails, hung sinks, two tasks opening one tracer, and an endless
``close_timeout``: under asyncio, uvloop and trio. Each scenario is bounded in
time (a hang fails the test, it does not wedge the suite), and every file is
checked line by line (``tracecheck``), never against a remainder.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
import trio
import uvloop
from deadlines import WatchedClock, advancing, bounded
from samples import dispatched
from tracecheck import only_run

import rollout_trace as rt
from rollout_trace.sinks import MemorySink
from rollout_trace.testing import MockClock

pytestmark = pytest.mark.timeout(60)
T = TypeVar("T")

# The asyncio-family event loops that ``asyncio.run`` semantics are checked on
# (``asyncio.Runner`` is what ``asyncio.run`` is; on 3.11 it takes the factory).
LOOPS = [
    pytest.param(None, id="asyncio"),
    pytest.param(uvloop.new_event_loop, id="uvloop"),
]
# Every anyio backend the tracer supports, for scenarios that are not about
# asyncio's own cancellation.
BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


def run_loop(
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
    main: Callable[[], Coroutine[Any, Any, T]],
) -> T:
    """``asyncio.run(main())`` on the given loop: cancels what is left when ``main`` returns."""

    def run() -> T:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())

    return bounded(run, 30)


def run_on(backend: tuple[str, dict[str, Any]], fn: Callable[[], Awaitable[T]]) -> T:
    name, options = backend
    return bounded(lambda: anyio.run(fn, backend=name, backend_options=options), 30)


def state_of(t: rt.Tracer) -> str:
    # From the repr, which says the state in every version of the tracer.
    return repr(t).split()[1]


def events_in(path: Path) -> int:
    """User events in the file (lines that are not trace_opened/trace_closed)."""
    if not path.exists():
        return 0
    lines = path.read_bytes().splitlines()
    return sum(
        1 for line in lines if b'"trace_opened"' not in line and b'"trace_closed"' not in line
    )


def own_tally(run: Any, uri: str) -> None:
    """``trace_closed`` says the file's sink wrote just the events in the file."""
    assert run.closed is not None, "trace_closed is missing"
    sinks = run.closed.get("sinks")
    if sinks is not None:  # what each sink wrote (not in trace_closed before the rewrite)
        (mine,) = [s for s in sinks if s["uri"] == uri]
        assert mine["written"] == len(run.events), (mine, len(run.events))


def complete_run(path: Path, emitted: int | None = None) -> Any:
    """The file holds one run with every one of ``emitted`` events (all the run
    emitted, when None) and trace_closed."""
    run = only_run(path.read_bytes())
    assert run.closed is not None, "trace_closed is missing"
    if emitted is None:
        emitted = run.closed["emitted"]
    assert run.closed["emitted"] == emitted, run.closed
    assert len(run.events) == emitted, (len(run.events), emitted)
    assert sorted(e["seq"] for e in run.events) == list(range(1, emitted + 1))
    own_tally(run, str(path))
    return run


def _child_env() -> dict[str, str]:
    # The child imports the same rollout_trace (and sinks) as this test run.
    root = str(Path(rt.__file__).resolve().parents[1])
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


_CHILD_PRELUDE = """\
import asyncio, json, math, os, signal, sys, time
import rollout_trace as rt

# Ctrl-C as at a terminal: a suite started in the background by a
# non-interactive shell hands its children SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)

PATH = sys.argv[1]
N = int(sys.argv[2])
LOOP = sys.argv[3]


def ev(i):
    return rt.StepTrained(step=i, group_ids=[])


def run(main):
    factory = None
    if LOOP == "uvloop":
        import uvloop
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())
"""


def _child(code: str, *args: object, timeout: float = 30) -> subprocess.Popen[bytes]:
    script = _CHILD_PRELUDE + textwrap.dedent(code)
    # Started as from a background job, with SIGINT ignored (the prelude
    # sets it back), whatever the shell that started the suite.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(),
        )
    finally:
        signal.signal(signal.SIGINT, old)


def _finish(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the child hung for {timeout} s; stderr: {err.decode()[-2000:]}")
    return proc.returncode, out.decode(), err.decode()


# --- 1. a controller task cancelled again and again --------------------------

N_CANCEL = 1_000


@dataclass
class Scene:
    """The controller task, its tracer, and the two nested timeouts around its block."""

    task: asyncio.Task[None]
    tracer: rt.Tracer
    timeouts: list[asyncio.Timeout]


async def _closing(scene: Scene) -> None:
    while state_of(scene.tracer) != "closing":
        await asyncio.sleep(0.001)


async def _twice(scene: Scene) -> None:
    scene.task.cancel()
    await asyncio.sleep(0)
    scene.task.cancel()


async def _twice_at_once(scene: Scene) -> None:
    scene.task.cancel()
    scene.task.cancel()


async def _thrice(scene: Scene) -> None:
    for _ in range(3):
        scene.task.cancel()
        await asyncio.sleep(0)


async def _once_closing(scene: Scene) -> None:
    await _closing(scene)
    scene.task.cancel()


async def _twice_closing(scene: Scene) -> None:
    await _closing(scene)
    await _twice(scene)


async def _timeouts_fire(scene: Scene) -> None:
    # Both expire at one moment: they cancel the task in one loop turn.
    now = asyncio.get_running_loop().time()
    for timeout in scene.timeouts:
        timeout.reschedule(now)


async def _timeouts_fire_closing(scene: Scene) -> None:
    await _closing(scene)
    await _timeouts_fire(scene)


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize("loop_factory", LOOPS)
@pytest.mark.parametrize(
    ("body_returns", "strike", "ends_with"),
    [
        # task.cancel() twice, one loop turn apart: the second lands in the close
        pytest.param(False, _twice, asyncio.CancelledError, id="twice"),
        # two task.cancel() before the task runs again: cancelling() is 2
        pytest.param(False, _twice_at_once, asyncio.CancelledError, id="twice-at-once"),
        # three cancels in a row, each a loop turn apart
        pytest.param(False, _thrice, asyncio.CancelledError, id="three-times"),
        # two nested asyncio.timeout()s expire together while the body sleeps
        pytest.param(False, _timeouts_fire, TimeoutError, id="nested-timeouts"),
        # the body ended; a cancel lands while aclose() is draining a slow sink
        pytest.param(True, _once_closing, asyncio.CancelledError, id="once-while-closing"),
        # and two cancels while aclose() runs
        pytest.param(True, _twice_closing, asyncio.CancelledError, id="twice-while-closing"),
        # the two nested timeouts expire together while aclose() runs
        pytest.param(True, _timeouts_fire_closing, TimeoutError, id="nested-timeouts-closing"),
    ],
)
def test_a_controller_cancelled_again_and_again_ends_promptly_with_a_complete_trace(
    tmp_path: Path,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
    body_returns: bool,
    strike: Callable[[Scene], Awaitable[None]],
    ends_with: type[BaseException],
) -> None:
    path = tmp_path / "run.jsonl"
    # A slow second sink makes the close take a while (about 0.6 s), so that
    # cancels can land in it. The deadlines' clock never moves: a close that
    # waited for close_timeout would not end (the 5 s wait below fails it).
    t = rt.tracer(
        str(path),
        "slow://?delay=0.1",
        batch_size=200,
        close_timeout=10,
        deadline_clock=MockClock(),
    )
    timeouts: list[asyncio.Timeout] = []

    async def controller(started: asyncio.Event) -> None:
        async with asyncio.timeout(None) as outer, asyncio.timeout(None) as inner:
            timeouts.extend([outer, inner])
            async with t:
                for i in range(N_CANCEL):
                    t.emit(dispatched(i))
                started.set()
                if not body_returns:
                    await asyncio.sleep(60)

    async def main() -> BaseException | None:
        started = asyncio.Event()
        task = asyncio.create_task(controller(started))
        await started.wait()
        await strike(Scene(task, t, timeouts))
        done, _ = await asyncio.wait([task], timeout=5)
        if not done:
            pytest.fail(f"the cancelled controller did not end within 5 s (state {state_of(t)})")
        return task.exception() if not task.cancelled() else asyncio.CancelledError()

    exc = run_loop(loop_factory, main)
    assert isinstance(exc, ends_with), repr(exc)
    assert state_of(t) == "closed"
    complete_run(path, N_CANCEL)


# --- 2. asyncio.run ends with the tracer still open ------------------------------

# The deadlines' clock stands still: a close that waited for its deadline
# (close_timeout) would never end, and the child would hang.
_BACKGROUND = """
from rollout_trace.testing import MockClock


async def holder(t, ready):
    async with t:
        for i in range(N):
            t.emit(ev(i))
        ready.set()
        await asyncio.sleep(3600)

TASKS = []

async def main():
    t = rt.tracer(PATH, close_timeout=5, deadline_clock=MockClock())
    ready = asyncio.Event()
    TASKS.append(asyncio.get_running_loop().create_task(holder(t, ready)))
    await ready.wait()
    # main returns; asyncio.run cancels the holder, inside `async with`

run(main)
"""

_NEVER_CLOSED = """
from rollout_trace.testing import MockClock


async def main():
    t = rt.tracer(PATH, close_timeout=1, deadline_clock=MockClock())
    await t.__aenter__()
    for i in range(N):
        t.emit(ev(i))
    # never closed: asyncio.run ends with the run open

run(main)
"""

_SIGINT = """
HOLDER, ACTIVITY = sys.argv[4], sys.argv[5]


async def hold():
    async with rt.tracer(PATH, close_timeout=5) as t:
        for i in range(N):
            t.emit(ev(i))
        if ACTIVITY == "sleeping":
            # Idle when Ctrl-C comes (the test after this one sends it while
            # the tracer writes).
            await t.flush()
        print("ready", flush=True)
        if ACTIVITY == "sleeping":
            await asyncio.sleep(3600)
        while True:  # emitting when Ctrl-C comes
            for _ in range(100):
                t.emit(ev(i))
            await asyncio.sleep(0.001)


async def main():
    if HOLDER == "main":
        await hold()
    else:
        task = asyncio.create_task(hold())
        await asyncio.sleep(3600)
        await task


run(main)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize(
    "code",
    [
        # a background task holds the tracer, sleeping in `async with`, when main returns
        pytest.param(_BACKGROUND, id="background-task"),
        # `await t.__aenter__()` and never closed: the run is closed as the loop ends
        pytest.param(_NEVER_CLOSED, id="never-closed"),
    ],
)
def test_asyncio_run_ending_with_the_tracer_open_leaves_a_complete_trace(
    tmp_path: Path, loop: str, code: str
) -> None:
    # The close waits for no deadline (the child's clock stands still): the
    # child ends (its timeout is a hang guard) with every event written.
    path = tmp_path / "run.jsonl"
    n = 3_000
    rc, _, err = _finish(_child(code, path, n, loop), timeout=20)
    assert rc == 0, err
    assert "Traceback" not in err, err
    complete_run(path, n)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize(
    ("holder", "activity"),
    [
        # the main task holds the tracer and sleeps in `async with`
        ("main", "sleeping"),
        # ... and emits, 100 events a millisecond
        ("main", "emitting"),
        # a background task holds it (asyncio.run cancels it after main)
        ("background", "sleeping"),
        ("background", "emitting"),
    ],
)
def test_ctrl_c_exits_as_keyboard_interrupt_does_with_a_complete_trace(
    tmp_path: Path, loop: str, holder: str, activity: str
) -> None:
    path = tmp_path / "run.jsonl"
    n = 3_000
    proc = _child(_SIGINT, path, n, loop, holder, activity)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the child has emitted every event
    assert line == b"ready\n", (line, proc.stderr.read() if proc.stderr else b"")
    proc.send_signal(signal.SIGINT)
    rc, _, err = _finish(proc, timeout=30)
    # An uncaught KeyboardInterrupt ends Python by SIGINT, as the shell expects.
    assert rc == -signal.SIGINT, (rc, err)
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert "rollout_trace" not in err, err  # nothing of ours in the traceback or the log
    run = complete_run(path)  # every event the run emitted, and trace_closed
    assert len(run.events) >= n


_TRIPPED = """
import contextlib, signal, threading

WHICH = sys.argv[4]


def main_thread_sleeps_in_its_selector():
    wchan = f"/proc/self/task/{threading.main_thread().native_id}/wchan"
    end = time.monotonic() + 10
    while "epoll" not in open(wchan).read():
        if time.monotonic() > end:  # a kernel that does not say
            return False
        time.sleep(0.001)
    return True


def trip():
    if not main_thread_sleeps_in_its_selector():
        print("no wchan", file=sys.stderr, flush=True)
        os._exit(0)
    # The C handler runs on this thread and only trips a flag: nothing wakes
    # the loop's thread, asleep in its selector (asyncio sets no wakeup fd).
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    print("tripped", file=sys.stderr, flush=True)


if WHICH == "sync":  # opened before the loop runs; emitted to from a coroutine
    tracer = rt.sync_tracer("stdout://", close_timeout=5).open()
    held = contextlib.nullcontext(tracer)
else:
    held = None


async def main():
    async with (held or rt.tracer("stdout://", close_timeout=5)) as t:
        for i in range(N):
            t.emit(ev(i))
        # The parent reads none of the trace yet: the sink is blocked on the
        # full pipe when the signal comes, and writes the rest after it.
        threading.Thread(target=trip, daemon=True).start()
        await asyncio.sleep(3600)


run(main)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("which", ["async", "sync"])
def test_ctrl_c_taken_while_the_tracer_writes_ends_the_loop_once_the_writing_is_done(
    which: str,
) -> None:
    """A Ctrl-C whose flag is tripped while the loop sleeps is taken when our
    threads finish their work: they wake the loop once, as its own work would."""
    n = 20_000  # far more than a pipe holds
    proc = _child(_TRIPPED, "-", n, "asyncio", which)
    assert proc.stderr is not None and proc.stdout is not None
    line = proc.stderr.readline()
    if line == b"no wchan\n":
        proc.communicate()
        pytest.skip("the kernel does not say where the loop's thread sleeps")
    assert line == b"tripped\n", line + proc.stderr.read()
    trace = proc.stdout.read()  # until the child exits
    rc, _, err = _finish(proc, timeout=30)
    assert rc == -signal.SIGINT, (rc, err)
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    run = only_run(trace)
    assert run.closed is not None and run.closed["emitted"] == n, run.closed
    assert sorted(e["seq"] for e in run.events) == list(range(1, n + 1))
    assert run.closed["sinks"] == [{"uri": "stdout://", "written": n, "error": None}]


def _count_wakes(loop: asyncio.AbstractEventLoop) -> list[float]:
    """Records the time of each wake our threads ask of ``loop``."""
    wakes: list[float] = []
    real = loop.call_soon_threadsafe

    def spy(callback: Callable[..., object], *args: Any, **kwargs: Any) -> Any:
        if getattr(callback, "__module__", "").startswith("rollout_trace"):
            wakes.append(time.monotonic())
        return real(callback, *args, **kwargs)

    loop.call_soon_threadsafe = spy  # type: ignore[method-assign]
    return wakes


def test_a_loop_that_is_not_running_is_never_woken() -> None:
    # Opened from a coroutine, then used from plain code after the loop
    # stopped: a wake would sit in the loop's queue for good, one per drain.
    loop = asyncio.new_event_loop()
    wakes = _count_wakes(loop)

    async def opened() -> rt.SyncTracer:
        return rt.sync_tracer("memory://").open()

    t = loop.run_until_complete(opened())
    try:
        for i in range(30):
            t.emit(rt.StepTrained(step=i, group_ids=[]))  # urgent: a drain each
            assert t.flush(timeout=10)
    finally:
        t.close()
        loop.close()
    assert wakes == []


async def test_our_threads_wake_the_loop_at_most_once_a_switch_interval() -> None:
    # A stream of urgent events drains the queue at every one of them.
    wakes = _count_wakes(asyncio.get_running_loop())
    async with rt.tracer("memory://") as t:
        for i in range(200):
            t.emit(rt.StepTrained(step=i, group_ids=[]))
            await asyncio.sleep(0.001)
        assert await t.flush()
    gaps = sorted(b - a for a, b in itertools.pairwise(wakes))
    # The spy reads the clock after the engine did: a thread put off between the
    # two reads moves one wake late and the next gap short. Unthrottled, wakes
    # would come a millisecond apart (one an emit).
    assert len(gaps) > 1 and gaps[0] >= 0.004 and gaps[len(gaps) // 2] >= 0.005, gaps


# --- 3. faults in the writer: what a sink or the encoder must never raise ---------


class RaisingSink(MemorySink):
    """Takes the first ``ok`` writes, then raises ``raise`` (a name) on every write."""

    options = frozenset({"ok", "raise"})
    RAISES: Mapping[str, type[BaseException]] = {
        "cancelled": asyncio.CancelledError,
        "exit": SystemExit,
        "interrupt": KeyboardInterrupt,
    }

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self.ok = int(options.get("ok", "1"))
        self.exc = self.RAISES[options.get("raise", "cancelled")]

    def write(self, data: bytes) -> Any:
        if self.ok <= 0:
            raise self.exc("injected")
        self.ok -= 1
        # Returned: the awaitable of a Sink whose methods are async (before the
        # rewrite), None now.
        return super().write(data)


class SlowOpenSink(MemorySink):
    """Takes 0.3 s to open (a network mount)."""

    def open(self) -> Any:
        time.sleep(0.3)
        return super().open()


@pytest.fixture
def own_plugins(plugins: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """This module's sinks, installed as entry points the way plugin_sinks' are."""
    import plugin_sinks

    registry = plugin_sinks.sinkspec._registry()
    group = plugin_sinks.sinkspec.ENTRY_POINT_GROUP
    for name, cls in {"raising": RaisingSink, "slowopen": SlowOpenSink}.items():
        ep = EntryPoint(name=name, value=f"{__name__}:{cls.__name__}", group=group)
        monkeypatch.setitem(registry, name, ep)


def _poison() -> rt.StepTrained:
    return rt.StepTrained(step=-1, group_ids=["poison"])


def _break_encoding_of_poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's encoder raises (a bug of ours, say) for a batch with the poison event."""
    from rollout_trace._schema.encoding import BatchEncoder

    real = BatchEncoder.encode

    def encode(self: Any, events: Any, *args: Any) -> Any:
        if any(getattr(ev, "group_ids", None) == ["poison"] for ev in events):
            raise RuntimeError("injected encoder failure")
        return real(self, events, *args)

    monkeypatch.setattr(BatchEncoder, "encode", encode)


@pytest.mark.usefixtures("own_plugins")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("other", "break_encoder", "flushes", "lost", "says"),
    [
        # a sink's write raises asyncio.CancelledError (a plugin that ran a loop inside)
        pytest.param(
            "raising://?raise=cancelled",
            False,
            [True, True, True],
            0,
            "CancelledError",
            id="sink-raises-CancelledError",
        ),
        # a sink's write raises SystemExit (a plugin that called sys.exit())
        pytest.param(
            "raising://?raise=exit",
            False,
            [True, True, True],
            0,
            "SystemExit",
            id="sink-SystemExit",
        ),
        # a sink's write raises KeyboardInterrupt
        pytest.param(
            "raising://?raise=interrupt",
            False,
            [True, True, True],
            0,
            "KeyboardInterrupt",
            id="sink-KeyboardInterrupt",
        ),
        # (a sink that fails is not live: the file, the one live sink, has
        # every event before each flush, so each flush says True)
        # the engine's encoder raises for the batch holding the poison event
        pytest.param("memory://", True, [True, False, False], 1, "injected", id="encoder-raises"),
    ],
)
def test_a_fault_in_the_writer_never_reaches_the_program(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trace_log: pytest.LogCaptureFixture,
    backend: tuple[str, dict[str, Any]],
    other: str,
    break_encoder: bool,
    flushes: list[bool],
    lost: int,
    says: str,
) -> None:
    path = tmp_path / "run.jsonl"
    if break_encoder:
        _break_encoding_of_poison(monkeypatch)
    # The deadlines' clock stands still: the close, which waits for no
    # deadline (the faulty sink is not live), ends all the same.
    t = rt.tracer(other, str(path), batch_size=100, close_timeout=5, deadline_clock=MockClock())
    results: list[bool] = []

    async def main() -> None:
        async with t:
            # 1: a batch the faulty sink fails on (it took only trace_opened)
            for i in range(300):
                t.emit(dispatched(i))
            with anyio.fail_after(5):
                results.append(await t.flush())
            # 2: the poison event alone (only the broken encoder minds it)
            t.emit(_poison())
            with anyio.fail_after(5):
                results.append(await t.flush())
            # 3: the run goes on; emit still refuses only what is not an event
            with pytest.raises(TypeError):
                t.emit(object())  # type: ignore[arg-type]
            for i in range(300):
                t.emit(dispatched(i))
            with anyio.fail_after(5):
                results.append(await t.flush())

    try:
        run_on(backend, main)
    except (KeyboardInterrupt, SystemExit) as exc:  # must never reach the program
        pytest.fail(f"{exc!r} from a sink reached the program")
    assert results == flushes
    c = t.counts
    assert c.emitted == 601 and c.pending == 0, c
    assert c.emitted == c.written + c.dropped + c.invalid, c
    assert c.dropped == lost, c
    # The jsonl sink kept every event the run did not lose, and trace_closed.
    run = only_run(path.read_bytes(), allow_drops=True)
    own_tally(run, str(path))
    assert run.closed is not None and run.closed["dropped"] == lost, run.closed
    assert len(run.events) == 601 - lost == run.closed["written"]
    reports = [r for r in trace_log.records if r.name == "rollout_trace"]
    assert len(reports) == 1, [r.getMessage() for r in reports]
    assert says in reports[0].getMessage()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_encoder_failing_on_trace_closed_does_not_reach_the_program(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trace_log: pytest.LogCaptureFixture,
    backend: tuple[str, dict[str, Any]],
) -> None:
    path = tmp_path / "run.jsonl"
    from rollout_trace._schema.encoding import BatchEncoder

    real = BatchEncoder.encode

    def encode(self: Any, events: Any, *args: Any) -> Any:
        if any(isinstance(ev, rt.TraceClosed) for ev in events):
            raise RuntimeError("injected encoder failure")
        return real(self, events, *args)

    monkeypatch.setattr(BatchEncoder, "encode", encode)
    # The clock stands still: the close waits for no deadline.
    t = rt.tracer(str(path), close_timeout=5, deadline_clock=MockClock())

    async def main() -> None:
        async with t:
            for i in range(300):
                t.emit(dispatched(i))
            with anyio.fail_after(5):
                assert await t.flush()

    run_on(backend, main)  # leaving the block raises nothing
    assert state_of(t) == "closed"
    c = t.counts
    assert c.emitted == 300 == c.written + c.dropped + c.invalid, c
    # Every event is in the file; only trace_closed, which could not be
    # encoded, is missing.
    run = only_run(path.read_bytes())
    assert len(run.events) == 300
    reports = [r for r in trace_log.records if r.name == "rollout_trace"]
    assert len(reports) == 1 and "injected" in reports[0].getMessage(), reports


_BROKEN_CLASS = """
import logging
import anyio
from rollout_trace.testing import MockClock
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s %(message)s")
BACKEND = sys.argv[4]
MIXED = sys.argv[5] == "mixed"


class Broken(rt.Event, tag="broken_annotation"):
    x: "NoSuchType"  # noqa: F821 - cannot be resolved, ever


async def main():
    out = {}
    # The clock stands still: a close that waited for its deadline would hang.
    t = rt.tracer(PATH, batch_size=100, close_timeout=5, deadline_clock=MockClock())
    async with t:
        for i in range(N):
            t.emit(ev(i))
        out["flush1"] = await t.flush()
        if MIXED:  # amid good events, in one batch
            for i in range(N):
                t.emit(ev(i))
                if i == N // 2:
                    t.emit(Broken(x=1))
        else:  # alone in its batch
            t.emit(Broken(x=1))
        out["flush2"] = await t.flush()
        for i in range(N):
            t.emit(ev(i))
        out["flush3"] = await t.flush()
    out["counts"] = t.counts._asdict()
    print(json.dumps(out))


anyio.run(main, backend=BACKEND)
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_event_class_whose_annotations_cannot_be_resolved_is_not_fatal(
    tmp_path: Path, backend: str
) -> None:
    # In a child: the class would stay in this process's registry of event classes.
    path = tmp_path / "run.jsonl"
    n = 300
    rc, out, err = _finish(_child(_BROKEN_CLASS, path, n, "-", backend, "alone"), timeout=20)
    assert rc == 0 and "Traceback" not in err, err
    got = json.loads(out.splitlines()[-1])
    c = got["counts"]
    emitted = 2 * n + 1
    assert c["emitted"] == emitted == c["written"] + c["dropped"] + c["invalid"], c
    assert c["dropped"] + c["invalid"] == 1, c  # the broken event, alone in its batch
    # Every flush returned; one after the event says False if it was dropped
    # (an event counted invalid was never going to be written).
    after = c["dropped"] == 0
    assert (got["flush1"], got["flush2"], got["flush3"]) == (True, after, after), got
    run = only_run(path.read_bytes(), allow_drops=True)
    assert run.closed is not None and len(run.events) == emitted - 1 == run.closed["written"]
    reports = [line for line in err.splitlines() if line.startswith("LOG ")]
    assert len(reports) == 1 and "NoSuchType" in reports[0], reports


def test_an_event_whose_class_cannot_be_encoded_costs_only_itself(tmp_path: Path) -> None:
    # README "Only what readers can read is written": a value that cannot
    # be encoded makes *its event* invalid. Here one such event sits amid 300
    # good ones in one batch: they must still be written.
    path = tmp_path / "run.jsonl"
    n = 300
    rc, out, err = _finish(_child(_BROKEN_CLASS, path, n, "-", "asyncio", "mixed"), timeout=20)
    assert rc == 0 and "Traceback" not in err, err
    got = json.loads(out.splitlines()[-1])
    c = got["counts"]
    emitted = 3 * n + 1
    assert c["emitted"] == emitted == c["written"] + c["dropped"] + c["invalid"], c
    assert c["written"] == emitted - 1, c
    run = only_run(path.read_bytes(), allow_drops=True)
    assert len(run.events) == emitted - 1


# --- 4. a bounded flush while a sink is hung ----------------------------------------


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_flush_cancelled_while_a_sink_hangs_does_not_wedge_the_writer(
    tmp_path: Path, backend: tuple[str, dict[str, Any]]
) -> None:
    path = tmp_path / "run.jsonl"
    close_timeout = 1.0
    clock = WatchedClock()
    t = rt.tracer(
        "stuck://?ok=1",
        str(path),
        batch_size=100,
        close_timeout=close_timeout,
        deadline_clock=clock,
    )

    async def main() -> None:
        async with t:
            hung = t.sinks[0].hung  # type: ignore[attr-defined]
            for i in range(500):
                t.emit(dispatched(i))
            with anyio.move_on_after(0.2):
                await t.flush()  # the stuck sink holds it: the caller gives up at 0.2 s
            for i in range(500, 1_000):
                t.emit(dispatched(i))
            # Later emits still reach the healthy file, without a flush.
            with anyio.fail_after(5):
                while events_in(path) < 1_000:
                    await anyio.sleep(0.02)
            # The next flush returns (True or False) once the hung call has
            # lasted longer than close_timeout on the clock, not before.
            with advancing(clock, close_timeout + 1e-6, ready=hung.is_set):
                await t.flush()
            t.emit(dispatched(1_000))
        # The close waits for no deadline: the hung sink was given up.

    run_on(backend, main)
    run = complete_run(path, 1_001)
    assert run.closed["dropped"] == 0


# --- 5. two tasks entering one tracer -----------------------------------------------


def _state_error() -> type[BaseException]:
    # Looked up when needed, so that this module imports on older versions too.
    return getattr(rt, "TracerStateError", type("NoTracerStateError", (Exception,), {}))


@pytest.mark.usefixtures("own_plugins")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("second_enters", "extra"),
    [
        # both tasks enter at the same moment; whichever is second is refused
        pytest.param(None, [], id="at-once"),
        # while the first one's sinks are still opening
        pytest.param("opening", ["slowopen://"], id="while-opening"),
        # while the first one is inside its block
        pytest.param("open", [], id="while-open"),
        # while the first one's close drains a slow sink
        pytest.param("closing", ["slow://?delay=0.1"], id="while-closing"),
    ],
)
def test_a_second_task_entering_the_tracer_gets_a_clear_error(
    tmp_path: Path,
    backend: tuple[str, dict[str, Any]],
    second_enters: str | None,
    extra: list[str],
) -> None:
    path = tmp_path / "run.jsonl"
    t = rt.tracer(str(path), *extra, batch_size=200)
    n = 1_000
    entered: list[str] = []
    refused: list[tuple[BaseException, str]] = []

    async def user(name: str, wait_for: str | None) -> None:
        if wait_for is not None:
            with anyio.fail_after(5):
                while state_of(t) != wait_for:
                    await anyio.sleep(0.001)
        seen = state_of(t)
        try:
            async with t:
                entered.append(name)
                for i in range(n):
                    t.emit(dispatched(i))
                    if i == n // 2:
                        await anyio.sleep(0.3)  # the other task tries meanwhile
        except RuntimeError as exc:
            refused.append((exc, seen))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(user, "first", None)
            tg.start_soon(user, "second", second_enters)

    run_on(backend, main)
    assert len(entered) == 1 and len(refused) == 1, (entered, refused)
    exc, seen = refused[0]
    assert type(exc) is _state_error(), repr(exc)
    assert isinstance(exc, rt.RolloutTraceError) and isinstance(exc, RuntimeError)
    assert seen in ("opening", "open", "closing"), seen
    assert seen in str(exc), (seen, str(exc))
    assert state_of(t) == "closed"
    complete_run(path, n)


# --- 6. close_timeout=inf ------------------------------------------------------------

_ENDLESS = """
import anyio
KIND = sys.argv[4]


async def body():
    async with rt.tracer(PATH, close_timeout=math.inf) as t:
        for i in range(N):
            t.emit(ev(i))
        assert await t.flush()
        for i in range(N, 2 * N):
            t.emit(ev(i))


async def left_open():
    t = rt.tracer(PATH, close_timeout=math.inf)
    await t.__aenter__()
    for i in range(2 * N):
        t.emit(ev(i))
    return t


if KIND in ("asyncio", "trio"):
    anyio.run(body, backend=KIND)
elif KIND == "uvloop":
    anyio.run(body, backend="asyncio", backend_options={"use_uvloop": True})
elif KIND == "at-exit":
    # A loop that is left, not closed: the interpreter's exit closes the run.
    loop = asyncio.new_event_loop()
    KEEP = loop.run_until_complete(left_open())
print("done")
"""


@pytest.mark.parametrize(
    "kind",
    [
        # `async with` on each backend: open, flush, close
        "asyncio",
        "uvloop",
        "trio",
        # a run left open on a loop that is left behind, closed at interpreter exit
        "at-exit",
    ],
)
def test_an_endless_close_timeout_works(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "run.jsonl"
    n = 2_000
    rc, out, err = _finish(_child(_ENDLESS, path, n, "-", kind), timeout=20)
    assert rc == 0, err
    assert "Traceback" not in err and "OverflowError" not in err, err
    assert out.splitlines()[-1] == "done"
    complete_run(path, 2 * n)


# --- 7. trio: cancel scopes, and trio.run ending with the tracer open ------------------


async def _trio_body(t: rt.Tracer, n: int, entered: trio.Event | None = None) -> None:
    async with t:
        for i in range(n):
            t.emit(dispatched(i))
        if entered is not None:
            entered.set()
        await trio.sleep(60)


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    "how",
    [
        # one move_on_after around the block fires while the body sleeps
        "move-on",
        # two nested scopes with one deadline fire together
        "nested-deadlines",
        # fail_after: the body's TooSlowError comes out
        "fail-after",
        # the scope is cancelled again while the close drains a slow sink
        "cancel-while-closing",
    ],
)
def test_trio_cancel_scopes_end_the_block_promptly_with_a_complete_trace(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "run.jsonl"
    n = 1_000
    # The deadlines' clock never moves: a close that waited for close_timeout
    # would not end (``bounded`` fails it).
    t = rt.tracer(
        str(path),
        "slow://?delay=0.1",
        batch_size=200,
        close_timeout=10,
        deadline_clock=MockClock(),
    )

    async def main() -> None:
        begun = trio.current_time()
        deadline = begun + 0.2
        if how == "move-on":
            with trio.move_on_at(deadline):
                await _trio_body(t, n)
        elif how == "nested-deadlines":
            with trio.move_on_at(deadline), trio.move_on_at(deadline):
                await _trio_body(t, n)
        elif how == "fail-after":
            with pytest.raises(trio.TooSlowError), trio.fail_at(deadline):
                await _trio_body(t, n)
        else:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:

                    async def closer() -> None:
                        async with t:
                            for i in range(n):
                                t.emit(dispatched(i))
                        # the close has run to its end

                    async def striker() -> None:
                        while state_of(t) != "closing":
                            await trio.sleep(0.001)
                        scope.cancel()

                    nursery.start_soon(closer)
                    nursery.start_soon(striker)

    bounded(lambda: trio.run(main), 30)
    complete_run(path, n)


@pytest.mark.parametrize(
    "how",
    [
        # a system task holds the tracer: trio cancels it when main returns
        "system-task",
        # main cancels the nursery whose child is inside `async with`
        "nursery-cancelled",
    ],
)
def test_trio_run_ending_with_the_tracer_open_leaves_a_complete_trace(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "run.jsonl"
    n = 2_000
    # The deadlines' clock never moves: a close that waited for close_timeout
    # would not end (``bounded`` fails it).
    t = rt.tracer(str(path), close_timeout=5, deadline_clock=MockClock())

    async def main() -> None:
        entered = trio.Event()
        if how == "system-task":
            trio.lowlevel.spawn_system_task(_trio_body, t, n, entered)
            await entered.wait()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_trio_body, t, n, entered)
            await entered.wait()
            nursery.cancel_scope.cancel()

    bounded(lambda: trio.run(main), 30)
    complete_run(path, n)
