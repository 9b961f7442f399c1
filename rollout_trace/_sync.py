"""The sync tracer: ``emit`` from any thread, one writer thread per tracer.

The writer thread runs a private asyncio loop and the same pipeline and sinks
as the async tracer, so there is one sink implementation, not two.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import importlib
import itertools
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from itertools import repeat, starmap
from types import TracebackType
from typing import Any

import anyio

from sinks import Sink

from ._config import (
    DEFAULT_BATCH,
    DEFAULT_BUFFER,
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_FLUSH_INTERVAL,
    Run,
    TraceCounts,
    TracerConfig,
    noop_emit,
)
from ._errors import SinkOpenError
from ._events import _EVENT_TYPES, Event
from ._pipeline import DRAIN_SHARE, Pipeline, logger, peek_count, warn_full_buffer
from ._sinkspec import open_sinks
from ._tracer import frozen_event, not_an_event

__all__ = ["SyncTracer", "sync_tracer"]

# anyio imports its backend on first use. If that first use were in the writer
# thread and the program forked meanwhile, the child would inherit a half
# imported module: import it here, in the importing thread.
importlib.import_module("anyio._backends._asyncio")

_time = time.time
_monotonic = time.monotonic


class _WriterLoop(asyncio.SelectorEventLoop):
    """The writer thread's loop: calls meant for an executor run inline.

    The writer thread is already off the callers' threads, so the sinks'
    thread hop (aiofiles) would only cost time: a hand-off to a worker and a
    wake-up through the loop's self-pipe for every write. Running inline also
    keeps working during interpreter shutdown, when ``concurrent.futures``
    refuses new work.
    """

    def run_in_executor(  # type: ignore[override]
        self, executor: object, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class _Marker:
    """Travels through the event queue; ``done`` is set when the writer reaches it.

    ``reached`` tells a marker the writer handled from one released because the
    writer ended first (its sinks failed to open, or the run closed).
    """

    __slots__ = ("done", "reached")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reached = False

    def handled(self) -> None:
        self.reached = True
        self.done.set()


class _CloseMarker(_Marker):
    """Ends the run. The drain stops at ``drain_deadline`` so that ``trace_closed``
    and the sinks' close still fit before ``deadline``."""

    __slots__ = ("deadline", "drain_deadline", "timeout")

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout
        now = _monotonic()
        self.deadline = now + timeout
        self.drain_deadline = now + timeout * DRAIN_SHARE


# Open tracers, for the atexit hook; every enabled tracer, for the fork hook.
# Weak, so that a tracer nobody holds can still be collected.
_live: weakref.WeakSet[SyncTracer] = weakref.WeakSet()
_enabled: weakref.WeakSet[SyncTracer] = weakref.WeakSet()


class SyncTracer:
    """A tracer for threads and sync code; build it with ``rt.sync_tracer()``.

    ``emit(event)`` may be called from any thread at once: it stamps the
    envelope and appends to a deque (no lock), waking the writer thread when
    a full batch waits. It never blocks and never raises for I/O trouble.
    """

    emit: Callable[[Event], None]
    run_id: str | None
    # The state of the open run, set in _start().
    _run: Run
    _pid: int
    _queue: deque[Event | _Marker]
    _markers: deque[_Marker]
    _seq: itertools.count[int]
    _full_drops: itertools.count[int]
    _buffer: int
    _batch_size: int
    _wake_pending: bool
    _opened: threading.Event
    _open_error: BaseException | None
    _open_waited: bool
    _open_abandoned: bool
    _writer_done: bool
    _closed_ok: bool
    _close_marker: _CloseMarker | None
    _loop: asyncio.AbstractEventLoop
    _wake_event: asyncio.Event
    _thread: threading.Thread
    _sinks: list[Sink]
    _pipeline: Pipeline

    def __init__(self, config: TracerConfig) -> None:
        self._config = config
        self._specs = config.specs()
        self._state = "new"
        self.run_id = None
        if not config.enabled:
            self.emit = noop_emit
            return
        self._open_lock = threading.Lock()
        _enabled.add(self)
        # Not opened yet: open() or `with` opens and raises what goes wrong;
        # otherwise the first emit opens it (a tracer handed to another
        # process opens there, with a run of its own).
        self.emit = self._emit_lazy

    # --- configuration, pickling --------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._config.enabled

    @property
    def uris(self) -> tuple[str, ...]:
        return self._config.uris

    @property
    def sinks(self) -> list[Sink]:
        """The open run's sinks (for tests: ``t.sinks[0].lines()`` of a ``memory://``)."""
        return list(self._sinks) if self._state in ("open", "closing") else []

    @property
    def counts(self) -> TraceCounts:
        """This run's counts so far, as ``trace_closed`` will give them (zeros if never opened)."""
        if getattr(self, "_run", None) is None or self._state == "new":
            return TraceCounts()  # never opened (or forked and not yet reopened)
        pipeline = getattr(self, "_pipeline", None)  # None: the sinks never opened
        return self._run.counts(
            peek_count(self._seq) - 1,
            pipeline.written if pipeline else 0,
            pipeline.invalid if pipeline else 0,
            peek_count(self._full_drops),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # A tracer travels as its configuration and opens lazily where it lands,
        # with a run_id of its own.
        return (_unpickle, (self._config,))

    def __repr__(self) -> str:
        uris = ", ".join(self._config.uris) or "disabled"
        return f"<rollout_trace.SyncTracer {self._state} run_id={self.run_id} sinks=[{uris}]>"

    def open(self) -> SyncTracer:
        """Open the sinks and start the writer thread now; raise if a sink cannot open.

        ``with`` calls it; without it, the first ``emit`` opens the tracer and
        an error is logged once instead. Opening an open tracer does nothing.
        """
        if self._config.enabled and self._state == "new":
            with self._open_lock:
                if self._state == "new":
                    self._start(wait=True)
        return self

    def __enter__(self) -> SyncTracer:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- emit ---------------------------------------------------------------

    def _make_emit(self) -> Callable[[Event], None]:
        # Its twin is _tracer.Tracer._make_emit: the stamping is written out in both, as a
        # shared helper would cost each emit a call.
        # A closure over the run's state: no attribute lookups on the hot path,
        # and no lock: deque.append and next() on a count are atomic.
        queue = self._queue
        append = queue.append
        next_seq = self._seq.__next__
        count_full = self._count_full_drop
        buffer = self._buffer
        batch_size = self._batch_size
        wake = self._wake
        types = _EVENT_TYPES
        now = self._config.clock
        copy_event = copy.copy

        def emit(ev: Event) -> None:
            if type(ev) not in types:
                raise not_an_event(ev)
            if ev.seq >= 0:
                # Emitted before: the queued object keeps its own envelope.
                ev = copy_event(ev)
            try:
                ev.time = now()
                ev.seq = next_seq()
            except AttributeError:
                raise frozen_event(ev) from None
            n = len(queue)
            if n >= buffer:
                # Dropped; its seq is taken, so trace_closed counts it.
                count_full()
                return
            append(ev)
            if n == batch_size:
                # Once per batch: a wake that a race skips is made up for by
                # the writer's flush interval.
                wake()

        return emit

    def _count_full_drop(self) -> None:
        if next(self._full_drops) == 0:
            warn_full_buffer(self._buffer, self.run_id)

    def _emit_lazy(self, ev: Event) -> None:
        if type(ev) not in _EVENT_TYPES:
            raise not_an_event(ev)
        if self._state == "new":
            with self._open_lock:
                if self._state == "new":
                    self._start(wait=False)
        # A caller may hold this method from before the open: hand on to the
        # open run's emit, or drop quietly once the tracer is closed.
        emit = self.emit
        if getattr(emit, "__func__", None) is not SyncTracer._emit_lazy:  # never itself
            emit(ev)

    def _forked(self) -> bool:
        """In a child forked by something that runs no fork hooks: start over here.

        Checked once per batch, at flush and at close rather than at every
        emit: ``os.getpid()`` is a system call (about 260 ns on these VMs).
        """
        if self._state in ("open", "closing") and os.getpid() != self._pid:
            self._after_fork()
            return True
        return False

    def _wake(self) -> None:
        if self._wake_pending:
            return
        self._wake_pending = True
        if self._forked():
            return
        with contextlib.suppress(RuntimeError):  # a closed loop has nothing to wake
            self._loop.call_soon_threadsafe(self._wake_event.set)

    # --- lifecycle ----------------------------------------------------------

    def _start(self, *, wait: bool) -> None:
        run = Run(self._config.clock)
        self._run = run
        self._pid = run.pid
        self._queue = deque()
        self._markers = deque()
        self._seq = itertools.count(1)
        self._full_drops = itertools.count()
        self._buffer = self._config.buffer
        self._batch_size = self._config.batch_size
        self._wake_pending = False
        self._opened = threading.Event()
        self._open_error = None
        self._open_waited = wait
        self._open_abandoned = False
        self._writer_done = False
        self._closed_ok = False
        self._close_marker = None
        loop = _WriterLoop()
        self._loop = loop
        self._wake_event = asyncio.Event()
        thread = threading.Thread(
            target=self._thread_main, name=f"rollout_trace writer {run.run_id[:8]}", daemon=True
        )
        self._thread = thread
        self.run_id = run.run_id
        self._state = "open"
        self.emit = self._make_emit()
        _live.add(self)
        _close_at_multiprocessing_exit(run.pid)
        thread.start()
        if wait:
            if not self._opened.wait(self._config.close_timeout):
                # A FIFO without a reader, a hung mount: the writer thread stays
                # stuck in its open (a daemon), and throws the sinks away if
                # they ever open.
                self._open_abandoned = True
                self._open_error = SinkOpenError(
                    ", ".join(self._config.uris),
                    f"did not open within {self._config.close_timeout:g} s",
                )
                self._state = "closed"
                self.emit = noop_emit
                _live.discard(self)
                raise self._open_error
            if self._open_error is not None:
                self._state = "closed"
                self.emit = noop_emit
                _live.discard(self)
                thread.join()
                raise self._open_error

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every event emitted before the call, from any thread, is written.

        Returns ``False`` if ``timeout`` seconds passed first; at once, and
        ``True``, for a tracer that is disabled, not open or closed.
        """
        if self._forked() or self._state != "open":
            return True
        marker = _Marker()
        self._enqueue_marker(marker)
        return marker.done.wait(timeout) and marker.reached

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued and ``trace_closed``, close the sinks; idempotent.

        One deadline (``timeout``, default the tracer's ``close_timeout``)
        covers the drain and the sinks' close; what is not written by then is
        counted as dropped, and the writer thread is left to end on its own.
        """
        marker = self._begin_close(timeout)
        if marker is not None:
            self._finish_close(marker)

    def _begin_close(self, timeout: float | None) -> _CloseMarker | None:
        self._forked()
        if self._state != "open":
            if self._state == "new":
                self._state = "closed"
                self.emit = noop_emit
            return None
        # Emits go on being queued behind the close marker, never written:
        # their seq numbers are taken, so trace_closed counts them as dropped.
        self._state = "closing"
        marker = _CloseMarker(self._config.close_timeout if timeout is None else timeout)
        self._close_marker = marker
        self._enqueue_marker(marker)
        return marker

    def _finish_close(self, marker: _CloseMarker) -> None:
        if not marker.done.wait(max(0.0, marker.deadline - _monotonic())) or not self._closed_ok:
            self._give_up()
            logger.warning(
                "rollout_trace: closing run %s took longer than %ss; what was not written "
                "by then is lost and trace_closed may be missing",
                self.run_id,
                marker.timeout,
            )
        else:
            self._thread.join(max(0.0, marker.deadline - _monotonic()))
        self._state = "closed"
        self.emit = noop_emit
        _live.discard(self)

    def _give_up(self) -> None:
        """Past the close deadline: what is not written by now counts as dropped."""
        pipeline = getattr(self, "_pipeline", None)
        last = peek_count(self._seq)
        self._run.closed(
            seq=last,
            emitted=last - 1,
            written=pipeline.written if pipeline else 0,
            invalid=pipeline.invalid if pipeline else 0,
        )

    def _enqueue_marker(self, marker: _Marker) -> None:
        # The side deque first: the writer scans a drained batch for markers
        # only while it holds one.
        self._markers.append(marker)
        self._queue.append(marker)
        self._wake()
        if self._writer_done:
            self._release_markers()

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's run; open a new one on the first emit."""
        # Another thread of the parent may have held the lock at the fork (it
        # was opening this tracer): in the child nobody would ever release it.
        self._open_lock = threading.Lock()
        if self._state not in ("open", "closing"):
            return
        # The parent's queue, loop, thread and sinks are left untouched: closing
        # them here could write the parent's data a second time.
        self._state = "new"
        self.run_id = None
        self.emit = self._emit_lazy

    # --- the writer thread --------------------------------------------------

    def _thread_main(self) -> None:
        loop = self._loop
        try:
            loop.run_until_complete(self._writer())
        except BaseException as exc:  # never let the writer thread print a traceback
            logger.error("rollout_trace: the writer thread of run %s failed: %r", self.run_id, exc)
        finally:
            self._writer_done = True
            self._release_markers()
            self._opened.set()
            with contextlib.suppress(Exception):
                loop.close()

    def _release_markers(self) -> None:
        # The writer has ended (its sinks failed to open, or the run is over):
        # nobody waiting on a flush or close marker may wait for it in vain.
        while self._markers:
            with contextlib.suppress(IndexError):
                self._markers.popleft().done.set()

    async def _writer(self) -> None:
        run = self._run
        try:
            sinks = await open_sinks(
                self._specs,
                run_id=run.run_id,
                pid=run.pid,
                host=run.host,
                each_within=self._config.close_timeout,
            )
            if self._open_abandoned:
                for _, sink in sinks:
                    with contextlib.suppress(Exception):
                        await sink.discard()
                return
        except BaseException as exc:
            self._open_error = exc
            if not self._open_waited:
                # Opened lazily: nobody waits to hear it, so say it once.
                logger.warning("rollout_trace: tracing is off for this process: %s", exc)
            self.emit = noop_emit
            self._state = "closed"
            return
        pipeline = Pipeline(sinks, run.run_id, direct=True)
        self._sinks = pipeline.sinks
        self._pipeline = pipeline
        self._opened.set()
        async with anyio.create_task_group() as tg:
            pipeline.start(tg)
            await pipeline.write([run.opened(self._config.meta)], count=False)
            close = await self._serve(pipeline)
            # Every emit took a seq number: the next one closes the run, and
            # the ones before it are what was emitted.
            last = next(self._seq)
            self.emit = noop_emit
            self._queue.clear()  # late events: counted as dropped, never written
            closed = run.closed(
                seq=last, emitted=last - 1, written=pipeline.written, invalid=pipeline.invalid
            )
            if _monotonic() < close.deadline:
                await pipeline.write([closed], count=False)
                self._closed_ok = True
            await pipeline.aclose()
        close.handled()

    async def _serve(self, pipeline: Pipeline) -> _CloseMarker:
        """Write batches as they fill or the flush interval passes, up to the close marker."""
        interval = self._config.flush_interval
        wake = self._wake_event
        while True:
            with anyio.move_on_after(interval):
                await wake.wait()
            wake.clear()
            self._wake_pending = False
            close = await self._drain(pipeline)
            if close is not None:
                return close

    async def _drain(self, pipeline: Pipeline) -> _CloseMarker | None:
        """Write everything queued; handle markers in order. Returns the close marker."""
        queue = self._queue
        pop = queue.popleft
        while queue:
            # starmap runs popleft in C: a third of the cost of a comprehension.
            items = list(starmap(pop, repeat((), len(queue))))
            if not self._markers:
                await self._write(pipeline, items)
                continue
            start = 0
            for i, item in enumerate(items):
                if not isinstance(item, _Marker):
                    continue
                await self._write(pipeline, items[start:i])
                start = i + 1
                # By identity, not position: a flush and a close racing from two
                # threads may reach the side deque and the queue in either order.
                self._markers.remove(item)
                if isinstance(item, _CloseMarker):
                    # Anything after the close marker came too late for this run.
                    return item
                await pipeline.flush()
                item.handled()
            await self._write(pipeline, items[start:])
        return None

    async def _write(self, pipeline: Pipeline, items: list[Any]) -> None:
        close = self._close_marker
        if close is None:
            await pipeline.write(items)
            return
        # Closing: write in chunks while the drain deadline allows; the rest
        # is dropped (trace_closed counts it).
        for start in range(0, len(items), self._batch_size):
            if _monotonic() >= close.drain_deadline:
                return
            await pipeline.write(items[start : start + self._batch_size])


def _unpickle(config: TracerConfig) -> SyncTracer:
    return SyncTracer(config)


def _after_fork_in_child() -> None:
    for tracer in list(_enabled):
        tracer._after_fork()


def _close_all_at_exit() -> None:
    # Every tracer's close starts at once, so N tracers share their deadlines
    # rather than adding them up.
    closing = [(t, t._begin_close(None)) for t in list(_live)]
    for tracer, marker in closing:
        if marker is not None:
            tracer._finish_close(marker)


_mp_registered = [0]


def _close_at_multiprocessing_exit(pid: int) -> None:
    """A multiprocessing child ends with os._exit(), which runs no atexit hook;
    its own exit function runs multiprocessing's finalizers, so close there."""
    util = sys.modules.get("multiprocessing.util")
    if util is None or _mp_registered[0] == pid:
        return
    _mp_registered[0] = pid
    util.Finalize(None, _close_all_at_exit, exitpriority=0)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)


def sync_tracer(
    *uris: str,
    enabled: bool = True,
    meta: Mapping[str, Any] | None = None,
    buffer: int = DEFAULT_BUFFER,
    batch_size: int = DEFAULT_BATCH,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    clock: Callable[[], float] = time.time,
) -> SyncTracer:
    """A tracer for threads, sync code and Ray actors, with one writer thread.

    Opened by ``with`` or ``open()`` (a sink that cannot be opened raises
    there) or else by its first ``emit``; closed by ``close()``, by leaving
    the ``with`` block, or at interpreter exit. The arguments are those of
    ``rt.tracer()``. A disabled tracer holds no thread, queue or lock, and
    pickles; an enabled one pickles as its configuration and opens a new run
    on its first emit in the process that unpickles it.
    """
    config = TracerConfig.make(
        uris,
        enabled=enabled,
        meta=meta,
        buffer=buffer,
        batch_size=batch_size,
        flush_interval=flush_interval,
        close_timeout=close_timeout,
        clock=clock,
    )
    return SyncTracer(config)
