"""Gzip trace files as writers leave them: killed mid-member, appended to, shared by a fork.

A ``.jsonl.gz`` sink writes one gzip member per open, a batch at a time, each
batch flushed to a byte boundary (README: Reference > Wire format). The files
here are made the same way, with zlib, and then cut as a kill cuts them; one
is written by the real sink from a parent and its forked child.
"""

from __future__ import annotations

import gzip
import os
import signal
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from samples import ROLLOUT_SAMPLES, dispatched
from scenario import lines, make_run

import rollout_trace as rt
from rollout_trace import ReadProblem


def _run(n: int, count: int) -> list[rt.Event]:
    """A run of ``count`` varied events (every kind of rollout event, in turn)."""
    t0 = 1_700_000_000.0 + n * 10_000
    events = [(t0 + 1 + i, ROLLOUT_SAMPLES[i % len(ROLLOUT_SAMPLES)]) for i in range(count)]
    return make_run(n, t0, events, closed=t0 + count + 2)


A, B, C = _run(1, 300), _run(2, 300), _run(3, 120)


def _batches(run: list[rt.Event], *sizes: int) -> list[bytes]:
    """``run``'s lines cut into batches of ``sizes`` lines (the rest in a last batch)."""
    text = lines(run).splitlines(keepends=True)
    out, at = [], 0
    for size in sizes:
        out.append(b"".join(text[at : at + size]))
        at += size
    if at < len(text):
        out.append(b"".join(text[at:]))
    return out


def _member(batches: list[bytes], *, end: bool = True) -> list[bytes]:
    """One gzip member as the sink writes it: a header, each batch flushed, an end."""
    deflate = zlib.compressobj(wbits=31)
    out = [deflate.compress(batch) + deflate.flush(zlib.Z_SYNC_FLUSH) for batch in batches]
    if end:
        out[-1] += deflate.flush(zlib.Z_FINISH)
    return out


def _whole_lines(data: bytes) -> int:
    """How many whole lines zlib inflates from ``data`` (a member, maybe cut short)."""
    text = zlib.decompressobj(wbits=31).decompress(data)
    return text.count(b"\n")


def _read(tmp_path: Path, data: bytes) -> tuple[list[bytes], list[ReadProblem]]:
    path = tmp_path / "run.jsonl.gz"
    path.write_bytes(data)
    problems: list[ReadProblem] = []
    events = [msgspec.json.encode(e) for e in rt.read(path, problems=problems)]
    return events, problems


def _encoded(events: list[rt.Event]) -> list[bytes]:
    return [msgspec.json.encode(e) for e in events]


# --- a killed writer, then a restored run appending to the same file ------------------


def _killed_between_batches() -> tuple[bytes, list[rt.Event], list[tuple[int, bool]]]:
    a = _member(_batches(A, 100, 100), end=False)[:2]
    return b"".join(a + _member(_batches(B, 150))), A[:200] + B, [(201, True)]


def _killed_mid_batch() -> tuple[bytes, list[rt.Event], list[tuple[int, bool]]]:
    a = _member(_batches(A, 100, 100, 100), end=False)
    cut = a[0] + a[1] + a[2][: len(a[2]) // 2]  # the kill lands in the third write
    kept = _whole_lines(cut)
    assert 200 < kept < 300  # a part of the third batch is there to keep
    # The cut line is the torn one; the restored run's lines come after it.
    return cut + b"".join(_member(_batches(B, 150))), A[:kept] + B, [(kept + 1, True)]


def _killed_in_header() -> tuple[bytes, list[rt.Event], list[tuple[int, bool]]]:
    a = _member(_batches(A, 100))[0][:6]  # not even the header was written whole
    return a + b"".join(_member(_batches(B, 150))), B, [(1, True)]


def _killed_twice() -> tuple[bytes, list[rt.Event], list[tuple[int, bool]]]:
    a = _member(_batches(A, 100, 100), end=False)[:2]
    b = _member(_batches(B, 50, 50), end=False)[:2]
    c = _member(_batches(C, 60))
    return b"".join(a + b + c), A[:200] + B[:100] + C, [(201, True), (301, True)]


def _restored_run_killed_too() -> tuple[bytes, list[rt.Event], list[tuple[int, bool]]]:
    a = _member(_batches(A, 100, 100), end=False)[:2]
    b = b"".join(_member(_batches(B, 150)))
    b = b[: len(b) // 2]
    kept = _whole_lines(b)
    return b"".join(a) + b, A[:200] + B[:kept], [(201, True), (201 + kept, True)]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_run_killed_by_sigkill_then_restored_into_the_same_gz_file(tmp_path: Path) -> None:
    # The real sink: a child writes two batches and is killed with its member
    # open; the restored run appends its own member and closes it.
    path = tmp_path / "run.jsonl.gz"
    pid = os.fork()
    if pid == 0:
        try:
            tracer = rt.sync_tracer(str(path), flush_interval=60)
            for first in (0, 5):
                for i in range(first, first + 5):
                    tracer.emit(rt.WeightsSynced(weight_version=i))
                tracer.flush(10)
            tracer.emit(rt.WeightsSynced(weight_version=99))  # queued, never written
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
    with rt.sync_tracer(str(path)) as restored:
        for i in range(100, 103):
            restored.emit(rt.WeightsSynced(weight_version=i))
    problems: list[ReadProblem] = []
    events = list(rt.read(path, problems=problems))
    assert [type(e).__name__ for e in events] == ["TraceOpened"] + ["WeightsSynced"] * 10 + [
        "TraceOpened"
    ] + ["WeightsSynced"] * 3 + ["TraceClosed"]
    versions = [e.weight_version for e in events if isinstance(e, rt.WeightsSynced)]
    assert versions == [*range(10), *range(100, 103)]
    assert [(p.line, p.torn) for p in problems] == [(12, True)]


@pytest.mark.parametrize(
    "make",
    [
        # The common kill: between two writes, so the member just lacks its end.
        _killed_between_batches,
        # Killed during a write: the member ends inside a line; what inflates is kept.
        _killed_mid_batch,
        # Killed while writing the member's first bytes: nothing of it to read.
        _killed_in_header,
        # Restored, killed again, restored again: three members, two cut short.
        _killed_twice,
        # The restored run was killed too, and nothing came after it.
        _restored_run_killed_too,
    ],
)
def test_a_member_cut_short_by_a_kill_does_not_hide_the_next(
    tmp_path: Path, make: Callable[[], tuple[bytes, list[rt.Event], list[tuple[int, bool]]]]
) -> None:
    data, expected, torn = make()
    events, problems = _read(tmp_path, data)
    assert events == _encoded(expected)
    assert [(p.line, p.torn) for p in problems] == torn
    assert all("gzip" in p.reason for p in problems)


# --- members of a parent and its forked child, interleaved ----------------------------

# A parent that ran a while before it forked, and children that do other work at
# the same time; a batch is the lines one write holds.
PARENT = _run(4, 400)
KIDS = [
    make_run(
        n,
        PARENT[0].time + 100,
        [(PARENT[0].time + 100 + i * 0.7, dispatched(1000 * n + i)) for i in range(count)],
        closed=PARENT[0].time + 500,
        pid=2000 + n,
    )
    for n, count in ((5, 250), (6, 90))
]


def _interleave(*members: list[bytes], order: str) -> bytes:
    """The members' writes in ``order``: "0101" is a write of member 0, of 1, of 0..."""
    queues = [list(m) for m in members]
    data = b"".join(queues[int(k)].pop(0) for k in order)
    assert not any(queues)
    return data


@pytest.mark.parametrize(
    ("data", "expected", "cuts"),
    [
        pytest.param(
            # Parent and child take turns, a batch each.
            _interleave(
                _member(_batches(PARENT, 200, 100)),
                _member(_batches(KIDS[0], 100, 100)),
                order="010101",
            ),
            PARENT + KIDS[0],
            1,
            id="turns",
        ),
        pytest.param(
            # Batches of one line, read with little history to tell them apart.
            _interleave(
                _member(_batches(PARENT, 150, *[1] * 20)),
                _member(_batches(KIDS[0], *[1] * 20)),
                order="0" + "10" * 21,
            ),
            PARENT + KIDS[0],
            1,
            id="one-line-batches",
        ),
        pytest.param(
            # The child writes its whole member between two of the parent's writes.
            _interleave(
                _member(_batches(PARENT, 100)), _member(_batches(KIDS[0], 50, 50)), order="01110"
            ),
            PARENT + KIDS[0],
            1,
            id="child-inside-parent",
        ),
        pytest.param(
            # Two children; the writes of all three in no regular order.
            _interleave(
                _member(_batches(PARENT, 150, 50, 50)),
                _member(_batches(KIDS[0], 70, 70, 70)),
                _member(_batches(KIDS[1], 40)),
                order="0110220110",
            ),
            PARENT + KIDS[0] + KIDS[1],
            2,  # the parent's member, then the first child's
            id="three-writers",
        ),
        pytest.param(
            # The parent was killed after the fork; the child writes on.
            _interleave(
                _member(_batches(PARENT, 150, 100), end=False)[:2],
                _member(_batches(KIDS[0], 100, 100)),
                order="01011",
            ),
            PARENT[:250] + KIDS[0],
            1,
            id="parent-killed",
        ),
    ],
)
def test_interleaved_members_each_read_whole(
    tmp_path: Path, data: bytes, expected: list[rt.Event], cuts: int
) -> None:
    events, problems = _read(tmp_path, data)
    assert sorted(events) == sorted(_encoded(expected))  # each event once, none made up
    # Each member that another began inside of is reported, once.
    assert [(p.torn, "another begins" in p.reason) for p in problems] == [(True, True)] * cuts


def test_twins_that_cannot_be_told_apart_are_not_guessed_at(tmp_path: Path) -> None:
    # Two runs writing the same events at the same seqs (a fork right after the
    # open, children alike): a batch of one reads as well as the other's with
    # either member's history. None is given a run on a guess; what is left
    # unread is reported.
    data = _interleave(
        _member(_batches(A, 100, 100)), _member(_batches(B, 100, 100)), order="010101"
    )
    events, problems = _read(tmp_path, data)
    written = _encoded(A) + _encoded(B)
    assert all(events.count(e) == 1 for e in events) and set(events) <= set(written)
    assert events[:100] == written[:100]  # the parent's batch before the fork
    assert len(events) < len(written)
    assert any("more than one" in p.reason for p in problems)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_writing_the_parents_gz_file(tmp_path: Path) -> None:
    # The real sink in a parent and its forked child, one path, their writes
    # taking turns: parent, child, parent, child, and each closes its member.
    path = tmp_path / "shared.jsonl.gz"
    tracer = rt.sync_tracer(str(path), flush_interval=60)
    tracer.open()
    parent_turn, child_turn = os.pipe(), os.pipe()

    def emit(first: int) -> None:
        for i in range(first, first + 5):
            tracer.emit(rt.WeightsSynced(weight_version=i))
        assert tracer.flush(10)

    emit(0)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            for first in (100, 105):
                emit(first)
                os.write(parent_turn[1], b".")
                os.read(child_turn[0], 1)
            tracer.close(timeout=10)
            code = 0
        finally:
            os._exit(code)
    for first in (5, 10):
        os.read(parent_turn[0], 1)
        emit(first)
        os.write(child_turn[1], b".")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent_run = tracer.run_id
    tracer.close()
    with pytest.raises(zlib.error):  # what the gzip module makes of it
        gzip.decompress(path.read_bytes())

    problems: list[ReadProblem] = []
    runs: dict[str, list[rt.Event | rt.UnknownEvent]] = {}
    for ev in rt.read(path, problems=problems):
        runs.setdefault(ev.run_id, []).append(ev)
    assert len(runs) == 2
    parent = runs.pop(str(parent_run))
    (child,) = runs.values()
    for run, versions in ((parent, range(15)), (child, range(100, 110))):
        assert [e.seq for e in run] == list(range(len(versions) + 2))
        assert [type(e) for e in run] == [rt.TraceOpened] + [rt.WeightsSynced] * len(versions) + [
            rt.TraceClosed
        ]
        assert [e.weight_version for e in run[1:-1]] == list(versions)  # type: ignore[union-attr]
    # The parent's member is cut where the child's begins: said once.
    assert [(p.line, p.torn) for p in problems] == [(7, True)]


# --- damage -----------------------------------------------------------------------------


def test_damage_inside_a_member_keeps_what_inflates_before_it(tmp_path: Path) -> None:
    # One big write, damaged four fifths in, then a whole member from the next run.
    a = b"".join(_member([lines(A * 4)]))
    at = len(a) * 4 // 5
    damaged = a[:at] + bytes(b ^ 0x55 for b in a[at : at + 64]) + a[at + 64 :]
    before = _whole_lines(a[:at])
    events, problems = _read(tmp_path, damaged + b"".join(_member(_batches(B, 100))))
    # Damaged deflate data may inflate to garbage before zlib sees the damage
    # (the member's checksum comes at its end): bad lines then, and reported.
    assert events[: before - 10] == _encoded(A * 4)[: before - 10]  # all but the last few
    assert events[-len(B) :] == _encoded(B)
    assert any("corrupt gzip data" in p.reason for p in problems)


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        # Zeros after the end: a file system's padding after a crash, said nothing of.
        (b"\0" * 100, None),
        # Bytes that are not gzip after the last member are reported.
        (b"not gzip at all\n", "not gzip data"),
    ],
)
def test_what_follows_the_last_member(tmp_path: Path, tail: bytes, reason: str | None) -> None:
    events, problems = _read(tmp_path, b"".join(_member(_batches(A, 100))) + tail)
    assert events == _encoded(A)
    assert [p.reason for p in problems if reason and reason in p.reason] == [
        p.reason for p in problems
    ]
    assert len(problems) == (reason is not None)
