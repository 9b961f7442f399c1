"""Byte ranges of a plain text file (``reader.TextRange``), and the plan of pieces."""

from __future__ import annotations

import gzip
import itertools
import random
from pathlib import Path

import msgspec
import pytest
from scenario import disp, lines, make_run, seal, write

from rollout_trace._errors import TraceReadError
from rollout_trace._reading import pieces, reader
from rollout_trace._reading.pieces import WHOLE, Piece, plan
from rollout_trace._reading.reader import ReadProblem, TextRange, iter_blocks


def _tiles(size: int, cuts: list[int]) -> list[tuple[int, int]]:
    bounds = sorted({0, size, *cuts})
    return list(itertools.pairwise(bounds)) or [(0, 0)]


def _raw(path: Path, ranges: list[tuple[int, int]]) -> list[bytes]:
    return [b"".join(reader._range_chunks(str(path), a, b, None)) for a, b in ranges]


@pytest.mark.parametrize(
    ("data", "cuts"),
    [
        # Cuts inside lines, at line starts and on newlines.
        (b"aaaa\nbbbb\ncccc\n", [2, 5, 9, 10]),
        # A line longer than several ranges: it is in the first range that meets it.
        (b"a\n" + b"x" * 50 + b"\nb\n", [5, 10, 20, 30, 40]),
        # CRLF line ends: the \r stays with its line.
        (b"aa\r\nbb\r\ncc\r\n", [1, 3, 4, 7]),
        # No newline at the end: the last range holds the unfinished line.
        (b"aaaa\nbbbb\ncc", [3, 8, 11]),
        # A newline right at a cut.
        (b"aaaa\nbbbb\n", [4, 5]),
        # An empty file.
        (b"", []),
        # Empty lines only.
        (b"\n\n\n\n", [1, 2, 3]),
    ],
)
def test_ranges_hold_every_line_exactly_once(tmp_path: Path, data: bytes, cuts: list[int]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    got = _raw(path, _tiles(len(data), cuts))
    assert b"".join(got) == data
    # Each range is whole lines: only the last one with text may lack a newline.
    for i, part in enumerate(got):
        assert part == b"" or part.endswith(b"\n") or not b"".join(got[i + 1 :])


def test_ranges_hold_every_line_exactly_once_at_random(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "_CHUNK", 7)  # lines and cuts across reads
    rng = random.Random(5)
    path = tmp_path / "t.jsonl"
    for _ in range(300):
        data = b"\n".join(b"x" * rng.randint(0, 20) for _ in range(rng.randint(0, 12)))
        data += rng.choice([b"", b"\n", b"\r\n"])
        path.write_bytes(data)
        cuts = [rng.randint(0, len(data)) for _ in range(rng.randint(0, 6))]
        got = _raw(path, _tiles(len(data), cuts))
        assert b"".join(got) == data, (data, cuts)


def _events_and_problems(
    path: Path, ranges: list[tuple[int, int]]
) -> tuple[list[tuple[int, int]], list[tuple[int, str, bool]]]:
    """(seq, line) of every event and (line, reason, torn) of every bad line, line
    numbers counted over the whole file."""
    events: list[tuple[int, int]] = []
    problems: list[ReadProblem] = []
    before = 0
    for a, b in ranges:
        mine: list[ReadProblem] = []
        part = TextRange(str(path), a, b, mine)
        for _, evs, nos in part.blocks():
            events += [(ev.seq, no + before) for ev, no in zip(evs, nos, strict=True)]
        problems += [msgspec.structs.replace(p, line=p.line + before) for p in mine]
        before += part.lines
    return events, [(p.line, p.reason, p.torn) for p in problems]


def test_a_file_read_in_ranges_gives_the_events_and_bad_lines_of_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "_CHUNK", 64)
    run = make_run(1, 100.0, [(100.0 + i, disp(i, 0)) for i in range(1, 40)])
    body = lines(run).split(b"\n")
    body.insert(10, b"not json")  # bad lines with their line numbers
    body.insert(25, b"")
    data = b"\n".join(body[:-1]) + b'\n{"event": "attempt_se'  # a torn last line
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    whole: list[ReadProblem] = []
    expected = [
        (ev.seq, no)
        for _, evs, nos in iter_blocks([str(path)], whole)
        for ev, no in zip(evs, nos, strict=True)
    ]
    rng = random.Random(3)
    for _ in range(30):
        cuts = [rng.randint(0, len(data)) for _ in range(rng.randint(1, 8))]
        events, problems = _events_and_problems(path, _tiles(len(data), cuts))
        assert events == expected
        assert problems == [(p.line, p.reason, p.torn) for p in whole]


def test_plan_cuts_large_text_files_and_keeps_gzip_and_small_files_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pieces, "_MIN_PIECE", 100)
    run = make_run(1, 100.0, [(100.0 + i, seal(i, 0)) for i in range(1, 60)])
    big = write(tmp_path / "big.jsonl", run)
    gz = write(tmp_path / "big.jsonl.gz", run, gz=True)
    # A .jsonl that holds gzip is read as gzip: never cut.
    hidden = tmp_path / "hidden.jsonl"
    hidden.write_bytes(gzip.compress(lines(run)))
    small = write(tmp_path / "small.jsonl", run[:1])
    files = [str(big), str(gz), str(hidden), str(small)]
    got, tasks = plan(files, 2)
    ranges = [p for p in got if p.path == str(big)]
    assert len(ranges) > 1 and all(p.end != WHOLE for p in ranges)
    assert ranges[0].start == 0
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
    assert ranges[-1].end == big.stat().st_size
    others = [p for p in got if p.path != str(big)]
    assert others == [Piece(str(gz)), Piece(str(hidden)), Piece(str(small))]
    # Every piece in exactly one task, in order within it; the largest tasks first.
    assert sorted(i for t in tasks for i in t) == list(range(len(got)))
    assert all(t == sorted(t) for t in tasks)
    sizes = [sum(_weight(got[i]) for i in t) for t in tasks]
    assert sizes == sorted(sizes, reverse=True)


def _weight(piece: Piece) -> int:
    return Path(piece.path).stat().st_size if piece.end == WHOLE else piece.end - piece.start


@pytest.mark.parametrize(
    ("gone", "said"),
    [
        # Deleted since it was listed: what a read of it says.
        ("missing.jsonl", "no such trace file: "),
        # Its folder replaced by a file since: the OSError, named.
        ("folder/t.jsonl", "cannot open trace file .*Not a directory"),
    ],
)
def test_plan_of_a_file_that_is_gone_is_a_read_error(tmp_path: Path, gone: str, said: str) -> None:
    path = tmp_path / gone
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"{}\n")
    path.unlink()
    if path.parent != tmp_path:
        path.parent.rmdir()
        path.parent.write_bytes(b"")
    with pytest.raises(TraceReadError, match=said):
        plan([str(path)], 2)
