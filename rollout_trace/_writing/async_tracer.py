"""The async tracer: ``emit`` on the event loop, batches through an anyio memory
stream to a pump task, sink I/O on the sinks' own threads, never blocking."""

from __future__ import annotations

import copy
import functools
import itertools
import math
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import TracerStateError
from .._internals import forget_native_cancel, is_cancellation, lend_gil, peek_count, restore_gil
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
from .engine import Engine, State, Wait, drive_async, drive_blocking, logger
from .facade import TracerFacade

__all__ = ["Tracer", "tracer"]

# The pump encodes and hands on at most this many events before it lets the
# loop run other tasks (about 4 ms of the loop's time).
_CHUNK = 16_384


class Tracer(TracerFacade):
    """An async tracer; open it with ``async with``. Build it with ``rt.tracer()``.

    ``emit(event)`` is synchronous and O(1): it stamps the envelope, appends the
    event to the current batch and, when the batch is full (or the event is
    urgent), hands the batch to the pump task through an anyio memory stream.
    It never awaits, never blocks and never raises for I/O trouble; it raises
    ``TypeError`` at once for anything that is not an ``Event``. Call it from
    the event loop's thread only (use ``rt.sync_tracer`` from other threads).
    Works under every anyio backend (asyncio, uvloop, trio).
    """

    emit: Callable[[Event], None]
    run_id: str | None
    # The state of the open run, set when it opens.
    _engine: Engine
    _tg: TaskGroup | None
    _send: MemoryObjectSendStream[list[Event]]
    _receive: MemoryObjectReceiveStream[list[Event]]
    _pending: list[Event]
    _seq: itertools.count[int]
    _set_limit: Callable[[int], None]
    _wake: anyio.Event
    _queued: int  # events in the memory stream
    _max_queued: int
    _idle: bool
    _partial_since: float
    _stop: bool
    _pump_done: bool
    _orphaned_at: float | None

    def __init__(self, config: TracerConfig) -> None:
        super().__init__(config)
        self._tg = None
        self._swallowed = 0
        self.emit = self._emit_not_open if config.enabled else noop_emit
        if config.enabled:
            hooks.prepare()

    # --- configuration, pickling --------------------------------------------

    @property
    def counts(self) -> TraceCounts:
        """This run's counts so far, as ``trace_closed`` gives them (zeros before the open)."""
        if self._state in (State.NEW, State.OPENING):
            return TraceCounts(outside_run=self._report.outside_run)
        emitted = peek_count(self._seq) - 1
        return self._engine.counts(emitted, self._report.outside_run)

    def __getstate__(self) -> dict[str, Any]:
        # A tracer travels as its configuration and opens anew where it lands.
        return {"config": self._config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    # --- emit ---------------------------------------------------------------

    def _make_emit(self) -> tuple[Callable[[Event], None], Callable[[int], None]]:
        # Its twin is sync_tracer.SyncTracer._make_emit: the stamping is written
        # out in both, as a shared helper would cost each emit a call. A
        # closure over the run's state: no attribute lookups on the hot path.
        pending = self._pending
        append = pending.append
        next_seq = self._seq.__next__
        types = REGISTRY.emit_types
        now = self._config.clock
        copy_event = copy.copy
        run_id = self._engine.run_id
        # Bound to this run: an emit kept from it must not touch a later run.
        on_batch = functools.partial(self._on_batch, self._engine, pending)
        # Past it, emit calls on_batch; closing sets it to 0, so that every
        # later emit (even through an old reference) is counted there.
        limit = self._config.batch_size

        def emit(ev: Event) -> None:
            try:
                urgent = types[type(ev)]
            except KeyError:
                raise not_an_event(ev) from None
            if ev.seq >= 0:
                # Emitted before: the queued object keeps its own envelope.
                ev = copy_event(ev)
            try:
                ev.time = now()
                ev.seq = next_seq()
                ev.run_id = run_id
            except AttributeError:
                raise frozen_event(ev) from None
            append(ev)
            n = len(pending)
            if n >= limit or urgent or n == 1:
                on_batch(n, urgent)

        def set_limit(value: int) -> None:
            nonlocal limit
            limit = value

        return emit, set_limit

    def _on_batch(self, engine: Engine, pending: list[Event], n: int, urgent: bool) -> None:
        if engine is not self._engine or self._state is not State.OPEN:
            # Closing or closed: trace_closed has taken its seq, so this event
            # belongs to no run. Counted in counts.after_close, said once.
            pending.clear()
            self._report.not_open(closed=True)
            return
        if n < self._config.batch_size and not urgent:
            # The first event of a batch: the flush interval starts now.
            self._partial_since = time.monotonic()
            if self._idle:
                self._wake.set()
            return
        if self._queued + n <= self._max_queued:
            try:
                self._send.send_nowait(pending.copy())
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            else:
                self._queued += n
                pending.clear()
                if urgent:
                    # To the sinks' threads now, even if the loop does not
                    # run again soon (blocking work, a kill).
                    self._take(everything=False)
                self._wake.set()
                return
        # The buffer is full: the batch being filled may fill up, and past
        # that the newest event is dropped. Its seq is taken, so trace_closed
        # counts it.
        if n > self._config.batch_size:
            ev = pending.pop()
            self._engine.note_lost(1, ev.seq)
            self._report.full(self._config.buffer, self.run_id)

    def _emit_not_open(self, ev: Event) -> None:
        if REGISTRY.emit_types.get(type(ev)) is None:
            raise not_an_event(ev)
        if self._state is State.OPEN:
            # A caller held this method from before the open: hand it on.
            self.emit(ev)
            return
        self._report.not_open(closed=self._state is not State.NEW)

    # --- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> Tracer:
        if not self._config.enabled:
            return self
        if self._state in (State.OPENING, State.OPEN, State.CLOSING):
            raise TracerStateError(
                f"this tracer is already {self._state.value} (one `async with` at a time; "
                "share the open tracer between tasks instead)"
            )
        self._state = State.OPENING
        engine = Engine(self._config)
        try:
            await drive_async(engine, engine.opening(self._specs), patient=False)
        except BaseException:
            self._state = State.NEW
            raise
        self._engine = engine
        self._sinks = [r.sink for r in engine.runners]
        self.run_id = engine.run_id
        config = self._config
        # The memory stream carries batches (an urgent event ships a short
        # one): it is bounded by the events in them, which with the batch
        # being filled are `buffer` at most.
        self._max_queued = max(config.batch_size, config.buffer - config.batch_size)
        self._send, self._receive = anyio.create_memory_object_stream[list[Event]](math.inf)
        self._pending = []
        self._seq = itertools.count(1)
        self._queued = 0
        self._idle = False
        self._partial_since = math.inf
        self._wake = anyio.Event()
        self._stop = False
        self._pump_done = False
        self._orphaned_at = None
        self._swallowed = 0
        self._report.new_run()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._pump, name=f"rollout_trace pump {engine.run_id[:8]}")
        self.emit, self._set_limit = self._make_emit()
        self._state = State.OPEN
        hooks.track(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._tg = self._tg, None
        if tg is None:
            return None
        try:
            await self.aclose()
        finally:
            # The pump has ended by now. The body's exception is not passed
            # on: the task group would wrap it in an ExceptionGroup, and the
            # user's exception must come out of the block as it went in.
            await tg.__aexit__(None, None, None)
        if self._swallowed and exc is None:
            # The task was cancelled while the run closed: let it be cancelled.
            self._swallowed = 0
            raise anyio.get_cancelled_exc_class()()
        return None

    async def flush(self) -> bool:
        """Return once every event emitted before the call is written by every sink.

        Returns ``True`` only if every live sink wrote every one of them;
        ``False`` if any was dropped, a sink failed, or the run closed first.
        A hung sink is given up after ``close_timeout``, so the wait is
        bounded; to bound it further, cancel it (``anyio.move_on_after``).
        At once for a tracer that is not open (``True`` when disabled, or when
        nothing emitted to it was lost).
        """
        if self._state is not State.OPEN:
            return self._settled()
        boundary = peek_count(self._seq)
        self._take(everything=True)
        result, _ = await drive_async(self._engine, self._engine.flushing(boundary), patient=False)
        return result

    async def aclose(self) -> None:
        """Write what is queued and ``trace_closed``, close the sinks, within ``close_timeout``.

        A task cancelled meanwhile (even twice, natively) still leaves a
        complete trace; the cancellation is raised once the run is closed.
        Past the deadline the rest is dropped and reported.
        """
        if self._state is State.OPEN:
            await self._close_run()
        elif self._state is State.CLOSING:
            # Another task (or the pump, at the loop's end) is closing it.
            with anyio.CancelScope(shield=True):
                self._swallowed += await self._engine.wait_async(
                    Wait(lambda: self._state is State.CLOSED, math.inf), patient=True
                )

    def _begin_close(self) -> tuple[int, float]:
        """Everything emitted so far goes to the sinks; later emits are dropped."""
        self._state = State.CLOSING
        self._set_limit(0)
        self._stop = True
        self._wake.set()
        self._take(everything=True)
        deadline = time.monotonic() + self._config.close_timeout
        return next(self._seq), deadline

    def _end_close(self) -> None:
        restore_gil()
        self._send.close()
        self._receive.close()
        self.emit = self._emit_not_open
        self._state = State.CLOSED
        hooks.untrack(self)

    async def _close_run(self) -> None:
        next_seq, deadline = self._begin_close()
        with anyio.CancelScope(shield=True):
            _, swallowed = await drive_async(
                self._engine, self._engine.closing(next_seq, deadline), patient=True
            )
            swallowed += await self._engine.wait_async(
                Wait(lambda: self._pump_done, math.inf), patient=True
            )
        self._swallowed += swallowed
        self._end_close()

    def close_blocking(self) -> None:
        """Close from outside the loop (interpreter exit, SIGTERM): the loop is
        gone or stopped, so nothing else touches the run meanwhile."""
        if self._state is State.OPEN:
            next_seq, deadline = self._begin_close()
            self._pump_done = True
            drive_blocking(self._engine, self._engine.closing(next_seq, deadline))
            self._end_close()

    async def _pump(self) -> None:
        # Shielded: cancelling the task that holds the tracer must not lose the
        # tail of the trace; a native cancel (asyncio.run ending, which cancels
        # every task, these included) is taken here and the run kept going
        # until its holder closes it, or closed by the pump at the deadline.
        with anyio.CancelScope(shield=True):
            try:
                while not self._stop:
                    try:
                        await self._wait_for_work()
                    except BaseException as exc:
                        if not is_cancellation(exc):
                            raise
                        forget_native_cancel()
                        self._orphaned()
                        continue
                    if self._stop:
                        break
                    self._take(everything=self._due())
                    self._lend_gil_if_starved()
                    if self._orphaned_at is not None and self._orphan_expired():
                        # The close waits for the pump to be done: it is.
                        self._pump_done = True
                        await self._close_run()
                        break
            finally:
                self._pump_done = True

    async def _wait_for_work(self) -> None:
        if self._queued or (self._orphaned_at is not None and self._pending):
            await anyio.lowlevel.checkpoint()
            return
        if not self._pending:
            if self._orphaned_at is not None:
                await anyio.sleep(0.01)
                return
            # Idle: sleep until an emit starts a batch; no timer wakes us.
            self._idle = True
            try:
                await self._wake.wait()
            finally:
                self._idle = False
                self._wake = anyio.Event()
            if self._queued or self._stop:
                return
        left = self._partial_since + self._config.flush_interval - time.monotonic()
        if left > 0:
            with anyio.move_on_after(left):
                await self._wake.wait()
            if self._wake.is_set():
                self._wake = anyio.Event()

    def _lend_gil_if_starved(self) -> None:
        """Lend the GIL (``lend_gil``) while a sink's thread is starved of it.

        A busy loop takes the GIL back from its own selector polls before a
        sink's thread waiting for it can: that thread then writes nothing
        while the loop stays busy, and everything is left for the close. The
        loop is never put to sleep for it. The sink's thread puts the switch
        interval back once it has caught up (or the pump does, once no sink
        has anything to write).
        """
        starved = self._engine.sink_starved()
        if starved:
            lend_gil()
        elif starved is None:
            restore_gil()

    def _due(self) -> bool:
        return (
            self._orphaned_at is not None
            or time.monotonic() - self._partial_since >= self._config.flush_interval
        )

    def _orphaned(self) -> None:
        if self._orphaned_at is None:
            self._orphaned_at = time.monotonic()
            # Hand everything on at once: the loop may not run much longer.
            self._take(everything=True)

    def _orphan_expired(self) -> bool:
        assert self._orphaned_at is not None
        if time.monotonic() - self._orphaned_at < self._config.close_timeout:
            return False
        logger.warning(
            "rollout_trace: run %s was still open %gs after its event loop cancelled the "
            "tracer's task; closing it (leave `async with` to close a tracer)",
            self.run_id,
            self._config.close_timeout,
        )
        return True

    def _take(self, *, everything: bool) -> None:
        """Hand the queued batches (and, with ``everything``, the one being
        filled) to the engine, in seq order."""
        items: list[Event] = []
        receive = self._receive
        while True:
            try:
                batch = receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            self._queued -= len(batch)
            items += batch
        if everything and self._pending:
            items += self._pending
            self._pending.clear()
            self._partial_since = math.inf
        for start in range(0, len(items), _CHUNK):
            self._engine.process(items[start : start + _CHUNK])


def tracer(
    *uris: str,
    enabled: bool = True,
    meta: Mapping[str, Any] | None = None,
    buffer: int = DEFAULT_BUFFER,
    batch_size: int = DEFAULT_BATCH,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    clock: Callable[[], float] = time.time,
) -> Tracer:
    """An async tracer writing every event to every sink URI; open it with ``async with``.

    With no URI, the URIs come from ``$ROLLOUT_TRACE`` (comma-separated);
    unset or empty, or ``enabled=False``, gives a disabled tracer that holds
    no task, queue or lock and whose ``emit`` does nothing.

    ``buffer``: events held at most before new ones are dropped (and counted);
    ``batch_size``: events per write (a full batch wakes the writer at once);
    ``flush_interval``: seconds a partial batch may wait, so a killed process
    loses at most about that much (urgent events, such as
    ``snapshot_published``, are written at once); ``close_timeout``: one
    deadline for closing, and how long one sink call may take before that
    sink is given up (``math.inf``: no limit); ``clock``: what stamps
    ``time`` (Unix seconds; ``time.time`` unless a simulation brings its own).
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
    return Tracer(config)
