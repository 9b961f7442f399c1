"""What reading holds on to: a line that never ends, and what each skipped or
unknown line leaves behind for the garbage collector (which the commands pause)."""

from __future__ import annotations

import gc
import gzip
import tracemalloc
from pathlib import Path

import pytest
from scenario import disp, lines, make_run, run_id

import rollout_trace as rt
from rollout_trace import ReadProblem
from rollout_trace._reading import reader
from rollout_trace._reading.reader import iter_blocks

RUN = make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, disp(2, 0))], closed=103.0)
HEAD, TAIL = lines(RUN[:2]), lines(RUN[2:])
RID = run_id(1)
LIMIT = 1 << 20
# 24 MiB on one line: the start of an event, and no end.
LONG = (
    b'{"event":"blob","time":1.5,"run_id":"' + RID.encode() + b'","seq":9,"b":"' + b"x" * (24 << 20)
)


@pytest.mark.parametrize(
    ("data", "count", "problem"),
    [
        # In the middle: skipped, and the lines after its newline are read.
        (HEAD + LONG + b"\n" + TAIL, 4, (3, False)),
        # At the end, with no newline to end it.
        (HEAD + TAIL + LONG, 4, (5, False)),
    ],
    ids=["middle", "end"],
)
@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "gzip"])
def test_a_line_too_long_to_hold_is_skipped_in_little_memory(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    data: bytes,
    count: int,
    problem: tuple[int, bool],
    gz: bool,
) -> None:
    monkeypatch.setattr(reader, "_MAX_LINE", LIMIT, raising=False)
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    found: list[ReadProblem] = []
    tracemalloc.start()
    try:
        events = list(rt.read(path, problems=found))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # What is held: a few chunks of text (4 MiB each from gzip) and the line
    # up to the limit, never the whole line, let alone a copy of it per chunk.
    assert peak < 16 << 20
    assert events == RUN[:count]
    assert [(p.line, p.torn, p.run_id, p.seq) for p in found] == [(*problem, RID, 9)]
    assert "longer than 1 MiB" in found[0].reason


def test_a_long_line_under_the_limit_is_read_whole(tmp_path: Path) -> None:
    # Spread over many chunks, it is still one line and one event.
    big = rt.GroupDiscarded(group_id="g", prompt_id=1, reason="r" * (5 << 20))
    run = make_run(1, 100.0, [(101.0, big), (102.0, disp(2, 0))])
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines(run))
    assert list(rt.read(path)) == run


# 24 MiB in one string field, of a known event and of one no class is defined for.
_BIG = 24 << 20
_BIG_KNOWN = lines(
    make_run(1, 100.0, [(101.0, rt.GroupDiscarded(group_id="g", prompt_id=1, reason="r" * _BIG))])
)
_BIG_UNKNOWN = (
    b'{"event":"blob","time":1.5,"run_id":"' + RID.encode() + b'","seq":9,"b":"' + b"x" * _BIG
) + b'"}\n'


@pytest.mark.parametrize(
    "data",
    [
        # Read by the block decoder before: its pieces, the block's array and the event.
        _BIG_KNOWN,
        # Refused by the block decoder, read by decode_one.
        HEAD + _BIG_UNKNOWN + TAIL,
    ],
    ids=["known", "unknown"],
)
@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "gzip"])
def test_a_long_line_costs_its_text_and_its_event(tmp_path: Path, data: bytes, gz: bool) -> None:
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    list(iter_blocks(path, None))  # decoders and caches are built once, first
    tracemalloc.start()
    try:
        count = sum(len(events) for _, events, _ in iter_blocks(path, None))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == data.count(b"\n")
    # The text and the event decoded from it; a copy more is half as much again.
    assert peak < 2.5 * _BIG


def test_the_reason_for_a_huge_bad_line_is_short(tmp_path: Path) -> None:
    # msgspec quotes the bad value; a reason carries a few hundred characters of it.
    bad = (
        b'{"event":"attempt_abandoned","time":1.5,"run_id":"' + RID.encode() + b'","seq":9,'
        b'"group_id":"g","prompt_id":1,"generation_index":0,"attempt":0,"reason":"'
        + b"x" * (3 << 20)
        + b'"}\n'
    )
    path = tmp_path / "t.jsonl"
    path.write_bytes(HEAD + bad + TAIL)
    found: list[ReadProblem] = []
    assert list(rt.read(path, problems=found)) == RUN
    assert [(p.line, p.run_id, p.seq) for p in found] == [(3, RID, 9)]
    assert "Invalid enum value 'xxx" in found[0].reason and len(found[0].reason) < 500


UNKNOWN = b'{"event":"gpu_sampled","time":1.5,"run_id":"' + RID.encode() + b'","seq":9,"gib":3}\n'
INVALID = b'{"event":"attempt_sealed","time":1.5,"run_id":"' + RID.encode() + b'","seq":9}\n'


@pytest.mark.parametrize(
    "line",
    [
        # A user's event, kept as an UnknownEvent: every one went through an exception.
        UNKNOWN,
        # A built-in event missing its fields, skipped.
        INVALID,
        # Not JSON at all.
        b"garbage\n",
    ],
    ids=["unknown", "invalid", "garbage"],
)
def test_reading_leaves_no_garbage_cycles(tmp_path: Path, line: bytes) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(HEAD + line * 3000 + TAIL)
    problems: list[ReadProblem] = []
    list(iter_blocks(path, None))  # decoders and caches are built once, first
    # Until nothing is left: objects a finalizer kept alive (earlier tests'
    # clients) are garbage again only at the next collection.
    for _ in range(10):
        if not gc.collect():
            break
    gc.disable()  # as `rollout-trace cost` does while it folds
    try:
        events = [ev for _, block, _ in iter_blocks(path, problems) for ev in block]
        left = gc.collect()
    finally:
        gc.enable()
    assert len(events) + len(problems) == 3004
    assert left < 50  # not a traceback, frame and exception per line
