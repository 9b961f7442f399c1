"""The reader under random garbage: it never raises but the documented error, and reports."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from samples import ROLLOUT_SAMPLES

import rollout_trace as rt
from rollout_trace._cli.main import main as cli

RUN_ID = "f" * 32


def _valid(i: int) -> bytes:
    sample = ROLLOUT_SAMPLES[i % len(ROLLOUT_SAMPLES)]
    ev = msgspec.structs.replace(sample, time=1_700_000_000.0 + i, run_id=RUN_ID, seq=i + 1)
    return msgspec.json.encode(ev)


_no_newline = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" "))

# Each entry: (kind, the bytes of one line without its newline).
line = st.one_of(
    st.integers(0, 10_000).map(lambda i: ("valid", _valid(i))),
    st.tuples(st.integers(0, 10_000), st.integers(1, 60)).map(
        lambda p: ("bad", _valid(p[0])[: p[1]])  # a truncated line
    ),
    _no_newline.map(lambda b: ("bad", b)),  # random bytes
    st.sampled_from(
        [
            b"[1, 2, 3]",  # JSON, but not an object
            b'"attempt_sealed"',
            b"null",
            b'{"event": 5, "time": "x", "run_id": 1, "seq": "2"}',  # wrong envelope types
            b'{"event":"attempt_sealed","time":1.0,"run_id":"' + RUN_ID.encode() + b'","seq":3}',
            b"\xff\xfe\x00not utf-8",
            b'{"event":"step_trained","time":1.0,"run_id":"r","seq":1,"step":"one",'
            b'"group_ids":[]}',  # a wrong field type
        ]
    ).map(lambda b: ("bad", b)),
    st.integers(100_000, 400_000).map(
        lambda n: ("bad", b'{"event":"huge","time":1.0,"seq":1,"blob":"' + b"x" * n + b'"')
    ),  # a huge line, cut before its end
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(line, max_size=40), gz=st.booleans(), cut=st.integers(0, 50))
def test_garbage_never_raises_and_every_whole_event_comes_back(
    lines: list[tuple[str, bytes]], gz: bool, cut: int
) -> None:
    data = b"".join(raw + b"\n" for _, raw in lines)
    if gz:
        data = gzip.compress(data)
        data = data[: max(0, len(data) - cut)]  # a truncated gzip stream, now and then
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("t.jsonl.gz" if gz else "t.jsonl")
        path.write_bytes(data)
        problems: list[rt.ReadProblem] = []
        events = list(rt.read(str(path), problems=problems))  # must not raise
        assert all(isinstance(p.line, int) and p.reason for p in problems)
        if not gz:
            # Every whole event comes back, nothing else does, and every bad
            # line is reported once, with its line number.
            valid = [msgspec.json.decode(raw)["seq"] for kind, raw in lines if kind == "valid"]
            assert sorted(e.seq for e in events) == sorted(valid)
            bad_lines = [n for n, (kind, _) in enumerate(lines, 1) if kind == "bad"]
            assert sorted(p.line for p in problems) == bad_lines
        # The command line says what is wrong and exits 0 or 1, never a traceback.
        assert cli(["validate", str(path)]) in (0, 1)
        assert cli(["summary", str(path)]) in (0, 1)


def test_a_missing_file_is_the_documented_error(tmp_path: Path) -> None:
    with pytest.raises(rt.TraceReadError, match=r"nope\.jsonl"):
        list(rt.read(str(tmp_path / "nope.jsonl")))
