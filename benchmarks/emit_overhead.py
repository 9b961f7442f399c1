"""Caller-side cost of ``emit``, in nanoseconds per event, building the event included.

Every mode runs N events in a fresh process. The event is the same everywhere:
``rt.AttemptDispatched(group_id, prompt_id, generation_index, attempt,
weight_version)`` plus its envelope (``event``, ``time``, ``run_id``, ``seq``),
8 fields, built anew for every emit from the loop index.

Modes:

- ``build_only``: the baseline; the loop builds the event and drops it.
- ``bare_struct``: a plain ``msgspec.Struct`` of the same 8 fields built with
  ``time.time()`` and a counter: the floor of any typed, stamped record.
- ``disabled_call``: ``rt.sync_tracer(enabled=False).emit(ev)`` on one
  prebuilt event: the call alone (10 calls per loop turn so the loop itself
  weighs little).
- ``disabled_build``: the same tracer, building the event for every call.
- ``async``, ``sync``, ``sync8``: an open tracer writing to a JSONL file, from
  ``throughput.py`` (see there): the async tracer yielding to the loop every
  1,000 emits, the sync tracer from 1 thread and from 8 threads.

Reported: ``caller_wall_ns`` (``perf_counter``) and ``caller_cpu_ns`` (the
emitting thread's ``thread_time``), the emit loop's time divided by N. Both are
shown because they answer different questions: CPU time is what the caller's
own code costs, leaving out the tracer's writer thread; wall time is what the
caller waits, which with the GIL includes the stretches the writer thread
holds the interpreter, and on a shared VM the time slices the host stole.
``run_all.py`` checks the targets against both.

The modes without a tracer thread (``build_only``, ``bare_struct``,
``disabled_*``) run their N events in 20 stretches and report the median
stretch, so that one stolen slice of a busy host does not decide the figure
(``caller_wall_ns_mean`` keeps the plain mean). The open-tracer modes run in
one piece: the writer's work must fall inside the measurement.

    python benchmarks/emit_overhead.py
    python benchmarks/emit_overhead.py --quick --out emit.json
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import throughput
from _bench import GROUP_ID, RUN_ID, WEIGHT_VERSION, script_main

import rollout_trace as rt

CHUNKS = 20


class BareRecord(msgspec.Struct, gc=False):
    event: str
    time: float
    run_id: str
    seq: int
    group_id: str
    prompt_id: int
    generation_index: int
    attempt: int
    weight_version: int


def _timed(events: int, body: Callable[[int], None]) -> dict[str, Any]:
    # In CHUNKS stretches, reporting the median stretch: on a shared VM one
    # stolen time slice would otherwise outweigh a whole run of 60 ns calls.
    per = max(10, events // CHUNKS // 10 * 10)  # whole turns of disabled_call's loop
    walls, cpus = [], []
    for _ in range(CHUNKS):
        c0, w0 = time.thread_time(), time.perf_counter()
        body(per)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.thread_time() - c0)
    return {
        "caller_wall_ns": statistics.median(walls) / per * 1e9,
        "caller_cpu_ns": statistics.median(cpus) / per * 1e9,
        "caller_wall_ns_mean": sum(walls) / (per * CHUNKS) * 1e9,
    }


def build_only(events: int) -> dict[str, Any]:
    make = rt.AttemptDispatched

    def body(n: int) -> None:
        for i in range(n):
            make(
                group_id=GROUP_ID,
                prompt_id=i,
                generation_index=i & 7,
                attempt=0,
                weight_version=WEIGHT_VERSION,
            )

    return _timed(events, body)


def bare_struct(events: int) -> dict[str, Any]:
    make, now = BareRecord, time.time

    def body(n: int) -> None:
        for i in range(n):
            make("attempt_dispatched", now(), RUN_ID, i, GROUP_ID, i, i & 7, 0, WEIGHT_VERSION)

    return _timed(events, body)


def disabled_call(events: int) -> dict[str, Any]:
    emit = rt.sync_tracer(enabled=False).emit
    ev = rt.AttemptDispatched(
        group_id=GROUP_ID, prompt_id=1, generation_index=1, attempt=0, weight_version=3
    )

    def body(n: int) -> None:
        for _ in range(max(1, n // 10)):
            emit(ev)
            emit(ev)
            emit(ev)
            emit(ev)
            emit(ev)
            emit(ev)
            emit(ev)
            emit(ev)
            emit(ev)
            emit(ev)

    return _timed(events, body)


def disabled_build(events: int) -> dict[str, Any]:
    emit = rt.sync_tracer(enabled=False).emit
    return _timed(events, lambda n: throughput._emit_many(emit, 0, n))


MODES = {
    "build_only": build_only,
    "bare_struct": bare_struct,
    "disabled_call": disabled_call,
    "disabled_build": disabled_build,
    "async": throughput.run_async,
    "sync": throughput.run_sync,
    "sync8": throughput.MODES["sync8"],
}

COLUMNS = [
    ("caller wall ns/ev", "caller_wall_ns", 0),
    ("caller CPU ns/ev", "caller_cpu_ns", 0),
    ("async loop wall ns/ev", "loop_wall_ns", 0),
    ("dropped", "dropped", 0),
]

if __name__ == "__main__":
    script_main("emit_overhead.py", MODES, __doc__, COLUMNS)
