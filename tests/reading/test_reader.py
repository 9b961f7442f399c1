"""Reading trace sets back: layouts, compression, and the damage a reader must take.

See the README, section Reference > Wire format.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec
import pytest
from scenario import disp, lines, make_run, run_id, seal

import rollout_trace as rt
from rollout_trace import ReadProblem, read, read_located

RUN = make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))], closed=103.0)
GOOD = lines(RUN)  # four lines
UNKNOWN = (
    b'{"event":"reader_test_unregistered_sample","time":1.5,"run_id":"'
    + run_id(1).encode()
    + b'","seq":9,"device":0,"used_gib":3.5}\n'
)


def _tags(events: list[object]) -> list[str]:
    return [getattr(e, "event", None) or type(e).__name__ for e in events]


CASES = [
    pytest.param(
        # Plain lines: every event, typed, with its envelope.
        GOOD,
        4,
        [],
        id="plain",
    ),
    pytest.param(
        # A whole last line without its newline is kept as it is.
        GOOD[:-1],
        4,
        [],
        id="last-line-without-newline",
    ),
    pytest.param(
        # A killed writer cut the last line: skipped and reported as torn.
        GOOD + b'{"event":"attempt_disp',
        4,
        [(5, True)],
        id="torn-last-line",
    ),
    pytest.param(
        # Not JSON in the middle: skipped, reported with its line, neighbours kept.
        lines(RUN[:2]) + b"garbage\n" + lines(RUN[2:]),
        4,
        [(3, False)],
        id="bad-line-middle",
    ),
    pytest.param(
        # A known event with a field of the wrong type is reported, not guessed at.
        lines(RUN[:1])
        + GOOD.splitlines(keepends=True)[1].replace(b'"attempt":0', b'"attempt":"x"')
        + lines(RUN[2:]),
        3,
        [(2, False)],
        id="wrong-type",
    ),
    pytest.param(
        # An empty line is reported.
        lines(RUN[:2]) + b"\n" + lines(RUN[2:]),
        4,
        [(3, False)],
        id="empty-line",
    ),
    pytest.param(
        # Two objects on one line are one bad line, not two events.
        lines(RUN[:1]) + lines(RUN[1:3]).replace(b"}\n{", b"},{", 1) + lines(RUN[3:]),
        2,
        [(2, False)],
        id="two-objects-one-line",
    ),
    pytest.param(
        # A killed writer's fragment runs into the next writer's first line:
        # the fragment is reported torn, the whole event after it kept.
        b'{"event":"attempt_dispa' + GOOD,
        4,
        [(1, True)],
        id="fragment-glued-to-next-line",
    ),
    pytest.param(
        # Unknown events are kept (as UnknownEvent), extra fields are ignored.
        UNKNOWN + GOOD.replace(b'"attempt":0,', b'"attempt":0,"extra":[1,2],', 1),
        5,
        [],
        id="unknown-event-and-extra-field",
    ),
]


@pytest.mark.parametrize(("data", "count", "problems"), CASES)
@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "gzip"])
def test_read(
    tmp_path: Path, data: bytes, count: int, problems: list[tuple[int, bool]], gz: bool
) -> None:
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    found: list[ReadProblem] = []
    events = list(read(str(path), problems=found))
    assert len(events) == count
    assert [(p.line, p.torn) for p in found] == problems
    assert all(p.file == str(path) for p in found)


def test_envelope_and_types(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(UNKNOWN + GOOD)
    events = list(read(path))
    assert isinstance(events[0], rt.UnknownEvent)
    assert events[0].fields == {"device": 0, "used_gib": 3.5}
    assert events[1:] == RUN
    assert [e.seq for e in events[1:]] == [0, 1, 2, 3]


def test_line_numbers_across_chunks(tmp_path: Path) -> None:
    # Enough lines to span several 1 MiB chunks, with a bad line far in.
    many = make_run(1, 1.0, [(2.0 + i, disp(i, 0)) for i in range(20_000)])
    body = lines(many).splitlines(keepends=True)
    body.insert(15_000, b"{oops}\n")
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(body))
    found: list[ReadProblem] = []
    located = list(read_located(path, problems=found))
    assert [(p.line, p.torn) for p in found] == [(15_001, False)]
    assert len(located) == len(many)
    assert located[-1][1] == len(many) + 1
    assert located[14_999][2].seq == 14_999 and located[14_999][1] == 15_000
    assert located[15_000][2].seq == 15_000 and located[15_000][1] == 15_002


def test_gzip_multi_member_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    # Two members (two writers appending), the second cut short.
    second = gzip.compress(GOOD)
    path.write_bytes(gzip.compress(GOOD) + second[: len(second) - 12])
    found: list[ReadProblem] = []
    events = list(read(path, problems=found))
    assert events[:4] == RUN
    assert len(found) == 1 and found[0].torn
    assert "gzip" in found[0].reason


@pytest.mark.parametrize(
    ("data", "count", "problems"),
    [
        # zlib refuses the first bytes at once: the lines are read as they are.
        (b"\x1f\x8b\n" + GOOD, 4, [(1, False)]),
        # The file ends inside what would be a gzip header.
        (b"\x1f\x8b\x08\n", 0, [(1, False)]),
        # A header whose file name never ends: zlib asks for more, past 64 KiB.
        (b"\x1f\x8b\x08\n" + GOOD + b"x" * 70_000 + b"\n", 4, [(1, False), (6, False)]),
    ],
    ids=["refused", "ends-in-header", "header-never-ends"],
)
def test_a_plain_file_whose_first_line_looks_like_gzip_is_read_as_lines(
    tmp_path: Path, data: bytes, count: int, problems: list[tuple[int, bool]]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    found: list[ReadProblem] = []
    assert list(read(path, problems=found)) == RUN[:count]
    assert [(p.line, p.torn) for p in found] == problems
    assert "not JSON" in found[0].reason


def test_a_gz_file_that_is_not_gzip_is_one_problem_and_not_a_torn_one(tmp_path: Path) -> None:
    # Damage is no kill's mark: an error for validate, not a warning.
    path = tmp_path / "t.jsonl.gz"  # named gzip: its bytes are not taken for lines
    path.write_bytes(b"\x1f\x8b\n" + GOOD)
    found: list[ReadProblem] = []
    assert list(read(path, problems=found)) == []
    assert [(p.line, p.torn) for p in found] == [(1, False)]
    assert "corrupt gzip data" in found[0].reason


def test_many_files_globs_and_folders(tmp_path: Path) -> None:
    other = make_run(2, 200.0, [(201.0, disp(2, 0))])
    (tmp_path / "a.jsonl").write_bytes(GOOD)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(lines(other)))
    by_glob = list(read(str(tmp_path / "*.jsonl*")))
    by_list = list(read([tmp_path / "a.jsonl", str(tmp_path / "b.jsonl.gz")]))
    by_folder = list(read(tmp_path))
    assert by_glob == by_list == by_folder == RUN + other


def test_interleaved_runs_in_one_file(tmp_path: Path) -> None:
    other = make_run(2, 200.0, [(201.0, disp(2, 0))])
    mixed = [e for pair in zip(RUN, other, strict=False) for e in pair] + RUN[len(other) :]
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines(mixed))
    assert list(read(path)) == mixed


def test_problems_callback(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD + b'{"event":"attempt_sealed","ti')
    seen: list[ReadProblem] = []
    list(read(path, problems=seen.append))
    assert [(p.line, p.torn, p.run_id) for p in seen] == [(5, True, None)]
    assert str(seen[0]).startswith(f"{path}:5: torn last line")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing.jsonl", "no such trace file"),  # a path that does not exist
        ("*.nothing", "no trace file matches"),  # a glob that matches nothing
    ],
)
def test_missing_input_raises(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(rt.TraceReadError, match=message):
        list(read(str(tmp_path / name)))


def test_events_round_trip_through_msgspec(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD)
    assert [msgspec.json.encode(e) for e in read(path)] == GOOD.splitlines()


# Each row: a line that once crashed every command with a traceback.
CRASHERS = [
    # A user event with a byte that is not UTF-8 in one of its fields.
    pytest.param(
        b'{"event":"gpu_sample","time":101.5,"run_id":"%s","seq":9,"note":"caf\xe9"}'
        % run_id(1).encode(),
        id="latin-1-byte",
    ),
    # Nested deeper than msgspec walks, with no event key at all.
    pytest.param(b"[" * 2000 + b"]" * 2000, id="deep-array"),
    # A trace_opened whose meta is nested that deep.
    pytest.param(
        b'{"event":"trace_opened","time":100.0,"run_id":"%s","seq":0,"schema":1,'
        b'"sdk_version":"0","pid":1,"host":"h","meta":%s}'
        % (run_id(2).encode(), b'{"a":' * 2000 + b"1" + b"}" * 2000),
        id="deep-meta",
    ),
]


@pytest.mark.parametrize("line", CRASHERS)
def test_a_line_msgspec_refuses_is_skipped_and_said(line: bytes, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    # In a block of its own and among 40 good lines (the block decoder).
    path.write_bytes(line + b"\n" + GOOD * 10 + line + b"\n")
    found: list[ReadProblem] = []
    events = list(read(path, problems=found))
    assert len(events) == 40
    assert [p.line for p in found] == [1, 42]
    assert all(not p.torn for p in found)


def test_damage_inside_a_gzip_member_is_an_error_not_a_torn_line(tmp_path: Path) -> None:
    # A killed writer leaves a member with no end (torn, a warning); bytes
    # damaged in the middle lose events nobody killed, and must say so.
    run = make_run(3, 100.0, [(100.0 + i, disp(i, 0)) for i in range(300)], closed=500.0)
    data = gzip.compress(lines(run))
    lost_somewhere = 0
    for at in range(20, len(data) - 40, max(1, len(data) // 30)):
        path = tmp_path / f"damaged-{at}.jsonl.gz"
        path.write_bytes(data[:at] + b"\x55" * 20 + data[at + 20 :])
        found: list[ReadProblem] = []
        got = list(read(path, problems=found))
        if len(got) < len(run):
            lost_somewhere += 1
            assert any(not p.torn for p in found), (at, [str(p) for p in found])
    assert lost_somewhere > 10
