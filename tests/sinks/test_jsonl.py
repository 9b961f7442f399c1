"""The ``jsonl://`` sink's gzip layout (README: Reference > Wire format)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import rollout_trace as rt
from rollout_trace._cli.main import main
from sinks import JsonlSink
from sinks.jsonl import segment_path

_SYNC = b"\x00\x00\xff\xff"


def _line(i: int) -> bytes:
    return b'{"event":"tick","time":1700000000.5,"run_id":"r","seq":%d,"n":%d}\n' % (i, i)


@pytest.mark.parametrize(
    "sizes",
    [
        [100, 100, 100],  # batches alike, which deflate would most like to refer back to
        [1] * 20,  # a line a batch: the least each batch has of its own
    ],
)
def test_each_gzip_batch_reads_alone(tmp_path: Path, sizes: list[int]) -> None:
    # A reader that cannot tell which writer a batch is from (a fork, a crash
    # loop, damage before it) reads it with no history: it must give its own text.
    path = tmp_path / "t.jsonl.gz"
    sink = JsonlSink(str(path), {})
    sink.open()
    writes, size, seq = [], 0, 0
    for n in sizes:
        batch = b"".join(_line(seq + i) for i in range(n))
        seq += n
        sink.write(batch)
        data = path.read_bytes()
        writes.append((batch, data[size:]))
        size = len(data)
    sink.close()
    assert gzip.decompress(path.read_bytes()) == b"".join(b for b, _ in writes)
    for i, (batch, written) in enumerate(writes):
        body = written[10:] if i == 0 else written  # the first write holds the header
        assert body.endswith(_SYNC)
        assert zlib.decompressobj(wbits=-15).decompress(body) == batch, f"write {i}"


# --- rotation -------------------------------------------------------------------------


def _emit(uri: str, n: int, *, pause_every: int = 0, pause_s: float = 0.0) -> None:
    with rt.sync_tracer(uri, batch_size=64) as t:
        for i in range(n):
            t.emit(rt.WeightsSynced(weight_version=i))
            if pause_every and i % pause_every == pause_every - 1:
                assert t.flush(timeout=10)
                time.sleep(pause_s)


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


@pytest.mark.parametrize(
    "option",
    [
        "rotate_mb=0.002",  # full: ended at once, not when a later batch comes
        "rotate_s=0.3",  # old: ended at the next flush
    ],
)
def test_an_ended_segment_is_a_whole_file_while_the_run_goes_on(
    tmp_path: Path, option: str
) -> None:
    with rt.sync_tracer(f"jsonl://{tmp_path}/t.jsonl.gz?{option}") as t:
        for i in range(100):
            t.emit(rt.WeightsSynced(weight_version=i))
        assert t.flush(timeout=10)
        time.sleep(0.4)
        assert t.flush(timeout=10)
        paths = sorted(tmp_path.glob("t.*.jsonl.gz"))
        if option.startswith("rotate_s"):
            assert len(paths) == 1
        whole = [gzip.decompress(p.read_bytes()) for p in paths[:-1]]
        if option.startswith("rotate_s"):  # the one segment is old: whole already
            whole = [gzip.decompress(paths[0].read_bytes())]
        assert whole and all(w.endswith(b"\n") for w in whole)


def test_a_segment_older_than_rotate_s_ends_before_the_next_batch(tmp_path: Path) -> None:
    # Three bursts, each flushed and followed by 0.8 s; segments of 0.5 s: a
    # segment a burst, and trace_closed in a fourth (a segment is ended only
    # when a batch comes, so none is empty).
    _emit(f"jsonl://{tmp_path}/t.jsonl?rotate_s=0.5", 300, pause_every=100, pause_s=0.8)
    paths = sorted(tmp_path.glob("t.*.jsonl"))
    counts = [len(p.read_bytes().splitlines()) for p in paths]
    assert counts == [101, 100, 100, 1], counts  # trace_opened first


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
        "t.jsonl.gz",  # gzip: the member stays cut at a batch's end
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
            data = zlib.decompressobj(wbits=31).decompress(data)  # cut members too
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
