"""The timeline is a streaming fold: one answer for any order of a set, in bounded memory."""

from __future__ import annotations

import gc
import json
import random
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import timeline_data as td
from scenario import disp, lines, make_run, restore, restored, seal, snapshot

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._model.terms import SEQ_LIMIT
from rollout_trace._timeline.model import build_timeline

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


def _notes_apart(document: bytes, page: bytes) -> tuple[bytes, bytes, set[str]]:
    """The outputs without their notes, and the kinds of the notes."""
    # The notes end the document's otherData, and have a card of their own.
    head, _, notes = document.rpartition(b',"notes":')
    kinds = {n["kind"] for n in json.loads(notes[:-2])}
    page = re.sub(rb'<div class="card" id="notes">.*?</div>', b"", page)
    return head, page, kinds


@pytest.mark.parametrize(
    ("reorder", "notes"),
    [
        (_files_reversed, set()),  # files given in the other order
        (_lines_reversed, set()),  # every file's lines last to first
        (_shuffled_into_three, set()),  # all lines shuffled and dealt into three files
        (_one_file_twice, {"read_twice"}),  # a run's file given twice
        (_half_twice_shuffled, {"read_twice"}),  # half the lines twice, everything shuffled
    ],
)
def test_any_order_of_the_set_gives_the_same_document_and_page(
    written: Layout,
    baseline: tuple[bytes, bytes],
    reorder: Callable[[Layout], Layout],
    notes: set[str],
    tmp_path: Path,
) -> None:
    # The same, but for the notes that lines were read twice.
    document, page = _outputs(reorder(written), tmp_path / "set")
    if not notes:
        assert (document, page) == baseline
    document, page, kinds = _notes_apart(document, page)
    assert kinds == notes
    assert (document, page) == _notes_apart(*baseline)[:2]


def test_the_baseline_has_what_the_comparison_needs(baseline: tuple[bytes, bytes]) -> None:
    # The comparison above is only as good as what is in the outputs: stops
    # with figures, redone and resumed tries, every outcome, the unknown event.
    document, page = baseline
    for needle in (b'"stop 1"', b'"redone":', b'"after_stop":', f'"{UNKNOWN}"'.encode()):
        assert needle in document, needle
    for needle in (b'class="f-lost"', b'class="f-resumed"', b'class="f-restarted"'):
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
# (rollout_trace._timeline.model.OTHER_PER_RUN).
OTHER_PER_RUN = 1000


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True, reason="#26: the model holds every event until it keeps columns (step 7)"
)
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
    from rollout_trace._timeline.model import OTHER_PER_RUN as KEPT

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


# --- lines the cost analysis leaves out --------------------------------------------


def _with_bad_seq(bad: int) -> list[rt.Event]:
    """Run A seals prompt 7 and is stopped; B restores. A also has lines with seq ``bad``.

    Counted, the bad dispatch of prompt 8 would be a try in flight at the
    stop (restarted 1) and the bad weight sync would be A's last event.
    """
    a = make_run(
        1, 100.0, [(101.0, disp(7, 0)), (102.0, seal(7, 0)), (103.0, snapshot(1, "/s", 102.5))]
    )
    rid = a[0].run_id
    if 0 < bad <= SEQ_LIMIT:
        # A line kept right before the first left out: in seq order, as
        # written, the two come one after the other.
        a.append(rt.WeightsSynced(weight_version=1, time=103.0, run_id=rid, seq=bad - 1))
    bad_dispatch = msgspec.structs.replace(disp(8, 0), time=104.0, run_id=rid, seq=bad)
    bad_sync = rt.WeightsSynced(weight_version=2, time=900.0, run_id=rid, seq=bad + 1)
    b = make_run(2, 200.0, [(201.0, restore("/s", 1)), (202.0, restored(1))], closed=203.0)
    return [*a, bad_dispatch, bad_sync, *b]


@pytest.mark.parametrize(
    "bad",
    [
        -7,  # below 0
        -(2**63),  # the lowest a signed 64-bit seq can be
        SEQ_LIMIT,  # the first left out, right after a line kept
        SEQ_LIMIT + 5,  # above 2**62: not a seq a tracer gives
        2**63 - 2,  # the highest a signed 64-bit seq can be, and one more
    ],
)
def test_lines_the_cost_analysis_leaves_out_are_not_drawn(bad: int) -> None:
    events = _with_bad_seq(bad)
    [stop] = rt.restore_costs(events)
    assert (stop.restarted, stop.stop_time) == (0, 103.0)
    page = rt.timeline_html(events)
    legend = re.search(r'<span class="k">restarted</span> <span class="n">(\d+)</span>', page)
    assert legend is not None and int(legend.group(1)) == stop.restarted
    tl = build_timeline(events)
    a_run = tl.runs[0]
    assert [a.prompt_id for a in a_run.attempts] == [7]
    assert a_run.last_time == 103.0 and tl.t1 == 203.0
    assert [m.values for m in a_run.marks if m.kind == "weights"] in ([], [(1,)])
    assert [n.kind for n in tl.notes] == ["bad_seq"]
    # And the same in any order of the lines.
    for order in (events[::-1], random.Random(bad % 97).sample(events, len(events))):
        assert rt.timeline_html(order) == page


# --- lines that share a seq ---------------------------------------------------------


def _sharing(first: rt.Event | rt.UnknownEvent, second: rt.Event | rt.UnknownEvent) -> list[Any]:
    """A run with two lines at seq 5 (a corrupt log, or one edited by hand)."""
    run = make_run(3, 100.0, [(101.0, disp(1, 0)), (110.0, seal(1, 0))], closed=111.0)
    rid = run[0].run_id
    shared = [msgspec.structs.replace(ev, run_id=rid, seq=5) for ev in (first, second)]
    return [*run, *shared]


def _group(gid: str) -> rt.Event:
    return rt.GroupAdmitted(group_id=gid, prompt_id=1, time=105.0)


def _sampled(value: int) -> rt.UnknownEvent:
    return rt.UnknownEvent(event="sampled", time=105.0, run_id="", seq=0, fields={"v": value})


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (_group("g-a"), _group("g-b")),  # two group events alike but for their group id
        (_sampled(1), _sampled(2)),  # two unknown events alike but for a field
        (rt.WeightsSynced(weight_version=1, time=105.0), _group("g-a")),  # two kinds
    ],
)
def test_of_lines_that_share_a_seq_the_same_one_is_drawn_in_any_order(
    first: rt.Event | rt.UnknownEvent, second: rt.Event | rt.UnknownEvent
) -> None:
    one, other = _sharing(first, second), _sharing(second, first)
    doc = rt.timeline_document(one)
    at_5 = [e for e in doc["traceEvents"] if e.get("ph") == "i" and e["ts"] == 105e6]
    assert len(at_5) == 1
    assert rt.timeline_document(other) == doc
    assert rt.timeline_document(one[::-1]) == doc
