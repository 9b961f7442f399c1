"""A sibling's state stays bounded however often its key is reused, in any order.

A sibling is ``(prompt_id, generation_index)``; prompts come round again, so
one key is dispatched and sealed many times in a run. What the table keeps of
it must not grow with those tries, and must give the figures that every event
of it, kept in memory, gives (``_reference`` below, the README's rules).
"""

from __future__ import annotations

import math
import random
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from scenario import abandon, disp, make_run, refuse, resume, seal

import rollout_trace as rt
from rollout_trace._analysis.cost import CostAnalysis
from rollout_trace._analysis.fold import RunFold
from rollout_trace._analysis.siblings import EXTRA, SiblingTable, unpack_key

Order = Callable[[list[rt.Event]], list[list[rt.Event]]]

TRIES = 1000


def _reused(tries: int, keys: int = 1, prompt: int | str = 7) -> list[rt.Event]:
    """``keys`` siblings, each dispatched and sealed ``tries`` times, in turn."""
    body: list[tuple[float, rt.Event]] = []
    t = 100.0
    for _ in range(tries):
        for k in range(keys):
            body.append((t, disp(prompt, k)))
            body.append((t + 0.5, seal(prompt, k)))
            t += 1.0
    return make_run(1, 50.0, body)


def _shuffled(events: list[rt.Event]) -> list[list[rt.Event]]:
    return [random.Random(3).sample(events, len(events))]


def _halves(events: list[rt.Event]) -> list[list[rt.Event]]:
    half = len(events) // 2
    return [events[:half], events[half:]]


def _dealt(events: list[rt.Event]) -> list[list[rt.Event]]:
    return [events[0::2], events[1::2]]


def _fold(parts: list[list[rt.Event]]) -> RunFold:
    """Each part folded apart (in batches, as a reader hands them), then merged."""
    merged = CostAnalysis()
    for part in parts:
        analysis = CostAnalysis()
        for i in range(0, len(part), 256):
            analysis.add(part[i : i + 256])
        merged.merge(analysis)
    [run] = merged.runs()
    return run


def _size(table: SiblingTable) -> int:
    """What the table keeps per sibling: records, rows, their other starts and ends,
    and the keys to join up at the end (the history is apart: see the module)."""
    extras = sum(
        len(row[EXTRA].starts) + len(row[EXTRA].ends)
        for row in table.rows.values()
        if row[EXTRA] is not None
    )
    return len(table.r_keys) + len(table.rows) + extras + len(table.collide)


# Each row: how the lines of one key dispatched and sealed 1,000 times arrive.
ORDERS: dict[str, Order] = {
    # as a tracer writes them: the hot loop retires each try
    "in order": lambda events: [events],
    # last line first: every line goes through RunFold.add
    "reversed": lambda events: [events[::-1]],
    # any order at all
    "shuffled": _shuffled,
    # the first half and the second half folded apart, then merged
    "two halves merged": _halves,
    # every other line in each of two folds, then merged
    "dealt to two folds merged": _dealt,
    # the whole run twice, in two folds merged (a run read from two files)
    "twice, merged": lambda events: [events, events[::-1]],
}


@pytest.mark.parametrize("order", list(ORDERS.values()), ids=list(ORDERS))
def test_a_key_tried_a_thousand_times_keeps_a_bounded_state(order: Order) -> None:
    events = _reused(TRIES)
    run = _fold(order(events))
    # A few records or a row, not one per try (the old table kept 1,000
    # records, or a row with 1,000 starts): records wait for a compaction
    # until 64 came back, and a merge can bring as many again.
    assert _size(run.table) <= 140, _size(run.table)
    assert len(run.table.r_keys) <= 130
    run.siblings()
    assert len(run.table.r_keys) <= 2  # the last try's record, one per copy read
    assert _siblings(run) == _reference(events)


@pytest.mark.parametrize(
    "prompt",
    [
        7,  # keys packed into one int
        "p-7",  # keys kept apart: every record of one key must share its code
    ],
)
def test_many_keys_reused_keep_a_record_each_not_one_per_try(prompt: int | str) -> None:
    # 200 siblings, 40 tries each, in order: the records stay about one per
    # sibling (up to twice that between two compactions), not 8,000.
    events = _reused(40, keys=200, prompt=prompt)
    run = _fold([events])
    assert len(run.table.r_keys) <= 2 * 200 + 64, len(run.table.r_keys)
    run.siblings()
    assert len(run.table.r_keys) == 200
    assert len(run.table.codes.other) == (200 if isinstance(prompt, str) else 0)
    assert _siblings(run) == _reference(events)


def test_a_retired_sibling_costs_its_numbers_and_little_more() -> None:
    # 20,000 siblings tried once: each is 7 numbers of 8 bytes in columns
    # and its key's hash. The key was a Python int in a list (40 bytes more).
    siblings = 20_000
    body: list[tuple[float, rt.Event]] = []
    for k in range(siblings):
        body += [(100.0 + k, disp(k, 3)), (100.5 + k, seal(k, 3))]
    events = make_run(1, 50.0, body)
    analysis = CostAnalysis(history=False)
    analysis.add(events[:2])  # the run's own state, apart from its siblings'
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(2, len(events), 4096):
            analysis.add(events[i : i + 4096])
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    [run] = analysis.runs()
    assert len(run.table.r_keys) == siblings and not run.table.rows
    per_sibling = (after - before) / siblings
    assert per_sibling < 80, per_sibling


@pytest.mark.parametrize(
    ("history", "kept"),
    [
        # The Python API keeps what each dropped start was (a line that
        # differs from its copy may need it).
        (True, True),
        # The command line's first read does not: its memory then grows with
        # the siblings, not the tries (it reads again with it on a conflict).
        (False, False),
    ],
)
def test_the_history_of_dropped_starts_is_kept_only_when_asked(history: bool, kept: bool) -> None:
    events = _reused(TRIES)
    analysis = CostAnalysis(copies_later=True, history=history)
    for i in range(0, len(events), 256):
        analysis.add(events[i : i + 256])
    [run] = analysis.runs()
    assert (len(run.table.h_keys) > TRIES // 2) is kept, len(run.table.h_keys)
    assert _siblings(run) == _reference(events)


def test_reused_keys_are_compacted_before_their_records_double() -> None:
    # 200 siblings, 40 tries each, in order, folded a batch at a time: between
    # two compactions at most a quarter as many records come back as are left
    # (at least 64), so the table never holds much over 1.25 records a sibling.
    events = _reused(40, keys=200)
    analysis = CostAnalysis()
    peak = 0
    for i in range(0, len(events), 256):
        analysis.add(events[i : i + 256])
        [run] = analysis._runs.values()
        peak = max(peak, len(run.table.r_keys))
    assert peak <= 200 + 64 + 1, peak


def test_a_sibling_with_many_open_tries_then_many_seals_is_pruned_rarely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 500 tries of one sibling open at once, then 1,500 seals: ends are never
    # pruned, so a limit on the starts alone sent every seal into a prune that
    # scanned all 500 starts (quadratic time). Prunes come as what is held doubles.
    tries = 500
    body = [(100.0 + a, disp(7, 0, a)) for a in range(tries)]
    body += [(1000.0 + i, seal(7, 0, i % tries)) for i in range(3 * tries)]
    events = make_run(1, 50.0, body)
    calls = []
    prune = SiblingTable.prune
    monkeypatch.setattr(
        SiblingTable, "prune", lambda self, key, row: calls.append(key) or prune(self, key, row)
    )
    run = _fold([events])
    assert len(calls) <= 40, len(calls)
    assert _siblings(run) == _reference(events)


# --- the figures, against every event kept in memory ----------------------------


def _reference(events: list[Any]) -> tuple[dict[Any, float], dict[Any, tuple[float, float]]]:
    """Per sibling, by the README's rules from every event: when its open try began
    (the siblings in flight) and its last seal's time and span (NaN: no start)."""
    starts: dict[Any, dict[int, tuple[int, float]]] = {}
    ends: dict[Any, dict[int, int]] = {}
    seals: dict[Any, tuple[int, int, float]] = {}
    for ev in events:
        if not isinstance(ev, (rt.AttemptDispatched, rt.AttemptResumed, rt.AttemptSealed,
                               rt.AttemptAbandoned, rt.AttemptRefused)):  # fmt: skip
            continue
        key = (ev.prompt_id, ev.generation_index)
        if isinstance(ev, (rt.AttemptDispatched, rt.AttemptResumed)):
            # Of two starts with one seq (a conflicting copy), the least.
            held = starts.setdefault(key, {}).get(ev.seq)
            if held is None or (ev.attempt, ev.time) < held:
                starts[key][ev.seq] = (ev.attempt, ev.time)
            continue
        att = ends.setdefault(key, {}).get(ev.seq)
        if att is None or ev.attempt < att:
            ends[key][ev.seq] = ev.attempt
        if isinstance(ev, rt.AttemptSealed):
            z = seals.get(key)
            if z is None or ev.seq > z[0] or (ev.seq == z[0] and (ev.attempt, ev.time) < z[1:]):
                seals[key] = (ev.seq, ev.attempt, ev.time)
    open_: dict[Any, float] = {}
    for key, by_seq in starts.items():
        seq = max(by_seq)
        att, t = by_seq[seq]
        if not any(s > seq and a == att for s, a in ends.get(key, {}).items()):
            open_[key] = t
    sealed: dict[Any, tuple[float, float]] = {}
    for key, (zseq, zatt, zt) in seals.items():
        began = [(s, t) for s, (a, t) in starts.get(key, {}).items() if a == zatt and s < zseq]
        sealed[key] = (zt, zt - max(began)[1] if began else math.nan)
    return open_, sealed


def _siblings(run: RunFold) -> tuple[dict[Any, float], dict[Any, tuple[float, float]]]:
    got = run.siblings()
    sealed = {
        unpack_key(k): (t, s)
        for k, t, s in zip(got.seal_keys, got.seal_times, got.seal_spans, strict=True)
    }
    return dict(got.open), sealed


def _same(a: Any, b: Any) -> bool:
    # NaN spans (a seal with no start of its try) compare equal here.
    return [repr(sorted(x.items())) for x in a] == [repr(sorted(x.items())) for x in b]


def _random_run(seed: int) -> list[rt.Event]:
    """Three siblings reused many times, with retries, restarts, resumes, refusals,
    seals of an old attempt long after, exact copies and conflicting copies."""
    rng = random.Random(seed)
    p: int | str = 7 if seed % 2 else "p7"  # a key kept packed, or kept as it is
    body: list[tuple[float, rt.Event]] = []
    t = 100.0
    for _ in range(rng.randint(20, 60)):
        g = rng.randrange(3)
        a = rng.choice([0, 0, 0, 1, 2])
        start = resume(p, g, a) if rng.random() < 0.1 else disp(p, g, a)
        body.append((t, start))
        t += rng.choice([0.25, 0.5, 1.0])
        r = rng.random()
        if r < 0.55:
            body.append((t, seal(p, g, a)))
        elif r < 0.7:
            body.append((t, abandon(p, g, a)))
        elif r < 0.78:
            body.append((t, refuse(p, g, a)))
        elif r < 0.86:
            body.append((t, seal(p, g, rng.choice([0, 1, 2]))))  # a seal of another try
        t += 0.25
    for _ in range(rng.randint(0, 3)):  # a seal of an attempt tried long before
        body.append((t, seal(p, rng.randrange(3), rng.choice([0, 1, 2]))))
        t += 0.25
    events = make_run(1, 50.0, body)
    for _ in range(rng.randint(0, 8)):
        ev = rng.choice(events[1:])
        copy = msgspec.structs.replace(ev)
        if rng.random() < 0.6:  # a conflicting copy: one seq, another attempt or time
            if rng.random() < 0.5:
                copy.attempt = max(0, ev.attempt + rng.choice([-1, 1]))  # type: ignore[attr-defined]
            else:
                copy.time = ev.time + rng.choice([-0.125, 0.125])
        events.append(copy)
    return events


def _random_orders(events: list[rt.Event], seed: int) -> list[list[list[rt.Event]]]:
    rng = random.Random(seed)
    out: list[list[list[rt.Event]]] = [[events], [events[::-1]]]
    for _ in range(6):
        out.append([rng.sample(events, len(events))])
    for parts in (2, 3):
        cut: list[list[rt.Event]] = [[] for _ in range(parts)]
        for ev in events:
            cut[rng.randrange(parts)].append(ev)
        out.append(cut)
        out.append([rng.sample(p, len(p)) for p in cut])
    return out


# Each row: a seed of a random reuse-heavy run (most also hold copies of
# lines, some of them conflicting, and seals of an attempt tried long before).
@pytest.mark.parametrize("seed", range(120))
def test_reused_siblings_give_the_figures_of_every_event_in_any_order(seed: int) -> None:
    events = _random_run(seed)
    want = _reference(events)
    for parts in _random_orders(events, seed):
        got = _siblings(_fold(parts))
        assert _same(got, want), (seed, got, want)


def test_a_reused_run_read_twice_counts_its_superseded_starts_again() -> None:
    # A second copy's line of a start that a later try of its key superseded
    # is not held by any record: the table then folds its history back in,
    # so a conflicting copy of that start counts as the README says.
    events = _reused(200)
    first = events[3]  # the second try's dispatch
    # Attempt 5 sorts after the line's own 0: the start at that seq stays of
    # attempt 0, so the late seal of attempt 5 has no start (a NaN span).
    conflict = msgspec.structs.replace(first, attempt=5, time=first.time - 1.0)
    late = msgspec.structs.replace(events[-1], attempt=5, seq=len(events), time=1e4)
    analysis = CostAnalysis()
    analysis.add(events)
    analysis.add([conflict, late])
    [run] = analysis.runs()
    assert run.table.unsure
    want = _reference([*events, conflict, late])
    assert math.isnan(want[1][(7, 0)][1])
    assert _same(_siblings(run), want)
