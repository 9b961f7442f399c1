"""Every trick that leans on CPython's or a dependency's internals, in one place.

Each one says what it assumes and what it saves; ``tests/test_internals.py``
fails when an assumption stops holding, so a new Python or anyio release
shows up there first rather than as a silent miscount.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import sys

import anyio

__all__ = [
    "peek_count",
    "first_caller",
    "is_cancellation",
    "forget_native_cancel",
    "lend_gil",
    "restore_gil",
]


def peek_count(counter: itertools.count[int]) -> int:
    """The next value of an ``itertools.count``, without taking it.

    Assumes ``repr(count(N))`` is ``"count(N)"`` (true since Python 2.7). The
    emit path takes ``seq`` with ``next()`` on a count, which is atomic under
    the GIL and costs about 30 ns; a lock would cost about 370 ns per emit,
    and reading the count back is needed only for ``counts`` and at close.
    """
    return int(repr(counter)[6:-1])


def first_caller(counter: itertools.count[int]) -> bool:
    """Whether this call is the first on ``counter``, from any number of threads.

    ``next()`` on a count is one C call, atomic under the GIL: exactly one
    thread sees 0. Every sink's thread acknowledges each batch, and the first
    one counts it as written; a lock there would cost about 370 ns per call.
    A free-threaded build would need a lock here.
    """
    return next(counter) == 0


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is the running backend's cancellation exception."""
    return isinstance(exc, anyio.get_cancelled_exc_class())


def forget_native_cancel() -> None:
    """After catching a native ``Task.cancel()`` in a task of the tracer's own,
    take the request back so that the task's later cancel scopes work as usual.

    asyncio counts cancel requests per task (``Task.cancelling()``, 3.11+),
    and anyio's scopes compare that count with the one they saw on entry: a
    request left pending would make every later timeout of the task look
    like a foreign cancellation. Only the tracer's own tasks call this; a
    user's task keeps its requests.
    """
    if sys.version_info < (3, 11):
        return
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not asyncio (trio has no native cancel to forget)
        return
    if task is not None and task.cancelling():
        task.uncancel()


# The switch interval while the GIL is lent, and the one to put back.
LEND_INTERVAL = 1e-5
_lent_from: list[float] = []
_fork_hook: list[bool] = []


def lend_gil() -> None:
    """Let a thread waiting for the GIL have it within microseconds, until ``restore_gil()``.

    Assumes CPython's GIL (3.11 to 3.13): a thread that has waited a switch
    interval (5 ms) for the GIL asks its holder to drop it, but its wait
    starts over whenever the holder drops the GIL on its own and takes it
    back first. An event loop polls its selector between tasks, dropping the
    GIL each time, every few hundred microseconds while it is busy: a sink's
    thread could then wait as long as the loop stayed busy (a whole run of
    200,000 events, measured). A short switch interval lets it ask in time;
    the loop is not put to sleep, it gives the GIL up between two of its
    instructions, as to any thread whose wait ran out. The interval is the
    process's: while lent, every thread waiting for the GIL gets it sooner.
    """
    if _lent_from:
        return
    current = sys.getswitchinterval()
    if current <= LEND_INTERVAL:  # the program's own is as short
        return
    if not _fork_hook:
        _fork_hook.append(True)
        # A child forked while it is lent has none of the threads it was lent to.
        os.register_at_fork(after_in_child=restore_gil)
    _lent_from.append(current)
    sys.setswitchinterval(LEND_INTERVAL)


def restore_gil() -> None:
    """Put back the switch interval ``lend_gil()`` replaced, unless the program
    has set one of its own since; safe to call from any thread, lent or not."""
    try:
        saved = _lent_from.pop()
    except IndexError:  # not lent, or another thread put it back first
        return
    if math.isclose(sys.getswitchinterval(), LEND_INTERVAL, rel_tol=0.01):
        sys.setswitchinterval(saved)
