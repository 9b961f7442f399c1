"""``stdout://`` into a pipe that other processes write to as well (a container's log pipe)."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import time
from collections import Counter

from writing.harness import child_env

from rollout_trace.sinks import stdio

# Batches of far more than PIPE_BUF: lines of some 500 bytes, 512 a batch.
# Each child says it is ready (imports take a varying while), then waits for its
# standard input to close, so that all write at once.
_CHILD = """
import sys
import rollout_trace as rt
sys.stderr.write("ready\\n")
sys.stderr.flush()
sys.stdin.read()
with rt.sync_tracer("stdout://", batch_size=512) as t:
    for i in range(5000):
        t.emit(rt.TrainerCheckpointPublished(step=i, path="/ckpt/" + "x" * 400))
"""


def test_writers_sharing_a_pipe_never_cut_each_others_lines() -> None:
    read_end, write_end = os.pipe()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        # A pipe of one page (Linux), a container log pipe at its busiest: a
        # long write waits for the reader at every page, and others get in.
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, select.PIPE_BUF)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        for _ in range(4)
    ]
    os.close(write_end)
    for child in children:
        assert child.stderr is not None
        assert child.stderr.readline() == b"ready\n"
    for child in children:
        assert child.stdin is not None
        child.stdin.close()
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()  # read while they write: the pipe fills, writers take turns
    for child in children:
        assert child.stderr is not None
        with child.stderr:
            err = child.stderr.read()
        assert child.wait(timeout=120) == 0, err[-2000:]
    lines = data.splitlines()
    torn = [line[:80] for line in lines if not _is_json(line)]
    assert torn == [], f"{len(torn)} lines cut by another writer's"
    records = [json.loads(line) for line in lines]
    closed = {r["run_id"]: r["written"] for r in records if r["event"] == "trace_closed"}
    assert len(closed) == 4
    per_run = Counter(r["run_id"] for r in records)
    assert per_run == {run: written + 2 for run, written in closed.items()}


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def test_a_batch_is_cut_into_as_few_whole_line_pieces_as_fit() -> None:
    limit = select.PIPE_BUF
    short, long = b"s" * 99 + b"\n", b"L" * (limit + 10) + b"\n"
    data = short * 100 + long + short * 3
    pieces = [bytes(p) for p in stdio._whole_lines(data, limit)]
    assert b"".join(pieces) == data
    assert all(p.endswith(b"\n") for p in pieces)
    # Full pieces of whole lines, the long line alone, then what is left.
    per_piece = limit // len(short)
    assert [len(p) for p in pieces] == [per_piece * 100] * (100 // per_piece) + [
        100 * (100 % per_piece),
        len(long),
        300,
    ]


_NONBLOCKING_CHILD = """
import os
import rollout_trace as rt
os.set_blocking(1, False)
with rt.sync_tracer("stdout://") as t:
    for i in range(50_000):
        t.emit(rt.AttemptSealed(group_id="g", prompt_id=i, generation_index=0, attempt=0))
"""


def test_a_non_blocking_pipe_with_a_slow_reader_gets_every_line() -> None:
    # asyncio's connect_write_pipe leaves the descriptor non-blocking: a full
    # pipe made the first write fail (EAGAIN), the sink stop and every line
    # count as dropped, though a reader got some of them.
    child = subprocess.Popen(
        [sys.executable, "-c", _NONBLOCKING_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert child.stdout is not None and child.stderr is not None
    data = b""
    with child.stdout, child.stderr:
        while chunk := child.stdout.read(4096):
            data += chunk
            time.sleep(0.0005)  # slower than the writer: the pipe stays full
        err = child.stderr.read()
    assert child.wait(timeout=120) == 0, err[-2000:]
    records = [json.loads(line) for line in data.splitlines()]
    [closed] = [r for r in records if r["event"] == "trace_closed"]
    assert (closed["written"], closed["dropped"]) == (50_000, 0), err[-2000:]
    assert len(records) == 50_002
