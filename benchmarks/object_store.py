"""The caller's cost of an object-store sink, with the store up, down and hung.

What is measured, per mode, in a fresh process each run: one thread emits N
``AttemptDispatched`` events into ``rt.sync_tracer(URI)`` and the wall time
per event spent in the emit loop is ``caller_wall_ns``. The store is moto's
S3 server in a process of its own behind a TCP proxy (the one the tests use,
``tests/s3server.py``), started before the clock and left out of it.

- ``jsonl``: a local file, the baseline.
- ``s3``: ``s3://traces/bench/t.jsonl?upload_s=0.5``, the store up: the
  segment is uploaded again every half second while events come.
- ``s3_down``: the same, the proxy refusing connections for the whole emit
  loop; it comes back before the close.
- ``s3_hung``: the same, the proxy holding every byte for the whole emit
  loop (an upload in flight hangs); released before the close.

After the close the objects are read back through boto3 and their lines
counted: ``stored`` must equal ``written + 2`` (``trace_opened`` and
``trace_closed``) and ``written`` must be N, else the run says what is off.
``e2e_eps`` is N over the time from the first emit to the end of the close.
The ratio to take away is each ``s3*`` mode's ``caller_wall_ns`` over
``jsonl``'s, measured in the same run: what the store's state costs ``emit``.

    python benchmarks/object_store.py               # every mode, 3 runs each
    python benchmarks/object_store.py --quick
"""

from __future__ import annotations

import gzip
import sys
import time
from pathlib import Path
from typing import Any

from _bench import HERE, count_lines, script_main, tmp_dir
from throughput import _emit_many

import rollout_trace as rt

sys.path.insert(0, str(HERE.parent / "tests"))


def _measure(uri: str, events: int, before: Any = None, after: Any = None) -> dict[str, Any]:
    perf = time.perf_counter
    t = rt.sync_tracer(uri, close_timeout=30).open()
    if before is not None:
        before()
    w0 = perf()
    _emit_many(t.emit, 0, events)
    caller_wall = perf() - w0
    if after is not None:
        after()
    t.close()
    total = perf() - w0
    return {
        "caller_wall_ns": caller_wall / events * 1e9,
        "e2e_s": total,
        "e2e_eps": events / total,
        "written": t.counts.written,
        "dropped": t.counts.dropped,
    }


def run_jsonl(events: int) -> dict[str, Any]:
    with tmp_dir() as d:
        path = Path(d) / "trace.jsonl"
        result = _measure(f"jsonl://{path}", events)
        result["stored"] = count_lines(path)
    return _checked(result, events)


def _run_s3(events: int, fault: str | None) -> dict[str, Any]:
    import os

    from s3server import BUCKET, S3Server

    server = S3Server()
    try:
        os.environ.update(server.env())
        uri = f"s3://{BUCKET}/bench/t.jsonl?upload_s=0.1"

        def start() -> None:
            if fault == "down":
                server.proxy.down()
            elif fault == "hang":
                server.proxy.hang = True

        def end() -> None:
            if fault == "down":
                server.proxy.up()
            server.proxy.hang = False

        result = _measure(uri, events, start if fault else None, end if fault else None)
        objects = server.objects("bench/")
        result["segments"] = len(objects)
        result["stored"] = sum(
            (gzip.decompress(b) if k.endswith(".gz") else b).count(b"\n")
            for k, b in objects.items()
        )
    finally:
        server.stop()
    return _checked(result, events)


def _checked(result: dict[str, Any], events: int) -> dict[str, Any]:
    if result["stored"] != result["written"] + 2 or result["written"] != events:
        result["error"] = (
            f"stored {result['stored']} lines, written {result['written']}, "
            f"dropped {result['dropped']}, of {events} events"
        )
    return result


MODES = {
    "jsonl": run_jsonl,
    "s3": lambda n: _run_s3(n, None),
    "s3_down": lambda n: _run_s3(n, "down"),
    "s3_hung": lambda n: _run_s3(n, "hang"),
}

COLUMNS = [
    ("caller ns/event", "caller_wall_ns", 0),
    ("e2e events/s", "e2e_eps", 0),
    ("written", "written", 0),
    ("stored lines", "stored", 0),
    ("segments", "segments", 0),
]

if __name__ == "__main__":
    script_main(Path(__file__).name, MODES, __doc__, COLUMNS)
