"""The sync tracer: ``emit`` from any thread, one writer thread per run.

``emit`` stamps ``time`` and ``run_id`` and appends to a deque; the writer
thread gives each event its ``seq`` in the order the deque received them, so
a run's lines are in ``seq`` order however many threads emit (a thread
preempted between taking a number and queueing its event can put nothing out
of place), and drives the same engine as the async tracer.

A lone sink is written by the writer thread itself: handing each batch to a
thread of the sink's own cost two more turns of the GIL per batch, each a
switch interval long while the program emits. A hung lone sink then holds
up the writer: emit still never blocks (the buffer fills and drops, counted),
and flush and close give the sink up after ``close_timeout``. Several sinks
write on threads of their own, so a hung one holds up neither the writer nor
the others.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from itertools import repeat, starmap
from operator import itemgetter
from types import TracebackType
from typing import Any

from .._errors import SinkOpenError
from .._internals import peek_count
from .._schema.events import Event
from .._schema.registry import REGISTRY
from . import hooks
from .config import (
    DEFAULT_BATCH,
    DEFAULT_BUFFER,
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_FLUSH_INTERVAL,
    TraceCounts,
    TracerConfig,
    noop_emit,
)
from .emitting import frozen_event, not_an_event
from .engine import Engine, State, drive_blocking, logger
from .facade import TracerFacade
from .runner import FlushMark
from .writer_run import CloseMark, QueueMark, WriterRun

__all__ = ["SyncTracer", "sync_tracer"]


class SyncTracer(TracerFacade):
    """A tracer for threads and sync code; build it with ``rt.sync_tracer()``.

    ``emit(event)`` may be called from any thread at once: it stamps the
    envelope and appends to a deque (no lock), waking the writer thread when
    a batch starts or fills. It never blocks and never raises for I/O trouble.
    """

    emit: Callable[[Event], None]
    run_id: str | None
    # The open (or last) run, set in _start(); _engine is its engine.
    _run: WriterRun
    _engine: Engine
    _pid: int
    _set_limit: Callable[[int], None]

    def __init__(self, config: TracerConfig) -> None:
        super().__init__(config)
        if not config.enabled:
            self.emit = noop_emit
            return
        self._lock = threading.RLock()
        hooks.track_enabled(self)
        # Not opened yet: open() or `with` opens and raises what goes wrong;
        # otherwise the first emit opens it (a tracer handed to another
        # process opens there, with a run of its own).
        self.emit = self._emit_lazy

    # --- configuration, pickling --------------------------------------------

    @property
    def counts(self) -> TraceCounts:
        """This run's counts so far, as ``trace_closed`` gives them (zeros before the open)."""
        outside = self._report.outside_run
        run: WriterRun | None = getattr(self, "_run", None)
        if self._state is State.NEW or run is None or run.open_error:
            return TraceCounts(outside_run=outside)
        return run.engine.counts(run.emitted_so_far(), outside)

    def __reduce__(self) -> tuple[Any, ...]:
        # A tracer travels as its configuration and opens lazily where it lands,
        # with a run_id of its own.
        return (SyncTracer, (self._config,))

    def open(self) -> SyncTracer:
        """Open the sinks and start the writer thread now; raise if a sink cannot open.

        ``with`` calls it; without it, the first ``emit`` opens the tracer and
        an error is logged once instead. Opening an open tracer does nothing;
        opening a closed one starts a new run.
        """
        if not self._config.enabled:
            return self
        with self._lock:
            if self._state not in (State.NEW, State.CLOSED):
                return self
            self._start(wait=True)
        # Not under the lock: the writer thread may need it to say it failed.
        within = self._config.close_timeout * 2 + 1
        run = self._run
        if run.open_error is None and not run.opened.wait(None if math.isinf(within) else within):
            # The sinks open on the writer thread, each within close_timeout.
            self._fail_open(
                run, SinkOpenError(", ".join(self._config.uris), "did not open in time")
            )
        if run.open_error is not None:
            raise run.open_error
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

    def _make_emit(self) -> tuple[Callable[[Event], None], Callable[[int], None]]:
        # Its twin is async_tracer.Tracer._make_emit: the stamping is written
        # out in both, as a shared helper would cost each emit a call. No
        # lock: deque.append is atomic.
        run = self._run
        queue = run.queue
        append = queue.append
        # Bound to this run: an emit kept from it must not touch a later run.
        on_full = functools.partial(self._on_full, run)
        batch_size = self._config.batch_size
        wake = functools.partial(self._wake, run)
        types = REGISTRY.emit_types
        now = self._config.clock
        copy_event = copy.copy
        run_id = run.engine.run_id
        # Closing sets it to 0, so that every later emit (even through an old
        # reference) is counted by on_full.
        limit = self._config.buffer

        def emit(ev: Event) -> None:
            try:
                urgent = types[type(ev)]
            except KeyError:
                raise not_an_event(ev) from None
            if ev.time:
                # Emitted before: the queued object keeps its own envelope.
                ev = copy_event(ev)
            try:
                ev.time = now()
                ev.run_id = run_id
            except AttributeError:
                raise frozen_event(ev) from None
            n = len(queue)
            if n >= limit:
                on_full()
                return
            # The writer numbers events in the order they arrive here.
            append(ev)
            if n == 0 or n == batch_size or urgent:
                wake(urgent)

        def set_limit(value: int) -> None:
            nonlocal limit
            limit = value

        return emit, set_limit

    def _on_full(self, run: WriterRun) -> None:
        if run is self._run and self._state is State.OPEN:
            # Dropped; the writer gives it a seq of the run, never written,
            # so trace_closed counts it.
            next(run.drops)
            self._report.full(self._config.buffer, self.run_id)
        else:
            self._report.not_open(closed=True)

    def _emit_lazy(self, ev: Event) -> None:
        if REGISTRY.emit_types.get(type(ev)) is None:
            raise not_an_event(ev)
        if self._state is State.NEW:
            with self._lock:
                if self._state is State.NEW:
                    self._start(wait=False)
        # A caller may hold this method from before the open: hand on to the
        # open run's emit, or count it once the tracer is closed.
        if self._state is State.OPEN:
            self.emit(ev)
        else:
            self._report.not_open(closed=True)

    def _forked(self) -> bool:
        """In a child forked by something that runs no fork hooks: start over here.

        Checked once per batch, at flush and at close rather than at every
        emit: ``os.getpid()`` is a system call (about 260 ns on these VMs).
        """
        if self._state in (State.OPEN, State.CLOSING) and os.getpid() != self._pid:
            self.after_fork()
            return True
        return False

    def _wake(self, run: WriterRun, urgent: bool = False) -> None:
        if urgent:
            run.urgent = True
        if run.wake_flag.is_set() or self._forked():
            return
        run.wake_flag.set()

    # --- lifecycle ----------------------------------------------------------

    def _start(self, *, wait: bool) -> None:
        engine = Engine(self._config, direct=True)
        run = WriterRun(engine)
        self._run = run
        self._engine = engine
        self._pid = engine.pid
        self._report.new_run()
        self.run_id = engine.run_id
        self.emit, self._set_limit = self._make_emit()
        self._state = State.OPEN
        thread = threading.Thread(
            target=self._writer,
            args=(run, wait),
            name=f"rollout_trace writer {engine.run_id[:8]}",
            daemon=True,
        )
        run.thread = thread
        try:
            thread.start()
        except RuntimeError as exc:  # a thread limit, or the interpreter shutting down
            uris = ", ".join(self._config.uris)
            self._fail_open(run, SinkOpenError(uris, f"cannot start the writer thread: {exc}"))
            if not wait:
                # Opened lazily: nobody waits to hear it, so say it once.
                logger.warning("rollout_trace: tracing is off for this process: %s", exc)
            return
        hooks.track(self)

    def _fail_open(self, run: WriterRun, exc: BaseException) -> None:
        """The run never opened: emit counts quietly, flush and close return at once."""
        with self._lock:
            if run.open_error is not None:
                return
            run.open_error = exc
            if run is not self._run:  # given up before; the tracer has opened again since
                return
            self._state = State.CLOSED
            self._set_limit(0)
            # The run never was: what was emitted into it belongs to no run.
            queued = sum(1 for item in list(run.queue) if isinstance(item, Event))
            self._report.add_outside(peek_count(run.drops) + queued)
            self._report.quiet("closed")  # this was said already, as the open's failure
            run.queue.clear()
            self.emit = self._emit_lazy
        hooks.untrack(self)
        self._release_marks(run, forget=True)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every event emitted before the call, from any thread, is written.

        Returns ``True`` only if every live sink wrote every one of them;
        ``False`` if ``timeout`` passed first, an event was dropped, a sink
        failed or the run closed. A hung sink is given up after
        ``close_timeout``, so even ``timeout=None`` returns. At once for a
        tracer that is not open.
        """
        if self._forked() or self._state is not State.OPEN:
            return self._settled()
        end = math.inf if timeout is None else time.monotonic() + timeout
        mark = QueueMark()
        run = self._run
        self._enqueue(run, mark)
        engine = run.engine
        if not engine.wait_event(mark.reached, end) or mark.mark is None:
            return False  # out of time, or the writer ended first
        engine.wait_event(mark.mark.done, end)
        return engine.flushed_all(mark.mark, mark.boundary)

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued and ``trace_closed``, close the sinks; idempotent.

        One deadline (``timeout``, default the tracer's ``close_timeout``)
        covers the drain and the sinks' close; what is not written by then is
        counted as dropped, and the threads are left to end on their own.
        """
        mark = self.begin_close(timeout)
        if mark is not None:
            self.finish_close(mark)

    def begin_close(self, timeout: float | None) -> CloseMark | None:
        if not self._config.enabled:
            return None
        with self._lock:
            self._forked()
            if self._state is State.NEW:
                # Closed before it ever opened: a later emit opens nothing.
                self._state = State.CLOSED
                return None
            if self._state is not State.OPEN:
                return None
            # What was queued before the close mark is the run's; later emits
            # belong to no run.
            self._state = State.CLOSING
            self._set_limit(0)
            limit = self._config.close_timeout if timeout is None else timeout
            mark = CloseMark(time.monotonic() + limit)
            self._enqueue(self._run, mark)
            return mark

    def finish_close(self, mark: CloseMark) -> None:
        run = self._run
        engine = run.engine
        if not engine.wait_event(mark.reached, mark.deadline):
            stuck = engine.writer_stuck
            # From now on the writer thread writes nothing of this run: what
            # it still holds, and a call it is inside, count as dropped. When
            # it gets out, it closes the sinks and ends.
            run.abandoned = True
            engine.give_up(
                mark.boundary or run.emitted_so_far() + 1,
                "did not write what it held before the close deadline",
            )
            logger.warning(
                "rollout_trace: closing run %s %s; what was not written by then is lost and "
                "trace_closed may be missing",
                self.run_id,
                "gave up: its sink hangs in a call" if stuck else "took longer than its deadline",
            )
        with self._lock:
            if self._state is State.CLOSING:
                self._state = State.CLOSED
                self.emit = self._emit_lazy
                hooks.untrack(self)
        # Nobody waits on a flush of the run in vain; the writer thread, if it
        # ever gets out of its call, still finds the marks in its queue.
        self._release_marks(run)

    close_blocking = close

    def _enqueue(self, run: WriterRun, mark: QueueMark) -> None:
        with self._lock:
            run.marks.append(mark)
            done = run.writer_done
        run.queue.append(mark)
        run.wake_flag.set()
        thread = run.thread
        if done or (thread is not None and not thread.is_alive() and thread.ident is not None):
            self._release_marks(run, forget=True)

    def _release_marks(
        self, run: WriterRun, *, forget: bool = False, writer_done: bool = False
    ) -> None:
        """Release (``reached``) every mark queued in ``run``; ``forget`` them too
        when no writer thread will look for them (it has ended, or the queue is gone)."""
        with self._lock:
            marks = list(run.marks)
            if forget or writer_done:
                run.marks.clear()
            # From now on a mark is released as it is queued (see _enqueue): one
            # queued after this, while the writer thread is still ending, would
            # find no thread alive to say so only later.
            run.writer_done = run.writer_done or writer_done
        for mark in marks:
            mark.reached.set()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's run; open a new one on the first emit."""
        # Another thread of the parent may have held the lock at the fork (it
        # was opening this tracer): in the child nobody would ever release it.
        self._lock = threading.RLock()
        if self._state in (State.NEW, State.CLOSED):
            return
        # The parent's queue, threads and sinks are left untouched: closing
        # them here could write the parent's data a second time.
        self._state = State.NEW
        self.run_id = None
        self.emit = self._emit_lazy

    # --- the writer thread --------------------------------------------------
    # Everything here works on the run handed to the thread, never on the
    # tracer's current one: a close may give this run up and the tracer open
    # another while this thread is still inside a sink's call.

    def _writer(self, run: WriterRun, waited: bool) -> None:
        hooks.keep_signals_off_this_thread()
        try:
            self._open_and_serve(run, waited)
        finally:
            self._release_marks(run, writer_done=True)

    def _open_and_serve(self, run: WriterRun, waited: bool) -> None:
        engine = run.engine
        try:
            drive_blocking(engine, engine.opening(self._specs, announce=False))
        except BaseException as exc:
            if not waited:
                # Said before the failure is known: a flush or close it ends
                # returns at once, and what it returns to may look for this.
                logger.warning("rollout_trace: tracing is off for this process: %s", exc)
            self._fail_open(run, exc)
            run.opened.set()
            return
        with self._lock:
            given_up = run.open_error is not None  # open() stopped waiting for it
            if not given_up:
                self._sinks = [r.sink for r in engine.runners]
        run.opened.set()
        if given_up:
            for runner in engine.runners:
                runner.live = False
                runner.discard()
            return
        try:
            # After the open is said: this thread writes a lone sink itself.
            engine.announce()
            close = self._serve(run)
            self._close_run(run, close)
        except BaseException as exc:  # never let the writer thread print a traceback
            logger.error(
                "rollout_trace: the writer thread of run %s failed: %r", engine.run_id, exc
            )

    def _serve(self, run: WriterRun) -> CloseMark:
        """Write batches as they start, fill or wait ``flush_interval``, up to the close mark."""
        interval = self._config.flush_interval
        batch_size = self._config.batch_size
        wake = run.wake_flag
        queue = run.queue
        while True:
            # Idle (nothing queued): sleep until an emit wakes us.
            wake.wait(interval if queue else None)
            wake.clear()
            if 0 < len(queue) < batch_size and not (run.urgent or run.marks):
                # A batch has started: give it the flush interval to fill up,
                # unless it fills, an urgent event comes or a mark waits (a wake).
                wake.wait(interval)
                wake.clear()
            run.urgent = False
            close = self._drain(run)
            if close is not None:
                return close

    @staticmethod
    def _fold_drops(run: WriterRun, dropped: int) -> None:
        """Number ``dropped`` drops here, in the order of the run."""
        if dropped:
            run.drops_folded += dropped
            run.engine.note_lost(dropped, run.next_seq)
            run.next_seq += dropped

    @staticmethod
    def _write(run: WriterRun, events: list[Event]) -> None:
        seq = run.next_seq
        run.next_seq = seq + len(events)
        if not run.abandoned:  # given up: its counts are fixed, nothing more is written
            run.engine.process(events, seq)

    def _drain(self, run: WriterRun) -> CloseMark | None:
        """Write everything queued; handle marks in order. Returns the close mark."""
        queue = run.queue
        pop = queue.popleft
        engine = run.engine
        while queue:
            # starmap runs popleft in C: a third of the cost of a comprehension.
            # Drops happen only while the queue is full, and nothing is queued
            # again before a drain: the drops counted by now came after every
            # event drained here, so they are numbered after the last of them
            # (before a mark that follows it: a flush then says False).
            dropped = peek_count(run.drops) - run.drops_folded
            items: list[Any] = list(starmap(pop, repeat((), len(queue))))
            marks = self._marks_in(run, items) if run.marks else []
            last_event = len(items) - 1
            while marks and any(i == last_event for i, _ in marks):
                last_event -= 1
            start = 0
            for i, item in marks:
                self._write(run, items[start:i])
                start = i + 1
                if i > last_event or isinstance(item, CloseMark):
                    # (Every drop counted before the close is the run's.)
                    self._fold_drops(run, dropped)
                    dropped = 0
                item.boundary = run.next_seq
                if isinstance(item, CloseMark):
                    self._late(run, items[start:])
                    return item
                if not run.abandoned:
                    item.mark = engine_mark = FlushMark(len(engine.live_sinks))
                    for runner in engine.live_sinks:
                        runner.mark(engine_mark)
                item.reached.set()
                with self._lock:
                    if item in run.marks:
                        run.marks.remove(item)
            self._write(run, items[start:] if start else items)
            self._fold_drops(run, dropped)
        # Drops since the last drain with nothing queued after them.
        self._fold_drops(run, peek_count(run.drops) - run.drops_folded)
        return None

    def _marks_in(self, run: WriterRun, items: list[Any]) -> list[tuple[int, QueueMark]]:
        """Where the flush and close marks are among ``items``, in their order.

        Every mark is registered before it is queued, so only those can be
        there; each is looked for by identity in C (a loop in Python over a
        batch of events costs milliseconds a flush).
        """
        with self._lock:
            registered = list(run.marks)
        found = []
        ids: list[int] | None = None
        for mark in registered:
            if items and items[-1] is mark:  # the usual place: queued after its events
                found.append((len(items) - 1, mark))
                continue
            if ids is None:
                ids = list(map(id, items))
            with contextlib.suppress(ValueError):  # not there: queued after this drain began
                found.append((ids.index(id(mark)), mark))
        found.sort(key=itemgetter(0))
        return found

    def _late(self, run: WriterRun, items: list[Any]) -> None:
        """What was queued behind the close mark belongs to no run."""
        items += list(starmap(run.queue.popleft, repeat((), len(run.queue))))
        if not run.abandoned:  # (given up: the run's emitted counted them already)
            self._report.add_outside(sum(1 for item in items if isinstance(item, Event)))
        for item in items:
            if isinstance(item, QueueMark):
                item.reached.set()

    def _close_run(self, run: WriterRun, mark: CloseMark) -> None:
        engine = run.engine
        if run.abandoned:
            # The close gave the run up at its deadline (its counts are fixed,
            # its sinks stopped) while this thread was inside a call: once out
            # of it, it closes the sinks and ends.
            for runner in engine.runners:
                runner.close()
            mark.reached.set()
            return
        drive_blocking(engine, engine.closing(mark.boundary, mark.deadline))
        # A drop that raced the close mark: after trace_closed's numbers.
        self._report.add_outside(peek_count(run.drops) - run.drops_folded)
        mark.reached.set()


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
    the ``with`` block, at interpreter exit or on SIGTERM. The arguments are
    those of ``rt.tracer()``. A disabled tracer holds no thread, queue or
    lock, and pickles; an enabled one pickles as its configuration and opens
    a new run on its first emit in the process that unpickles it.
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
