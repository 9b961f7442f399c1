"""Both tracers: one writer core, two thin facades.

``emit`` stamps ``time`` and ``run_id`` and appends the event to a deque: no
lock, no encoding, O(1) whatever is queued, urgent events included. One
writer thread per run numbers the events in the order the deque received
them, encodes and checks them (``Engine.process``) and hands the bytes to the
sinks, so a run's lines are in ``seq`` order however many threads emit, and
nothing of it runs on an event loop: a loop that is busy, or blocked by
synchronous code, is not held up by the writer and does not hold it up.

``_TracerCore`` holds everything but the waiting. What takes time (opening,
flushing, closing) is written once, as steps that yield ``Wait``s; the sync
tracer drives them blocking (``drive_blocking``), the async tracer polls them
from the event loop (``drive_async``), which keeps running meanwhile. A close
is carried out by the writer thread, so a caller interrupted while it waits
(Ctrl-C, a task cancelled twice) leaves a complete trace all the same.

A lone sink is written by the writer thread itself: handing each batch to a
thread of the sink's own would cost two more turns of the GIL per batch.
Several sinks write on threads of their own, so a hung one holds up neither
the writer nor the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import itertools
import math
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from itertools import repeat, starmap
from operator import itemgetter
from types import TracebackType
from typing import Any, NoReturn

import anyio

from rollout_trace.sinks import Sink

from .._errors import EventTagError, InvalidEventError, SinkOpenError, TracerStateError
from .._internals import peek_count
from .._schema.encoding import refusal
from .._schema.events import Event, tag_of
from .._schema.registry import REGISTRY, not_an_event_type
from . import hooks
from .attempts import Attempt
from .config import (
    DEFAULT_BATCH,
    DEFAULT_BUFFER,
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_FLUSH_INTERVAL,
    TraceCounts,
    TracerConfig,
)
from .engine import (
    Engine,
    State,
    Steps,
    Wait,
    drain_deadline,
    drive_async,
    drive_blocking,
    logger,
    open_within,
)
from .runner import FlushMark
from .specs import capture_strict

__all__ = ["SyncTracer", "Tracer", "sync_tracer", "tracer"]

# The most events the writer takes off the queue at once, and checks and
# encodes before its next write lets the GIL go: an event loop waiting for the
# GIL stalls that long, and a smaller slice costs more calls an event.
_SLICE = 2_048
# How long an emit waits for a writer starved of the GIL to take the queue.
HAND_OVER_S = 0.001
# Hand-overs that found the writer inside a sink's call are tried again this
# much later each time, up to the longest gap; one the writer took resets it.
_GAP_MAX = 0.1
# A run takes events in these states (opening: its sinks are being opened).
_RUNNING = (State.OPENING, State.OPEN)


def _no_limit(value: int) -> None:
    """``_set_limit`` before the first run has its own (an open cut short before it had one)."""


def _frozen_event(ev: object) -> TypeError:
    return TypeError(
        f"emit() cannot stamp the envelope of a frozen event ({type(ev).__qualname__}); "
        "define the event class without frozen=True"
    )


def _strictly(plain: Callable[[Event], None]) -> Callable[[Event], None]:
    """``plain`` emit, first raising for what the writer would refuse (strict mode).

    A separate function, so that a tracer that is not strict pays nothing.
    """
    types = REGISTRY.emit_types

    # Named emit, as the plain one is: the SIGTERM hook lets an emit be cut short.
    def emit(ev: Event) -> None:
        cls = type(ev)
        if cls not in types:
            REGISTRY.emit_type(cls)  # raises for a refused class, or no event class
        holder = REGISTRY.superseded_by(cls)
        if holder is not None:
            raise EventTagError(
                f"strict mode: event class {cls.__module__}.{cls.__qualname__} was defined "
                f"again, and its tag {tag_of(cls)!r} is now held by the new class "
                f"({holder.__module__}.{holder.__qualname__}): its lines would be read back "
                "as that class. Emit events of the class as it is now defined",
                tag=tag_of(cls),
                classes=(holder, cls),
            )
        reason = refusal(ev)
        if reason is not None:
            raise InvalidEventError(reason, event=ev)
        plain(ev)

    return emit


class EmitReport:
    """Says each kind of trouble once per run, and counts emits outside a run."""

    __slots__ = ("_outside", "_said", "lost_at_fork")

    def __init__(self) -> None:
        self._said: set[str] = set()
        # A child forked without fork hooks may have lost events it could not
        # count (see ``_TracerCore._forked``).
        self.lost_at_fork = False
        # Emits made while no run was open (before the first open, after a
        # close): no trace_closed counts them. A count is atomic from threads.
        self._outside = itertools.count()

    @property
    def outside_run(self) -> int:
        return peek_count(self._outside)

    def add_outside(self, n: int) -> None:
        if n > 0:  # advance the count by n, in C
            next(itertools.islice(self._outside, n - 1, n), None)

    def quiet(self, kind: str) -> None:
        """Say nothing more of ``kind`` (it was said another way)."""
        self._said.add(kind)

    def _once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._said:
            self._said.add(kind)
            logger.warning(message, *args)

    def new_run(self) -> None:
        """A new run says its own troubles again."""
        self._said.clear()

    def unchosen(self, name: str) -> None:
        self._once(
            "unchosen",
            "rollout_trace: %s left its block without a.seal(), a.refuse(reason) or "
            "a.drop(); it is recorded as attempt_abandoned(reason='dropped') (reported "
            "once a run; choose how each try ends)",
            name,
        )

    def full(self, buffer: int, run_id: str | None) -> None:
        # Said from the emit that dropped first, not from the writer: the
        # writer may be the part that is stuck.
        self._once(
            "full",
            "rollout_trace: the buffer of %d events is full, so new events are dropped "
            "(reported once; trace_closed counts them all): the sinks of run %s are "
            "slower than the program emits",
            buffer,
            run_id,
        )

    def not_open(self, *, closed: bool) -> None:
        next(self._outside)
        if closed:
            self._once(
                "closed",
                "rollout_trace: emit() on a closed tracer; the event is not written "
                "(reported once; counts.outside_run counts them)",
            )
        else:
            self._once(
                "new",
                "rollout_trace: emit() on a tracer that is not open yet; the event is not "
                "written (open it with `async with`/`with` first; reported once; "
                "counts.outside_run counts them)",
            )


class QueueMark:
    """Travels through the event queue. ``reached`` is set when the writer
    gets to it, or when the writer ends first (then ``mark`` stays ``None``);
    ``boundary`` is then the seq the next event would get."""

    __slots__ = ("boundary", "deadline", "drops", "mark", "reached")

    def __init__(self, deadline: float = math.inf) -> None:
        self.boundary = 0
        self.deadline = deadline
        self.drops = 0  # the run's drops counted when it was queued: numbered before it
        self.mark: FlushMark | None = None
        self.reached = threading.Event()


class CloseMark(QueueMark):
    """The close, queued; ``drain_by``: when its drain ends (``drain_deadline``)."""

    __slots__ = ("drain_by",)

    def __init__(self, deadline: float = math.inf, drain_by: float | None = None) -> None:
        super().__init__(deadline)
        self.drain_by = deadline if drain_by is None else drain_by


class WriterRun:
    """One run: its engine, queue and numbering, and its writer thread.

    The writer thread is handed its run when it starts and touches nothing
    else of the tracer's: a close that gives a run up at its deadline leaves
    the thread behind (inside a hung or slow call), and the tracer may open
    again meanwhile. When the call returns, the thread ends this run, and only
    this one: it writes nothing more, closes the sink and ends.
    """

    __slots__ = (
        "abandoned",
        "after",
        "catch_up_to",
        "caught_up",
        "close_mark",
        "drops",
        "drops_folded",
        "engine",
        "gap",
        "handed_at",
        "marks",
        "marks_popped",
        "marks_queued",
        "next_seq",
        "open_error",
        "opened",
        "queue",
        "taken",
        "taken_at",
        "thread",
        "urgent",
        "waited",
        "wake_flag",
        "woken_at",
        "writer_done",
    )

    def __init__(self, engine: Engine, waited: bool) -> None:
        self.engine = engine
        self.waited = waited  # someone waits for the open and raises its failure
        self.queue: deque[Event | QueueMark] = deque()
        # Marks queued and not yet handled by the writer (looked for among
        # the items it drains); each is released (``reached``) by then.
        self.marks: list[QueueMark] = []
        self.marks_queued = 0  # marks ever queued, and taken off the queue by the writer
        self.marks_popped = 0
        self.close_mark: CloseMark | None = None
        self.drops = itertools.count()  # emits dropped at a full buffer (emitting threads)
        self.drops_folded = 0  # ... of which the writer has given seqs
        self.next_seq = 1  # the writer's
        self.wake_flag = threading.Event()
        self.urgent = False
        # Set, with the time, whenever the writer takes events off the queue.
        self.taken = threading.Event()
        self.taken_at = 0.0
        self.handed_at = 0.0  # when an emit last handed the GIL over
        self.gap = 0.0  # the least time between hand-overs (0: a switch interval)
        # Set by the writer once the queue is down to ``catch_up_to`` events.
        self.caught_up = threading.Event()
        self.catch_up_to = -1
        self.woken_at = 0.0  # when an emit last woke the idle writer
        self.opened = threading.Event()
        # A run given up while its sinks opened, whose writer thread may still
        # be discarding them (an empty file it made): this one opens after it.
        self.after: WriterRun | None = None
        self.writer_done = False  # the writer thread has handled its last mark
        self.open_error: BaseException | None = None
        # The close gave the run up at its deadline: its counts are fixed, its
        # sinks stopped; the writer thread only ends it.
        self.abandoned = False
        self.thread: threading.Thread | None = None

    def emitted_so_far(self) -> int:
        # Read from any thread: the writer's numbers, the drops it has not
        # numbered yet, and the events that wait in the queue.
        unfolded = peek_count(self.drops) - self.drops_folded
        marks = self.marks_queued - self.marks_popped
        return self.next_seq - 1 + unfolded + max(0, len(self.queue) - marks)

    def reach(self, mark: QueueMark) -> None:
        mark.reached.set()
        self.engine.notify()


def _disabled_emit(ev: Event) -> None:
    # A disabled tracer writes nothing, yet refuses what an enabled one
    # refuses: a mistake must not wait for $ROLLOUT_TRACE to show.
    if not isinstance(ev, Event):
        raise not_an_event_type(type(ev))


class _TracerCore:
    """Everything a tracer is but the waiting: its configuration and state,
    ``emit``, the run's queue and writer thread, and the steps of opening,
    flushing and closing, which the facades drive their own way."""

    run_id: str | None
    _run: WriterRun
    _pid: int
    _set_limit: Callable[[int], None]

    def __init__(self, config: TracerConfig) -> None:
        self._config = config
        self._specs = config.specs()
        self._state = State.NEW
        self._sinks: list[Sink] = []
        self._report = EmitReport()
        # The t.attempt(...) blocks running, in dispatch order: ended at the
        # close (``close_out``).
        self._attempts: dict[Attempt, None] = {}
        self.run_id = None
        # The open run's: the tracer's own, or that of a strict capture_events().
        self._strict = config.strict
        if not config.enabled:
            self._set_emit(_disabled_emit)
            return
        self._lock = threading.RLock()
        self._pid = os.getpid()  # the process the tracer's runs are of
        self._behind: WriterRun | None = None  # a run given up as it opened
        self._set_emit(self._emit_idle)
        self._set_limit = _no_limit
        hooks.track_enabled(self)

    # --- emit and attempt: the calls a controller makes --------------------------

    def emit(self, ev: Event) -> None:
        """Record ``ev``: stamp its envelope (``time``, ``run_id``) and queue it; O(1).

        Callable from any thread and, for the async tracer, from any task: it
        never awaits, never blocks and never raises for I/O trouble. An event
        that cannot be written is counted in ``trace_closed`` (``dropped``:
        a full buffer, a closed tracer, the close deadline; ``invalid``: a
        value its field does not allow) and reported once through the
        ``rollout_trace`` logger. Raises ``TypeError`` at once for anything
        that is not an ``rt.Event``, ``rt.EventTagError`` for a refused
        class, and, on a strict tracer, ``rt.InvalidEventError`` for an
        event it would count invalid. Returns ``None``.
        """
        # Each tracer holds its own emit, made for its open run (``_set_emit``),
        # which shadows this method: this body runs only when called through
        # the class, as ``rt.Tracer.emit(t, ev)``.
        self.__dict__["emit"](ev)

    def _set_emit(self, emit: Callable[[Event], None]) -> None:
        # An instance attribute: one lookup and a direct call on the hot path
        # (a function on the class is a non-data descriptor, so this wins).
        self.__dict__["emit"] = emit

    def attempt(
        self,
        *,
        group_id: str,
        prompt_id: int | str,
        generation_index: int,
        attempt: int,
        weight_version: int,
    ) -> Attempt:
        """One try's lifecycle: ``async with t.attempt(...) as a:`` (``with`` on a sync tracer).

        Entering emits ``attempt_dispatched`` with these fields; exactly one
        end event follows: ``a.seal()``, ``a.refuse(reason)`` or ``a.drop()``
        as the body chooses, else ``attempt_abandoned`` with reason
        ``failed`` (an exception) or ``cancelled`` (a cancellation, Ctrl-C),
        re-raised, or ``dropped`` with a warning when the block is left
        without a choice. See ``rt.Attempt``.
        """
        return Attempt(self, group_id, prompt_id, generation_index, attempt, weight_version)

    def _unchosen(self, name: str) -> None:
        """An attempt block was left without a choice (recorded as dropped)."""
        if self._strict:
            raise TracerStateError(
                f"{name} left its block without a.seal(), a.refuse(reason) or a.drop(); "
                "it is recorded as attempt_abandoned(reason='dropped')"
            )
        if self._config.enabled:
            self._report.unchosen(name)

    # --- what every tracer shows ----------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether this tracer writes anything (``False``: every call does nothing)."""
        return self._config.enabled

    @property
    def uris(self) -> tuple[str, ...]:
        """The sink URIs, as given (or as read from ``$ROLLOUT_TRACE``)."""
        return self._config.uris

    @property
    def state(self) -> str:
        """``new``, ``opening``, ``open``, ``closing`` or ``closed``."""
        return self._state.value

    @property
    def sinks(self) -> list[Sink]:
        """The sinks of the open or last run (``t.sinks[0].lines()`` of a ``memory://``)."""
        return list(self._sinks)

    @property
    def counts(self) -> TraceCounts:
        """This run's counts so far, as ``trace_closed`` gives them (zeros before the open)."""
        outside = self._report.outside_run
        run: WriterRun | None = getattr(self, "_run", None)
        if self._state is State.NEW or run is None or run.open_error or self._parents(run):
            return TraceCounts(outside_run=outside)
        unnumbered = max(0, peek_count(run.drops) - run.drops_folded)
        return run.engine.counts(run.emitted_so_far(), outside, unnumbered)

    def __repr__(self) -> str:
        uris = ", ".join(self._config.uris) or "disabled"
        name = type(self).__name__
        return f"<rollout_trace.{name} {self.state} run_id={self.run_id} sinks=[{uris}]>"

    @staticmethod
    def _parents(run: WriterRun) -> bool:
        """Whether ``run`` is another process's (this one is a forked child)."""
        return run.engine.pid != os.getpid()

    def _settled(self) -> bool:
        """``flush()``'s answer when no run is open: was nothing emitted lost?"""
        if not self._config.enabled:
            return True
        if self._report.outside_run or self._report.lost_at_fork:
            return False
        run: WriterRun | None = getattr(self, "_run", None)
        if self._state is State.NEW or run is None or self._parents(run):
            return True  # no run yet (or closed before one; or a forked child's)
        final = run.engine.final
        return final is not None and final.dropped == 0 and not any(t.error for t in final.sinks)

    # --- emit ---------------------------------------------------------------

    def _make_emit(self) -> tuple[Callable[[Event], None], Callable[[int], None]]:
        # A closure over the run's state: no attribute lookups on the hot path.
        run = self._run
        queue = run.queue
        append = queue.append
        # Bound to this run: an emit kept from it must not touch a later run.
        on_full = functools.partial(self._on_full, run)
        wake = functools.partial(self._wake, run)
        batch_size = self._config.batch_size
        types = REGISTRY.emit_types
        admit = REGISTRY.emit_type
        now = self._config.clock
        copy_event = copy.copy
        run_id = run.engine.run_id
        # Closing sets it to 0, so that every later emit (even through an old
        # reference) is counted by on_full.
        limit = self._config.buffer

        def emit(ev: Event) -> None:
            try:
                urgent = types[type(ev)]
            except KeyError:  # a class not emitted before, or no event at all: raises
                urgent = admit(type(ev))
            if ev.run_id:
                # Emitted before: the queued object keeps its own envelope.
                ev = copy_event(ev)
            try:
                ev.time = now()
                ev.run_id = run_id
            except AttributeError:
                raise _frozen_event(ev) from None
            if len(queue) >= limit:
                on_full()
                return
            # The writer numbers events in the order they arrive here.
            append(ev)
            # Read after the append: the writer cannot drain the queue and go
            # to sleep between this read and the event's arrival.
            n = len(queue)
            if n == 1 or urgent or not n % batch_size:
                wake(n, urgent, ev)

        def set_limit(value: int) -> None:
            nonlocal limit
            limit = value

        # Decided as the run opens: a strict capture_events() around the open counts.
        self._strict = self._config.strict or bool(capture_strict and capture_strict[-1])
        chosen: Callable[[Event], None] = _strictly(emit) if self._strict else emit
        chosen.__doc__ = _TracerCore.emit.__doc__  # what help(t.emit) shows
        return chosen, set_limit

    def _wake(self, run: WriterRun, n: int, urgent: bool, ev: Event) -> None:
        if self._forked(kept=1):
            # A child forked without fork hooks (a C-level fork): the parent's
            # writer is not here to wake or to hand anything over to. This
            # event is counted as outside any run, as every later one is.
            self.emit(ev)
            return
        if urgent:
            run.urgent = True
        # The loop that emits is the one our threads must wake (a sync tracer
        # opened before it, or on another thread, does not know it).
        loop = asyncio._get_running_loop()
        if loop is not None:
            held = run.engine.loop
            if held is None or held() is not loop:
                run.engine.loop = weakref.ref(loop)
        behind = n > self._config.buffer // 2
        if n > self._config.batch_size and self._starved(run, behind):
            self._hand_over(run, self._switch if behind else 0.0, self._config.buffer // 4)
        elif not run.wake_flag.is_set():
            run.woken_at = time.monotonic()
            run.wake_flag.set()

    def _starved(self, run: WriterRun, behind: bool) -> bool:
        """Whether to hand the writer the GIL: it was woken and has taken nothing
        for two switch intervals, or the queue holds an eighth of the buffer
        (``behind``).

        A thread that waits for the GIL gets it within one interval from a thread
        that runs flat out, but an event loop drops and retakes it at every poll
        of its selector, and the waiting thread's interval starts over each
        time: two intervals without a take means it is kept from the GIL. And a
        writer given the GIL once an interval writes one slice each time, less
        than an emitter running flat out makes: a long queue means it falls
        behind, however recently it took. At most once a switch interval (less
        often after hand-overs the writer did not take: it was inside a sink's
        call, which wants no GIL)."""
        now = time.monotonic()
        if now - run.handed_at <= max(self._switch, run.gap) or run.engine.in_long_call(now):
            return False
        if behind or (
            now - max(run.taken_at, run.woken_at) > 2 * self._switch and run.wake_flag.is_set()
        ):
            run.handed_at = now
            return True
        return False

    @staticmethod
    def _hand_over(run: WriterRun, catch_up_s: float, target: int) -> None:
        """Let the writer have the GIL: wait without it until the writer has
        taken the queue, at most ``HAND_OVER_S`` (a thread waiting for the GIL
        takes it within microseconds of its release); with ``catch_up_s``, until
        it has written the queue down to ``target`` events, at most that long
        (it falls behind: the program is slowed to its pace rather than losing
        events). Only this thread's own wait changes: nothing of the
        interpreter's is set. A writer that took nothing (inside a sink's call,
        which wants no GIL) is handed it again only after twice the gap."""
        run.taken.clear()
        if catch_up_s:
            run.caught_up.clear()
            run.catch_up_to = target
            run.caught_up.wait(catch_up_s)
            run.catch_up_to = -1
        else:
            run.taken.wait(HAND_OVER_S)
        if run.taken.is_set():
            run.gap = 0.0
        else:
            run.gap = min(_GAP_MAX, max(run.gap * 2, 0.01))

    def _on_full(self, run: WriterRun) -> None:
        # (A forked child whose copy of the queue is full wakes no writer: it
        # notices here.)
        if run is self._run and self._state in _RUNNING and not self._forked():
            # Dropped; the writer gives it a seq of the run, never written,
            # so trace_closed counts it.
            next(run.drops)
            self._report.full(self._config.buffer, self.run_id)
        else:
            self._report.not_open(closed=True)

    def _emit_idle(self, ev: Event) -> None:
        # ``emit`` while no run is open: opens one (the sync tracer's first
        # emit), hands on to the open run's (a caller held this method from
        # before the open), or counts the event as outside any run.
        if type(ev) not in REGISTRY.emit_types:
            REGISTRY.emit_type(type(ev))  # raises for anything that cannot be emitted
        if self._state is State.NEW and not self._forked():
            self._open_lazily()
        if self._state in _RUNNING:
            # A caller held this method from before the open: hand it on.
            self.emit(ev)
            return
        self._report.not_open(closed=self._state is not State.NEW)

    def _open_lazily(self) -> None:
        """The sync tracer opens on its first emit; the async one only by ``async with``."""

    def _forked(self, kept: int = 0) -> bool:
        """In a child forked by something that runs no fork hooks (a C-level
        fork): the parent's run is not this process's; the tracer goes quiet.

        Checked at every emit that wakes the writer (one that starts or fills
        a batch, an urgent one), at flush and at close rather than at every
        emit: ``os.getpid()`` is a system call; and before any lock is taken,
        since a thread of the parent may have held it at the fork.

        The tracer starts no thread here by itself: CPython does not make
        itself ready for threads in such a child (one started there can hang
        it for good), so no run opens lazily (``open()`` still opens one), and
        emits are counted in ``counts.outside_run``, quietly (the parent's
        threads may have held the logging module's locks). What the child
        emitted before it noticed is in the queue it copied, behind the
        parent's waiting events, and cannot be told from them: it is lost
        uncounted, and ``flush()`` says ``False`` while no run is open.
        ``kept``: events at the queue's end that the caller counts itself.
        """
        if self._state in (State.NEW, State.CLOSED):  # asked before an open
            if os.getpid() == self._pid:
                return False
            self._lock = threading.RLock()
            self._pid = os.getpid()
            self._behind = None  # the parent's thread, not this process's
            if self._state is State.CLOSED:
                return False  # nothing of the parent's to leave; open() opens
            self._report.quiet("closed")
            self._leave_the_parents_run(State.CLOSED)
            return True
        if self._state not in (*_RUNNING, State.CLOSING) or os.getpid() == self._pid:
            return False
        self._lock = threading.RLock()  # (see after_fork)
        queue = self._run.queue
        if len(queue) > kept:
            # Events (not marks) queued before the caller's: maybe the child's.
            unknown = sum(1 for item in list(queue) if isinstance(item, Event))
            self._report.lost_at_fork = self._report.lost_at_fork or unknown > kept
        self._report.quiet("closed")
        self._leave_the_parents_run(State.CLOSED)
        return True

    def after_fork(self) -> None:
        """In a forked child: forget the parent's run; open a new one on the first emit."""
        # Another thread of the parent may have held the lock at the fork (it
        # was opening this tracer, or it was the writer): in the child nobody
        # would ever release it.
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._behind = None  # the parent's thread, not this process's
        if self._state in (State.NEW, State.CLOSED):
            return
        self._leave_the_parents_run(State.NEW)

    def _leave_the_parents_run(self, state: State) -> None:
        # The parent's queue, threads and sinks are left untouched: closing
        # them here could write the parent's data a second time. An emit kept
        # from the parent's run counts its events as outside any run.
        self._set_limit(0)
        self._state = state
        self.run_id = None
        self._behind = None  # the parent's thread, not this process's
        self._set_emit(self._emit_idle)

    # --- opening ------------------------------------------------------------

    def _new_run(self, *, waited: bool) -> WriterRun:
        """A run not started yet. ``waited``: the caller waits for the open and
        raises what fails; otherwise (a lazy open) a failure is logged, once."""
        return WriterRun(Engine(self._config, direct=True), waited)

    def _start(self, run: WriterRun) -> None:
        """Make ``run`` the tracer's: its queue takes events at once; its writer
        thread opens the sinks. Called with the lock held; a caller interrupted
        in here (Ctrl-C) undoes it with ``_abort_open``."""
        engine = run.engine
        run.after, self._behind = self._behind, None
        run.engine.loop = _running_loop()
        self._run = run
        self._pid = engine.pid
        self._switch = sys.getswitchinterval()
        self._report.new_run()
        self.run_id = engine.run_id
        emit, self._set_limit = self._make_emit()
        self._set_emit(emit)
        # Events are queued from now on; the run is "open" once its sinks are.
        self._state = State.OPENING if run.waited else State.OPEN
        thread = threading.Thread(
            target=self._writer,
            args=(run,),
            name=f"rollout_trace writer {engine.run_id[:8]}",
            daemon=True,
        )
        run.thread = thread
        try:
            thread.start()
        except RuntimeError as exc:  # a thread limit, or the interpreter shutting down
            uris = ", ".join(self._config.uris)
            self._fail_open(run, SinkOpenError(uris, f"cannot start the writer thread: {exc}"))
            return
        hooks.track(self)

    def _opening(self, run: WriterRun) -> Steps[None]:
        """Wait for the writer thread to open the sinks; raise what it could not open."""
        # The sinks' own open bound, plus the writer's wait for a given-up run.
        close_timeout = self._config.close_timeout
        within = open_within(close_timeout, self._specs) + close_timeout + 1
        yield Wait(
            lambda: run.opened.is_set() or run.open_error is not None,
            self._config.deadline_clock() + within,
        )
        if run.open_error is None and not run.opened.is_set():
            # The sinks open on the writer thread, each within close_timeout.
            self._fail_open(
                run, SinkOpenError(", ".join(self._config.uris), "did not open in time")
            )
        if run.open_error is not None:
            raise run.open_error
        with self._lock:
            if run is self._run and self._state is State.OPENING:
                self._state = State.OPEN

    def _fail_open(self, run: WriterRun, exc: BaseException) -> bool:
        """The run never opened: emit counts quietly, flush and close return at once.

        ``False`` if it did open meanwhile (the writer serves it): the caller
        closes it instead.
        """
        with self._lock:
            if run.open_error is not None:
                return True
            if run.opened.is_set():
                return False
            run.open_error = exc
            if run.thread is not None:  # started, or being started
                self._behind = run
            if not run.waited:
                logger.warning("rollout_trace: tracing is off for this process: %s", exc)
            if run is not self._run:  # given up before; the tracer has opened again since
                return True
            self._state = State.CLOSED
            self._set_limit(0)
            # The run never was: what was emitted into it belongs to no run.
            queued = sum(1 for item in list(run.queue) if isinstance(item, Event))
            self._report.add_outside(peek_count(run.drops) + queued)
            self._report.quiet("closed")  # this was said already, as the open's failure
            run.queue.clear()
            self._set_emit(self._emit_idle)
        hooks.untrack(self)
        self._release_marks(run, forget=True)
        return True

    def _abort_open(self, run: WriterRun, exc: BaseException) -> bool:
        """An open interrupted part way (Ctrl-C) ends its run here: the tracer is
        left closed, never half-open (``opening`` for good, or a run whose
        writer thread never started, which a close would wait for in vain).

        ``False`` if the writer thread had opened the sinks already: the run is
        then served as any other (tracked, so that exit closes it), and the
        caller closes it or keeps it.
        """
        if self._fail_open(run, exc):
            return True
        hooks.track(self)  # (the interruption may have come before it)
        return False

    # --- flushing -----------------------------------------------------------

    def _flushing(self, timeout: float | None) -> Steps[bool]:
        if self._forked() or self._state not in _RUNNING:
            return self._settled()
        end = math.inf if timeout is None else self._config.deadline_clock() + timeout
        mark = QueueMark()
        run = self._run
        self._enqueue(run, mark)
        engine = run.engine
        yield Wait(lambda: self._reached(run, mark.reached), end)
        if not mark.reached.is_set() or mark.mark is None:
            return False  # out of time, or the writer ended first
        flush = mark.mark
        yield Wait(lambda: self._reached(run, flush.done), end)
        return engine.flushed_all(flush, mark.boundary)

    @staticmethod
    def _reached(run: WriterRun, event: threading.Event) -> bool:
        """Whether ``event`` is set; a hung sink is given up meanwhile, and a
        writer stuck in a call to one sets nothing more (so: done)."""
        if event.is_set():
            return True
        run.engine.check_stalls()
        return run.engine.writer_stuck

    # --- closing ------------------------------------------------------------

    def begin_close(self, timeout: float | None = None) -> CloseMark | None:
        """Hand the writer the close; later emits belong to no run. The mark
        of the close under way, if one is (begun by another thread)."""
        if not self._config.enabled:
            return None
        self._forked()  # before the lock: in a forked child, the parent's may be held
        if self._state in _RUNNING:
            # A try still running (a sibling that gather() did not cancel)
            # ends in the run, as cancelled, rather than go unended.
            for running in list(self._attempts):
                running.close_out()
        with self._lock:
            if self._state is State.NEW:
                # Closed before it ever opened: a later emit opens nothing.
                self._state = State.CLOSED
                return None
            if self._state is State.CLOSING:
                return self._run.close_mark
            if self._state not in _RUNNING:
                return None
            # What was queued before the close mark is the run's.
            self._state = State.CLOSING
            self._set_limit(0)
            limit = self._config.close_timeout if timeout is None else timeout
            now = self._config.deadline_clock()
            mark = CloseMark(now + limit, drain_deadline(now, limit))
            self._run.close_mark = mark
            self._enqueue(self._run, mark)
            return mark

    def _closing(self, mark: CloseMark) -> Steps[None]:
        """Wait for the writer thread to close the run; give it up at the deadline."""
        run = self._run
        yield Wait(lambda: self._reached(run, mark.reached), mark.deadline)
        if not mark.reached.is_set():
            self._give_up(run, mark)
        self._closed(run)

    def finish_close(self, mark: CloseMark, *, real_s: float = math.inf) -> None:
        """``begin_close()``'s second half, blocking (the exit and SIGTERM hooks).
        ``real_s``: the run is given up that many seconds of real time from now
        at the latest, however the deadline clock (a test's) moves."""
        drive_blocking(self._run.engine, self._closing(mark), real_s=real_s)

    def _give_up(self, run: WriterRun, mark: CloseMark) -> None:
        stuck = run.engine.writer_stuck
        # From now on the writer thread writes nothing of this run: what it
        # still holds, and a call it is inside, count as dropped. When it gets
        # out, it closes the sinks and ends.
        run.abandoned = True
        run.engine.give_up(
            mark.boundary or run.emitted_so_far() + 1,
            "did not write what it held before the close deadline",
        )
        logger.warning(
            "rollout_trace: closing run %s %s; what was not written by then is lost and "
            "trace_closed may be missing",
            run.engine.run_id,
            "gave up: its sink hangs in a call" if stuck else "took longer than its deadline",
        )

    def _closed(self, run: WriterRun) -> None:
        """The run is over (closed by its writer thread, or given up)."""
        with self._lock:
            if run is self._run and self._state is State.CLOSING:
                self._state = State.CLOSED
                self._set_emit(self._emit_idle)
                hooks.untrack(self)
        # Nobody waits on a flush of the run in vain; the writer thread, if it
        # ever gets out of its call, still finds the marks in its queue.
        self._release_marks(run)

    # --- the queue's marks ----------------------------------------------------

    def _enqueue(self, run: WriterRun, mark: QueueMark) -> None:
        with self._lock:
            run.marks.append(mark)
            run.marks_queued += 1
            # A run given up serves no mark, whether its writer ran or not.
            done = run.writer_done or run.open_error is not None
            # An event dropped before the call is one the mark must account for.
            mark.drops = peek_count(run.drops)
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
        run.engine.notify()

    # --- the writer thread --------------------------------------------------
    # Everything here works on the run handed to the thread, never on the
    # tracer's current one: a close may give this run up and the tracer open
    # another while this thread is still inside a sink's call.

    def _writer(self, run: WriterRun) -> None:
        hooks.keep_signals_off_this_thread()
        after = run.after
        run.after = None
        if after is not None and after.thread is not None:
            # Its sinks' discard (an empty file it made, by path) must not
            # take what this run opens at the same path. A thread that has not
            # begun yet finds its run given up below and opens nothing.
            with contextlib.suppress(RuntimeError):  # (not begun)
                after.thread.join(self._config.close_timeout)
        with self._lock:
            if run.open_error is not None:  # given up before it began
                self._release_marks(run, writer_done=True)
                return
        try:
            self._open_and_serve(run)
        finally:
            self._release_marks(run, writer_done=True)

    def _open_and_serve(self, run: WriterRun) -> None:
        engine = run.engine
        try:
            drive_blocking(engine, engine.opening(self._specs, announce=False))
        except BaseException as exc:
            self._fail_open(run, exc)
            engine.notify()
            return
        with self._lock:
            # Decided under the lock with the opener's _fail_open: either it
            # gave the run up, or the run is open and it will close it.
            given_up = run.open_error is not None
            if not given_up:
                self._sinks = [r.sink for r in engine.runners]
                run.opened.set()
        engine.notify()
        if given_up:
            for runner in engine.runners:
                runner.live = False
                runner.discard()
            for runner in engine.runners:
                runner.ended.wait(self._config.close_timeout)
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
            fill = True
            if not queue:
                # Idle until an emit starts a batch. The timeout catches a
                # wake-up that threads appending at once both left to the
                # other: what came then has waited long enough.
                fill = wake.wait(interval)
            wake.clear()
            if fill and 0 < len(queue) < batch_size and not (run.urgent or run.marks):
                # A batch has started: give it the flush interval to fill up,
                # unless it fills, an urgent event comes or a mark waits.
                wake.wait(interval)
                wake.clear()
            run.urgent = False
            had = bool(queue)
            close = self._drain(run)
            if close is not None:
                return close
            if (had and any(r.direct for r in run.engine.runners)) or run.engine.wake_owed:
                run.engine.went_idle()  # (a sink's own thread says so after its writes)

    @staticmethod
    def _fold_drops(run: WriterRun, dropped: int) -> None:
        """Number ``dropped`` drops here, in the order of the run."""
        if dropped > 0:
            run.drops_folded += dropped
            run.engine.note_lost(dropped, run.next_seq)
            run.next_seq += dropped

    @staticmethod
    def _write(run: WriterRun, events: list[Any]) -> None:
        for start in range(0, len(events), _SLICE):
            part = events[start : start + _SLICE]
            seq = run.next_seq
            run.next_seq = seq + len(part)
            if not run.abandoned:  # given up: its counts are fixed, nothing more is written
                run.engine.process(part, seq)

    def _drain(self, run: WriterRun) -> CloseMark | None:
        """Write everything queued; handle marks in order. Returns the close mark.

        A drop at a full buffer has no place in the queue: it is numbered
        before the first mark queued after it was counted (so a flush then
        says False), and otherwise once the queue is empty.
        """
        queue = run.queue
        pop = queue.popleft
        engine = run.engine
        while queue:
            # starmap runs popleft in C: a third of the cost of a comprehension.
            items: list[Any] = list(starmap(pop, repeat((), min(len(queue), _SLICE))))
            run.taken_at = time.monotonic()
            run.taken.set()
            marks = self._marks_in(run, items) if run.marks else []
            run.marks_popped += len(marks)
            start = 0
            for i, item in marks:
                self._write(run, items[start:i])
                start = i + 1
                self._fold_drops(run, item.drops - run.drops_folded)
                item.boundary = run.next_seq
                if isinstance(item, CloseMark):
                    self._late(run, items[start:])
                    return item
                if not run.abandoned:
                    item.mark = engine_mark = FlushMark(len(engine.live_sinks))
                    for runner in engine.live_sinks:
                        runner.mark(engine_mark)
                with self._lock:
                    if item in run.marks:
                        run.marks.remove(item)
                run.reach(item)
            self._write(run, items[start:] if start else items)
            if len(queue) <= run.catch_up_to:
                run.caught_up.set()
        self._fold_drops(run, peek_count(run.drops) - run.drops_folded)
        run.caught_up.set()
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
            with contextlib.suppress(ValueError):  # not there: in a later slice
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
            run.reach(mark)
            return
        drive_blocking(engine, engine.closing(mark.boundary, mark.deadline, mark.drain_by))
        # A drop that raced the close mark: after trace_closed's numbers.
        self._report.add_outside(peek_count(run.drops) - run.drops_folded)
        self._closed(run)
        run.reach(mark)


def _running_loop() -> weakref.ref[asyncio.AbstractEventLoop] | None:
    """The asyncio loop running in this thread, if any (``Engine.went_idle``)."""
    loop = asyncio._get_running_loop()  # None in a thread, or under trio
    return None if loop is None else weakref.ref(loop)


# What help(t.emit) shows, whichever emit a tracer holds now (disabled, no
# run open, or its run's own).
_disabled_emit.__doc__ = _TracerCore._emit_idle.__doc__ = _TracerCore.emit.__doc__


class SyncTracer(_TracerCore):
    """A tracer for threads, sync code and Ray actors; build it with ``rt.sync_tracer()``.

    ``emit(event)`` may be called from any thread at once: it stamps the
    envelope and appends to a queue (no lock), waking the writer thread when
    a batch starts or fills. It never blocks and never raises for I/O
    trouble. The first ``emit`` opens a tracer not opened yet (``with`` or
    ``open()`` open it at once, and raise what cannot be opened).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # A tracer travels as its configuration and opens lazily where it lands,
        # with a run_id of its own.
        return (SyncTracer, (self._config,))

    def open(self) -> SyncTracer:
        """Open the sinks and start the writer thread now; raise if a sink cannot open.

        ``with`` calls it; without it, the first ``emit`` opens the tracer and
        an error is logged once instead. Opening an open tracer does nothing;
        opening a closed one starts a new run (after the close under way, if
        one is, has ended).
        """
        if not self._config.enabled:
            return self
        self._forked()  # (then closed: a new run opens)
        run: WriterRun | None = None
        try:
            while True:
                with self._lock:
                    if self._state is State.CLOSING:
                        mark = self._run.close_mark
                    elif self._state in (State.NEW, State.CLOSED):
                        run = self._new_run(waited=True)
                        self._start(run)
                        break
                    else:
                        return self
                if mark is not None:
                    self.finish_close(mark)
            drive_blocking(run.engine, self._opening(run))
        except BaseException as exc:
            # Ctrl-C (or a sink's failure) part way: the tracer ends closed,
            # and open() starts a new run.
            if run is not None and not self._abort_open(run, exc):
                self.close()
            raise
        return self

    def __enter__(self) -> SyncTracer:
        return self.open()

    async def __aenter__(self) -> NoReturn:
        raise TypeError(
            "rt.sync_tracer() is a sync tracer: use a plain `with rt.sync_tracer(...)`, "
            "or `async with rt.tracer(...)` in async code"
        )

    async def __aexit__(self, *exc_info: object) -> None:  # pragma: no cover - __aenter__ raises
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open_lazily(self) -> None:
        with self._lock:
            if self._state is State.NEW:
                run = self._new_run(waited=False)
                try:
                    self._start(run)
                except BaseException as exc:  # Ctrl-C in the emit that opens
                    # Not the sinks' failure: the emit raises it, and the next
                    # emit opens again (nothing to log, no run to keep).
                    run.waited = True
                    if self._abort_open(run, exc) and self._run is run:
                        self._state = State.NEW
                    raise

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every event emitted before the call, from any thread, is written.

        Returns ``True`` only if every live sink wrote every one of them;
        ``False`` if ``timeout`` passed first, an event was dropped, a sink
        failed or the run closed. A hung sink is given up after
        ``close_timeout``, so even ``timeout=None`` returns. At once for a
        tracer that is not open.
        """
        run: WriterRun | None = getattr(self, "_run", None)
        steps = self._flushing(timeout)
        if run is None:
            return self._settled()
        return drive_blocking(run.engine, steps)

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued and ``trace_closed``, close the sinks; idempotent.

        One deadline (``timeout``, default the tracer's ``close_timeout``)
        covers the drain and the sinks' close; what is not written by then is
        counted as dropped, and the threads are left to end on their own.
        The writer thread carries the close out: interrupted while it waits
        (Ctrl-C), the close still ends, and ``close()`` again waits for it.
        """
        mark = self.begin_close(timeout)
        if mark is not None:
            self.finish_close(mark)


class Tracer(_TracerCore):
    """An async tracer; open it with ``async with``. Build it with ``rt.tracer()``.

    ``emit(event)`` is synchronous and O(1): it stamps the envelope and
    appends the event to the run's queue; a writer thread of the run's own
    encodes and writes, so nothing of the tracer's runs on the event loop
    but ``emit`` itself and the polls of an awaited ``flush()`` or close.
    It never awaits, never blocks and never raises for I/O trouble; it
    raises ``TypeError`` at once for anything that is not an ``Event``.
    Works under every anyio backend (asyncio, uvloop, trio).
    """

    def __getstate__(self) -> dict[str, Any]:
        # A tracer travels as its configuration and opens anew where it lands.
        return {"config": self._config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    async def __aenter__(self) -> Tracer:
        if not self._config.enabled:
            return self
        self._forked()  # (then closed: a new run opens)
        run: WriterRun | None = None
        try:
            with self._lock:
                if self._state in (*_RUNNING, State.CLOSING):
                    raise TracerStateError(
                        f"this tracer is already {self._state.value} (one `async with` at a "
                        "time; share the open tracer between tasks instead)"
                    )
                run = self._new_run(waited=True)
                self._start(run)
            await drive_async(run.engine, self._opening(run), patient=False)
        except BaseException as exc:
            # Cancelled (or Ctrl-C) while the sinks open: the writer thread
            # discards them, or, if they opened meanwhile, the run is closed here.
            if run is not None and not self._abort_open(run, exc):
                await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if await self._close() and exc is None:
            # The task was cancelled while the run closed: let it be cancelled.
            # (An exception from the body goes on as it went in.)
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
        run: WriterRun | None = getattr(self, "_run", None)
        steps = self._flushing(None)
        if run is None:
            return self._settled()
        result, _ = await drive_async(run.engine, steps, patient=False)
        return result

    async def aclose(self) -> None:
        """Write what is queued and ``trace_closed``, close the sinks, within ``close_timeout``.

        The writer thread carries the close out: a task cancelled meanwhile
        (even twice, natively) still leaves a complete trace; the
        cancellation is raised once the run is closed. Past the deadline the
        rest is dropped and reported.
        """
        if await self._close():
            raise anyio.get_cancelled_exc_class()()

    async def _close(self) -> int:
        """Close the run, shielded; the native cancellations taken meanwhile."""
        mark = self.begin_close(None)
        if mark is None:
            return 0
        with anyio.CancelScope(shield=True):
            _, swallowed = await drive_async(self._run.engine, self._closing(mark), patient=True)
        return swallowed

    def close_blocking(self) -> None:
        """Close from outside the event loop (the exit and SIGTERM hooks)."""
        mark = self.begin_close(None)
        if mark is not None:
            self.finish_close(mark)

    def __enter__(self) -> None:
        raise TypeError(
            "rt.tracer() is an async tracer: use `async with rt.tracer(...)`, "
            "or rt.sync_tracer(...) with a plain `with`"
        )

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        return None


def tracer(
    *uris: str,
    enabled: bool = True,
    meta: Mapping[str, Any] | None = None,
    buffer: int = DEFAULT_BUFFER,
    batch_size: int = DEFAULT_BATCH,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    clock: Callable[[], float] = time.time,
    deadline_clock: Callable[[], float] = time.monotonic,
    strict: bool = False,
) -> Tracer:
    """An async tracer writing every event to every sink URI; open it with ``async with``.

    With no URI, the URIs come from ``$ROLLOUT_TRACE`` (comma-separated);
    unset or empty, or ``enabled=False``, gives a disabled tracer that holds
    no thread, queue or lock and whose ``emit`` does nothing.

    ``buffer``: events held at most before new ones are dropped (and counted);
    ``batch_size``: events per write (a full batch wakes the writer at once);
    ``flush_interval``: seconds a partial batch may wait, so a killed process
    loses at most about that much (urgent events, such as
    ``snapshot_published``, are written at once); ``close_timeout``: one
    deadline for closing, and how long one sink call may take before that
    sink is given up (``math.inf``: no limit); ``clock``: what stamps
    ``time`` (Unix seconds; ``time.time`` unless a simulation brings its own);
    ``deadline_clock``: the clock of every deadline (the open's wait, a
    flush's ``timeout``, ``close_timeout`` for the close and for a hung sink,
    and the sinks' own timeouts and backoff, ``Sink.deadline_clock``;
    ``time.monotonic``; a test passes ``rollout_trace.testing.MockClock`` and
    moves it past a deadline, which the waits notice within 50 ms);
    ``strict``: for tests, ``emit`` raises ``rt.InvalidEventError`` for an
    event it would otherwise count invalid (a field of the wrong type, a NaN)
    and ``rt.EventTagError`` for a class whose tag another class holds, and an
    ``attempt`` block left without a choice raises ``rt.TracerStateError``
    (off, it costs nothing; ``capture_events(strict=True)`` turns it on for
    every tracer opened inside).
    """
    return Tracer(
        TracerConfig.make(
            uris,
            enabled=enabled,
            meta=meta,
            buffer=buffer,
            batch_size=batch_size,
            flush_interval=flush_interval,
            close_timeout=close_timeout,
            clock=clock,
            deadline_clock=deadline_clock,
            strict=strict,
        )
    )


def sync_tracer(
    *uris: str,
    enabled: bool = True,
    meta: Mapping[str, Any] | None = None,
    buffer: int = DEFAULT_BUFFER,
    batch_size: int = DEFAULT_BATCH,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    clock: Callable[[], float] = time.time,
    deadline_clock: Callable[[], float] = time.monotonic,
    strict: bool = False,
) -> SyncTracer:
    """A tracer for threads, sync code and Ray actors, with one writer thread.

    Opened by ``with`` or ``open()`` (a sink that cannot be opened raises
    there) or else by its first ``emit``; closed by ``close()``, by leaving
    the ``with`` block, at interpreter exit or on SIGTERM. The arguments are
    those of ``rt.tracer()``. A disabled tracer holds no thread, queue or
    lock, and pickles; an enabled one pickles as its configuration and opens
    a new run on its first emit in the process that unpickles it.
    """
    return SyncTracer(
        TracerConfig.make(
            uris,
            enabled=enabled,
            meta=meta,
            buffer=buffer,
            batch_size=batch_size,
            flush_interval=flush_interval,
            close_timeout=close_timeout,
            clock=clock,
            deadline_clock=deadline_clock,
            strict=strict,
        )
    )
