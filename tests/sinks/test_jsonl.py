"""The ``jsonl://`` sink's gzip layout (README: Reference > Wire format)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from sinks import JsonlSink

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
