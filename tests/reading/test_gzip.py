"""Gzip trace files as writers leave them: killed mid-write, appended to, shared by a fork, damaged.

A ``.jsonl.gz`` sink writes each batch as one whole gzip member (README:
Reference > Wire format). The files here are made the same way, with zlib,
and then cut as a kill cuts them or damaged; some are written by the real
sink from a parent and its forked child.
"""

from __future__ import annotations

import gzip
import os
import random
import signal
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from samples import ROLLOUT_SAMPLES, dispatched
from scenario import lines, make_run

import rollout_trace as rt
from rollout_trace import ReadProblem
from rollout_trace._reading import reader
from rollout_trace._reading.gunzip import Cut, Members


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


def _member(text: bytes) -> bytes:
    """``text`` as the sink writes one batch: a whole gzip member."""
    deflate = zlib.compressobj(wbits=31)
    return deflate.compress(text) + deflate.flush(zlib.Z_FINISH)


def _members(run: list[rt.Event], *sizes: int) -> list[bytes]:
    """``run`` as the sink writes it in batches of ``sizes`` lines: a member each."""
    return [_member(batch) for batch in _batches(run, *sizes)]


def _kept(cut: bytes) -> tuple[int, bool]:
    """What zlib inflates from a member cut short: its whole lines, and whether a
    torn line follows them."""
    text = zlib.decompressobj(wbits=31).decompress(cut)
    return text.count(b"\n"), not text.endswith(b"\n") and bool(text)


def _read(tmp_path: Path, data: bytes) -> tuple[list[bytes], list[ReadProblem]]:
    path = tmp_path / "run.jsonl.gz"
    path.write_bytes(data)
    problems: list[ReadProblem] = []
    events = [msgspec.json.encode(e) for e in rt.read(path, problems=problems)]
    return events, problems


def _encoded(events: list[rt.Event]) -> list[bytes]:
    return [msgspec.json.encode(e) for e in events]


# --- a killed writer, then a restored run appending to the same file ------------------


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_run_killed_by_sigkill_then_restored_into_the_same_gz_file(tmp_path: Path) -> None:
    # The real sink: a child writes two batches and is killed; the restored run
    # appends its own. A kill between writes leaves whole members only.
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
    assert problems == []  # the killed run's mark is its missing trace_closed
    assert len(gzip.decompress(path.read_bytes()).splitlines()) == len(events)


def _cut(member: bytes, fraction: float) -> bytes:
    return member[: int(len(member) * fraction)]


# Each: the bytes, the events read from them, and the members cut short as
# (whole lines kept, whether a torn line follows), in file order.
_Case = tuple[bytes, list[rt.Event], list[tuple[int, bool]]]


def _killed_mid_write() -> _Case:
    a = _members(A, 100, 100, 100)
    cut = _cut(a[2], 0.5)  # the kill lands in the third write
    kept, torn = _kept(cut)
    assert 0 < kept < 100  # a part of the third batch is there to keep
    return a[0] + a[1] + cut + b"".join(_members(B, 150)), A[: 200 + kept] + B, [(200 + kept, torn)]


def _killed_in_header() -> _Case:
    cut = _members(A, 100)[0][:6]  # not even the header was written whole
    return cut + b"".join(_members(B, 150)), B, [(0, False)]


def _killed_twice() -> _Case:
    a, b = _members(A, 100, 100), _members(B, 50, 50)
    cut_a, cut_b = _cut(a[1], 0.3), _cut(b[1], 0.6)
    (ka, ta), (kb, tb) = _kept(cut_a), _kept(cut_b)
    data = a[0] + cut_a + b[0] + cut_b + b"".join(_members(C, 60))
    return data, A[: 100 + ka] + B[: 50 + kb] + C, [(100 + ka, ta), (50 + kb, tb)]


def _restored_run_killed_too() -> _Case:
    a, b = _members(A, 100, 100), _members(B, 150)
    cut_a, cut_b = _cut(a[1], 0.5), _cut(b[0], 0.5)
    (ka, ta), (kb, tb) = _kept(cut_a), _kept(cut_b)
    return a[0] + cut_a + cut_b, A[: 100 + ka] + B[:kb], [(100 + ka, ta), (kb, tb)]


def _trailer_lost() -> _Case:
    # Killed in the last bytes of a write: every line inflates, the check sum is lost.
    a = _members(A, 100, 100)
    cut = a[1][:-4]
    return a[0] + cut + b"".join(_members(B)), A[:200] + B, [(200, False)]


@pytest.mark.parametrize(
    "make",
    [_killed_mid_write, _killed_in_header, _killed_twice, _restored_run_killed_too, _trailer_lost],
)
def test_a_member_cut_short_by_a_kill_loses_only_its_own_lines(
    tmp_path: Path, make: Callable[[], _Case]
) -> None:
    data, expected, cuts = make()
    events, problems = _read(tmp_path, data)
    assert events == _encoded(expected)
    # A torn line, or the cut alone, where each member breaks off.
    at, where = 0, []
    for kept, torn in cuts:
        at += kept
        where.append((at + 1, True))
        at += torn
    assert [(p.line, p.torn) for p in problems] == where
    assert all("gzip member" in p.reason for p in problems)


def test_a_kill_between_writes_loses_nothing(tmp_path: Path) -> None:
    data = b"".join(_members(A, 100, 100)[:2] + _members(B, 150))
    events, problems = _read(tmp_path, data)
    assert events == _encoded(A[:200] + B)
    assert problems == []


_WHOLE_A = _member(lines(A))
_WHOLE_B = b"".join(_members(B, 100))


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
    assert events == _encoded(B)
    # Junk is damage, not a kill's mark: an error for validate.
    assert [(p.line, p.torn) for p in problems] == [(1, False)]
    assert f"bytes 0-{len(junk):,}" in problems[0].reason


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


# --- writers sharing a file: a parent and its forked children ----------------------------

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


def _interleave(*writers: list[bytes], seed: int) -> bytes:
    """The writers' members, each writer's in its order, the writers' in a random one."""
    turns = [i for i, members in enumerate(writers) for _ in members]
    random.Random(seed).shuffle(turns)
    queues = [list(w) for w in writers]
    return b"".join(queues[i].pop(0) for i in turns)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_writes_of_writers_taking_turns_are_each_read(tmp_path: Path, seed: int) -> None:
    data = _interleave(
        _members(PARENT, 150, *[1] * 20, 50, 50),
        _members(KIDS[0], 70, *[1] * 10, 70),
        _members(KIDS[1], 40),
        seed=seed,
    )
    events, problems = _read(tmp_path, data)
    assert sorted(events) == sorted(_encoded(PARENT + KIDS[0] + KIDS[1]))
    assert problems == []


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.9])  # where the kill lands in the write
def test_a_forked_child_killed_mid_write_does_not_hide_the_parent(
    tmp_path: Path, fraction: float
) -> None:
    parent = _members(PARENT, 100, 100, 100, 50)
    child = _members(KIDS[0], 100, 100, 50)
    cut = _cut(child[1], fraction)
    data = parent[0] + child[0] + parent[1] + cut + b"".join(parent[2:])
    events, problems = _read(tmp_path, data)
    kept, _ = _kept(cut)
    assert sorted(events) == sorted(_encoded(PARENT + KIDS[0][: 100 + kept]))
    assert [p.torn for p in problems] == [True]
    assert "another begins" in problems[0].reason


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_writing_the_parents_gz_file(tmp_path: Path) -> None:
    # The real sink in a parent and its forked child, one path, their writes
    # taking turns: parent, child, parent, child, then each closes.
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
    whole = gzip.decompress(path.read_bytes())  # whole members: any gzip reader takes it

    problems: list[ReadProblem] = []
    runs: dict[str, list[rt.Event | rt.UnknownEvent]] = {}
    for ev in rt.read(path, problems=problems):
        runs.setdefault(ev.run_id, []).append(ev)
    assert problems == []
    assert sum(map(len, runs.values())) == len(whole.splitlines())
    assert len(runs) == 2
    parent = runs.pop(str(parent_run))
    (child,) = runs.values()
    for run, versions in ((parent, range(15)), (child, range(100, 110))):
        assert [e.seq for e in run] == list(range(len(versions) + 2))
        assert [type(e) for e in run] == [rt.TraceOpened] + [rt.WeightsSynced] * len(versions) + [
            rt.TraceClosed
        ]
        assert [e.weight_version for e in run[1:-1]] == list(versions)  # type: ignore[union-attr]


# --- damage -----------------------------------------------------------------------------


def test_damage_inside_a_member_keeps_what_inflates_before_it(tmp_path: Path) -> None:
    # One big write, damaged four fifths in, then the next run's members.
    a = _member(lines(A * 4))
    at = len(a) * 4 // 5
    damaged = a[:at] + bytes(b ^ 0x55 for b in a[at : at + 64]) + a[at + 64 :]
    before, _ = _kept(a[:at])
    events, problems = _read(tmp_path, damaged + _WHOLE_B)
    # Damaged deflate data may inflate to garbage before zlib sees the damage
    # (the member's checksum comes at its end): bad lines then, and reported.
    assert events[: before - 10] == _encoded(A * 4)[: before - 10]  # all but the last few
    assert events[-len(B) :] == _encoded(B)
    assert any("corrupt gzip data" in p.reason and not p.torn for p in problems)


@pytest.mark.parametrize(
    "where",
    [
        "a-third-in",  # 40 bytes flipped a third of the way in
        "on-a-header",  # the same, from the first byte of a member
    ],
)
def test_damage_costs_only_the_members_it_hits(tmp_path: Path, where: str) -> None:
    members = _members(A, *[20] * 15)
    starts = [sum(map(len, members[:i])) for i in range(len(members) + 1)]
    data = b"".join(members)
    at = len(data) // 3
    if where == "on-a-header":
        at = next(s for s in starts if s >= at)
    damaged = data[:at] + bytes(b ^ 0xFF for b in data[at : at + 40]) + data[at + 40 :]
    events, problems = _read(tmp_path, damaged)
    hit = {i for i in range(len(members)) if starts[i] < at + 40 and at < starts[i + 1]}
    batches = _batches(A, *[20] * 15)
    spared = [line for i, b in enumerate(batches) if i not in hit for line in b.splitlines()]
    assert set(spared) <= set(events) <= set(_encoded(A))  # what a hit member gave before it too
    assert len(events) == len(set(events))
    assert len(events) < len(A)
    # Reported as damage (an error for validate), never as a kill's mark.
    assert problems and not any(p.torn for p in problems)


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
    events, problems = _read(tmp_path, b"".join(_members(A, 100)) + tail)
    assert events == _encoded(A)
    assert [p.reason for p in problems if reason and reason in p.reason] == [
        p.reason for p in problems
    ]
    assert len(problems) == (reason is not None)


def test_a_member_that_inflates_a_thousandfold_is_read_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 100 KB write of one 100 MB line must never be held whole.
    monkeypatch.setattr(reader, "_MAX_LINE", 1 << 20)
    huge = b'{"event":"note","run_id":"x","seq":1,"text":"' + b" " * (100 << 20) + b'"}\n'
    data = b"".join(_members(A, 100)) + _member(lines(B[:1])) + _member(huge)
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        problems: list[ReadProblem] = []
        events = list(rt.read(path, problems=problems))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert events == A + B[:1]
    assert peak < 24 << 20, f"peak {peak >> 20} MiB"
    assert [p.line for p in problems] == [len(A) + 2]  # the line left unread


BIG = _run(9, 20_000)  # about 5 MiB of text: more than one inflate call gives


def test_a_big_member_then_a_crashs_zeros_then_the_next(tmp_path: Path) -> None:
    # zlib repeats what follows a member's end when the end comes after a
    # call cut short by the output limit; the zeros a crash leaves are padding.
    data = _member(lines(BIG)) + bytes(64 << 10) + b"".join(_members(B, 100))
    events, problems = _read(tmp_path, data)
    assert events == _encoded(BIG + B)
    assert [(p.torn, "zeros" in p.reason) for p in problems] == [(True, True)]


# --- a file still being written, read as its bytes come (``rollout-trace watch``) -----------


def _walk(data: bytes, sizes: list[int]) -> tuple[list[bytes], list[tuple[str, bool]]]:
    """What ``Members`` makes of ``data`` fed in pieces of ``sizes`` (over and over):
    the text before each cut and after the last, and the cuts."""
    members = Members()
    text, cuts = [b""], []

    def take(pieces: Iterator[bytes | Cut]) -> None:
        for piece in pieces:
            if isinstance(piece, Cut):
                cuts.append((piece.reason, piece.torn))
                text.append(b"")
            else:
                text[-1] += piece

    at, i = 0, 0
    while at < len(data):
        size = sizes[i % len(sizes)]
        take(members.feed(data[at : at + size]))
        at, i = at + size, i + 1
    take(members.end())
    return text, cuts


@pytest.mark.parametrize("sizes", [[1], [2, 3, 5], [7, 4096, 1], [65_537]])
def test_bytes_fed_in_pieces_read_as_the_whole_file_does(sizes: list[int]) -> None:
    a = _members(A, 100, 100, 100)
    damaged = bytearray(_member(lines(C)))
    damaged[len(damaged) // 2 : len(damaged) // 2 + 8] = b"\xff" * 8
    data = (
        a[0]
        + _cut(a[1], 0.5)  # a killed writer
        + b"".join(_members(B, 10, 20))
        + bytes(damaged)
        + _member(lines(C[:5]))
        + b"\0" * 300  # a crash's padding
        + a[2]
        + b"trailing junk"
    )
    whole, cuts = _walk(data, [len(data)])
    assert [torn for _, torn in cuts] == [True, False, True, False]
    text, same_cuts = _walk(data, sizes)
    assert same_cuts == cuts
    # Up to the damage, the same text, as far as the calls that failed let zlib give it.
    assert text[1].startswith(whole[1]) or whole[1].startswith(text[1])
    assert text[:1] + text[2:] == whole[:1] + whole[2:]
