"""The ``jsonl://`` sink's gzip layout (README: Reference > Wire format)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from writing.harness import child_env

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace.sinks import JsonlSink
from rollout_trace.sinks.jsonl import segment_path
from rollout_trace.testing import MockClock


def _line(i: int) -> bytes:
    return b'{"event":"tick","time":1700000000.5,"run_id":"r","seq":%d,"n":%d}\n' % (i, i)


def _members(data: bytes) -> list[bytes]:
    """The text of each gzip member of ``data``, read one after another with zlib
    (a last one cut short as far as it goes)."""
    texts = []
    while data:
        inflater = zlib.decompressobj(wbits=31)
        texts.append(inflater.decompress(data))
        data = inflater.unused_data
    return texts


@pytest.mark.parametrize(
    "sizes",
    [
        [100, 100, 100],  # batches alike
        [1] * 20,  # a line a batch
    ],
)
def test_each_gzip_write_is_one_whole_member(tmp_path: Path, sizes: list[int]) -> None:
    # Writers appending to one path never interleave inside a member, and any
    # gzip reader takes the file: a member a write, each with its end.
    path = tmp_path / "t.jsonl.gz"
    sink = JsonlSink(str(path), {})
    sink.open()
    batches, size, seq = [], 0, 0
    for n in sizes:
        batch = b"".join(_line(seq + i) for i in range(n))
        seq += n
        sink.write(batch)
        data = path.read_bytes()
        assert _members(data[size:]) == [batch]  # this write's bytes: one whole member
        size = len(data)
        batches.append(batch)
    sink.close()
    data = path.read_bytes()
    assert len(data) == size  # nothing more at close (no trailer to add)
    assert _members(data) == batches
    assert gzip.decompress(data) == b"".join(batches)


def test_a_write_split_over_segments_is_a_member_in_each(tmp_path: Path) -> None:
    limit = 2_000
    sink = JsonlSink(str(tmp_path / "t.jsonl.gz"), {"rotate_mb": str(limit / 1e6)})
    sink.open()
    # Lines that compress little, so that the first write spans segments.
    big = b"".join(b'{"n":%d,"x":"%s"}\n' % (i, os.urandom(40).hex().encode()) for i in range(150))
    small = _line(0)
    sink.write(big)
    sink.write(small)
    sink.close()
    paths = sorted(tmp_path.glob("t.*.jsonl.gz"))
    assert len(paths) >= 3
    segments = [_members(p.read_bytes()) for p in paths]
    # A member of the big write in each; the small write's own after the last.
    assert [len(m) for m in segments] == [1] * (len(paths) - 1) + [2]
    assert b"".join(b"".join(m) for m in segments) == big + small
    assert all(p.stat().st_size <= limit for p in paths)


# Each child opens its tracer (its first member is written), says so, and writes
# on only once every child has opened: their writes to the one file take turns.
_APPENDER = """
import sys
import rollout_trace as rt
t = rt.sync_tracer(sys.argv[1], batch_size=16)
t.open()
assert t.flush(10)
sys.stderr.write("ready\\n")
sys.stderr.flush()
sys.stdin.read()
for i in range(2000):
    t.emit(rt.WeightsSynced(weight_version=i))
    if i % 50 == 49:
        t.flush(10)
t.close()
"""


def test_two_processes_appending_to_one_gz_file_give_only_whole_members(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl.gz"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _APPENDER, str(path)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        for _ in range(2)
    ]
    for child in children:
        assert child.stderr is not None
        assert child.stderr.readline() == b"ready\n"
    for child in children:
        assert child.stdin is not None
        child.stdin.close()
    for child in children:
        assert child.stderr is not None
        with child.stderr:
            err = child.stderr.read()
        assert child.wait(timeout=120) == 0, err[-2000:]
    # Read member by member with the standard library: every line is whole.
    lines = gzip.decompress(path.read_bytes()).splitlines()
    records = [json.loads(line) for line in lines]
    closed = {r["run_id"]: r["written"] for r in records if r["event"] == "trace_closed"}
    assert len(closed) == 2
    assert Counter(r["run_id"] for r in records) == {r: n + 2 for r, n in closed.items()}
    problems: list[rt.ReadProblem] = []
    assert len(list(rt.read(path, problems=problems))) == len(lines)
    assert problems == []


# --- rotation -------------------------------------------------------------------------


def _emit(uri: str, n: int, *, pause_every: int = 0, pauses: Sequence[float] = ()) -> None:
    """Emit ``n`` events; after every ``pause_every``, flush and move the tracer's
    ``deadline_clock`` (a ``MockClock``, still otherwise) on by the next of ``pauses``."""
    clock = MockClock()
    steps = iter(pauses)
    with rt.sync_tracer(uri, batch_size=64, deadline_clock=clock) as t:
        for i in range(n):
            t.emit(rt.WeightsSynced(weight_version=i))
            if pause_every and i % pause_every == pause_every - 1:
                assert t.flush(timeout=10)
                clock.advance(next(steps))
        assert next(steps, None) is None  # every pause taken


@pytest.mark.parametrize(
    ("suffix", "unpack"),
    [
        (".jsonl", lambda b: b),  # plain
        (".jsonl.gz", gzip.decompress),  # each segment a whole gzip file
    ],
)
def test_segments_stay_within_their_size_and_read_as_one_run(
    tmp_path: Path,
    suffix: str,
    unpack: Callable[[bytes], bytes],
    capsys: pytest.CaptureFixture[str],
) -> None:
    limit = 20_000
    # Emitted flat out: the writer joins what is queued into writes of up to
    # megabytes, which a segment must still split at its size.
    _emit(f"jsonl://{tmp_path}/t{suffix}?rotate_mb={limit / 1e6}", 20_000)
    paths = sorted(tmp_path.glob(f"t.*{suffix}"))
    assert [p.name for p in paths] == [f"t.{i:06d}{suffix}" for i in range(1, len(paths) + 1)]
    assert len(paths) >= 3
    sizes = [p.stat().st_size for p in paths]
    lines = [line for p in paths for line in unpack(p.read_bytes()).splitlines()]
    assert len(lines) == 20_002  # trace_opened, 20,000 events, trace_closed
    # Within the size (gzip: its header, trailer and flush markers aside).
    assert all(size <= limit + 64 for size in sizes), sizes
    if suffix == ".jsonl":  # full but for the line that did not fit
        longest = max(map(len, lines)) + 1
        assert all(size > limit - longest for size in sizes[:-1]), sizes
    # Any order of the segments: one run, every event once, no gap.
    assert main(["summary", "--json", *map(str, paths[::-1])]) == 0
    [run] = json.loads(capsys.readouterr().out)["runs"]
    assert (run["events"], run["missing_seqs"], run["read_twice"], run["closed"]) == (
        20_002, 0, 0, True,
    )  # fmt: skip


def _held(path: Path) -> bool:
    """Whether this process has ``path`` open (a sink's segment not ended yet)."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("no /proc/self/fd here to see which files are open")
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            if os.readlink(fd) == os.path.realpath(path):
                return True
    return False


@pytest.mark.parametrize(
    "option",
    [
        "rotate_mb=0.002",  # full: ended at once, not when a later batch comes
        "rotate_s=0.5",  # old: ended at the next flush
    ],
)
def test_an_ended_segment_is_a_whole_file_while_the_run_goes_on(
    tmp_path: Path, option: str
) -> None:
    clock = MockClock()
    with rt.sync_tracer(f"jsonl://{tmp_path}/t.jsonl.gz?{option}", deadline_clock=clock) as t:
        for i in range(1000):  # some 10 kB compressed: segments of 2 kB
            t.emit(rt.WeightsSynced(weight_version=i))
        assert t.flush(timeout=10)
        paths = sorted(tmp_path.glob("t.*.jsonl.gz"))
        if option.startswith("rotate_s"):
            # One segment, open until it is 0.5 s old on the tracer's clock
            # (binary fractions: the sums are exact), then ended at a flush.
            assert len(paths) == 1 and _held(paths[0])
            clock.advance(0.25)
            assert t.flush(timeout=10)
            assert _held(paths[0])  # younger: written on
            clock.advance(0.25)
            assert t.flush(timeout=10)
            ended = paths
        else:
            assert len(paths) >= 3
            ended = paths[:-1]
        assert sorted(tmp_path.glob("t.*.jsonl.gz")) == paths  # no segment begun early
        assert not any(map(_held, ended)), ended
        whole = [gzip.decompress(p.read_bytes()) for p in ended]
        assert whole and all(w.endswith(b"\n") for w in whole)
        if option.startswith("rotate_s"):
            assert whole[0].count(b"\n") == 1001  # trace_opened and every event


def test_a_segment_older_than_rotate_s_ends_before_the_next_batch(tmp_path: Path) -> None:
    # Segments of 1 s on the tracer's clock; bursts of 100, each flushed, then
    # the clock moved on. A burst 0.75 s in goes to the first segment still;
    # one at 1 s to the next, as does trace_closed at 2 s, on its own (a
    # segment ends only when a batch comes or at a flush, so none is empty).
    _emit(
        f"jsonl://{tmp_path}/t.jsonl?rotate_s=1",
        400,
        pause_every=100,
        pauses=[0.75, 0.25, 0.75, 0.25],
    )
    paths = sorted(tmp_path.glob("t.*.jsonl"))
    counts = [len(p.read_bytes().splitlines()) for p in paths]
    assert counts == [201, 200, 1], counts  # trace_opened first


def test_a_path_written_again_numbers_on_from_its_last_segment(tmp_path: Path) -> None:
    (tmp_path / "t.20261204.jsonl").write_bytes(b"")  # a dated file, no segment
    uri = f"jsonl://{tmp_path}/t.jsonl?rotate_mb=1"
    _emit(uri, 10)
    _emit(uri, 10)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["t.000001.jsonl", "t.000002.jsonl", "t.20261204.jsonl"]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("rotate_mb", "0"),  # not above 0
        ("rotate_mb", "-5"),  # negative
        ("rotate_mb", "nan"),  # no number
        ("rotate_s", "inf"),  # never
        ("rotate_s", "soon"),  # not a number
    ],
)
def test_a_bad_rotation_is_named(option: str, value: str) -> None:
    unit = "megabytes" if option == "rotate_mb" else "seconds"
    with pytest.raises(rt.SinkOptionError) as exc:
        rt.sync_tracer(f"jsonl:///tmp/x.jsonl?{option}={value}")
    assert f"{option}={value!r} is not a number of {unit} above 0" in str(exc.value)


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/t.gz",  # gzip, but no .jsonl before it: segments would lose their kind
        "/tmp/t.log",  # readers given a folder would pass its segments over
    ],
)
def test_rotation_needs_a_jsonl_path(path: str) -> None:
    with pytest.raises(rt.SinkOptionError) as exc:
        rt.sync_tracer(f"jsonl://{path}?rotate_mb=1")
    assert "rotation needs a path ending in .jsonl or .jsonl.gz" in str(exc.value)


def test_segment_paths() -> None:
    assert segment_path("/r/t-00000000aa.jsonl", 7) == "/r/t-00000000aa.000007.jsonl"
    assert segment_path("/r/t.jsonl.gz", 12) == "/r/t.000012.jsonl.gz"
    assert segment_path("/r/t.log", 0) == "/r/t.log.000000"


# --- a disk that fills -----------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KB tmpfs: writes fail part way with ENOSPC, as on a full disk."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize(
    "name",
    [
        "t.jsonl",  # plain
        "t.jsonl.gz",  # gzip: whole members only
        "t.jsonl?rotate_mb=0.01",  # segments: a batch split over two of them
    ],
)
def test_a_batch_the_disk_cuts_short_is_taken_back_whole(small_disk: Path, name: str) -> None:
    t = rt.sync_tracer(f"jsonl://{small_disk}/{name}", batch_size=256)
    with t:
        for i in range(20_000):
            t.emit(rt.WeightsSynced(weight_version=i))
            if i % 256 == 255:
                t.flush(timeout=10)
    c = t.counts
    assert c.written + c.dropped == c.emitted == 20_000 and c.dropped > 0  # the disk filled
    events, torn = 0, 0
    for path in sorted(small_disk.glob("t*")):
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = b"".join(_members(data))  # a member cut short too
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                torn += 1
            elif b'"weights_synced"' in line:
                events += 1
    # Every event in the files is one the sink counted, and no line is torn.
    assert (events, torn) == (c.written, 0)
    assert 0 < events < 20_000


@pytest.mark.parametrize(
    "name",
    [
        "t.jsonl",  # plain
        "t.jsonl.gz",  # gzip
    ],
)
def test_a_take_back_cuts_the_file_written_not_the_one_now_at_its_path(
    small_disk: Path, name: str
) -> None:
    # The sink's file is moved away and another writer makes a new one at
    # the path; then the disk fills during the sink's next write. The cut
    # must fall on the moved file (the one written), never on the other's.
    path = small_disk / name
    sink = JsonlSink(str(path), {})
    sink.open()
    sink.write(b"".join(_line(i) for i in range(10)))
    moved = small_disk / f"moved-{name}"
    before = path.read_bytes()
    path.rename(moved)
    theirs = b"".join(b'{"other":%d}\n' % i for i in range(30))
    path.write_bytes(theirs)
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):
        while True:
            os.write(fd, b"x" * 512)
    # A little room left: the next write fails part way.
    os.ftruncate(fd, os.fstat(fd).st_size - 2048)
    os.close(fd)
    with pytest.raises(OSError, match="No space left"):
        sink.write(b"".join(_line(i) for i in range(10, 2_000)))
    sink.close()
    assert path.read_bytes() == theirs
    assert moved.read_bytes() == before


@pytest.mark.parametrize("under", ["t.jsonl", "sub/t.jsonl"])
def test_a_path_under_a_file_says_not_a_directory(tmp_path: Path, under: str) -> None:
    # As /etc/passwd/trace.jsonl would: the file in the way is named, and
    # the open does not say "File exists" of a file it never meant to make.
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(rt.SinkOpenError) as info, rt.sync_tracer(f"{blocker}/{under}"):
        pass
    message = str(info.value)
    assert "Not a directory" in message and "File exists" not in message, message
    assert f"{str(blocker)!r} is a file" in message
    assert isinstance(info.value.__cause__, NotADirectoryError)
    assert blocker.read_text() == "x" and sorted(tmp_path.iterdir()) == [blocker]
