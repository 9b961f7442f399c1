"""One sink and the daemon thread that makes its calls, and how a batch counts written.

Encoded batches arrive from the engine without waiting; the thread writes
them in order and acknowledges each. Only what a sink acknowledged counts as
written by it. A sink that fails is reported once and written to no more; one
that falls behind by more than its share of the buffer loses batches (counted)
rather than holding up the other sinks or the program.

A ``direct`` runner is written and flushed by the thread that hands it the
batches (the run's writer thread, for a lone sink): a thread of its
own would cost each batch two more turns of the GIL, each a switch interval
long while the program emits. Its thread only opens and closes the sink. If
one of its calls hangs, the writer thread hangs with it; the sink is given up
after ``close_timeout`` as any other (``Engine.writer_stuck``).
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rollout_trace.sinks import Sink

from .._internals import first_caller, peek_count
from .hooks import keep_signals_off_this_thread

__all__ = ["Batch", "FlushMark", "SinkRunner", "Unsent", "logger"]

logger = logging.getLogger("rollout_trace")
_INF = math.inf


# Held to count a batch a staging sink delivered in part (``Batch.ack_part``)
# and by the first sink that wrote a batch whole: the two must not both count
# the same events.
_PART_LOCK = threading.Lock()


class Batch:
    """Encoded events handed to every sink at once, one line each; ``on_first_ack``
    counts them written once (what the run counts): when the first sink wrote
    it whole, or as far as a staging sink delivered its first lines."""

    __slots__ = ("_acks", "_part", "first_seq", "n", "on_first_ack")

    def __init__(self, n: int, first_seq: float, on_first_ack: Callable[[int], None]) -> None:
        self.n = n
        self.first_seq = first_seq
        self.on_first_ack = on_first_ack
        self._acks = itertools.count()
        self._part = 0  # its first events counted by ack_part (under _PART_LOCK)

    def ack(self) -> None:
        if first_caller(self._acks):
            with _PART_LOCK:
                self.on_first_ack(self.n - self._part)
                self._part = self.n

    def ack_part(self, k: int) -> None:
        """A sink holds the batch's first ``k`` events (of ``n``)."""
        with _PART_LOCK:
            if peek_count(self._acks) == 0 and k > self._part:
                self.on_first_ack(k - self._part)
                self._part = k


class Unsent:
    """A staging sink's write not yet delivered whole: its batches, and how
    far into them the sink delivered."""

    __slots__ = ("batches", "done", "end", "end_lines", "lines", "whole")

    def __init__(self, end: int, end_lines: int, lines: int, batches: list[Batch]) -> None:
        self.end = end  # the runner's accepted bytes at its end
        self.end_lines = end_lines  # ... and accepted lines
        self.lines = lines
        self.batches = batches
        # Whether its lines are its batches' events, one each, in order (a
        # lifecycle batch, n == 0, is one line): then a part is counted.
        self.whole = lines == sum(b.n or 1 for b in batches)
        self.done = 0  # lines of it the sink delivered (and were counted)

    def count(self, upto: int) -> int:
        """Count its first ``upto`` lines delivered (acks); the events newly counted."""
        upto = min(upto, self.lines)
        if upto <= self.done or (upto < self.lines and not self.whole):
            return 0
        if not self.whole:  # all of it, at once
            self.done = upto
            for batch in self.batches:
                batch.ack()
            return sum(batch.n for batch in self.batches)
        new, start = 0, 0
        for batch in self.batches:
            size = batch.n or 1
            if start + size > self.done and start < upto:  # it gains lines
                have = min(upto, start + size) - start
                if have == size:
                    batch.ack()
                else:
                    batch.ack_part(have)
                if batch.n:
                    new += have - max(self.done - start, 0)
            start += size
        self.done = upto
        return new

    def short(self) -> list[Batch]:
        """Its batches not delivered whole."""
        if not self.whole:
            return self.batches
        out, start = [], 0
        for batch in self.batches:
            start += batch.n or 1
            if start > self.done:
                out.append(batch)
        return out

    def left(self) -> int:
        """Its events not counted written."""
        total = sum(b.n for b in self.batches)
        if not self.whole:
            return total if self.done < self.lines else 0
        start, done = 0, 0
        for batch in self.batches:
            size = batch.n or 1
            if batch.n:
                done += min(max(self.done - start, 0), size)
            start += size
        return total - done


class FlushMark:
    """Done once every sink it was handed to has flushed, failed or been given up."""

    __slots__ = ("_left", "_lock", "done", "failed")

    def __init__(self, parties: int) -> None:
        self._left = parties
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.failed = parties == 0
        if parties == 0:
            self.done.set()

    def sink_done(self, ok: bool) -> None:
        with self._lock:
            if not ok:
                self.failed = True
            self._left -= 1
            if self._left == 0:
                self.done.set()


_CLOSE = object()
_DISCARD = object()
# A sink's thread joins queued batches into one write until it holds this many
# bytes. A thread that waits for the GIL after every call can go without a turn
# for a hundred milliseconds while the program keeps its event loop busy: when
# it gets one, it catches up in a few calls. Joining (a copy) is paid only then.
_GATHER = 1 << 23
# A direct sink's writes (see SinkRunner._write_pieces): the writer thread
# drains the whole queue at once, which can be a buffer's worth of events
# (tens of MiB) after a slow write. A call is sized to last about _PIECE_S at
# the rate the sink's last write went, within these bounds. Sized by bytes
# alone (1 MiB), a fast file cost a turn of the GIL (up to a switch interval,
# 5 ms, while the program emits) per 8,000 events, and the writer fell behind.
_PIECE_S = 0.05
_MIN_PIECE = 1 << 20
_MAX_PIECE = _GATHER  # as much as a sink's own thread writes in one call
# A direct write this large is timed, to size the next piece: a smaller one
# says more about the call than about the sink.
_TIMED = 1 << 18
# While a flush or close waits on the sink (``waited_on``) and for this long
# after, its pieces are the least: a sink that turned slow after a fast burst
# must not be taken for a hung one because a call sized for its old speed
# outlasts close_timeout (8 MiB at 1 MB/s: 8 s).
_WATCHED_S = 1.0


class SinkRunner:
    """A sink and its thread: ``submit()`` and ``mark()`` never block."""

    def __init__(
        self,
        uri: str,
        sink: Sink,
        cap: int,
        on_progress: Callable[[], None],
        on_idle: Callable[[], None] = lambda: None,
        *,
        direct: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.uri = uri
        # The deadlines' clock (``TracerConfig.deadline_clock``): how long a
        # call has lasted, to give a hung sink up.
        self._clock = clock
        self.sink = sink
        # The sink's own timeouts and backoff run on the same clock (``Sink.deadline_clock``).
        sink.deadline_clock = clock
        self.cap = cap  # events this sink may have queued before it loses batches
        self.direct = direct  # written and flushed by the caller of submit() and mark()
        # A sink that stages what it accepts (``Sink.stages``): its batches
        # count as written once it says they are delivered (``staged_bytes``).
        self.stages = type(sink).stages
        # The most bytes the sink takes in one write (``Sink.max_write``):
        # batches are gathered up to it, and a larger one goes in pieces.
        self.max_write = type(sink).max_write
        self._accepted = 0  # bytes its write() accepted (the thread that writes only)
        self._accepted_lines = 0  # ... and lines
        self._unsent: deque[Unsent] = deque()
        self._piece = _MIN_PIECE  # a direct sink's bytes per call (_write_pieces)
        self._on_progress = on_progress
        self._on_idle = on_idle  # after a write that left nothing queued
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Held to change ``live`` and to count a write: a run given up at its
        # close deadline stops its sinks and fixes its counts under it.
        self.lock = threading.Lock()
        self.live = False
        self.error: str | None = None
        self.written = 0  # events this sink acknowledged
        self.lost = 0  # events handed to the run that this sink did not write
        self.first_lost: float = _INF  # the lowest seq among them
        self._handed = 0  # events handed (engine's thread only)
        self._done = 0  # events finished, written or not (the thread that writes only)
        self._marks: list[FlushMark] = []
        # When the call under way began, on ``clock`` (a hung sink) and in
        # real time (``Engine.in_long_call``: a thread blocked in the system).
        self.busy_since: float | None = None
        self.busy_real: float | None = None
        self._watched = -_INF  # when a flush or close last looked for a stall
        self.stalled = False  # given up in a call that may never return
        self.open_error: BaseException | None = None
        self.opened = threading.Event()
        self.ended = threading.Event()
        self._warned_behind = False
        self._thread = threading.Thread(
            target=self._main, name=f"rollout_trace sink {uri}", daemon=True
        )

    # --- the engine's side ----------------------------------------------------

    def start(self) -> None:
        """Start the thread, which opens the sink (raises if no thread can start)."""
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Nothing handed is still waiting to be written."""
        return self._handed == self._done or not self.live

    @property
    def unsent(self) -> bool:
        """A staging sink holds batches it accepted and has not delivered."""
        return bool(self._unsent) and self.live

    @property
    def first_missing(self) -> float:
        """The lowest seq handed to this sink that it lost or has not delivered yet."""
        # The first batch of events among those waiting: a lifecycle line
        # (trace_opened, n == 0) has no seq to miss. Under the lock: the
        # sink's thread takes delivered batches off meanwhile.
        with self.lock:
            if self.live:
                for unsent in self._unsent:
                    for batch in unsent.batches:
                        if batch.n:
                            return min(self.first_lost, batch.first_seq)
            return self.first_lost

    def submit(self, data: bytes, batch: Batch) -> None:
        if not self.live:
            self._lose(batch.n, batch.first_seq)
            return
        if self.direct:
            self._handed += batch.n
            if len(data) < _TIMED and (self.max_write is None or len(data) <= self.max_write):
                self._write(data, [batch])
            else:
                self._write_pieces(data, batch)
            return
        if self._handed - self._done + batch.n > self.cap and self._handed != self._done:
            if not self._warned_behind:
                self._warned_behind = True
                logger.warning(
                    "rollout_trace: sink %s is more than %d events behind; it loses batches "
                    "until it catches up (reported once; the other sinks are not held up)",
                    self.uri,
                    self.cap,
                )
            self._lose(batch.n, batch.first_seq)
            return
        self._handed += batch.n
        self._calls.put((data, batch))

    def mark(self, mark: FlushMark) -> None:
        if not self.live:
            mark.sink_done(False)
            return
        if self.direct:
            mark.sink_done(self._flush())
            self._on_progress()
            return
        with self.lock:
            self._marks.append(mark)
        self._calls.put(mark)

    def close(self) -> None:
        self._calls.put(_CLOSE)

    def discard(self) -> None:
        self._calls.put(_DISCARD)

    @property
    def trouble(self) -> str | None:
        """Why this sink holds less than the run wrote, if it does (``None``: it does not)."""
        if self.error is not None:
            return self.error
        if self.lost:
            return f"fell behind and lost {self.lost} events"
        return None

    def waited_on(self, now: float) -> None:
        """A flush or close waits on the sink: its next pieces are the least (``_WATCHED_S``)."""
        self._watched = now

    def check_stall(self, now: float, limit: float) -> None:
        """Give the sink up if one call has taken longer than ``limit`` seconds."""
        since = self.busy_since
        if since is not None and now - since > limit and self.live:
            self.stalled = True
            self.fail(f"one call took longer than {limit:g} s (a hung mount, a pipe nobody reads)")

    def fail(self, reason: str) -> None:
        """Stop using the sink; what it had queued counts as lost by it."""
        with self.lock:
            marks = self.stop_held(reason)
        if marks is not None:
            self.report_stop(reason, marks)

    def stop_held(self, reason: str) -> list[FlushMark] | None:
        """``fail()``'s part under ``lock`` (held by the caller): no write starts
        or is counted after it. The marks to report, or ``None`` if already stopped."""
        if not self.live:
            return None
        self.live = False
        self.error = reason
        if self._handed != self._done:
            # What it held is lost to it; its seqs are not known here.
            self.first_lost = min(self.first_lost, 0)
        while self._unsent:  # staged, never delivered (but for a part delivered)
            unsent = self._unsent.popleft()
            self.lost += unsent.left()
            for batch in unsent.short():
                self.first_lost = min(self.first_lost, batch.first_seq)
        marks, self._marks = self._marks, []
        return marks

    def report_stop(self, reason: str, marks: list[FlushMark]) -> None:
        """``fail()``'s part after the lock: say so, and end the flushes waiting on it."""
        logger.warning(
            "rollout_trace: sink %s is stopped (the other sinks go on): %s", self.uri, reason
        )
        for mark in marks:
            mark.sink_done(False)
        self._on_progress()

    def _lose(self, n: int, first_seq: float) -> None:
        with self.lock:
            self.lost += n
            self.first_lost = min(self.first_lost, first_seq)

    # --- the sink's thread (and a direct runner's writes) -------------------------

    def _main(self) -> None:
        keep_signals_off_this_thread()
        try:
            self.busy_since = self._clock()
            self.busy_real = time.monotonic()
            self.sink.open()
        except BaseException as exc:  # a sink may raise anything; the tracer reports it
            self.open_error = exc
            self.busy_since = self.busy_real = None
            self.opened.set()
            self.ended.set()
            self._on_progress()
            return
        self.busy_since = self.busy_real = None
        self.live = True
        self.opened.set()
        self._on_progress()
        try:
            self._serve()
        finally:
            self.ended.set()
            self._on_progress()

    def _serve(self) -> None:
        get, get_nowait = self._calls.get, self._calls.get_nowait
        call: Any = None
        wrote = False
        while True:
            if call is None:
                if wrote and self._calls.empty():
                    wrote = False
                    self._on_idle()
                call = get()
            if call is _CLOSE or call is _DISCARD:
                self._end(call is _DISCARD)
                return
            if isinstance(call, FlushMark):
                with self.lock:
                    ours = call in self._marks
                    if ours:
                        self._marks.remove(call)
                if ours:  # else fail() already counted it
                    call.sink_done(self._flush())
                    self._on_progress()
                call = None
                continue
            # The batches queued behind this one go in the same write: this
            # thread waits for the GIL after every call while the program
            # runs, so one call per batch would fall behind a busy program.
            # A lifecycle line (n == 0) is written alone, as the first or
            # last write of the run.
            datas, batches = [call[0]], [call[1]]
            size, call = len(datas[0]), None
            most = self.max_write
            while size < _GATHER and batches[0].n:
                try:
                    call = get_nowait()
                except queue.Empty:
                    break
                if type(call) is not tuple or not call[1].n:
                    break
                if most is not None and size + len(call[0]) > most:
                    break  # the sink's largest write: this batch goes in the next
                datas.append(call[0])
                batches.append(call[1])
                size += len(call[0])
                call = None
            wrote = True
            if most is not None and size > most:  # one batch, larger than the sink takes
                self._write_split(datas[0], batches[0], most)
                continue
            self._write(datas[0] if len(datas) == 1 else b"".join(datas), batches)

    def _write_pieces(self, data: bytes, batch: Batch) -> None:
        """A direct batch (or one larger than the sink's ``max_write``) goes in
        writes of ``self._piece`` bytes of whole lines at most (and at most
        ``max_write``): a slow sink then finishes each call well within
        ``close_timeout`` (it is not taken for a hung one), and a close that
        gives the run up at its deadline stops it between two of them.

        A piece is what the sink wrote in ``_PIECE_S`` in its last timed write
        (the wait for the GIL after the call included), so a slow sink gets
        small pieces and a fast file few calls; the least while a flush or
        close waits on it (``_WATCHED_S``)."""
        end_all, start, left = len(data), 0, batch.n
        while start < end_all:
            watched = time.monotonic() - self._watched < _WATCHED_S
            piece = _MIN_PIECE if watched else self._piece
            if self.max_write is not None:
                piece = min(piece, self.max_write)
            if end_all - start <= piece:
                end = end_all
            else:
                end = data.rfind(b"\n", start, start + piece) + 1
                if end <= start:  # one line longer than a piece: it goes whole
                    end = data.find(b"\n", start + piece) + 1 or end_all
            n = left if end >= end_all else data.count(b"\n", start, end)
            left -= n
            # A piece's events have seqs from the batch's first on: it is
            # only ever compared with a later flush's boundary.
            began = time.monotonic()
            part = data if start == 0 and end == end_all else data[start:end]
            self._write(part, [Batch(n, batch.first_seq, batch.on_first_ack)])
            took = time.monotonic() - began
            if end - start >= _TIMED:
                rate = (end - start) / took if took > 0 else _MAX_PIECE / _PIECE_S
                self._piece = min(_MAX_PIECE, max(_MIN_PIECE, int(rate * _PIECE_S)))
            start = end

    def _write_split(self, data: bytes, batch: Batch, most: int) -> None:
        """A batch larger than the sink's ``max_write``, in writes of whole lines
        of at most that many bytes (a longer line alone). Each piece written
        counts its lines (one event each) at once (``Batch.ack_part``, which
        the other sinks sharing ``batch`` respect): a later piece that fails
        loses only what it and the rest held, as the direct path's pieces do."""
        ok, start, sent = True, 0, 0
        while ok and start < len(data):
            end = data.rfind(b"\n", start, start + most) + 1
            if end <= start:  # one line longer than max_write: it goes whole
                end = data.find(b"\n", start + most) + 1 or len(data)
            ok = self.live and self._call(self.sink.write, "write", data[start:end])
            if ok and end < len(data) and not self.stages:
                lines = data.count(b"\n", start, end)
                with self.lock:
                    if self.live:
                        self.written += lines
                        sent += lines
                        batch.ack_part(sent)
            start = end
        self._count(ok, data, [batch], sent)

    def _write(self, data: bytes, batches: list[Batch]) -> None:
        ok = self.live and self._call(self.sink.write, "write", data)
        self._count(ok, data, batches)

    def _count(self, ok: bool, data: bytes, batches: list[Batch], counted: int = 0) -> None:
        """Count a write of ``data`` holding ``batches``: written if ``ok``; of
        their events, ``counted`` already were (the pieces of a split write)."""
        n = sum(batch.n for batch in batches)
        with self.lock:
            if ok and self.live and self.stages:
                lines = data.count(b"\n")
                self._accepted += len(data)
                self._accepted_lines += lines
                self._unsent.append(Unsent(self._accepted, self._accepted_lines, lines, batches))
                self._settle()
            elif ok and self.live:
                self.written += n - counted
                # Under the lock, with the sink's own count: a run given up
                # at its deadline fixes both at one instant.
                for batch in batches:
                    batch.ack()
            else:
                self.lost += n - counted
                self.first_lost = min(self.first_lost, *(batch.first_seq for batch in batches))
                ok = False
        self._done += n
        self._on_progress()

    def _settle(self) -> None:
        """Count what a staging sink has delivered (under ``lock``)."""
        try:
            staged = self.sink.staged_bytes()
        except BaseException:  # a plugin's bug must not stop the writer; nothing counts
            return
        try:
            staged_lines = self.sink.staged_lines()
        except BaseException:  # then only whole writes count, as for a sink without it
            staged_lines = None
        delivered = self._accepted - staged
        unsent = self._unsent
        while unsent and unsent[0].end <= delivered:
            first = unsent.popleft()
            self.written += first.count(first.lines)
        if unsent and staged_lines is not None:
            # A write delivered in part (the end of a segment, its first lines).
            first = unsent[0]
            upto = self._accepted_lines - staged_lines - (first.end_lines - first.lines)
            if upto > first.done:
                self.written += first.count(upto)

    def undelivered_reason(self) -> str:
        """Why a staging sink's batches are lost at the close: what it says of them."""
        try:
            why = self.sink.why_staged()
        except BaseException as exc:  # a plugin's bug
            why = f"{type(exc).__name__}: {exc}"
        reason = "did not deliver what it staged before the close deadline"
        return f"{reason}: {why}" if why else reason

    def _flush(self) -> bool:
        """Flush; for a staging sink, ``True`` only if it delivered all it accepted."""
        ok = self._call(self.sink.flush, "flush")
        if ok and self.stages:
            with self.lock:
                if self.live:
                    self._settle()
                ok = self.live and not self._unsent
        return ok

    def _call(self, method: Callable[..., None], action: str, *args: Any) -> bool:
        with self.lock:  # a sink stopped (given up) starts no call after it
            if not self.live:
                return False
            self.busy_since = self._clock()
            self.busy_real = time.monotonic()
        try:
            method(*args)
        except BaseException as exc:  # CancelledError or SystemExit from a plugin too
            self.fail(f"failed to {action}: {type(exc).__name__}: {exc}")
            return False
        finally:
            self.busy_since = self.busy_real = None
        return True

    def _end(self, discard: bool) -> None:
        if self.stages and not self.live:
            # Stopped: what the sink still stages was counted lost, and is
            # dropped rather than delivered after the counts (and a store
            # that is down does not hold the close up until it gives up).
            discard = True
        try:
            (self.sink.discard if discard else self.sink.close)()
        except BaseException as exc:
            if self.live:
                self.fail(f"failed to close: {type(exc).__name__}: {exc}")
        self.live = False
