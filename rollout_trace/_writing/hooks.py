"""Process hooks: close open runs at exit and on SIGTERM, start over after a fork.

Registered when the first tracer opens (or, for fork, when the first enabled
sync tracer is built), so that importing the package, or running
``rollout-trace cost``, changes nothing in the process.

Ray workers install a SIGTERM handler of their own before any actor code runs
(``Worker.main_loop``), which is kept: it raises ``SystemExit``, so the runs
close in the ``atexit`` hook, as they do after ``ray.actor.exit_actor()``,
``actor.__ray_terminate__`` and an actor handle going out of scope. A force
kill (``ray.kill``, and every actor whose owner exits, so at ``ray.shutdown()``
too) ends the worker at once from Ray's C++ core: no Python code runs there.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any, Protocol

__all__ = [
    "track",
    "untrack",
    "track_enabled",
    "prepare",
    "close_all",
    "keep_signals_off_this_thread",
]


class _Closable(Protocol):
    def begin_close(self, timeout: float | None = None) -> Any: ...

    def finish_close(self, mark: Any, *, real_s: float = ...) -> None: ...


class _Forkable(Protocol):
    def after_fork(self) -> None: ...


# Weak, so that a tracer nobody holds can still be collected. Each open
# tracer maps to the thread that opened it: an async tracer's event loop.
_open: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_enabled: weakref.WeakSet[Any] = weakref.WeakSet()
# Reentrant: the SIGTERM handler may interrupt its own thread holding it.
# Taken through _here(), never directly: in a forked child it is made anew.
_lock = threading.RLock()
_pid = [os.getpid()]  # the process the state below belongs to
_registered_in: list[int] = []  # the pid whose exit hooks are in place
_fork_hook = [False]
_sigterm = [False]  # decided: installed, or the program has its own handler
_deferred_since: list[float] = []  # when the SIGTERM handler first had to wait
_handling: list[str] = []  # "waiting" or "closing" while the SIGTERM handler runs
# Frames of these modules are the tracers' own code.
_WRITING = __name__.rpartition(".")[0] + "."
# ... but for t.attempt()'s blocks, which hold no lock: they only call emit.
_ATTEMPTS = _WRITING + "attempts"
_POLL = 0.005
# Modules whose code the tracer calls and which take locks.
_LOCKING = frozenset({"threading", "logging", "queue"})
_warned_thread: list[bool] = []  # said once: SIGTERM cannot be hooked from this thread
logger = logging.getLogger("rollout_trace")


def _here() -> threading.RLock:
    """The lock of the hooks' state, which is this process's.

    A child forked by something that runs no fork hooks (a C-level fork)
    finds it here: a thread of the parent may have held the lock at the fork
    (in the child nobody would ever release it), and the parent's open runs
    are not the child's to close. Only called when a run opens or closes, at
    exit and on SIGTERM: ``os.getpid()`` is a system call.
    """
    if _pid[0] != os.getpid():
        _forget_the_parent()
    return _lock


def _forget_the_parent() -> None:
    global _lock
    _lock = threading.RLock()
    _open.clear()
    _deferred_since.clear()
    _handling.clear()
    _pid[0] = os.getpid()


def track(tracer: _Closable) -> None:
    """``tracer`` has an open run, to close at exit or on SIGTERM."""
    with _here():
        _open[tracer] = threading.get_ident()
    prepare(opening=True)


def prepare(*, opening: bool = False) -> None:
    """Install the exit and SIGTERM hooks, once per process; called when an
    enabled tracer is built and again when one opens.

    At the build, not only at the open: atexit runs the latest hook first and
    none registered while it runs, so a tracer that first opens in the
    program's own exit hook would never be closed; and the build is usually on
    the main thread, the only one that may install a signal handler.
    """
    if not _sigterm[0]:
        _close_on_sigterm(warn=opening)
    pid = os.getpid()
    with _here():
        if _registered_in == [pid]:
            return
        first = not _registered_in
        _registered_in[:] = [pid]
    if first:
        atexit.register(close_all)
    _close_at_multiprocessing_exit()


def untrack(tracer: _Closable) -> None:
    with _here():
        _open.pop(tracer, None)


def track_enabled(tracer: _Forkable) -> None:
    """``tracer`` starts over in a forked child."""
    _enabled.add(tracer)
    prepare()
    if not _fork_hook[0]:
        _fork_hook[0] = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _tracked() -> list[tuple[Any, int]]:
    with _here():
        return list(_open.items())


def _close_timeout(tracer: Any) -> float:
    timeout = getattr(getattr(tracer, "_config", None), "close_timeout", 10.0)
    return float(timeout) if timeout < float("inf") else 10.0


def close_all() -> None:
    """Close every open run, each within its close's own deadline (``close_timeout``,
    or the timeout a close already under way was begun with).

    Every close is begun before any is waited for, so N tracers share their
    deadlines rather than adding them up. A close that another thread has
    begun is waited for too: the process must not end before it writes
    ``trace_closed``. Each run's writer thread carries its close out.
    """
    begun = [(t, m) for t, _ in _tracked() if (m := t.begin_close(None)) is not None]
    # Each close also ends when its deadline's time has passed in real time,
    # counted from now for all alike: a process must end even when its
    # deadline clock is a test's that nobody moves any more.
    now = _real_time()
    ends = [now + _time_left(t, m) for t, m in begun]
    for (tracer, mark), end in zip(begun, ends, strict=True):
        with contextlib.suppress(Exception):  # an exit hook must not raise
            tracer.finish_close(mark, real_s=max(0.0, end - _real_time()))


_real_time = time.monotonic  # (a test's to replace)


def _time_left(tracer: Any, mark: Any) -> float:
    """Seconds until the close's deadline (its own: one begun with a longer
    timeout keeps it). On a deadline clock of its own (a test's), which may
    stand still, at most ``close_timeout`` too: a sink that hangs is given up
    by that clock alone."""
    try:
        config = tracer._config
        left = float(mark.deadline - config.deadline_clock())
        if config.deadline_clock is not time.monotonic:
            left = min(left, float(config.close_timeout))
        return left
    except Exception:  # not a tracer of ours: its own deadline holds
        return math.inf


def _after_fork_in_child() -> None:
    for tracer in list(_enabled):
        tracer.after_fork()
    _forget_the_parent()


def _close_at_multiprocessing_exit() -> None:
    """A multiprocessing child ends with os._exit(), which runs no atexit hook;
    its own exit function runs multiprocessing's finalizers, so close there."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.Finalize(None, close_all, exitpriority=0)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _handling:
        # Delivered again while the handler runs: a second SIGTERM while the
        # runs close is one too many; a redelivery that came too early is kept.
        if _handling[-1] == "waiting":
            _redeliver_soon()
        return
    _handling.append("waiting")
    try:
        if _must_wait(frame) and _redeliver_soon():
            return
        _handling[-1] = "closing"
        close_all()
        # Then die of SIGTERM as the program would have: the exit status says so.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        # Still here: this thread blocks SIGTERM (the handler runs anyway, when
        # another thread took the signal). To the process, then: any thread.
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        _handling.clear()


def _redeliver_soon() -> bool:
    """SIGTERM to the main thread again in a moment, once the handler has
    returned (a signal raised in the handler itself would be handled in it)."""
    main = threading.main_thread().ident
    assert main is not None

    def redeliver() -> None:
        keep_signals_off_this_thread()
        time.sleep(_POLL)
        signal.pthread_kill(main, signal.SIGTERM)

    thread = threading.Thread(target=redeliver, name="rollout_trace sigterm", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no thread can start (a limit, interpreter shutdown)
        return False
    return True


# Signals a program catches, and that are sent to the process, not a thread.
_ASYNC_SIGNALS = {
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGALRM", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
}


def keep_signals_off_this_thread() -> None:
    """Call first thing in every thread of the SDK's own.

    The kernel hands a signal sent to the process to any thread that does
    not block it. Python runs its handlers on the main thread only, and does
    not wake it: a SIGTERM that lands on one of our threads while the main
    thread sleeps or waits on a lock is handled when that wait ends, if ever.
    Our threads never run a Python signal handler anyway.
    """
    if hasattr(signal, "pthread_sigmask"):
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)


def _must_wait(frame: FrameType | None) -> bool:
    """Whether closing now would break what this thread was doing.

    The handler runs between two bytecodes of the main thread: inside the
    tracer's own code (an emit waking the writer, a flush queueing its mark
    or looking for a hung sink), it may hold a lock that the close needs.
    The body of ``emit`` holds none (an event it queues after the close's
    mark belongs to no run): a program that emits all the time is closed at
    once, not after the close timeouts that bound this wait.
    """
    tracers = _tracked()
    now = time.monotonic()
    if not _deferred_since:
        _deferred_since.append(now)
    limit = max((_close_timeout(t) for t, _ in tracers), default=0.0) + 1.0
    if now - _deferred_since[0] > limit:
        return False
    inside_a_library = False  # threading's, logging's: they take locks
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(_WRITING) and name != __name__:
            if (frame.f_code.co_name == "emit" or name == _ATTEMPTS) and not inside_a_library:
                frame = frame.f_back
                continue
            return True
        if name.partition(".")[0] in _LOCKING:
            inside_a_library = True
        frame = frame.f_back
    return False


def _close_on_sigterm(*, warn: bool) -> None:
    """Ray, SLURM and Kubernetes send SIGTERM before SIGKILL: close runs then,
    unless the program handles SIGTERM itself (its handler is never replaced).

    Only the main thread may install a handler. A tracer built and opened on
    another thread, in a program that leaves SIGTERM at its default, cannot
    close on SIGTERM: that is said once, when such a run opens, with what to
    do about it.
    """
    if threading.current_thread() is not threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            default = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            if warn and default and not _warned_thread:
                _warned_thread.append(True)
                logger.warning(
                    "rollout_trace: a tracer was opened off the main thread, so SIGTERM cannot "
                    "close its run (only the main thread may handle a signal): a SIGTERM loses "
                    "what is not written yet and trace_closed. Build one tracer on the main "
                    "thread first, or handle SIGTERM yourself (raise SystemExit in it)"
                )
        return  # a later build or open on the main thread will
    _sigterm[0] = True
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # no signals here (an embedded interpreter)
        pass
