"""One run's state, from encoded events to acknowledged bytes.

The run's writer thread (``tracers``) calls ``Engine.process`` with events
in ``seq`` order; the engine encodes and checks them once and hands the bytes
to every sink (a lone one written on the writer thread itself, ``direct``;
several on threads of their own). What takes time (opening the sinks,
flushing, closing) is written once, as steps that yield ``Wait``s, driven
blocking (``drive_blocking``) or from an event loop (``drive_async``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import anyio

from .._errors import SinkOpenError
from .._internals import is_cancellation
from .._schema.encoding import BatchEncoder, field_of
from .._schema.events import Event, SinkTally, TraceClosed, TraceOpened
from .._version import __version__
from .config import TraceCounts, TracerConfig
from .runner import Batch, FlushMark, SinkRunner, logger
from .specs import SinkSpec, build_sinks

__all__ = ["State", "Engine", "Wait", "drain_deadline", "drive_blocking", "drive_async", "logger"]

_INF = math.inf
# The share of the close deadline spent draining; the rest is for trace_closed
# and closing the sinks.
DRAIN_SHARE = 0.8
# At a close, how long to wait before asking a staging sink that could not
# deliver (its store is down) to try again.
RETRY_STAGED_S = 0.5
# A sink call this long is taken for one blocked in the system, not for a
# thread back from it that waits for the GIL (the two look alike from here).
LONG_CALL = 0.1
T = TypeVar("T")


class State(enum.Enum):
    """A tracer's life: ``NEW`` -> ``OPENING`` -> ``OPEN`` -> ``CLOSING`` -> ``CLOSED``.

    A closed tracer may open again, with a new run.
    """

    NEW = "new"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass
class Wait:
    """A step waits until ``ready()`` or ``deadline`` (on the engine's
    ``deadline_clock``, ``time.monotonic`` unless the tracer was given one)."""

    ready: Callable[[], bool]
    deadline: float


Steps = Generator[Wait, None, T]


class Engine:
    """One run: its identity, its sinks, and the counts ``trace_closed`` reports."""

    def __init__(self, config: TracerConfig, *, direct: bool = False) -> None:
        self.config = config
        # The thread that calls process() writes to a lone sink itself.
        self.direct = direct
        self.clock = config.clock
        # Every deadline's clock; real time (time.monotonic) still measures
        # what is about speed (the GIL's hand-overs, a direct sink's pieces).
        self.monotonic = config.deadline_clock
        self.run_id = uuid.uuid4().hex
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.state = State.OPENING
        self.runners: list[SinkRunner] = []
        self.invalid = 0
        self.handed = 0
        self.written = 0
        # Events the run itself lost before any sink saw them (full buffer,
        # emitted while closing, a batch the writer could not process).
        self.lost = 0
        self.first_lost: float = _INF
        self.final: TraceClosed | None = None
        self._last_time = time.time()  # a lifecycle line's time if the clock fails
        self._encoder = BatchEncoder(own_time=config.clock is time.time)
        self._written_lock = threading.Lock()
        self._progress = threading.Condition()
        self._said_invalid: set[tuple[type, str | None]] = set()
        # The asyncio loop the run was opened or emitted on (``went_idle``).
        self.loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self.wake_owed = False  # a wake left out to bound their rate
        self._woke_at = -_INF
        self._warned_broken = False

    # --- counting -------------------------------------------------------------

    def _add_written(self, n: int) -> None:
        with self._written_lock:
            self.written += n

    def note_lost(self, n: int, first_seq: float) -> None:
        """``n`` events from ``first_seq`` on were taken but never handed to the sinks."""
        self.lost += n
        if first_seq < self.first_lost:
            self.first_lost = first_seq

    def counts(self, emitted: int, outside_run: int = 0, unnumbered: int = 0) -> TraceCounts:
        """The counts so far; the final ones (``trace_closed``'s) once closed.

        ``unnumbered``: drops the writer has not given a seq yet.
        """
        if self.final is not None:
            f = self.final
            return TraceCounts(f.emitted, f.written, f.dropped, f.invalid, 0, outside_run)
        written, invalid = self.written, self.invalid
        dropped = self.lost + unnumbered
        if not self.live_sinks:
            # No sink can write what it was handed any more.
            dropped += self.handed - written
        pending = max(0, emitted - written - invalid - dropped)
        return TraceCounts(emitted, written, dropped, invalid, pending, outside_run)

    # --- the hot part: events to bytes to sinks --------------------------------

    def process(self, events: Sequence[Event], first_seq: int | None = None) -> None:
        """Encode and check ``events`` (in seq order) once and hand them to every
        sink; never raises.

        ``emit`` stamped their ``time`` and ``run_id`` (and the async tracer's
        their ``seq``). The sync tracer's writer numbers them in the order they
        arrived: from ``first_seq`` on, in the same pass as their check.
        """
        if not events:
            return
        try:
            data, bad = self._encoder.encode(events, first_seq)
        except Exception as exc:
            # Nothing in one batch may stop the run: the batch counts as lost.
            first = min(ev.seq for ev in events) if first_seq is None else first_seq
            self.note_lost(len(events), first)
            if not self._warned_broken:
                self._warned_broken = True
                logger.error(
                    "rollout_trace: a batch of %d events of run %s could not be encoded and "
                    "is dropped (reported once; trace_closed counts them): %s: %s",
                    len(events),
                    self.run_id,
                    type(exc).__name__,
                    exc,
                )
            return
        if bad:
            self.invalid += len(bad)
            for ev, reason in bad:
                # Once for each event class and field: a second mistake is not
                # hidden behind the first.
                key = (type(ev), field_of(reason))
                if key not in self._said_invalid:
                    self._said_invalid.add(key)
                    logger.warning(
                        "rollout_trace: an event does not fit its schema and is counted as "
                        "invalid, not written (reported once for each event and field; "
                        "trace_closed counts them all): %s",
                        reason,
                    )
        n = len(events) - len(bad)
        if n:
            self._submit(data, n, events[0].seq)

    def _submit(self, data: bytes, n: int, first_seq: float) -> None:
        self.handed += n
        batch = Batch(n, first_seq, self._add_written)
        now = self.monotonic()
        for runner in self.runners:
            runner.check_stall(now, self.config.close_timeout)
            runner.submit(data, batch)

    def write_lifecycle(self, event: Event) -> None:
        """Write a lifecycle event, which the counts leave out; never raises."""
        event.run_id = self.run_id
        try:
            data, bad = self._encoder.encode([event])
        except Exception as exc:
            data, bad = b"", [(event, f"{type(exc).__name__}: {exc}")]
        if bad:
            logger.error(
                "rollout_trace: %s of run %s could not be encoded and is not written: %s",
                type(event).__name__,
                self.run_id,
                bad[0][1],
            )
            return
        batch = Batch(0, _INF, self._add_written)
        for runner in self.runners:
            runner.submit(data, batch)

    def went_idle(self) -> None:
        """The run's threads wrote all they had: wake the loop it was opened on.

        A signal that arrives while the loop's thread drops the GIL on its way
        into the selector's wait (it hands the GIL over to a thread of ours
        that asked for it) only trips a flag: asyncio's SIGINT handler then
        runs when the loop next wakes, and nothing wakes an idle loop (asyncio
        sets no signal wakeup fd). One wake after our threads' work closes
        the window they opened; then the loop goes back to sleep.
        """
        ref = self.loop
        loop = None if ref is None else ref()
        if loop is None or not loop.is_running():  # (a stopped loop would pile them up)
            return
        now = time.monotonic()
        if now - self._woke_at < _WAKE_EVERY:
            self.wake_owed = True  # the writer's next idle timeout makes it
            return
        self._woke_at, self.wake_owed = now, False
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(_nothing)

    def notify(self) -> None:
        """Wake whoever waits (``wait_blocking``): a sink or the writer made progress."""
        with self._progress:
            self._progress.notify_all()

    def in_long_call(self, now: float) -> bool:
        """Whether the thread that writes a direct sink has been inside one of
        its calls for ``LONG_CALL`` or more: blocked in the system, which
        wants no GIL (a slow or hung sink), rather than waiting for it."""
        for r in self.runners:
            since = r.busy_real
            if r.direct and since is not None and now - since >= LONG_CALL:
                return True
        return False

    def check_stalls(self) -> None:
        """While a flush or close waits: give up a sink whose call has lasted too long."""
        now, real = self.monotonic(), time.monotonic()
        for runner in self.runners:
            runner.waited_on(real)
            runner.check_stall(now, self.config.close_timeout)

    @property
    def live_sinks(self) -> list[SinkRunner]:
        return [r for r in self.runners if r.live]

    @property
    def writer_stuck(self) -> bool:
        """The thread that writes to a direct sink is inside a call given up as hung."""
        return any(r.direct and r.stalled for r in self.runners)

    def give_up(self, next_seq: int, reason: str) -> None:
        """The close's deadline passed before the writer thread got to the close:
        fix the counts (``finalize``) and stop every sink at one instant.

        No write starts, and none is counted, after it: what the writer thread
        still holds is lost, and it does not write past the deadline. A call
        under way then (a direct sink's, or a sink thread's) may still finish;
        its events count as dropped. If the writer thread's own close has
        fixed the counts already, it has dealt with the sinks.
        """
        stopped: list[tuple[SinkRunner, list[FlushMark]]] = []
        with contextlib.ExitStack() as held:
            for runner in self.runners:
                held.enter_context(runner.lock)
            if self.final is None:
                for runner in self.runners:
                    marks = runner.stop_held(reason)
                    if marks is not None:
                        stopped.append((runner, marks))
                self.finalize(next_seq)
        for runner, marks in stopped:
            runner.report_stop(reason, marks)

    # --- steps: open, flush, close ----------------------------------------------

    def opening(self, specs: Sequence[SinkSpec], *, announce: bool = True) -> Steps[None]:
        """Build and open every sink, each in its thread, or none (``SinkOpenError``).

        Then write ``trace_opened``, unless ``announce`` is False: the caller
        calls ``announce()`` itself once it has said the run is open (a direct
        sink is written by the caller, and its first write may hang).
        """
        BatchEncoder.prepare((TraceOpened, TraceClosed))
        uris_sinks = build_sinks(specs, run_id=self.run_id, pid=self.pid, host=self.host)
        # A sink may fall this far behind (its thread waits for the GIL while
        # the program emits flat out) before it loses batches.
        cap = 2 * max(self.config.buffer, self.config.batch_size)
        direct = self.direct and len(uris_sinks) == 1
        self.runners = [
            SinkRunner(
                uri, sink, cap, self.notify, self.went_idle, direct=direct, clock=self.monotonic
            )
            for uri, sink in uris_sinks
        ]
        started: list[SinkRunner] = []
        try:
            for runner in self.runners:
                try:
                    runner.start()
                except RuntimeError as exc:  # no thread can be started (a limit, shutdown)
                    raise SinkOpenError(runner.uri, f"cannot start its thread: {exc}") from exc
                started.append(runner)
            within = open_within(self.config.close_timeout, specs)
            yield Wait(lambda: all(r.opened.is_set() for r in started), self.monotonic() + within)
            for runner in started:
                if not runner.opened.is_set():
                    raise SinkOpenError(runner.uri, f"did not open within {within:g} s")
                error = runner.open_error
                if error is not None:
                    reason = f"cannot open: {error}" if isinstance(error, OSError) else f"{error!r}"
                    raise SinkOpenError(runner.uri, reason) from error
        except BaseException as exc:
            # Nothing half-opened is left behind: the sinks that did open take
            # back what they made (a folder, an empty file), within a second.
            for runner in started:
                runner.live = False
                runner.discard()
            self.state = State.CLOSED
            if isinstance(exc, GeneratorExit):
                raise  # the open was cancelled: the threads discard on their own
            deadline = self.monotonic() + 1.0
            yield Wait(
                lambda: all(r.ended.is_set() for r in started if r.opened.is_set()), deadline
            )
            self.state = State.CLOSED
            raise
        self.state = State.OPEN
        if announce:
            self.announce()

    def _lifecycle_time(self) -> float:
        """The clock's time for a lifecycle line; a user's clock that reads 0
        or less, or no number, costs its own events only (they are invalid),
        never ``trace_opened`` or ``trace_closed``: they take the last good time."""
        t = self.clock()
        if type(t) in (int, float) and 0 < t < _INF:
            self._last_time = float(t)
        return self._last_time

    def announce(self) -> None:
        """Write ``trace_opened``, the run's first line."""
        self.write_lifecycle(
            TraceOpened(
                time=self._lifecycle_time(),
                seq=0,
                sdk_version=__version__,
                pid=self.pid,
                host=self.host,
                meta=dict(self.config.meta),
            )
        )

    def flushing(self, boundary: int) -> Steps[bool]:
        """Flush every live sink; ``True`` if every one wrote all before ``boundary``."""
        live = self.live_sinks
        mark = FlushMark(len(live))
        for runner in live:
            runner.mark(mark)

        def ready() -> bool:
            self.check_stalls()
            return mark.done.is_set()

        yield Wait(ready, _INF)
        return self.flushed_all(mark, boundary)

    def flushed_all(self, mark: FlushMark, boundary: int) -> bool:
        """Whether ``mark`` found every event before ``boundary`` in every live sink."""
        # The sinks still working when the flush is over answer for it, so
        # the answer does not depend on when another one's failure (reported
        # once, and in trace_closed.sinks) was noticed.
        if not mark.done.is_set() or self.first_lost < boundary:
            return False
        live = self.live_sinks
        return bool(live) and all(r.first_missing >= boundary for r in live)

    def closing(self, next_seq: int, deadline: float, drain_by: float) -> Steps[bool]:
        """Let the sinks write what they hold, write ``trace_closed``, close them.

        ``next_seq`` is the seq ``trace_closed`` takes: every seq below it was
        emitted. The sinks drain until ``drain_by`` (``drain_deadline``, fixed
        when the close was called). Returns whether everything happened
        before ``deadline``.
        """
        self.state = State.CLOSING

        def drained() -> bool:
            self.check_stalls()
            return all(r.idle for r in self.runners)

        yield Wait(drained, drain_by)
        for runner in self.runners:
            if not runner.idle:
                runner.fail("did not write what it held before the close deadline")
        # A sink that stages what it accepts (an object store) delivers it now,
        # so that trace_closed counts only what is really there.
        # A store that is down is tried again until the drain's share of the
        # deadline is over.
        staging = [r for r in self.runners if r.unsent]
        longest = 0.0  # the longest try so far
        while staging:
            began = self.monotonic()
            mark = FlushMark(len(staging))
            for runner in staging:
                runner.mark(mark)

            def delivered(mark: FlushMark = mark) -> bool:
                self.check_stalls()
                return mark.done.is_set()

            yield Wait(delivered, drain_by)
            staging = [r for r in staging if r.unsent]
            # Tried again only if a try as long as the longest so far still
            # ends by then: a try is not cut short (a direct sink's flush is
            # the sync tracer's writer thread), and one begun just before the
            # drain's end would hold the close past its deadline.
            now = self.monotonic()
            longest = max(longest, now - began)
            pause = min(RETRY_STAGED_S, drain_by - now - longest)
            if not staging or pause <= 0:
                break
            yield Wait(lambda: False, self.monotonic() + pause)
        for runner in staging:
            if runner.unsent:
                runner.fail(runner.undelivered_reason())
        final = self.finalize(next_seq)
        self.write_lifecycle(final)
        for runner in self.runners:
            runner.close()
        # A sink given up as hung has been reported; its thread is not waited for.
        waited = [r for r in self.runners if not r.stalled]
        yield Wait(lambda: all(r.ended.is_set() for r in waited), deadline)
        self.state = State.CLOSED
        stuck = [r.uri for r in waited if not r.ended.is_set()]
        if stuck:
            logger.warning(
                "rollout_trace: closing run %s took longer than its deadline; sink %s "
                "is left behind and may lack the end of the run and trace_closed",
                self.run_id,
                ", ".join(stuck),
            )
        return not stuck

    def finalize(self, next_seq: int) -> TraceClosed:
        """The run's ``trace_closed``; the first call fixes the counts for good.

        A close that gives up at its deadline calls it first, and what the
        writer still manages after that does not change what close reported.
        """
        if self.final is None:
            emitted = next_seq - 1
            self.final = TraceClosed(
                time=self._lifecycle_time(),
                seq=next_seq,
                emitted=emitted,
                written=self.written,
                dropped=emitted - self.written - self.invalid,
                invalid=self.invalid,
                sinks=[
                    SinkTally(uri=r.uri, written=r.written, error=r.trouble) for r in self.runners
                ],
            )
        return self.final

    # --- waiting, two ways --------------------------------------------------------

    def wait_blocking(
        self, wait: Wait, timeout: float | None = None, *, real_end: float = math.inf
    ) -> bool:
        """Block until the wait is over; ``False`` if ``timeout`` came first.

        Deadlines are on ``deadline_clock``; the wait itself goes in slices of
        real time, so a deadline a test's clock jumps past ends it at the next.
        ``real_end`` (``time.monotonic()``) ends it too, whatever that clock says.
        """
        clock = self.monotonic
        end = wait.deadline if timeout is None else min(wait.deadline, clock() + timeout)
        with self._progress:
            while not wait.ready():
                left = end - clock()
                if left <= 0:
                    return end == wait.deadline
                if time.monotonic() >= real_end:
                    return False
                # Woken by every acknowledgement; the slice bounds how late a
                # hung sink (or a deadline passed on a test's clock) is noticed.
                self._progress.wait(min(left, 0.05))
        return True

    async def wait_async(self, wait: Wait, *, patient: bool) -> int:
        """Poll until the wait is over, without waking while nothing is waited for.

        ``patient``: native asyncio cancellations (``Task.cancel()``, which an
        anyio shield does not stop) are taken and counted, not raised, so a
        close that has begun ends; the caller raises them afterwards. Otherwise
        a cancellation ends the wait at once (a flush bounded by its caller).
        """
        swallowed = 0
        delay = 0.0005
        clock = self.monotonic
        while not wait.ready():
            left = wait.deadline - clock()
            if left <= 0:
                break
            try:
                await anyio.sleep(min(delay, left))
            except BaseException as exc:
                if not (patient and is_cancellation(exc)):
                    raise
                swallowed += 1
            delay = min(delay * 2, 0.02)
        return swallowed


def _nothing() -> None:
    pass


# At most one wake of the loop per switch interval: a stream of urgent events
# drains the queue hundreds of times a second.
_WAKE_EVERY = 0.005


def drain_deadline(now: float, timeout: float) -> float:
    """When the drain of a close called at ``now`` with ``timeout`` ends.

    From the close's call, not from when the writer thread gets to it: a
    writer held up would push the drain into the time left for the rest.
    """
    return now + timeout * DRAIN_SHARE


def open_within(close_timeout: float, specs: Sequence[SinkSpec]) -> float:
    """How long the sinks of ``specs`` may take to open: ``close_timeout``, or
    longer for a sink that waits for a remote answer (``Sink.open_within``)."""
    return max([close_timeout, *(s.factory.open_within(dict(s.options)) for s in specs)])


def drive_blocking(engine: Engine, steps: Steps[T], *, real_s: float = math.inf) -> T:
    """Run ``steps`` on this thread, blocking through each wait; ``real_s``:
    the waits end that many seconds of real time from now at the latest."""
    real_end = time.monotonic() + real_s
    try:
        wait = next(steps)
        while True:
            engine.wait_blocking(wait, real_end=real_end)
            wait = steps.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        steps.close()


async def drive_async(engine: Engine, steps: Steps[T], *, patient: bool) -> tuple[T, int]:
    """Run ``steps`` on the event loop; returns their value and the native
    cancellations taken while ``patient``."""
    swallowed = 0
    try:
        wait = next(steps)
        while True:
            swallowed += await engine.wait_async(wait, patient=patient)
            wait = steps.send(None)
    except StopIteration as stop:
        return stop.value, swallowed
    finally:
        steps.close()  # cancelled mid-way: the steps clean up after themselves
