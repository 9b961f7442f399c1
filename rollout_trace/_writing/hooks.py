"""Process hooks: close open runs at exit and on SIGTERM, start over after a fork.

Registered when the first tracer opens (or, for fork, when the first enabled
sync tracer is built), so that importing the package, or running
``rollout-trace cost``, changes nothing in the process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import weakref
from types import FrameType
from typing import Any, Protocol

__all__ = ["track", "untrack", "track_enabled", "close_all"]


class _Closable(Protocol):
    def close_blocking(self) -> None: ...


class _Forkable(Protocol):
    def after_fork(self) -> None: ...


# Weak, so that a tracer nobody holds can still be collected.
_open: weakref.WeakSet[Any] = weakref.WeakSet()
_enabled: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_registered_in: list[int] = []  # the pid whose exit hooks are in place
_fork_hook = [False]
_sigterm = [False]  # decided: installed, or the program has its own handler


def track(tracer: _Closable) -> None:
    """``tracer`` has an open run, to close at exit or on SIGTERM."""
    _open.add(tracer)
    if not _sigterm[0]:
        _close_on_sigterm()
    pid = os.getpid()
    with _lock:
        if _registered_in == [pid]:
            return
        first = not _registered_in
        _registered_in[:] = [pid]
    if first:
        atexit.register(close_all)
    _close_at_multiprocessing_exit()


def untrack(tracer: _Closable) -> None:
    _open.discard(tracer)


def track_enabled(tracer: _Forkable) -> None:
    """``tracer`` starts over in a forked child."""
    _enabled.add(tracer)
    if not _fork_hook[0]:
        _fork_hook[0] = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


def close_all() -> None:
    """Close every open run, each within its own ``close_timeout``.

    Sync tracers begin closing all at once, so N tracers share their
    deadlines rather than adding them up.
    """
    tracers = list(_open)
    begun = [(t, t.begin_close(None)) for t in tracers if hasattr(t, "begin_close")]
    for tracer in tracers:
        if not hasattr(tracer, "begin_close"):
            with contextlib.suppress(Exception):  # an exit hook must not raise
                tracer.close_blocking()
    for tracer, mark in begun:
        if mark is not None:
            tracer.finish_close(mark)


def _after_fork_in_child() -> None:
    for tracer in list(_enabled):
        tracer.after_fork()
    _open.clear()


def _close_at_multiprocessing_exit() -> None:
    """A multiprocessing child ends with os._exit(), which runs no atexit hook;
    its own exit function runs multiprocessing's finalizers, so close there."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.Finalize(None, close_all, exitpriority=0)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    close_all()
    # Then die of SIGTERM as the program would have: the exit status says so.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)


def _close_on_sigterm() -> None:
    """Ray, SLURM and Kubernetes send SIGTERM before SIGKILL: close runs then,
    unless the program handles SIGTERM itself (its handler is never replaced)."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may; a later open there will
    _sigterm[0] = True
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # no signals here (an embedded interpreter)
        pass
