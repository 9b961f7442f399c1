"""Hand-written floors: the least any tracer can do to get the same lines into a file.

Each floor writes what rollout_trace writes (the same 8-field event, built the
same way by the same loop as in ``throughput.py``, encoded with msgspec's
``encode_lines``) and nothing else: no schema check, no buffer bound, no
sink thread, no flush interval, no lifecycle lines, no counts. They are the
yardsticks ``run_all.py`` holds rollout_trace to, measured in the same run.

- ``sync``: ``emit`` stamps the envelope (``time``, ``seq`` from an
  ``itertools.count``, ``run_id``) and puts the event on a
  ``queue.SimpleQueue``; one writer thread blocks on the first event, drains
  what is queued, encodes the batch with ``encode_lines`` and writes it with
  one ``os.write``. The queue is unbounded, so it never drops: what it costs
  instead is memory when the writer falls behind.
- ``sync_ctor``: the same, with the envelope passed to the constructor
  instead of stamped afterwards (no ``setattr`` on the struct).
- ``sync8``: ``sync`` with 8 threads emitting N/8 events each at once.
- ``async``: on asyncio, ``emit`` stamps the envelope and calls
  ``send_nowait`` on an unbounded anyio memory object stream; a consumer task
  awaits the first event, drains the stream with ``receive_nowait``, encodes
  the batch and writes it with one ``os.write`` on the loop. The emitting task
  yields every 1,000 emits, as in ``throughput.py``.

Reported as in ``throughput.py``: the caller's wall and CPU time per event
(the emit loop, building the event included), end-to-end events/s (first
emit to the file complete), the lines in the file, ``writer_cpu_ns``: the
CPU time of everything but the emitting code (the writer thread; for
``async``, the consumer task's time on the loop), per event, and for the
sync modes ``written_in_emit``: the events in the file by the time the
emitting threads were done.

    python benchmarks/floors.py
    python benchmarks/floors.py --mode sync --events 1000000
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
from _bench import GROUP_ID, RUN_ID, WEIGHT_VERSION, count_lines, script_main, tmp_dir

import rollout_trace as rt

YIELD_EVERY = 1_000
THREADS = 8
_STOP = object()


def _open(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _writer(q: queue.SimpleQueue[Any], fd: int, written: list[int]) -> None:
    encode_lines = msgspec.json.Encoder().encode_lines
    get, get_nowait = q.get, q.get_nowait
    while True:
        first = get()
        batch = [first]
        append = batch.append
        try:
            while True:
                append(get_nowait())
        except queue.Empty:
            pass
        stop = batch[-1] is _STOP  # emitters are done before the stop goes in
        if stop:
            batch.pop()
        if batch:
            _write_all(fd, encode_lines(batch))
            written[0] += len(batch)
        if stop:
            return


def _make_emit(q: queue.SimpleQueue[Any]) -> Any:
    put, now, nxt = q.put, time.time, itertools.count(1).__next__
    run_id = RUN_ID

    def emit(ev: rt.AttemptDispatched) -> None:
        ev.time = now()
        ev.seq = nxt()
        ev.run_id = run_id
        put(ev)

    return emit


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


def _emit_many_ctor(q: queue.SimpleQueue[Any], start: int, stop: int) -> None:
    make, put, now = rt.AttemptDispatched, q.put, time.time
    nxt = itertools.count(start + 1).__next__
    for i in range(start, stop):
        put(
            make(
                time=now(),
                run_id=RUN_ID,
                seq=nxt(),
                group_id=GROUP_ID,
                prompt_id=i,
                generation_index=i & 7,
                attempt=0,
                weight_version=WEIGHT_VERSION,
            )
        )


def _result(
    events: int, path: Path, wall: float, cpu: float, proc0: float, total: float, in_emit: int
) -> dict[str, Any]:
    lines = count_lines(path)
    return {
        "written_in_emit": in_emit,
        "caller_wall_ns": wall / events * 1e9,
        "caller_cpu_ns": cpu / events * 1e9,
        "writer_cpu_ns": (time.process_time() - proc0 - cpu) / events * 1e9,
        "e2e_s": total,
        "e2e_eps": events / total,
        "lines": lines,
        "dropped": events - lines,
        "check": "ok" if lines == events else f"{events - lines} lines missing",
    }


def run_sync(events: int, threads: int = 1, ctor: bool = False) -> dict[str, Any]:
    perf = time.perf_counter
    with tmp_dir() as d:
        path = Path(d) / "floor.jsonl"
        fd = _open(path)
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        written = [0]
        writer = threading.Thread(target=_writer, args=(q, fd, written), daemon=True)
        writer.start()
        emit = _make_emit(q)
        proc0 = time.process_time()
        if threads == 1:
            c0, w0 = time.thread_time(), perf()
            if ctor:
                _emit_many_ctor(q, 0, events)
            else:
                _emit_many(emit, 0, events)
            wall, cpu = perf() - w0, time.thread_time() - c0
        else:
            wall, cpu, w0 = _threaded(emit, events, threads)
        in_emit = written[0]
        q.put(_STOP)
        writer.join()
        os.close(fd)
        total = perf() - w0
        return _result(events, path, wall, cpu, proc0, total, in_emit)


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


def run_async(events: int) -> dict[str, Any]:
    with tmp_dir() as d:
        path = Path(d) / "floor.jsonl"
        result = asyncio.run(_async_body(path, events))
        result.update(_result_lines(path, events))
    return result


def _result_lines(path: Path, events: int) -> dict[str, Any]:
    lines = count_lines(path)
    ok = lines == events
    return {"lines": lines, "dropped": events - lines, "check": "ok" if ok else "lines missing"}


async def _consume(receive: Any, fd: int) -> None:
    encode_lines = msgspec.json.Encoder().encode_lines
    receive_nowait = receive.receive_nowait
    async for first in receive:
        batch = [first]
        append = batch.append
        try:
            while True:
                append(receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            pass
        _write_all(fd, encode_lines(batch))


async def _async_body(path: Path, events: int) -> dict[str, Any]:
    make = rt.AttemptDispatched
    perf, cpu = time.perf_counter, time.thread_time
    fd = _open(path)
    send, receive = anyio.create_memory_object_stream[Any](float("inf"))
    send_nowait, now, nxt = send.send_nowait, time.time, itertools.count(1).__next__
    run_id = RUN_ID

    def emit(ev: rt.AttemptDispatched) -> None:
        ev.time = now()
        ev.seq = nxt()
        ev.run_id = run_id
        send_nowait(ev)

    emit_wall = emit_cpu = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(_consume, receive, fd)
        await asyncio.sleep(0)  # the consumer waits for its first event
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
        send.close()
    os.close(fd)
    total = perf() - w_start
    return {
        "caller_wall_ns": emit_wall / events * 1e9,
        "caller_cpu_ns": emit_cpu / events * 1e9,
        "loop_wall_ns": loop_wall / events * 1e9,
        "loop_cpu_ns": loop_cpu / events * 1e9,
        "writer_cpu_ns": (time.process_time() - proc0 - emit_cpu) / events * 1e9,
        "e2e_s": total,
        "e2e_eps": events / total,
    }


MODES = {
    "sync": run_sync,
    "sync_ctor": lambda n: run_sync(n, ctor=True),
    "sync8": lambda n: run_sync(n, THREADS),
    "async": run_async,
}

COLUMNS = [
    ("events/s end to end", "e2e_eps", 0),
    ("caller wall ns/ev", "caller_wall_ns", 0),
    ("caller CPU ns/ev", "caller_cpu_ns", 0),
    ("writer CPU ns/ev", "writer_cpu_ns", 0),
    ("lines", "lines", 0),
    ("peak RSS MiB", "maxrss_mib", 1),
]

if __name__ == "__main__":
    script_main("floors.py", MODES, __doc__, COLUMNS)
