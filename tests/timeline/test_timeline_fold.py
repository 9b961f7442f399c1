"""The timeline is a streaming fold: one answer for any order of a set, in bounded memory."""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
import timeline_data as td
from scenario import lines

import rollout_trace as rt
from rollout_trace._cli.main import main

T = TypeVar("T")

UNKNOWN = "timeline_fold_test_sampled"

# A set as written: run files, each a list of lines (bytes, newline included).
Layout = list[list[bytes]]


def _as_written() -> Layout:
    # Two runs of a 64-slot controller, stopped and restored, with every
    # outcome; run A has more lines than the cost analysis's old reorder
    # window (4,096), so reversed lines are out of order by more than that.
    # Plus a third, small run with every event type and an unknown one.
    runs: dict[str, list[bytes]] = {}
    for ev in [*td.many_attempts(5000), *_third_run()]:
        runs.setdefault(ev.run_id, []).append(lines([ev]))  # type: ignore[list-item]
    return list(runs.values())


def _third_run() -> list[rt.Event | rt.UnknownEvent]:
    # every_kind's two runs under other run ids, later: a second stop. Its
    # unknown event gets a tag of its own: other tests define event classes
    # (gpu_memory_sampled among them) that would read it back as theirs.
    out = []
    for ev in td.every_kind():
        moved = msgspec.structs.replace(ev, run_id="f" + ev.run_id[1:], time=ev.time + 10_000.0)
        if isinstance(moved, rt.UnknownEvent):
            moved.event = UNKNOWN
        out.append(moved)
    return out


def _files_reversed(runs: Layout) -> Layout:
    return runs[::-1]


def _lines_reversed(runs: Layout) -> Layout:
    return [r[::-1] for r in runs]


def _shuffled_into_three(runs: Layout) -> Layout:
    every = [line for r in runs for line in r]
    random.Random(3).shuffle(every)
    return [every[i::3] for i in range(3)]


def _one_file_twice(runs: Layout) -> Layout:
    # The same run in two files (a copied file, two sinks of one tracer):
    # a line read twice counts once.
    return [*runs, runs[0]]


def _half_twice_shuffled(runs: Layout) -> Layout:
    # Overlapping pieces of every run, shuffled: rotated logs kept twice.
    every = [line for r in runs for line in r]
    again = every[: len(every) // 2]
    both = every + again
    random.Random(5).shuffle(both)
    return [both[: len(both) // 2], both[len(both) // 2 :]]


@pytest.fixture(scope="module")
def written() -> Layout:
    return _as_written()


def _outputs(runs: Layout, folder: Path) -> tuple[bytes, bytes]:
    folder.mkdir()
    paths = []
    for i, r in enumerate(runs):
        path = folder / f"part-{i}.jsonl"
        path.write_bytes(b"".join(r))
        paths.append(str(path))
    out = []
    for suffix in (".json", ".html"):
        target = folder / f"timeline{suffix}"
        assert main(["timeline", *paths, "-o", str(target)]) == 0
        out.append(target.read_bytes())
    return out[0], out[1]


@pytest.fixture(scope="module")
def baseline(written: Layout, tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    return _outputs(written, tmp_path_factory.mktemp("base") / "set")


@pytest.mark.parametrize(
    "reorder",
    [
        _files_reversed,  # files given in the other order
        _lines_reversed,  # every file's lines last to first
        _shuffled_into_three,  # all lines shuffled and dealt into three files
        _one_file_twice,  # a run's file given twice
        _half_twice_shuffled,  # half the lines twice, everything shuffled
    ],
)
def test_any_order_of_the_set_gives_the_same_document_and_page(
    written: Layout,
    baseline: tuple[bytes, bytes],
    reorder: Callable[[Layout], Layout],
    tmp_path: Path,
) -> None:
    document, page = _outputs(reorder(written), tmp_path / "set")
    assert document == baseline[0]
    assert page == baseline[1]


def test_the_baseline_has_what_the_comparison_needs(baseline: tuple[bytes, bytes]) -> None:
    # The comparison above is only as good as what is in the outputs: stops
    # with figures, redone and resumed tries, every outcome, the unknown event.
    document, page = baseline
    for needle in (b'"stop 1"', b'"redone":', b'"after_stop":', f'"{UNKNOWN}"'.encode()):
        assert needle in document, needle
    for needle in (b'class="f-redone"', b'class="f-resumed"', b'class="f-restarted"'):
        assert needle in page, needle


# --- memory -----------------------------------------------------------------------


def _peak(make: Callable[[], T]) -> tuple[int, T]:
    """Peak bytes allocated (tracemalloc) while ``make`` runs, and what it made."""
    gc.collect()
    tracemalloc.start()
    try:
        made = make()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, made


ATTEMPTS = 1500
# How many events of kinds it does not draw the timeline keeps per run
# (rollout_trace._timeline.fold.OTHER_PER_RUN).
OTHER_PER_RUN = 1000


@pytest.mark.slow
def test_events_that_are_not_drawn_cost_no_memory() -> None:
    # Events of a kind the timeline does not draw after every try, made one
    # at a time (no reader, whose buffers would blur the numbers). Folded,
    # a bounded number of them stay, so twelve times as many leave the peak
    # where it was; held, they take several times the whole page's peak.
    few, _ = _peak(lambda: rt.timeline_html(td.stream(ATTEMPTS, user_every=1)))
    many, page = _peak(lambda: rt.timeline_html(td.stream(ATTEMPTS, user_every=12)))
    held, _ = _peak(lambda: list(td.stream(ATTEMPTS, user_every=12)))
    assert held > 3 * few, (held, few)  # so a fold that kept them would show
    # What differs is one block's mix of events (user events are larger).
    assert many - few < 0.25 * few, (many, few)
    assert f"{ATTEMPTS:,} attempts" in page


@pytest.mark.parametrize("per_run", [OTHER_PER_RUN - 1, OTHER_PER_RUN, OTHER_PER_RUN + 1])
def test_the_kept_unknown_events_are_the_first_by_seq_in_any_order(per_run: int) -> None:
    # One fewer, as many, one more than are kept: reversed and shuffled, the
    # same ones are kept, and `others_cut` says whether any were left out.
    from rollout_trace._timeline.fold import OTHER_PER_RUN as KEPT
    from rollout_trace._timeline.fold import build_timeline

    assert KEPT == OTHER_PER_RUN
    events = [
        rt.UnknownEvent(event="sampled", time=100.0 + i, run_id="a" * 32, seq=i + 1, fields={})
        for i in range(per_run)
    ]
    shuffled = events[:]
    random.Random(1).shuffle(shuffled)
    kept = []
    for order in (events, events[::-1], shuffled, events + events[::-1]):
        run = build_timeline(order).runs[0]
        kept.append([m.seq for m in run.marks])
        assert run.others_cut == (per_run > OTHER_PER_RUN)
    assert kept[0] == list(range(1, min(per_run, OTHER_PER_RUN) + 1))
    assert all(k == kept[0] for k in kept)
