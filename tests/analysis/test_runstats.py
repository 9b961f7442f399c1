"""``SeqSet`` and ``RunStats``: seqs kept as ranges, and a run read from several files."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from scenario import disp, make_run, run_id

from rollout_trace._analysis.runstats import SeqSet


def _gaps_of(seqs: set[int]) -> list[tuple[int, int]]:
    """The gaps between 0 and max(seqs), the slow and obvious way."""
    out: list[tuple[int, int]] = []
    for s in range(max(seqs) + 1):
        if s in seqs:
            continue
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


@pytest.mark.parametrize(
    "order",
    [
        "in-order",  # one emitting thread
        "neighbours-swapped",  # several threads
        "reversed",  # the files of a run given last first
        "shuffled",  # any order at all
    ],
)
@pytest.mark.parametrize("drop", [0.0, 0.3])  # no gap; many gaps
def test_seqset_finds_duplicates_and_gaps_in_any_order(order: str, drop: float) -> None:
    rng = random.Random(f"{order}{drop}")
    kept = [s for s in range(5000) if rng.random() >= drop]
    seqs = list(kept)
    if order == "neighbours-swapped":
        for i in range(0, len(seqs) - 1, 3):
            seqs[i], seqs[i + 1] = seqs[i + 1], seqs[i]
    elif order == "reversed":
        seqs.reverse()
    elif order == "shuffled":
        rng.shuffle(seqs)
    again = rng.sample(kept, 200)
    s = SeqSet()
    assert [s.add(x) for x in seqs] == [True] * len(seqs)
    assert [s.add(x) for x in again] == [False] * len(again)
    assert s.count == len(kept)
    assert s.max == max(kept)
    assert s.gaps() == _gaps_of(set(kept))
    assert all(x in s for x in again)
    assert s.ranges()[0][0] == min(kept)


def test_a_huge_seq_costs_a_range_not_a_bitmap() -> None:
    seqs = [0, 1, 2, 10**8, 2**62]
    tracemalloc.start()
    try:
        s = SeqSet()
        for x in seqs:
            assert s.add(x)
        assert not s.add(10**8)
        gaps = s.gaps()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10, peak  # a bitmap to 10**8 would be 100 MB
    assert gaps == [(3, 10**8 - 1), (10**8 + 1, 2**62 - 1)]
    assert s.count == 5


def test_the_same_run_in_two_files_counts_once() -> None:
    from rollout_trace._analysis.runstats import COPY, DUPLICATE, NEW, RunStats

    run = make_run(1, 1.78e9, [(1.78e9 + 1, disp(1, 0))], closed=1.78e9 + 2)
    stats = RunStats(run_id(1))
    assert [stats.add(ev, "a.jsonl") for ev in run] == [NEW] * 3
    assert [stats.add(ev, "b.jsonl") for ev in run] == [COPY] * 3
    assert stats.add(run[1], "b.jsonl") == DUPLICATE  # twice in b itself
    summary = stats.summary()
    assert (summary.events, summary.read_twice, summary.duplicate_seqs) == (3, 3, 1)
    assert summary.events_by_name == {
        "attempt_dispatched": 1,
        "trace_closed": 1,
        "trace_opened": 1,
    }
    assert summary.files == ["a.jsonl", "b.jsonl"]
