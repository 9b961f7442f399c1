"""The async tracer: ``emit`` on the event loop, sink I/O in tasks, never blocking."""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

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
from ._events import _EVENT_TYPES, Event
from ._pipeline import DRAIN_SHARE, Pipeline, _Flush, logger, peek_count, warn_full_buffer
from ._sinkspec import open_sinks

__all__ = ["Tracer", "tracer", "not_an_event"]


class _Close:
    pass


_CLOSE = _Close()
_Item = list[Event] | _Flush | _Close


def not_an_event(obj: object) -> TypeError:
    return TypeError(
        f"emit() takes an rollout_trace.Event, not {type(obj).__qualname__}: {obj!r:.200}"
    )


def frozen_event(ev: object) -> TypeError:
    return TypeError(
        f"emit() cannot stamp the envelope of a frozen event ({type(ev).__qualname__}); "
        "define the event class without frozen=True"
    )


class Tracer:
    """An async tracer; open it with ``async with``. Build it with ``rt.tracer()``.

    ``emit(event)`` is synchronous and O(1): it stamps the envelope, appends the
    event to the current batch and, when the batch is full, hands it to the
    writer task through an anyio memory stream. It never awaits, never blocks
    and never raises for I/O trouble; it raises ``TypeError`` at once for
    anything that is not an ``Event``. Call it from the event loop's thread
    only (use ``rt.sync_tracer`` from other threads).
    """

    emit: Callable[[Event], None]
    run_id: str | None
    # The state of the open run, set in __aenter__.
    _run: Run
    _pipeline: Pipeline
    _tg: TaskGroup
    _send: MemoryObjectSendStream[_Item]
    _receive: MemoryObjectReceiveStream[_Item]
    _pending: list[Event]
    _batch_size: int
    _max_queued: int
    _queued: int
    _seq: itertools.count[int]
    _full_drops: int
    _uncounted: int
    _pump_done: anyio.Event
    _pump_scope: anyio.CancelScope
    _drain_deadline: float

    def __init__(self, config: TracerConfig) -> None:
        self._config = config
        self._specs = config.specs()
        self._state = "new"
        self.run_id = None
        self.emit = noop_emit if not config.enabled else self._emit_not_open
        self._warned_not_open = False
        self._tg_entered = False

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
        return self._pipeline.sinks if self._state == "open" else []

    @property
    def counts(self) -> TraceCounts:
        """This run's counts so far, as ``trace_closed`` will give them (zeros if never opened)."""
        if self._state == "new" or not self._config.enabled:
            return TraceCounts()
        p = self._pipeline
        return self._run.counts(peek_count(self._seq) - 1, p.written, p.invalid, self._full_drops)

    def __getstate__(self) -> dict[str, Any]:
        # A tracer travels as its configuration and opens anew where it lands.
        return {"config": self._config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    def __repr__(self) -> str:
        uris = ", ".join(self._config.uris) or "disabled"
        return f"<rollout_trace.Tracer {self._state} run_id={self.run_id} sinks=[{uris}]>"

    # --- emit ---------------------------------------------------------------

    def _make_emit(self) -> Callable[[Event], None]:
        # Its twin is _sync.SyncTracer._make_emit: the stamping is written out in both, as a
        # shared helper would cost each emit a call.
        # A closure over the run's state: no attribute lookups on the hot path.
        pending = self._pending
        append = pending.append
        next_seq = self._seq.__next__
        batch_size = self._batch_size
        on_full = self._on_full_batch
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
            append(ev)
            if len(pending) >= batch_size:
                on_full()

        return emit

    def _on_full_batch(self) -> None:
        pending = self._pending
        if self._state == "open" and self._queued < self._max_queued:
            try:
                self._send.send_nowait(pending.copy())
            except anyio.WouldBlock:  # flush markers hold the slots
                pass
            else:
                self._queued += 1
                pending.clear()
                return
        # The buffer is full, or the run is closing: the pending batch may fill
        # up, and past that the newest event is dropped. Its seq is taken, so
        # trace_closed counts it as dropped.
        if len(pending) > self._batch_size:
            pending.pop()
            if self._state == "open":
                self._full_drops += 1
                if self._full_drops == 1:
                    warn_full_buffer(self._config.buffer, self.run_id)

    def _emit_not_open(self, ev: Event) -> None:
        if type(ev) not in _EVENT_TYPES:
            raise not_an_event(ev)
        if self._state == "open":
            # A caller held this method from before the open: hand it on.
            self.emit(ev)
            return
        if not self._warned_not_open:
            self._warned_not_open = True
            logger.warning(
                "rollout_trace: emit() on a tracer that is not open; open it with "
                "`async with` (events emitted outside it are not written)"
            )

    # --- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> Tracer:
        if not self._config.enabled:
            return self
        if self._state == "open" or self._state == "closing":
            raise RuntimeError("this tracer is already open")
        config = self._config
        run = Run(self._config.clock)
        sinks = await open_sinks(
            self._specs,
            run_id=run.run_id,
            pid=run.pid,
            host=run.host,
            each_within=config.close_timeout,
        )
        self.run_id = run.run_id
        self._run = run
        self._pipeline = Pipeline(
            sinks, run.run_id, direct=False, stall_timeout=config.close_timeout
        )
        self._batch_size = config.batch_size
        # The memory stream carries whole batches; with the batch being filled
        # they hold `buffer` events at most.
        self._max_queued = max(1, config.buffer // config.batch_size - 1)
        self._send, self._receive = anyio.create_memory_object_stream[_Item](self._max_queued + 8)
        self._pending = []
        self._queued = 0
        self._seq = itertools.count(1)
        self._full_drops = 0
        self._pump_done = anyio.Event()
        self._pump_scope = anyio.CancelScope(shield=True)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._tg_entered = True
        self._pipeline.start(tg)
        tg.start_soon(self._pump, name="rollout_trace pump")
        tg.start_soon(self._handover, name="rollout_trace GIL handover")
        self._pending.append(run.opened(config.meta))  # seq 0, not counted
        self._uncounted = 1
        self._state = "open"
        self.emit = self._make_emit()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if not self._tg_entered:
            return None
        try:
            await self.aclose()
        finally:
            self._tg_entered = False
            # Our tasks have ended by now. The body's exception is not passed
            # on: the task group would wrap it in an ExceptionGroup, and the
            # user's exception must come out of the block as it went in.
            await self._tg.__aexit__(None, None, None)
        return None

    async def flush(self) -> bool:
        """Return once every event emitted before the call is written by every sink.

        Returns ``False`` if the run closed first. To bound the wait, cancel
        it: ``with anyio.move_on_after(5): await t.flush()`` (the events stay
        queued). At once, and ``True``, for a tracer that is disabled, not open
        or closed.
        """
        if self._state != "open":
            return True
        await self._ship_pending()
        if self._state != "open":  # closed while this flush waited for room
            return False
        marker = _Flush(1)
        await self._send.send(marker)
        await marker.done.wait()
        return marker.reached

    async def aclose(self) -> None:
        """Drain, write ``trace_closed`` and close the sinks, within ``close_timeout``.

        Runs shielded from cancellation, so a cancelled task still leaves a
        complete trace; past the deadline the rest is dropped and reported.
        """
        if self._state != "open":
            return
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self._config.close_timeout
            await self._ship_pending()
            # From here on, emits wait in the pending batch, and a full one is
            # dropped: their seq numbers are taken, so trace_closed counts them.
            self._state = "closing"
            self._drain_deadline = anyio.current_time() + self._config.close_timeout * DRAIN_SHARE
            await self._send.send(_CLOSE)
            await self._pump_done.wait()
        if scope.cancelled_caught:
            # Past the deadline: what is not written by now counts as dropped.
            last = peek_count(self._seq)
            self._run.closed(
                seq=last,
                emitted=last - 1,
                written=self._pipeline.written,
                invalid=self._pipeline.invalid,
            )
            self._pump_scope.cancel()
            self._pipeline.abort()
            logger.warning(
                "rollout_trace: closing run %s took longer than close_timeout=%ss; "
                "%d events were not written and trace_closed was not written",
                self.run_id,
                self._config.close_timeout,
                peek_count(self._seq) - 1 - self._pipeline.written - self._pipeline.invalid,
            )
        self._send.close()
        self._state = "closed"
        self.emit = noop_emit

    async def _pump(self) -> None:
        pipeline = self._pipeline
        receive = self._receive
        with self._pump_scope, receive:
            try:
                carried: _Item | None = None
                while True:
                    item: _Item | None = carried
                    carried = None
                    if item is None:
                        with anyio.move_on_after(self._config.flush_interval):
                            item = await receive.receive()
                    match item:
                        case None:  # the flush interval passed: write what is pending
                            if not self._pending:
                                continue
                            item = self._pending.copy()
                            self._pending.clear()
                            await self._write(item)
                        case list():
                            self._queued -= 1
                            item, carried = self._take_queued(item)
                            if self._state == "open" or anyio.current_time() < self._drain_deadline:
                                await self._write(item)
                        case _Flush():
                            await pipeline.flush()
                            item.arrive()
                        case _Close():
                            break
                # Every emit took a seq number: the next one closes the run, and
                # the ones before it are what was emitted.
                last = next(self._seq)
                self.emit = noop_emit
                closed = self._run.closed(
                    seq=last,
                    emitted=last - 1,
                    written=pipeline.written,
                    invalid=pipeline.invalid,
                )
                await pipeline.write([closed], count=False)
                await pipeline.aclose()
            except Exception:
                logger.exception("rollout_trace: the writer task failed; tracing stops")
            finally:
                self._release_flushes()
                self._pump_done.set()

    async def _handover(self) -> None:
        # Checks on the sinks' threads while the run is open; see
        # Pipeline.yield_to_starved_writers.
        while not self._pump_done.is_set():
            await anyio.sleep(0.005)
            self._pipeline.yield_to_starved_writers()

    def _release_flushes(self) -> None:
        # A flush queued behind the close marker would otherwise wait forever.
        while True:
            try:
                item = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            if isinstance(item, _Flush):
                item.release()

    def _take_queued(self, batch: list[Event]) -> tuple[list[Event], _Item | None]:
        """Join the batches already queued behind ``batch``, to write them at once.

        Returns the joined batch and the marker that stopped the joining, if any.
        """
        while True:
            try:
                item = self._receive.receive_nowait()
            except anyio.WouldBlock:
                return batch, None
            if not isinstance(item, list):
                return batch, item
            self._queued -= 1
            batch.extend(item)

    async def _ship_pending(self) -> None:
        if self._pending:
            batch = self._pending.copy()
            self._pending.clear()
            self._queued += 1
            try:
                await self._send.send(batch)
            except BaseException:
                # Cancelled while waiting for room (a flush given a deadline):
                # the batch goes back in front of what was emitted since.
                self._queued -= 1
                self._pending[:0] = batch
                raise

    async def _write(self, batch: list[Event]) -> None:
        if self._uncounted:
            # trace_opened leads the first batch; it is not a user event.
            self._uncounted = 0
            await self._pipeline.write(batch[:1], count=False)
            batch = batch[1:]
        await self._pipeline.write(batch)


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
    loses at most about that much; ``close_timeout``: one deadline for
    draining and closing the sinks; ``clock``: what stamps ``time`` (Unix
    seconds; ``time.time`` unless a simulation brings its own).
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
