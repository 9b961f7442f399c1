"""End-to-end throughput of rollout_trace to a JSONL file, and the caller's cost on the way.

What is measured, per mode, in a fresh process each run:

- ``async``: ``async with rt.tracer("jsonl://FILE")`` on asyncio; the task emits
  N ``AttemptDispatched`` events (built in the loop, 8 fields with the envelope)
  and awaits ``asyncio.sleep(0)`` after every 1,000, as a controller that does
  other work would. The file is written by the ``jsonl`` sink, on its own thread.
- ``sync``: ``with rt.sync_tracer("jsonl://FILE")``; one thread emits N events;
  the tracer's writer thread encodes and writes.
- ``sync8``: the same with 8 threads emitting N/8 events each at once.

End to end: the clock starts at the first emit (the tracer and its file are
already open, as the peers' handlers are) and stops when the tracer is closed,
that is when every event is in the file and ``trace_closed`` is written.
``e2e_eps`` = N / that time. The file is then checked: its lines must be
``written + 2`` (``trace_opened`` and ``trace_closed``) and ``emitted`` must be
N; ``dropped`` is reported as written in ``trace_closed``, so a figure bought
with drops shows.

Caller side (the same run): ``caller_wall_ns`` and ``caller_cpu_ns`` are the
wall time (``perf_counter``) and the emitting thread's CPU time (``thread_time``)
spent in the emit loop, building the event included, divided by N. CPU time
leaves out the writer thread's work; wall time includes the time the emitting
thread waits for the GIL while the writer holds it, which a program pays too.
For ``async`` these time only the 1,000-event stretches of emits; the writer's
tasks run on the same loop in the ``sleep(0)`` gaps, and what they cost the
loop thread shows in ``loop_wall_ns``/``loop_cpu_ns`` (the whole emit loop,
gaps included, per event). For ``sync8``, wall is the time from releasing the
threads until the last is done, per event of all threads; CPU is the sum of
the threads' CPU time per event.

Writer side: ``writer_cpu_ns`` is the process's CPU time from the first emit
to the close less the emitting code's, per event: the writer thread and the
sinks' threads (for ``async``, the pump's time on the loop and the sink's
thread). For the sync modes, ``written_in_emit`` is ``counts.written`` when
the emitting threads are done: what the writer managed while they ran.

    python benchmarks/throughput.py                 # every mode, 3 runs each
    python benchmarks/throughput.py --quick
    python benchmarks/throughput.py --mode sync --events 1000000
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from _bench import GROUP_ID, WEIGHT_VERSION, count_lines, script_main, tmp_dir, trace_closed

import rollout_trace as rt

YIELD_EVERY = 1_000
THREADS = 8


def _verify(path: Path, events: int) -> dict[str, Any]:
    closed = trace_closed(path)
    lines = count_lines(path)
    out: dict[str, Any] = {"lines": lines}
    if closed is None:
        out["check"] = "FAIL: no trace_closed line"
        return out
    out.update({k: closed[k] for k in ("emitted", "written", "dropped", "invalid")})
    ok = closed["emitted"] == events and lines == closed["written"] + 2
    out["check"] = "ok" if ok else f"FAIL: {lines} lines for {closed}"
    return out


def run_async(events: int) -> dict[str, Any]:
    with tmp_dir() as d:
        path = Path(d) / "trace.jsonl"
        result = asyncio.run(_async_body(path, events))
        result.update(_verify(path, events))
    return result


async def _async_body(path: Path, events: int) -> dict[str, Any]:
    make = rt.AttemptDispatched
    perf, cpu = time.perf_counter, time.thread_time
    emit_wall = emit_cpu = 0.0
    async with rt.tracer(f"jsonl://{path}") as t:
        emit = t.emit
        proc0 = time.process_time()
        w_start, c_start = perf(), cpu()
        for base in range(0, events, YIELD_EVERY):
            w0, c0 = perf(), cpu()
            for i in range(base, min(base + YIELD_EVERY, events)):
                emit(
                    make(
                        group_id=GROUP_ID,
                        prompt_id=i,
                        generation_index=i & 7,
                        attempt=0,
                        weight_version=WEIGHT_VERSION,
                    )
                )
            emit_wall += perf() - w0
            emit_cpu += cpu() - c0
            await asyncio.sleep(0)
        loop_wall, loop_cpu = perf() - w_start, cpu() - c_start
    total = perf() - w_start
    writer_cpu = time.process_time() - proc0 - emit_cpu
    return {
        "caller_wall_ns": emit_wall / events * 1e9,
        "caller_cpu_ns": emit_cpu / events * 1e9,
        "loop_wall_ns": loop_wall / events * 1e9,
        "loop_cpu_ns": loop_cpu / events * 1e9,
        "writer_cpu_ns": writer_cpu / events * 1e9,
        "e2e_s": total,
        "e2e_eps": events / total,
    }


def _emit_many(emit: Any, start: int, stop: int) -> None:
    make = rt.AttemptDispatched
    for i in range(start, stop):
        emit(
            make(
                group_id=GROUP_ID,
                prompt_id=i,
                generation_index=i & 7,
                attempt=0,
                weight_version=WEIGHT_VERSION,
            )
        )


def run_sync(events: int, threads: int = 1) -> dict[str, Any]:
    perf = time.perf_counter
    with tmp_dir() as d:
        path = Path(d) / "trace.jsonl"
        t = rt.sync_tracer(f"jsonl://{path}").open()
        emit = t.emit
        proc0 = time.process_time()
        if threads == 1:
            c0 = time.thread_time()
            w0 = perf()
            _emit_many(emit, 0, events)
            caller_wall = perf() - w0
            caller_cpu = time.thread_time() - c0
        else:
            caller_wall, caller_cpu, w0 = _threaded(emit, events, threads)
        in_emit = t.counts.written
        t.close()
        total = perf() - w0
        writer_cpu = time.process_time() - proc0 - caller_cpu
        result: dict[str, Any] = {
            "written_in_emit": in_emit,
            "caller_wall_ns": caller_wall / events * 1e9,
            "caller_cpu_ns": caller_cpu / events * 1e9,
            "writer_cpu_ns": writer_cpu / events * 1e9,
            "e2e_s": total,
            "e2e_eps": events / total,
        }
        result.update(_verify(path, events))
    return result


def _threaded(emit: Any, events: int, threads: int) -> tuple[float, float, float]:
    gate = threading.Barrier(threads + 1)
    cpu_times = [0.0] * threads
    share = events // threads

    def worker(k: int) -> None:
        start = k * share
        stop = events if k == threads - 1 else start + share
        gate.wait()
        c0 = time.thread_time()
        _emit_many(emit, start, stop)
        cpu_times[k] = time.thread_time() - c0

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for th in pool:
        th.start()
    w0 = time.perf_counter()
    gate.wait()
    for th in pool:
        th.join()
    return time.perf_counter() - w0, sum(cpu_times), w0


MODES = {
    "async": run_async,
    "sync": run_sync,
    "sync8": lambda n: run_sync(n, THREADS),
}

COLUMNS = [
    ("events/s end to end", "e2e_eps", 0),
    ("caller wall ns/ev", "caller_wall_ns", 0),
    ("caller CPU ns/ev", "caller_cpu_ns", 0),
    ("writer CPU ns/ev", "writer_cpu_ns", 0),
    ("dropped", "dropped", 0),
    ("lines", "lines", 0),
    ("peak RSS MiB", "maxrss_mib", 1),
]

if __name__ == "__main__":
    script_main("throughput.py", MODES, __doc__, COLUMNS)
