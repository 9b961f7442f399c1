"""Encode once, fan out to one task per sink; shared by both tracers."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from sinks import Sink

from ._encoding import BatchEncoder
from ._events import Event

__all__ = ["DRAIN_SHARE", "Pipeline", "logger", "peek_count", "warn_full_buffer"]

logger = logging.getLogger("rollout_trace")

# The async tracer encodes and writes at most this many events at a time
# (about 4 ms of the loop's time). Each write costs its sink's thread a few
# turns at the GIL; measured with an emitting loop that never idles, smaller
# writes fell behind and overflowed the buffer, these did not.
_ASYNC_CHUNK = 16_384
# Batches a sink may hold before the pipeline waits for it.
_SINK_QUEUE = 4
# A sink write outstanding this long has its thread starved of the GIL, which
# the loop thread then hands over by sleeping this long.
_STARVED = 0.010
_HANDOVER = 0.0002
# The share of the close deadline spent draining; the rest is for trace_closed
# and closing the sinks.
DRAIN_SHARE = 0.8


def warn_full_buffer(buffer: int, run_id: str | None) -> None:
    """Say, once per run and from the emit that dropped first, that the buffer is full.

    Not from the writer: the writer may be the part that is stuck.
    """
    logger.warning(
        "rollout_trace: the buffer of %d events is full, so new events are dropped "
        "(reported once; trace_closed counts them all): the sinks of run %s are "
        "slower than the program emits",
        buffer,
        run_id,
    )


def peek_count(counter: itertools.count[int]) -> int:
    """The next value of an ``itertools.count``, without taking it."""
    # count's repr is "count(N)"; it is the only way to read it without a lock.
    return int(repr(counter)[6:-1])


class _Flush:
    """A marker that is done when every sink it was sent to has flushed.

    ``reached`` tells a flush that completed from one released because the
    run closed first.
    """

    def __init__(self, parties: int) -> None:
        self._left = parties
        self.done = anyio.Event()
        self.reached = parties == 0
        if parties == 0:
            self.done.set()

    def arrive(self) -> None:
        self._left -= 1
        if self._left == 0:
            self.reached = True
            self.done.set()

    def release(self) -> None:
        self.done.set()


class _SinkWorker:
    """Writes one sink's batches in order; a failure is reported once and ends its use."""

    def __init__(self, uri: str, sink: Sink) -> None:
        self.uri = uri
        self.sink = sink
        self.failed = False
        self.busy_since: float | None = None
        self.send: MemoryObjectSendStream[bytes | _Flush]
        self.done = anyio.Event()
        self.scope = anyio.CancelScope(shield=True)

    def _fail(self, action: str, exc: BaseException) -> None:
        if not self.failed:
            self.failed = True
            logger.warning(
                "rollout_trace: sink %s failed to %s and is stopped (the other sinks go on): "
                "%s: %s",
                self.uri,
                action,
                type(exc).__name__,
                exc,
            )

    async def hand(self, item: bytes | _Flush, stall_timeout: float) -> bool:
        """Give the sink's task an item; a sink that takes none for ``stall_timeout``
        seconds (a hung mount, a reader that never reads) is stopped, so that it
        cannot hold up the other sinks. Returns whether the item was taken."""
        if self.failed:
            return False
        with anyio.move_on_after(stall_timeout):
            await self.send.send(item)
            return True
        self._fail("keep up", TimeoutError(f"it took no batch for {stall_timeout:g} s"))
        self.scope.cancel()
        self.send.close()
        return False

    async def write(self, data: bytes) -> None:
        if not self.failed:
            try:
                await self.sink.write(data)
            except Exception as exc:
                self._fail("write", exc)

    async def flush(self) -> None:
        if not self.failed:
            try:
                await self.sink.flush()
            except Exception as exc:
                self._fail("flush", exc)

    async def close(self) -> None:
        try:
            await self.sink.aclose()
        except Exception as exc:
            self._fail("close", exc)
        finally:
            self.done.set()

    def start(self, tg: TaskGroup) -> None:
        """Give the sink a task of its own, fed through a small memory stream."""
        self.send, receive = anyio.create_memory_object_stream[bytes | _Flush](_SINK_QUEUE)
        tg.start_soon(self._run, receive, name=f"rollout_trace sink {self.uri}")

    async def _run(self, receive: MemoryObjectReceiveStream[bytes | _Flush]) -> None:
        # Shielded: cancelling the task that holds the tracer must not lose the
        # tail of the trace. The close deadline cancels this scope explicitly.
        with self.scope:
            try:
                async with receive:
                    async for item in receive:
                        if isinstance(item, bytes):
                            self.busy_since = time.monotonic()
                            await self.write(item)
                            self.busy_since = None
                        else:
                            await self.flush()
                            item.arrive()
            finally:
                await self.close()


class Pipeline:
    """Stamps ``run_id``, encodes each batch once and hands the bytes to every sink.

    Counts what it handed on (``written``) and what could not be encoded
    (``invalid``); the first invalid event is reported once.
    """

    def __init__(
        self,
        sinks: Sequence[tuple[str, Sink]],
        run_id: str,
        *,
        direct: bool,
        stall_timeout: float = 10.0,
    ) -> None:
        # direct: the caller awaits each sink's write itself, in turn, instead
        # of handing it to the sink's task. The sync tracer's writer thread
        # does: its sinks complete without yielding, so a whole batch is
        # written in one turn of its loop, and every turn of a loop polls for
        # I/O, which gives the GIL away to the threads that emit.
        self._direct = direct
        self._stall_timeout = stall_timeout
        self._chunk = 1 << 62 if direct else _ASYNC_CHUNK
        self.run_id = run_id
        self.written = 0
        self.invalid = 0
        self._encoder = BatchEncoder()
        self._workers = [_SinkWorker(uri, sink) for uri, sink in sinks]

    @property
    def sinks(self) -> list[Sink]:
        return [w.sink for w in self._workers]

    def start(self, tg: TaskGroup) -> None:
        if self._direct:
            return
        for worker in self._workers:
            worker.start(tg)

    async def write(self, events: Sequence[Event], *, count: bool = True) -> None:
        """Encode ``events`` and hand them to every sink, in as few writes as may be.

        Each write costs a system call, which gives the GIL away, and a busy
        producer thread may keep it for the whole switch interval (5 ms)
        before the writer gets it back: the sync tracer's writer thread
        encodes and writes all it drained at once (the buffer bounds it).
        ``count=False`` is for the lifecycle events.
        """
        run_id = self.run_id
        for start in range(0, len(events), self._chunk):
            chunk = events[start : start + self._chunk]
            for ev in chunk:
                ev.run_id = run_id
            data, bad = self._encoder.encode(chunk)
            if count:
                if bad:
                    self._report_invalid(bad[0])
                    self.invalid += len(bad)
                self.written += len(chunk) - len(bad)
            if not data:
                continue
            for worker in self._workers:
                if self._direct:
                    await worker.write(data)
                else:
                    await worker.hand(data, self._stall_timeout)

    def _report_invalid(self, first: tuple[Event, Exception]) -> None:
        if self.invalid == 0:
            ev, exc = first
            logger.warning(
                "rollout_trace: event %s (seq %d) cannot be encoded and is counted "
                "as invalid (reported once; trace_closed counts them all): %s",
                type(ev).__struct_config__.tag,
                ev.seq,
                exc,
            )

    def yield_to_starved_writers(self) -> None:
        """Give the GIL, briefly, to a sink thread that has waited long for it.

        A sink's thread needs the GIL back after every write. An event loop
        that gives the GIL away only for its short polls of I/O wakes that
        thread each time, and each wake restarts the thread's 5 ms wait for
        its turn: CPython never asks the loop to hand the GIL over, and the
        writes wait hundreds of milliseconds (measured) while the buffer
        overflows. A short sleep of the loop thread hands it over.
        """
        now = time.monotonic()
        for worker in self._workers:
            since = worker.busy_since
            if since is not None and now - since > _STARVED:
                time.sleep(_HANDOVER)
                return

    async def flush(self) -> None:
        """Return once every sink has written and flushed all it was handed."""
        if self._direct:
            for worker in self._workers:
                await worker.flush()
            return
        live = [w for w in self._workers if not w.failed]
        marker = _Flush(len(live))
        for worker in live:
            if not await worker.hand(marker, self._stall_timeout):
                marker.arrive()  # stopped just now: nothing more to wait for
        await marker.done.wait()

    async def aclose(self) -> None:
        """Let every sink write what it holds, then close it."""
        for worker in self._workers:
            if self._direct:
                await worker.close()
            else:
                await worker.send.aclose()
        for worker in self._workers:
            await worker.done.wait()

    def abort(self) -> None:
        """Stop every sink at once (the close deadline has passed)."""
        for worker in self._workers:
            worker.scope.cancel()
            if not self._direct:
                worker.send.close()
