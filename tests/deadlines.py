"""Driving the tracer's deadlines from a test: a ``MockClock`` moved past them.

``past_deadline(fn, clock, seconds)`` calls ``fn`` on a helper thread, waits
until that thread has read ``clock`` (so the deadline it waits for is fixed)
and until ``ready()`` (a sink is inside the call that hangs), checks that
``fn`` is still waiting, then moves the clock ``seconds`` on and returns what
``fn`` returned. Its deadline passed, ``fn`` returns at the wait's next poll.

Unless ``early=False``, the clock first stops ``SHORT_S`` short of that, and
``fn`` must still be waiting a few polls later: it waits for its deadline,
not for anything less.

``with advancing(clock, seconds):`` does the same for a wait made by the
block itself, on this thread (an event loop's, a ``with`` block's exit). A
block still waiting ``HANG_S`` after that fails, the clock moved a day on so
that it ends.

``at_once(fn)`` is ``fn()``, which must return while every clock stands
still: it waits for no deadline (a hang guard of ``HANG_S`` fails it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from rollout_trace.testing import MockClock

T = TypeVar("T")

# How long a helper is given for what is not a wait on our deadlines (a hang
# guard, not a measure: the waits poll every 50 ms).
HANG_S = 10.0
# How far short of the deadline the clock first stops, and for how long
# (three of the waits' polls of 50 ms).
SHORT_S = 1e-3
POLLS_S = 0.15


class WatchedClock(MockClock):
    """A ``MockClock`` that knows which threads have read it."""

    def __init__(self, start: float = 1000.0) -> None:
        super().__init__(start)
        self._readers: set[int] = set()

    def __call__(self) -> float:
        now = super().__call__()
        # Counted once the time is taken: a move made after the read is seen
        # cannot change what the read returned.
        self._readers.add(threading.get_ident())
        return now

    def read_by(self, ident: int | None) -> bool:
        return ident in self._readers

    def forget(self) -> None:
        """Forget the readers so far (a thread's ident is reused once it ended)."""
        self._readers.clear()


def _until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + HANG_S
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"{what} did not happen within {HANG_S} s")
        time.sleep(0.002)


class Helper:
    """``fn()`` on a daemon thread of the test's (a hang leaves it behind);
    ``result()`` is its value, or its exception raised on the test's thread."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self.box: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.box["value"] = fn()
        except BaseException as exc:  # handed to the test's thread
            self.box["error"] = exc

    def result(self) -> Any:
        if "error" in self.box:
            raise self.box["error"]
        return self.box["value"]


def bounded(fn: Callable[[], T], within: float = HANG_S, what: str | None = None) -> T:
    """``fn()`` on a helper thread: its value, or its exception raised here. A hang
    leaves the thread behind (a daemon) and fails the test after ``within``
    seconds: a call that never returns cannot wedge the suite."""
    running = Helper(fn, "test call")
    running.thread.start()
    running.thread.join(within)
    if running.thread.is_alive():
        name = what if what is not None else getattr(fn, "__name__", repr(fn))
        pytest.fail(f"{name} did not return within {within} s")
    return running.result()  # type: ignore[no-any-return]


def at_once(fn: Callable[[], T], what: str = "the call") -> T:
    """``fn()``, which must return (or raise) while the test's clocks stand still:
    it waits for no deadline."""
    return bounded(fn, HANG_S, f"{what} waited for a deadline: it")


def past_deadline(
    fn: Callable[[], T],
    clock: WatchedClock,
    seconds: float,
    *,
    ready: Callable[[], bool] = lambda: True,
    early: bool = True,
) -> T:
    """``fn()`` on a helper thread, which must wait until ``clock`` moves
    ``seconds`` on; then its value (or its exception, raised here)."""
    running = Helper(fn, "test deadline")
    helper, box = running.thread, running.box
    clock.forget()
    helper.start()
    _until(lambda: clock.read_by(helper.ident) or not helper.is_alive(), "a read of the clock")
    _until(ready, "what the test waits for")
    # The clock stands still: whatever fn waits for, it is not its deadline yet.
    assert helper.is_alive(), f"{fn} returned before its deadline: {box}"
    # Moved to the deadline exactly: a step of ``seconds - SHORT_S`` then
    # ``SHORT_S`` could land a rounding short of it, a wait that never ends.
    deadline = clock() + seconds
    if early:
        clock.advance(seconds - SHORT_S)
        helper.join(POLLS_S)
        assert helper.is_alive(), f"{fn} returned {SHORT_S} s before its deadline: {box}"
    clock.advance_to(deadline)
    helper.join(HANG_S)
    if helper.is_alive():
        pytest.fail(f"{fn} did not return within {HANG_S} s of its deadline")
    return running.result()  # type: ignore[no-any-return]


@contextmanager
def advancing(
    clock: WatchedClock,
    seconds: float,
    *,
    ready: Callable[[], bool] = lambda: True,
    early: bool = True,
    must_wait: bool = True,
    by: str | None = None,
) -> Iterator[None]:
    """The block waits, on this thread, for a deadline ``seconds`` ahead on
    ``clock``: once ``ready()``, and this thread has read the clock since, a
    helper moves the clock on (as ``past_deadline`` does). Fails if the block
    ends before the clock was moved (unless ``must_wait=False``: it may end
    sooner, but never wait longer), or (``early``) before it reached the
    deadline. ``by``: the wait is made on the code's own thread of that name
    (the tracers open on their writer thread), not on this one."""
    me = threading.get_ident()
    done = threading.Event()
    seen: dict[str, bool] = {}

    def waiter() -> int | None:
        if by is None:
            return me
        return next((t.ident for t in threading.enumerate() if t.name.startswith(by)), None)

    def helper() -> None:
        end = time.monotonic() + HANG_S
        # A read once ready() is one that fixed the deadline, or a later one.
        while not ready():
            if done.is_set() or time.monotonic() > end:
                return
            time.sleep(0.002)
        clock.forget()
        while not clock.read_by(waiter()):
            if done.is_set() or time.monotonic() > end:
                return
            time.sleep(0.002)
        if done.is_set():
            return
        seen["waited"] = True
        deadline = clock() + seconds
        if early:
            clock.advance(seconds - SHORT_S)
            if done.wait(POLLS_S):
                seen["early"] = True
        if clock() < deadline:  # (the block may have moved it on itself)
            clock.advance_to(deadline)  # exactly there (see past_deadline)
        if not done.wait(HANG_S):
            # It waits for a later deadline, which nothing will move the clock
            # to: moved a day on, it ends (and the test fails) rather than hang.
            seen["late"] = True
            clock.advance(86_400.0)

    mover = threading.Thread(target=helper, name="test clock", daemon=True)
    mover.start()
    try:
        yield
    finally:
        done.set()
        mover.join(HANG_S + 1)
        # Also when the block raised (an open that gave up): a failed check
        # is what the test reports then.
        assert seen.get("waited") or not must_wait, "the block ended before the clock moved"
        assert not seen.get("early"), f"the block ended {SHORT_S} s before its deadline"
        assert not seen.get("late"), f"the block did not end within {HANG_S} s of its deadline"
