"""A sink's thread (``_writing.runner``): what it hands its sink, and what it counts.

The runner is fed without waiting and writes on its own thread; while one
write is in progress (or the thread waits for the GIL), batches queue behind
it. These tests hold a sink inside a real write and queue batches behind it,
so what happens next does not depend on timing.
"""

from __future__ import annotations

import threading
import time

import pytest

from rollout_trace._writing import runner as runner_module
from rollout_trace._writing.runner import _GATHER, _MAX_PIECE, _MIN_PIECE, Batch, SinkRunner
from rollout_trace.sinks import Sink


class HeldSink(Sink):
    """Records every call; its first write waits for ``release``; writes past
    ``fail_at`` raise."""

    def __init__(self, fail_at: int = 0) -> None:
        super().__init__("held", {})
        self.writes: list[bytes] = []
        self.fail_at = fail_at
        self.inside = threading.Event()
        self.release = threading.Event()

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        if len(self.writes) == 1:
            self.inside.set()
            assert self.release.wait(10), "the test never released the sink"
        if self.fail_at and len(self.writes) >= self.fail_at:
            raise OSError(5, "Input/output error (injected)")


def _line(seq: int) -> bytes:
    return b'{"seq":%d}\n' % seq


def _run(sink: HeldSink, queued: list[tuple[int, int]]) -> tuple[SinkRunner, list[int]]:
    """Hold ``sink`` in a write of seq 1, queue ``queued`` behind it as
    (first seq, events) batches (0 events: a lifecycle line), then let go."""
    acks: list[int] = []
    runner = SinkRunner("held://", sink, 1_000_000, lambda: None)
    runner.start()
    assert runner.opened.wait(10)
    runner.submit(_line(1), Batch(1, 1, acks.append))
    assert sink.inside.wait(10)
    for first, n in queued:
        data = b"".join(_line(seq) for seq in range(first, first + max(n, 1)))
        runner.submit(data, Batch(n, first if n else float("inf"), acks.append))
    sink.release.set()
    runner.close()
    assert runner.ended.wait(10)
    return runner, acks


@pytest.mark.parametrize(
    ("queued", "writes"),
    [
        # Twenty batches queued behind a write go to the sink in one write.
        ([(s, 1) for s in range(2, 22)], [[1], list(range(2, 22))]),
        # Batches of many events too, in seq order.
        ([(2, 10), (12, 10), (22, 5)], [[1], list(range(2, 27))]),
        # A lifecycle line (no events: trace_opened, trace_closed) is written
        # alone, between what came before it and what came after it.
        ([(2, 1), (3, 1), (99, 0), (4, 1)], [[1], [2, 3], [99], [4]]),
    ],
    ids=["single-events", "whole-batches", "lifecycle-alone"],
)
def test_batches_queued_behind_a_write_go_in_one_write(
    queued: list[tuple[int, int]], writes: list[list[int]]
) -> None:
    sink = HeldSink()
    runner, acks = _run(sink, queued)
    assert [[int(x[7:-1]) for x in w.splitlines()] for w in sink.writes] == writes
    events = 1 + sum(n for _, n in queued)
    # Every batch is acknowledged once, with its own count.
    assert sorted(acks) == sorted([1] + [n for _, n in queued])
    assert (runner.written, runner.lost, runner.error) == (events, 0, None)
    assert runner.idle


def test_a_joined_write_that_fails_loses_every_batch_in_it() -> None:
    sink = HeldSink(fail_at=2)
    runner, acks = _run(sink, [(2, 3), (5, 4), (9, 1)])
    assert len(sink.writes) == 2  # the held one, then one for the three batches
    assert acks == [1]  # only the held write was acknowledged
    assert (runner.written, runner.lost) == (1, 8)
    assert runner.first_lost <= 2  # a flush from seq 2 on says False
    assert runner.error is not None and "Input/output error" in runner.error
    assert runner.idle


def test_what_a_sink_joins_is_bounded() -> None:
    # Batches past the bound wait for the next write, so a sink that fell far
    # behind never gets one write the size of everything it holds.
    sink = HeldSink()
    size = _GATHER * 3 // 8  # the bound is reached with the third batch
    acks: list[int] = []
    runner = SinkRunner("held://", sink, 1_000_000, lambda: None)
    runner.start()
    assert runner.opened.wait(10)
    runner.submit(_line(1), Batch(1, 1, acks.append))
    assert sink.inside.wait(10)
    for seq in range(2, 6):
        runner.submit(b"x" * (size - 1) + b"\n", Batch(1, seq, acks.append))
    sink.release.set()
    runner.close()
    assert runner.ended.wait(10)
    assert [len(w) for w in sink.writes] == [len(_line(1)), 3 * size, size]
    assert runner.written == 5


def _direct(sink: HeldSink) -> tuple[SinkRunner, list[int]]:
    """A direct runner (written by the caller of submit) on an opened ``sink``."""
    acks: list[int] = []
    runner = SinkRunner("held://", sink, 1_000_000, lambda: None, direct=True)
    runner.start()
    assert runner.opened.wait(10)
    return runner, acks


SMALL = b"s" * 99 + b"\n"  # a line of 100 bytes
BIG = b"b" * (_MIN_PIECE * 3 // 2) + b"\n"  # a line longer than a piece


@pytest.mark.parametrize(
    ("lines", "writes"),
    [
        # Within the bound: one write, as the batch came.
        ([SMALL] * 10, [[SMALL] * 10]),
        # A batch of two and a half pieces: three writes of whole lines, none
        # longer than a piece (a slow sink finishes each well within
        # close_timeout, and a run given up stops between two of them).
        (
            [SMALL] * (_MIN_PIECE * 5 // 200),
            [[SMALL] * (_MIN_PIECE // 100)] * 2
            + [[SMALL] * (_MIN_PIECE * 5 // 200 - 2 * (_MIN_PIECE // 100))],
        ),
        # A line longer than a piece goes whole, in a write of its own.
        (
            [SMALL] * 10 + [BIG] + [SMALL] * 10,
            [[SMALL] * 10, [BIG], [SMALL] * 10],
        ),
    ],
    ids=["small", "pieces", "long-line"],
)
def test_a_direct_runner_writes_a_large_batch_in_pieces_of_whole_lines(
    lines: list[bytes], writes: list[list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "_PIECE_S", 0.0)  # pieces of _MIN_PIECE, however fast
    sink = HeldSink()
    sink.release.set()
    runner, acks = _direct(sink)
    runner.submit(b"".join(lines), Batch(len(lines), 1, acks.append))
    assert [w.splitlines(keepends=True) for w in sink.writes] == writes
    assert all(len(w) <= _MIN_PIECE for w in sink.writes if BIG not in w)
    # Counted as written once each, piece by piece.
    assert sum(acks) == runner.written == len(lines) and runner.idle
    runner.close()
    assert runner.ended.wait(10)


def test_a_direct_runner_stopped_inside_a_piece_writes_no_more() -> None:
    # A close that gives the run up at its deadline stops the sink while the
    # writer thread is inside a write: the pieces after it are never written,
    # and the one it was in counts as lost, though it may have reached the sink.
    sink = HeldSink()
    runner, acks = _direct(sink)
    n = _MIN_PIECE * 3 // 100
    writer = threading.Thread(
        target=runner.submit, args=(SMALL * n, Batch(n, 1, acks.append)), daemon=True
    )
    writer.start()
    assert sink.inside.wait(10)
    runner.fail("did not write what it held before the close deadline")
    sink.release.set()
    writer.join(10)
    assert not writer.is_alive()
    assert len(sink.writes) == 1  # the piece it was in; none after
    assert (acks, runner.written, runner.lost) == ([], 0, n)
    assert runner.idle
    runner.close()
    assert runner.ended.wait(10)


class PacedSink(Sink):
    """Writes at ``rates[k]`` bytes per second in its k-th call (the last rate
    after that; 0: at once), recording the size of each call."""

    def __init__(self, rates: list[float]) -> None:
        super().__init__("paced", {})
        self.rates = rates
        self.sizes: list[int] = []

    def write(self, data: bytes) -> None:
        rate = self.rates[min(len(self.sizes), len(self.rates) - 1)]
        self.sizes.append(len(data))
        if rate:
            time.sleep(len(data) / rate)


MIB = 1 << 20


@pytest.mark.parametrize(
    ("rates", "size", "pieces"),
    [
        # A fast file: after the first piece, pieces of the most a call may
        # take (a piece per 8,000 events cost the writer a turn of the GIL each).
        ([0], 20 * MIB, ["min", "max", "max", "rest"]),
        # A slow sink (10 MB/s: a piece takes a tenth of a second): pieces stay
        # the least, so no call comes near close_timeout.
        ([10e6], 4 * MIB, ["min", "min", "min", "min", "rest"]),
        # A fast sink that turns slow (20 MB/s) after its first piece: one large
        # piece, then the pieces shrink back at once.
        ([0, 20e6], 13 * MIB, ["min", "max", "min", "min", "min", "min", "rest"]),
    ],
    ids=["fast", "slow", "turns-slow"],
)
def test_a_direct_runner_sizes_its_pieces_by_how_fast_the_sink_writes(
    rates: list[float], size: int, pieces: list[str]
) -> None:
    sink = PacedSink(rates)
    runner = SinkRunner("paced://", sink, 1_000_000, lambda: None, direct=True)
    runner.start()
    assert runner.opened.wait(10)
    n = size // len(SMALL)
    # As the engine hands a batch over: a look for a stalled call first,
    # which no flush or close waits on.
    runner.check_stall(time.monotonic(), 10.0)
    runner.submit(SMALL * n, Batch(n, 1, lambda k: None))
    assert sum(sink.sizes) == n * len(SMALL) and runner.written == n
    # Whole lines: a piece is up to a line short of its bound.
    bounds = {
        "min": (_MIN_PIECE - len(SMALL), _MIN_PIECE),
        "max": (_MAX_PIECE - len(SMALL), _MAX_PIECE),
        "rest": (0, _MAX_PIECE),
    }
    shapes = [
        want if low < got <= high else f"{got} bytes"
        for got, want in zip(sink.sizes, pieces, strict=False)
        for low, high in [bounds[want]]
    ]
    assert len(sink.sizes) == len(pieces) and shapes == pieces, sink.sizes
    runner.close()
    assert runner.ended.wait(10)


class TurnsSlow(Sink):
    """Writes at once until ``slow`` is set, then at ``rate`` bytes per second."""

    def __init__(self, rate: float) -> None:
        super().__init__("turns-slow", {})
        self.rate = rate
        self.slow = False
        self.slow_sizes: list[int] = []

    def write(self, data: bytes) -> None:
        if self.slow:
            self.slow_sizes.append(len(data))
            time.sleep(len(data) / self.rate)


def test_a_direct_sink_that_turns_slow_while_a_flush_waits_is_not_taken_for_hung() -> None:
    # A burst while the sink is fast sizes its pieces up to _MAX_PIECE; then
    # it turns slow (2 MB/s: 1 MiB in half a second), and a flush waits on it,
    # giving it up if one call outlasts the limit. A call sized for its old
    # speed (6 MiB: 3 s) would; the least pieces, while a flush waits, do not.
    limit = 2.0
    sink = TurnsSlow(2e6)
    runner = SinkRunner("turns-slow://", sink, 10**9, lambda: None, direct=True)
    runner.start()
    assert runner.opened.wait(10)
    n = 20 * MIB // len(SMALL)
    runner.submit(SMALL * n, Batch(n, 1, lambda k: None))
    assert runner._piece == _MAX_PIECE  # sized for a fast sink
    sink.slow = True
    done = threading.Event()

    def flush_waits() -> None:
        # What `Engine.check_stalls` does while a flush waits.
        while True:
            now = time.monotonic()
            runner.waited_on(now)
            runner.check_stall(now, limit)
            if done.wait(0.05):
                return

    watcher = threading.Thread(target=flush_waits, daemon=True)
    watcher.start()
    deadline = time.monotonic() + 10
    while runner._watched < 0:  # the flush has begun to wait
        assert watcher.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)

    m = 6 * MIB // len(SMALL)
    runner.submit(SMALL * m, Batch(m, n + 1, lambda k: None))
    done.set()
    watcher.join(10)
    assert (runner.live, runner.error, runner.lost) == (True, None, 0)
    assert runner.written == n + m
    assert sink.slow_sizes and max(sink.slow_sizes) <= _MIN_PIECE
    runner.close()
    assert runner.ended.wait(10)


class SplitSink(HeldSink):
    """Takes at most three lines of ``_line(10..99)`` a write (``max_write``)."""

    max_write = 3 * len(_line(10))


@pytest.mark.parametrize("direct", [False, True], ids=["thread", "direct"])
def test_a_split_batch_counts_the_pieces_written_before_one_failed(direct: bool) -> None:
    # Ten events go in pieces of three; the third piece fails. The two pieces
    # the sink took are written (it holds them, as a collector holds requests
    # it answered), the rest lost: the same count whoever writes.
    sink = SplitSink(fail_at=3)
    sink.release.set()
    acks: list[int] = []
    runner = SinkRunner("held://", sink, 1_000_000, lambda: None, direct=direct)
    runner.start()
    assert runner.opened.wait(10)
    runner.submit(b"".join(_line(seq) for seq in range(10, 20)), Batch(10, 10, acks.append))
    runner.close()
    assert runner.ended.wait(10)
    assert [w.count(b"\n") for w in sink.writes] == [3, 3, 3]  # the last one raised
    held = sum(w.count(b"\n") for w in sink.writes[:2])
    assert sum(acks) == runner.written == held == 6
    assert runner.lost == 10 - held
    assert runner.error is not None and "Input/output error" in runner.error
