"""Gzip trace files as writers leave them: killed mid-member, appended to, shared by a fork.

A ``.jsonl.gz`` sink writes one gzip member per open, a batch at a time, each
batch flushed to a byte boundary (README: Reference > Wire format). The files
here are made the same way, with zlib, and then cut as a kill cuts them; one
is written by the real sink from a parent and its forked child.
"""

from __future__ import annotations

import gzip
import os
import random
import signal
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from samples import ROLLOUT_SAMPLES, dispatched
from scenario import lines, make_run

import rollout_trace as rt
from rollout_trace import ReadProblem
from sinks import JsonlSink


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


def _member(
    batches: list[bytes], *, end: bool = True, flush: int = zlib.Z_SYNC_FLUSH
) -> list[bytes]:
    """One gzip member: a header, each batch flushed, an end.

    ``Z_FULL_FLUSH`` is how the sink writes now (each batch stands alone);
    ``Z_SYNC_FLUSH``, whose batches refer back, is how it wrote before.
    """
    deflate = zlib.compressobj(wbits=31)
    out = [deflate.compress(batch) + deflate.flush(flush) for batch in batches]
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


_WHOLE_B = b"".join(_member(_batches(B, 100)))
_WHOLE_A = b"".join(_member(_batches(A, 100)))


@pytest.mark.parametrize(
    ("name", "junk"),
    [
        # Zeros where a file system lost what a crash had not written; a run appended.
        ("run.jsonl.gz", b"\0" * 4096),
        # Random bytes, as damage leaves them.
        ("run.jsonl.gz", random.Random(5).randbytes(3000)),
        # A member whose first bytes were zeroed: its header is lost, its data junk.
        ("run.jsonl.gz", b"\0" * 64 + _WHOLE_A[64:]),
        # A line of text, then a member, in a file whose name does not say gzip.
        ("run.jsonl", b"not a trace line\n"),
        ("run.jsonl", b"\0" * 4096),
    ],
    ids=["zeros", "random", "header-zeroed", "text-line", "zeros-jsonl"],
)
def test_junk_before_the_first_member_is_reported_and_the_members_read(
    tmp_path: Path, name: str, junk: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(junk + _WHOLE_B)
    problems: list[ReadProblem] = []
    events = _encoded(list(rt.read(path, problems=problems)))
    assert events[-len(B) :] == _encoded(B)
    # What is read of a member with no header is its own (batches that stand alone).
    assert set(events[: -len(B)]) <= set(_encoded(A))
    # Junk is damage, not a kill's mark: an error for validate.
    assert problems and not any(p.torn for p in problems)
    assert problems[0].line == 1 and f"bytes 0-{len(junk):,}" in problems[0].reason


# A gzip header, and text where its deflate data would be.
_MAGIC_LINE = b"\x1f\x8b\x08\0\0\0\0\0\0\x03junk\n"


@pytest.mark.parametrize(
    ("name", "data", "count", "bad"),
    [
        # A line of text that holds gzip's magic bytes, not a member.
        ("run.jsonl", lines(A[:3]) + _MAGIC_LINE + lines(A[3:]), 302, [4]),
        # Zeros (a crash) at the start of a text file.
        ("run.jsonl", b"\0" * 4096 + b"\n" + lines(A), 302, [1]),
        # Text in a file named .gz, and with zeros after it (a crash).
        ("run.jsonl.gz", lines(A), 302, []),
        ("run.jsonl.gz", lines(A) + b"\0" * 4096, 302, [303]),
    ],
    ids=["magic-in-a-line", "zeros-then-text", "text-named-gz", "text-named-gz-zeros"],
)
def test_text_is_read_as_text(
    tmp_path: Path, name: str, data: bytes, count: int, bad: list[int]
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    problems: list[ReadProblem] = []
    assert len(list(rt.read(path, problems=problems))) == count
    assert [p.line for p in problems] == bad


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


_FULL = zlib.Z_FULL_FLUSH
# Two runs whose lines are alike but for the run id: a crash loop, or children forked
# right after the open, start with the same events.
TWIN_A, TWIN_B = _run(7, 200), _run(8, 200)


def _sunk(folder: Path, batches: list[bytes], *, end: bool = True) -> list[bytes]:
    """The bytes each write of the real ``.jsonl.gz`` sink adds (the end with the last)."""
    path = folder / f"member{len(list(folder.iterdir()))}.jsonl.gz"
    sink = JsonlSink(str(path), {})
    sink.open()
    out, size = [], 0
    for batch in batches:
        sink.write(batch)
        data = path.read_bytes()
        out.append(data[size:])
        size = len(data)
    if end:
        sink.close()
        out[-1] += path.read_bytes()[size:]
    else:
        sink.discard()
    return out


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        pytest.param(
            # Twins taking turns, a batch each.
            lambda d: _interleave(
                _sunk(d, _batches(TWIN_A, 50, 50, 50)),
                _sunk(d, _batches(TWIN_B, 50, 50, 50)),
                order="01010101",
            ),
            TWIN_A + TWIN_B,
            id="twins",
        ),
        pytest.param(
            # Batches of a line or two, which give the least to tell twins apart by.
            lambda d: _interleave(
                _sunk(d, _batches(TWIN_A, 150, *[2] * 10)),
                _sunk(d, _batches(TWIN_B, *[1] * 20)),
                order="0" + "10" * 11 + "1" * 10,
            ),
            TWIN_A + TWIN_B,
            id="twins-small-batches",
        ),
        pytest.param(
            # A crash loop: each run killed between batches, the next appending.
            lambda d: b"".join(
                _sunk(d, _batches(TWIN_A, 60, 60), end=False)[:2]
                + _sunk(d, _batches(TWIN_B, 60, 60), end=False)[:2]
                + _sunk(d, _batches(C, 60))
            ),
            TWIN_A[:120] + TWIN_B[:120] + C,
            id="crash-loop",
        ),
    ],
)
def test_batches_of_the_sink_are_read_whoever_wrote_them(
    tmp_path: Path, layout: Callable[[Path], bytes], expected: list[rt.Event]
) -> None:
    # The sink flushes each batch so that it reads alone: twins that the old
    # layout (batches that refer back) could not tell apart lose nothing.
    folder = tmp_path / "members"
    folder.mkdir()
    events, problems = _read(tmp_path, layout(folder))
    assert sorted(events) == sorted(_encoded(expected))
    assert all(p.torn and "another begins" in p.reason for p in problems)


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.9])  # where the kill lands in the batch
def test_a_forked_child_killed_mid_batch_does_not_hide_the_parent(
    tmp_path: Path, fraction: float
) -> None:
    # parent | child | parent | child's batch cut short | parent, parent, end:
    # the parent's next batch follows torn bytes, with no batch end before it.
    parent = _member(_batches(PARENT, 100, 100, 100, 50), flush=_FULL)
    child = _member(_batches(KIDS[0], 100, 100, 50), flush=_FULL)
    cut = child[1][: max(1, int(len(child[1]) * fraction))]
    data = parent[0] + child[0] + parent[1] + cut + b"".join(parent[2:])
    events, problems = _read(tmp_path, data)
    kept = _whole_lines_alone(cut)
    assert sorted(events) == sorted(_encoded(PARENT + KIDS[0][: 100 + kept]))
    assert [p.torn for p in problems] == [True, True]
    assert "a batch cut short" in problems[1].reason


def _whole_lines_alone(batch: bytes) -> int:
    """How many whole lines a batch that stands alone inflates to, cut short or not."""
    inflater = zlib.decompressobj(wbits=-15)
    text = b""
    for i in range(len(batch)):
        try:
            text += inflater.decompress(batch[i : i + 1])
        except zlib.error:
            break
    return text.count(b"\n")


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
    ("hit", "damage"),
    [
        (1, b"\xff" * 8),  # the second batch's block header: not deflate at all
        (2, b"\x00" * 8),  # the third's: a stored block whose length does not check
    ],
)
def test_damage_loses_only_the_batch_it_lands_in(tmp_path: Path, hit: int, damage: bytes) -> None:
    members = _member(_batches(A, 60, 60, 60, 60), flush=_FULL)
    members[hit] = damage + members[hit][len(damage) :]
    events, problems = _read(tmp_path, b"".join(members))
    # The batches after the damaged one are read, each line once; before, all was lost.
    assert sorted(events) == sorted(_encoded(A[: hit * 60] + A[(hit + 1) * 60 :]))
    assert [p.torn for p in problems if "corrupt gzip data" in p.reason][-1] is False


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


def test_a_batch_that_inflates_a_thousandfold_is_judged_by_its_start(tmp_path: Path) -> None:
    # After a member cut short, each batch is inflated by every member that
    # might own it. A 100 KB batch of one 100 MB line must not be held whole.
    opened = lines(B[:1])
    huge = b'{"event":"note","run_id":"x","seq":1,"text":"' + b" " * (100 << 20) + b'"}\n'
    data = b"".join(_member(_batches(A, 100, 100), end=False)[:2] + _member([opened, huge]))
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        problems: list[ReadProblem] = []
        events = list(rt.read(path, problems=problems))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(events) == 201  # A's first 200 lines and B's first: the huge line is skipped
    assert peak < 40 << 20, f"peak {peak >> 20} MiB"
    assert [p.line for p in problems] == [201, 202]  # the cut, then the line left unread


# --- batches of over 4 MiB of text (a busy tracer), where zlib and the reader step in pieces

BIG = _run(9, 20_000)  # about 5 MiB of text


def test_a_big_member_then_a_crashs_zeros_then_the_next(tmp_path: Path) -> None:
    # zlib repeats what follows a member's end when the end comes after a
    # call cut short by the output limit; the zeros a crash leaves are padding.
    data = b"".join(_member(_batches(BIG, 20_001), flush=_FULL)) + bytes(64 << 10)
    events, problems = _read(tmp_path, data + b"".join(_member(_batches(B, 100), flush=_FULL)))
    assert events == _encoded(BIG + B)
    assert [(p.torn, "zeros" in p.reason) for p in problems] == [(True, True)]


def test_a_kill_before_a_batchs_first_line_ended_is_only_torn(tmp_path: Path) -> None:
    # Killed run, restored run killed two bytes into a write, restored again.
    a = _member(_batches(A, 100, 100), end=False, flush=_FULL)[:2]
    b = _member(_batches(B, 100, 100), end=False, flush=_FULL)
    c = _member(_batches(C, 60), flush=_FULL)
    events, problems = _read(tmp_path, b"".join([*a, b[0], b[1][:2], *c]))
    assert events == _encoded(A[:200] + B[:100] + C)
    assert problems and all(p.torn for p in problems)


@pytest.mark.parametrize("left", [0.5, 0.99])  # how much of the child's big write landed
def test_a_forked_child_killed_in_a_big_write_does_not_hide_the_parent(
    tmp_path: Path, left: float
) -> None:
    parent = _member(_batches(PARENT, 100, 100, 100, 50), flush=_FULL)
    child = _member(_batches(BIG, 10, 20_000), flush=_FULL)
    cut = child[1][: int(len(child[1]) * left)]
    data = parent[0] + child[0] + parent[1] + cut + b"".join(parent[2:])
    events, problems = _read(tmp_path, data)
    assert set(_encoded(PARENT)) <= set(events)  # every parent line, whatever came before it
    assert set(events) <= set(_encoded(PARENT + BIG))
    assert len(events) == len(set(events))
    assert all(p.torn for p in problems), problems


def test_damage_in_a_big_batch_after_a_kill_is_reported_not_raised(tmp_path: Path) -> None:
    a = _member(_batches(A, 100, 100), end=False, flush=_FULL)[:2]
    b = _member(_batches(BIG, 10, 20_000, 10), flush=_FULL)
    at = len(b[2]) * 19 // 20  # past the first 4 MiB of text, which a batch is judged by
    b[2] = b[2][:at] + b"\xff" * 20 + b[2][at + 20 :]
    events, problems = _read(tmp_path, b"".join(a + b))
    assert set(_encoded(A[:200] + BIG[:10])) <= set(events)
    assert set(_encoded(BIG[20_010:])) <= set(events)  # read on after the damaged batch
    assert any(not p.torn for p in problems)
