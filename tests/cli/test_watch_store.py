"""``rollout-trace watch`` over an object store (``s3://``), against moto's real server.

An object the sink uploads again under its key is its bytes before and more
(whole lines, or whole gzip members): what is new is read from the size at the
last look. An object that is shorter, or that begins with other bytes, or that
changed with no byte more, was written anew and is read from its start.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from s3server import BUCKET, S3Server
from traced import KNOWN, Run, write_runs

from rollout_trace._cli.main import main
from rollout_trace._cli.watch import frame
from rollout_trace._reading.stores import StoreFile
from rollout_trace._report.live import Follower, LiveView

URL = f"s3://{BUCKET}"


def _lines(*ns: int) -> bytes:
    return b"".join(b'{"n":%d}\n' % n for n in ns)


def _gz(*parts: bytes) -> bytes:
    """Each part a gzip member of its own, as the sink writes a batch."""
    return b"".join(gzip.compress(p) for p in parts)


# Each step: what the object holds now, and the lines a poll gives.
_STEPS = {
    "plain": [
        # The first look: every line.
        (_lines(1, 2, 3), [1, 2, 3]),
        # Uploaded again with more lines: only those.
        (_lines(1, 2, 3, 4, 5), [4, 5]),
        # Not changed: nothing.
        (_lines(1, 2, 3, 4, 5), []),
        # A torn last line waits for its end ...
        (_lines(1, 2, 3, 4, 5) + b'{"n":', []),
        # ... which the next upload brings.
        (_lines(1, 2, 3, 4, 5) + b'{"n":6}\n', [6]),
        # Shorter: written anew, read from its start.
        (_lines(7, 8), [7, 8]),
        # The same size, other bytes from the start: read from its start.
        (_lines(9, 8), [9, 8]),
        # The same size, the same first bytes, another etag: written anew too.
        (_lines(9, 7), [9, 7]),
    ],
    "gzip": [
        # One member.
        (_gz(_lines(1, 2)), [1, 2]),
        # Another member appended: its lines only.
        (_gz(_lines(1, 2), _lines(3)), [3]),
        # Two more.
        (_gz(_lines(1, 2), _lines(3), _lines(4), _lines(5, 6)), [4, 5, 6]),
        # Replaced by another file: read from its start.
        (_gz(_lines(7)), [7]),
    ],
}


@pytest.mark.parametrize("kind", list(_STEPS))
def test_an_object_uploaded_again_is_followed_from_where_it_was(s3: S3Server, kind: str) -> None:
    key = f"live/run.jsonl{'.gz' if kind == 'gzip' else ''}"
    follower = Follower([f"{URL}/live/*"])
    client = s3.client()
    for i, (body, expected) in enumerate(_STEPS[kind]):
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
        got = [int(line[5:-1]) for line in follower.lines()]
        assert got == expected, f"step {i}"


def test_objects_that_appear_under_a_glob_are_followed(s3: S3Server) -> None:
    # A glob with no match yet waits; objects that appear later are read.
    follower = Follower([f"{URL}/later/*.jsonl"])
    assert list(follower.lines()) == []
    s3.client().put_object(Bucket=BUCKET, Key="later/a.jsonl", Body=_lines(1))
    assert list(follower.lines()) == [b'{"n":1}']


def test_a_store_down_for_a_poll_is_looked_at_again(s3: S3Server) -> None:
    s3.client().put_object(Bucket=BUCKET, Key="live/a.jsonl", Body=_lines(1))
    follower = Follower([f"{URL}/live/"])
    assert list(follower.lines()) == [b'{"n":1}']
    s3.client().put_object(Bucket=BUCKET, Key="live/a.jsonl", Body=_lines(1, 2))
    s3.proxy.down()
    try:
        assert list(follower.lines()) == []  # a poll that reaches nothing
    finally:
        s3.proxy.up()
    assert list(follower.lines()) == [b'{"n":2}']


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # The first look at an object: its read fails; the next look reads it all.
        (None, _lines(1, 2)),
        # Bytes uploaded since the last look: their read fails; the next look reads them.
        (_lines(1), _lines(1, 2, 3)),
        # An object written anew (shorter): the same.
        (_lines(1, 2, 3), _lines(4)),
    ],
)
def test_a_read_that_fails_is_done_again_at_the_next_poll(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, before: bytes | None, after: bytes
) -> None:
    client = s3.client()
    follower = Follower([f"{URL}/live/"])
    if before is not None:
        client.put_object(Bucket=BUCKET, Key="live/a.jsonl", Body=before)
        assert list(follower.lines()) == before.splitlines()
    client.put_object(Bucket=BUCKET, Key="live/a.jsonl", Body=after)
    real = StoreFile.read
    failed: list[str] = []

    def failing(self: StoreFile, n: int = -1) -> bytes:
        if n == -1 and not failed:  # the read of what is new, after the object's first bytes
            failed.append(self.url)
            s3.proxy.down()  # the store cuts the connection
            try:
                return real(self, n)
            finally:
                s3.proxy.up()
        return real(self, n)

    monkeypatch.setattr(StoreFile, "read", failing)
    assert list(follower.lines()) == []  # a poll whose read failed
    assert failed == [f"{URL}/live/a.jsonl"]
    new = after if before is None or len(after) < len(before) else after[len(before) :]
    assert list(follower.lines()) == new.splitlines()
    assert list(follower.lines()) == []


@pytest.mark.parametrize(
    ("given", "key"),
    [
        # A bucket, without its closing slash, that holds no trace object yet.
        (URL, "a.jsonl"),
        # A prefix without its closing slash that holds no trace object yet (notes.txt).
        (f"{URL}/n", "n/a.jsonl"),
        # A prefix with its closing slash that holds nothing yet.
        (f"{URL}/m/", "m/a.jsonl"),
    ],
)
def test_a_bucket_or_prefix_is_waited_on_as_a_folder_is(
    s3: S3Server, capsys: pytest.CaptureFixture[str], given: str, key: str
) -> None:
    s3.client().put_object(Bucket=BUCKET, Key="n/notes.txt", Body=b"notes")
    assert main(["watch", "--once", given]) == 0
    assert "no trace event yet" in capsys.readouterr().out
    follower = Follower([given])
    assert list(follower.lines()) == []
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=_lines(1))
    assert list(follower.lines()) == [b'{"n":1}']


def test_once_over_the_store_shows_the_frame_of_the_local_files(
    s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    for f in files:
        s3.client().put_object(Bucket=BUCKET, Key=f"set/{f.name}", Body=f.read_bytes())
    local, remote = LiveView([str(tmp_path / "set")], 600.0), LiveView([f"{URL}/set/"], 600.0)
    assert local.poll() == remote.poll() > 0
    assert frame(remote, 2000.0) == frame(local, 2000.0)
    # The command: the frame, and the exit status of a stall (sibling 4 open 960 s).
    assert main(["watch", "--once", f"{URL}/set/*.jsonl"]) == 1
    assert "stalls: 1 (open longer than 600 s" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("given", "status", "said"),
    [
        # A glob with no match yet: a frame with no event, not an error.
        (f"{URL}/none/*.jsonl", 0, "no trace event yet"),
        # A bucket that is not there: an error at the first look.
        ("s3://no-such-bucket/*.jsonl", 2, "no such bucket 'no-such-bucket'"),
        # An object that is not there: an error at the first look, as a local file's.
        (f"{URL}/none/a.jsonl", 2, f"no such trace object: '{URL}/none/a.jsonl'"),
    ],
)
def test_once_over_what_is_not_there(
    s3: S3Server, capsys: pytest.CaptureFixture[str], given: str, status: int, said: str
) -> None:
    assert main(["watch", "--once", given]) == status
    assert said in "".join(capsys.readouterr())
