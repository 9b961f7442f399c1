"""What the tracer costs the program hosting it: its event loop's lateness, its work, its threads.

Every scenario runs the same host, in a fresh interpreter each time:

- a controller task on the event loop doing pure-Python work units (a sum of
  100 squares, about 5 us each) in slices of 50 (about 0.25 ms), awaiting
  ``asyncio.sleep(0)`` after each slice, and emitting between slices when the
  scenario says so;
- a 1 ms ticker task on the same loop: ``await asyncio.sleep(0.001)`` in a
  loop, recording how late each wake-up is against its due time;
- 2 host threads doing the same work units in slices of 10, sleeping 1 ms
  between slices (light: busy threads would hold the loop off for whole 5 ms
  switch intervals and drown the tracer's share of its lateness), and
  reading ``sys.getswitchinterval()`` after each slice.

The scenarios differ only in what is emitted and where to:

- ``no tracer``: nothing is built or emitted; the baseline of every ratio;
- ``rt.tracer`` paced at 10,000 and 100,000 events/s: the controller emits
  ``rt.AttemptDispatched`` from the loop, as many as are due by the clock at
  each slice;
- ``rt.tracer`` burst of 50,000 and of 250,000: the controller emits them in
  one go, 0.3 s into the window, and emits nothing after;
- ``rt.tracer`` urgent: a burst of 50,000 with an ``rt.StepTrained`` every
  1,000 events in it, then 10,000 events/s with the same mix: urgent events
  arrive while up to 50,000 events are queued;
- ``rt.sync_tracer`` from 2 threads: the 2 host threads emit 50,000 events/s
  each (100,000 in all, paced as above) between their slices; the controller
  emits nothing;
- ``floor``, under each of the same loads: a hand-written tracer whose emit
  stamps the envelope and appends to a ``collections.deque``; one writer
  thread polls it every 10 ms and encodes it with
  ``msgspec.json.Encoder().encode_lines`` 4,096 events at a time, each chunk
  written with ``os.write``: what any tracer with a writer thread costs.

Each writes to a JSONL file in a temporary folder. The window (``--seconds``,
3 by default) starts once the tracer is open and ends before it closes; over
it are measured:

- the ticker's lateness, p50, p99 and max, in ms. In the burst scenarios a
  tick due while the controller emitted in one go is late from the burst's
  end, not from its due time: the ticker cannot run during the burst's emit
  loop (that time is the host's own, reported as ``burst emit ms``, where a
  tracer's work inside ``emit`` shows), and what matters is what the tracer
  does on the loop once the burst is emitted;
- the same lateness on CPU: less the time during the tick when no thread of
  the process ran at all (wall time less the process's CPU time over the
  tick, when positive). On a machine shared with other programs the raw
  figures are mostly theirs (a busy neighbour makes a 50 ms max of no
  tracer); what the process itself does, the loop encoding or a thread of
  ours holding the GIL, stays in. On a quiet machine the two are the same;
  on a loaded one a stall of the process's own shows at the CPU time it got;
- the host's work: units done per second by the controller and the threads
  together, and its ratio to ``no tracer``'s; also per CPU second of the
  whole process (tracer threads included), a ratio that other programs on
  the machine move less than they move wall time;
- the process's context switches per second (``ru_nvcsw + ru_nivcsw`` of
  ``getrusage(RUSAGE_SELF)``, every thread) and CPU seconds per second;
- the smallest ``sys.getswitchinterval()`` seen by the host threads and the
  controller, from before the tracer opens until after it closes: a tracer
  must never change the process's switch interval;
- the events written (``trace_closed``'s ``written``; the floor's lines)
  against those emitted, after the close.

Rounds (``--repeat``, default 5) run every scenario once each, in a fresh
child, each round starting one scenario further along the list, so that the
machine's drift falls on every scenario alike. The table gives the median
over rounds of each figure, except the switch interval (the smallest seen in
any round) and written / emitted (the round that wrote the smallest share);
ratios are of medians measured in this one run; ``on-CPU max - no tracer``
is the scenario's median on-CPU max lateness less ``no tracer``'s (the raw
one, ``max_over_none_ms``, is in the JSON).

Targets (stated here, not judged: this is a report, and it exits 0 whatever
the outcome): the ticker's max lateness attributable to the tracer (``on-CPU
max - no tracer``; ``max`` less ``no tracer``'s too on a quiet machine) at
most 5 ms in every scenario; the host's work at 10,000 events/s within 2% of
``no tracer``'s (a ratio of at least 0.98, per wall second on a quiet
machine, per CPU second on a loaded one); the minimum switch interval the
process's own (5 ms by default) everywhere.

    python benchmarks/host_impact.py                   # about 5 minutes
    python benchmarks/host_impact.py --quick           # one short round, about 30 s
    python benchmarks/host_impact.py --repeat 7 --out host_impact.json
    python benchmarks/host_impact.py --mode rt_burst_250k --seconds 2   # one child, JSON
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from _bench import (
    GROUP_ID,
    HERE,
    RUN_ID,
    WEIGHT_VERSION,
    count_lines,
    finish,
    fmt,
    machine,
    machine_line,
    table,
    tmp_dir,
    trace_closed,
)

import rollout_trace as rt

TICK = 0.001
LOOP_SLICE = 50  # work units per controller slice: about 0.25 ms
# The host threads are light (about 50 us of work a millisecond each): busy
# threads would take the GIL from the loop for whole switch intervals (5 ms)
# and drown what the tracer does in the ticker's lateness.
THREAD_SLICE = 10
THREAD_PAUSE = 0.001
HOST_THREADS = 2
BURST_AT = 0.3  # seconds into the window
URGENT_EVERY = 1_000
URGENT_GROUPS = [f"g-{k:04d}" for k in range(8)]
# The floor's writer: how often it looks at its deque, and how many events it
# encodes at once (a whole 250,000-event backlog in one encode_lines call
# would hold the GIL for tens of ms).
FLOOR_POLL = 0.010
FLOOR_CHUNK = 4_096
SETTLE = 0.2  # seconds the host runs before the window, threads and loop warmed up
DEFAULT_SECONDS = 3.0
QUICK_SECONDS = 1.5


@dataclass(frozen=True)
class Load:
    rate: int = 0  # events/s from the loop
    burst: int = 0  # events in one go from the loop, at BURST_AT
    urgent: bool = False  # a StepTrained every URGENT_EVERY events
    thread_rate: int = 0  # events/s from the host threads, in all


# mode: (label, tracer, load). "rt" is rt.tracer for loads from the loop and
# rt.sync_tracer for loads from the threads.
SCENARIOS: dict[str, tuple[str, str, Load]] = {
    "none": ("no tracer", "none", Load()),
    "rt_10k": ("rt.tracer 10k ev/s", "rt", Load(rate=10_000)),
    "floor_10k": ("floor 10k ev/s", "floor", Load(rate=10_000)),
    "rt_100k": ("rt.tracer 100k ev/s", "rt", Load(rate=100_000)),
    "floor_100k": ("floor 100k ev/s", "floor", Load(rate=100_000)),
    "rt_burst_50k": ("rt.tracer burst 50k", "rt", Load(burst=50_000)),
    "floor_burst_50k": ("floor burst 50k", "floor", Load(burst=50_000)),
    "rt_burst_250k": ("rt.tracer burst 250k", "rt", Load(burst=250_000)),
    "floor_burst_250k": ("floor burst 250k", "floor", Load(burst=250_000)),
    "rt_urgent": (
        "rt.tracer urgent: burst 50k + 10k ev/s, StepTrained every 1k",
        "rt",
        Load(rate=10_000, burst=50_000, urgent=True),
    ),
    "floor_urgent": (
        "floor urgent: burst 50k + 10k ev/s, StepTrained every 1k",
        "floor",
        Load(rate=10_000, burst=50_000, urgent=True),
    ),
    "rt_sync_threads": (
        "rt.sync_tracer 2 threads 100k ev/s",
        "rt",
        Load(thread_rate=100_000),
    ),
    "floor_threads": ("floor 2 threads 100k ev/s", "floor", Load(thread_rate=100_000)),
}


def unit() -> int:
    """One unit of the host's own work: pure Python, about 5 us."""
    x = 0
    for i in range(100):
        x += i * i
    return x


def _emit_range(emit: Any, start: int, stop: int, urgent: bool) -> None:
    make, step = rt.AttemptDispatched, rt.StepTrained
    for i in range(start, stop):
        if urgent and i % URGENT_EVERY == URGENT_EVERY - 1:
            emit(step(step=i // URGENT_EVERY, group_ids=URGENT_GROUPS))
        else:
            emit(
                make(
                    group_id=GROUP_ID,
                    prompt_id=i,
                    generation_index=i & 7,
                    attempt=0,
                    weight_version=WEIGHT_VERSION,
                )
            )


# --- the floor ------------------------------------------------------------


class Floor:
    """emit: stamp the envelope, append to a deque; a writer thread encodes and writes."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self.queue: collections.deque[Any] = collections.deque()
        self.written = 0
        self.stop = False
        put, now, nxt = self.queue.append, time.time, itertools.count(1).__next__
        run_id = RUN_ID

        def emit(ev: Any) -> None:
            ev.time = now()
            ev.seq = nxt()
            ev.run_id = run_id
            put(ev)

        self.emit = emit
        self.thread = threading.Thread(target=self._write, name="floor writer", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        encode_lines = msgspec.json.Encoder().encode_lines
        q = self.queue
        popleft = q.popleft
        while True:
            n = len(q)
            if not n:
                # stop is read first: set after the last emit, it means q is final.
                if self.stop and not q:
                    return
                time.sleep(FLOOR_POLL)
                continue
            batch = [popleft() for _ in range(min(n, FLOOR_CHUNK))]
            view = memoryview(encode_lines(batch))
            while view:
                view = view[os.write(self.fd, view) :]
            self.written += len(batch)

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        os.close(self.fd)


# --- the host -------------------------------------------------------------


class Host:
    """The program the tracer lives in: the controller and ticker on a loop, 2 threads."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.thread_emit: Any = None  # set once the tracer is open
        self.window: tuple[float, float] = (math.inf, math.inf)  # perf_counter
        self.thread_units = [0] * HOST_THREADS
        self.thread_emitted = [0] * HOST_THREADS
        self.emitting = [False] * HOST_THREADS  # a thread is inside its emit loop
        self.min_switch = [sys.getswitchinterval()] * (HOST_THREADS + 1)
        self.done = threading.Event()
        self.threads = [
            threading.Thread(target=self._thread, args=(k,), name=f"host {k}", daemon=True)
            for k in range(HOST_THREADS)
        ]

    def start(self) -> None:
        for th in self.threads:
            th.start()

    def stop_emits(self) -> None:
        """No host thread emits from now on (one that is catching up finishes
        first): what the tracer's close then counts is everything emitted."""
        self.thread_emit = None
        while any(self.emitting):
            time.sleep(0.001)

    def stop(self) -> None:
        self.done.set()
        for th in self.threads:
            th.join()

    def _thread(self, k: int) -> None:
        perf, switch, sleep, done = time.perf_counter, sys.getswitchinterval, time.sleep, self.done
        rate = self.load.thread_rate / HOST_THREADS
        units = self.thread_units
        lowest = self.min_switch[k]
        # Each thread emits its own range of prompt ids (emitted count * threads + k).
        emitted = 0
        while not done.is_set():
            self.emitting[k] = True
            emit = self.thread_emit
            if rate and emit is not None:
                start, end = self.window
                now = perf()
                if start <= now < end:
                    due = int((now - start) * rate)
                    make = rt.AttemptDispatched
                    for j in range(emitted, due):
                        emit(
                            make(
                                group_id=GROUP_ID,
                                prompt_id=j * HOST_THREADS + k,
                                generation_index=j & 7,
                                attempt=0,
                                weight_version=WEIGHT_VERSION,
                            )
                        )
                    emitted = max(emitted, due)
                    self.thread_emitted[k] = emitted
            self.emitting[k] = False
            for _ in range(THREAD_SLICE):
                unit()
            units[k] += THREAD_SLICE
            si = switch()
            if si < lowest:
                lowest = self.min_switch[k] = si
            sleep(THREAD_PAUSE)

    async def measure(self, emit: Any, seconds: float) -> dict[str, Any]:
        """Run the window on this loop: the controller (emitting to ``emit``, from
        the loop) and the ticker; return what was measured."""
        perf = time.perf_counter
        load = self.load
        pcpu = time.process_time
        # (went to sleep, woke): perf_counter and the process's CPU time at each
        ticks: list[tuple[float, float, float, float]] = []
        ticking = [True]

        async def ticker() -> None:
            while ticking[0]:
                start, start_cpu = perf(), pcpu()
                await asyncio.sleep(TICK)
                ticks.append((start, start_cpu, perf(), pcpu()))

        settle_end = perf() + SETTLE
        while perf() < settle_end:
            for _ in range(LOOP_SLICE):
                unit()
            await asyncio.sleep(0)

        switch = sys.getswitchinterval
        lowest = self.min_switch[HOST_THREADS]
        units = emitted = 0
        burst_span: tuple[float, float, float] | None = None  # start, end, CPU at end
        u0 = sum(self.thread_units)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = time.process_time()
        t0 = perf()
        end = t0 + seconds
        self.window = (t0, end)
        pace_from = math.inf if load.burst else t0  # after the burst, if there is one
        tick_task = asyncio.create_task(ticker())
        while True:
            now = perf()
            if now >= end:
                break
            if emit is not None:
                if burst_span is None and load.burst and now - t0 >= BURST_AT:
                    b0 = perf()
                    _emit_range(emit, emitted, emitted + load.burst, load.urgent)
                    emitted += load.burst
                    b1 = perf()
                    burst_span = (b0, b1, pcpu())
                    pace_from = b1
                    now = b1
                if load.rate and now >= pace_from:
                    due = int((now - pace_from) * load.rate) + load.burst
                    if due > emitted:
                        _emit_range(emit, emitted, due, load.urgent)
                        emitted = due
            for _ in range(LOOP_SLICE):
                unit()
            units += LOOP_SLICE
            si = switch()
            if si < lowest:
                lowest = self.min_switch[HOST_THREADS] = si
            await asyncio.sleep(0)
        t1 = perf()
        cpu = time.process_time() - cpu0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        thread_units = sum(self.thread_units) - u0
        ticking[0] = False
        await tick_task
        wall = t1 - t0
        result: dict[str, Any] = {
            "window_s": wall,
            "loop_units_s": units / wall,
            "thread_units_s": thread_units / wall,
            "units_s": (units + thread_units) / wall,
            "units_per_cpu_s": (units + thread_units) / cpu if cpu > 0 else None,
            "ctx_s": (r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw) / wall,
            "vol_ctx_s": (r1.ru_nvcsw - r0.ru_nvcsw) / wall,
            "cpu_s_per_s": cpu / wall,
            "emitted_loop": emitted,
        }
        late, on_cpu = _lateness(ticks, burst_span)
        result.update(_percentiles("late", late))
        result.update(_percentiles("oncpu", on_cpu))
        result["ticks"] = len(ticks)
        if burst_span is not None:
            result["burst_emit_ms"] = (burst_span[1] - burst_span[0]) * 1e3
            # When the worst tick woke, from the burst's end: a stall the tracer
            # causes right after the burst shows as a small figure here.
            worst = max(range(len(late)), key=late.__getitem__)
            result["worst_tick_after_burst_ms"] = (ticks[worst][2] - burst_span[1]) * 1e3
        return result


def _lateness(
    ticks: list[tuple[float, float, float, float]], burst: tuple[float, float, float] | None
) -> tuple[list[float], list[float]]:
    """Each tick's lateness, and its lateness on CPU: less the time in the tick
    when no thread of the process ran (other programs had the cores).

    A tick due during a burst is late from the burst's end: the emit loop's own
    time is the host's, what runs on the loop after it is not.
    """
    end, end_cpu = (burst[1], burst[2]) if burst is not None else (math.inf, 0.0)
    late, on_cpu = [], []
    for start, start_cpu, woke, woke_cpu in ticks:
        due = start + TICK
        if due < end <= woke:
            start, start_cpu, due = end, end_cpu, end
        idle = max(0.0, (woke - start) - (woke_cpu - start_cpu))
        late.append(woke - due)
        on_cpu.append(max(0.0, woke - due - idle))
    return late, on_cpu


def _percentiles(name: str, values: list[float]) -> dict[str, Any]:
    if not values:
        return {}
    values = sorted(values)
    n = len(values)
    return {
        f"{name}_p50_ms": values[n // 2] * 1e3,
        f"{name}_p99_ms": values[min(n - 1, math.ceil(0.99 * n) - 1)] * 1e3,
        f"{name}_max_ms": values[-1] * 1e3,
    }


# --- one scenario, in this process ----------------------------------------


def run_scenario(mode: str, seconds: float) -> dict[str, Any]:
    label, kind, load = SCENARIOS[mode]
    switch_before = sys.getswitchinterval()
    host = Host(load)
    host.start()
    result: dict[str, Any] = {"mode": mode, "label": label, "rt_file": rt.__file__}
    try:
        with tmp_dir() as d:
            path = Path(d) / "trace.jsonl"
            if kind == "none":
                result.update(asyncio.run(host.measure(None, seconds)))
            elif kind == "floor":
                floor = Floor(path)
                loop_emit = None
                if load.thread_rate:
                    host.thread_emit = floor.emit
                else:
                    loop_emit = floor.emit
                result.update(asyncio.run(host.measure(loop_emit, seconds)))
                result["written_in_window"] = floor.written
                host.stop_emits()
                c0 = time.perf_counter()
                floor.close()
                result["close_s"] = time.perf_counter() - c0
                result["written"] = count_lines(path)
            elif load.thread_rate:
                with rt.sync_tracer(f"jsonl://{path}") as t:
                    host.thread_emit = t.emit
                    result.update(asyncio.run(host.measure(None, seconds)))
                    result["written_in_window"] = _written_so_far(t)
                    host.stop_emits()
                    c0 = time.perf_counter()
                result["close_s"] = time.perf_counter() - c0
                result.update(_closed_counts(path))
            else:
                result.update(asyncio.run(_with_async_tracer(host, path, seconds)))
                result.update(_closed_counts(path))
    finally:
        host.stop()
    result["emitted"] = result.pop("emitted_loop") + sum(host.thread_emitted)
    result["min_switch_interval"] = min(host.min_switch)
    result["switch_interval_before"] = switch_before
    result["switch_interval_after"] = sys.getswitchinterval()
    return result


async def _with_async_tracer(host: Host, path: Path, seconds: float) -> dict[str, Any]:
    async with rt.tracer(f"jsonl://{path}") as t:
        result = await host.measure(t.emit, seconds)
        result["written_in_window"] = _written_so_far(t)
        c0 = time.perf_counter()
    result["close_s"] = time.perf_counter() - c0
    return result


def _written_so_far(t: Any) -> int:
    return int(t.counts.written)


def _closed_counts(path: Path) -> dict[str, Any]:
    closed = trace_closed(path)
    if closed is None:
        return {"written": None, "check": "no trace_closed line"}
    out = {k: closed.get(k) for k in ("written", "dropped", "invalid")}
    out["emitted_closed"] = closed.get("emitted")
    return out


# --- the rounds, in the parent --------------------------------------------


def run_child(mode: str, seconds: float) -> dict[str, Any]:
    """One scenario in a fresh interpreter; its environment (PYTHONPATH) is ours."""
    cmd = [sys.executable, str(HERE / "host_impact.py"), "--mode", mode, "--seconds", str(seconds)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=seconds + 120, check=False
        )
    except subprocess.TimeoutExpired:
        return {"mode": mode, "error": "timed out"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"mode": mode, "error": (proc.stderr or proc.stdout).strip()[-2000:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


MEDIAN_KEYS = (
    "late_p50_ms",
    "late_p99_ms",
    "late_max_ms",
    "oncpu_p50_ms",
    "oncpu_p99_ms",
    "oncpu_max_ms",
    "units_s",
    "units_per_cpu_s",
    "loop_units_s",
    "thread_units_s",
    "ctx_s",
    "vol_ctx_s",
    "cpu_s_per_s",
    "burst_emit_ms",
    "worst_tick_after_burst_ms",
    "close_s",
    "maxrss_mib",
)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    med: dict[str, dict[str, Any]] = {}
    for mode, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        m: dict[str, Any] = {"label": SCENARIOS[mode][0], "rounds": len(ok)}
        for key in MEDIAN_KEYS:
            values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
            m[key] = statistics.median(values) if values else None
        switches = [r["min_switch_interval"] for r in ok if "min_switch_interval" in r]
        m["min_switch_interval"] = min(switches) if switches else None
        # The round that wrote the smallest share of what it emitted.
        shares = [
            (r["written"] / r["emitted"] if r["emitted"] else 1.0, r["written"], r["emitted"])
            for r in ok
            if isinstance(r.get("written"), int) and isinstance(r.get("emitted"), int)
        ]
        worst = min(shares, default=None)
        m["written"], m["emitted"] = (worst[1], worst[2]) if worst else (None, None)
        m["errors"] = [r["error"][-300:] for r in rs if "error" in r]
        m["rt_files"] = sorted({r["rt_file"] for r in ok if "rt_file" in r})
        med[mode] = m
    base = med.get("none", {})
    for m in med.values():
        m["units_vs_none"] = _ratio(m["units_s"], base.get("units_s"))
        m["units_per_cpu_vs_none"] = _ratio(m["units_per_cpu_s"], base.get("units_per_cpu_s"))
        m["max_over_none_ms"] = _minus(m["late_max_ms"], base.get("late_max_ms"))
        m["oncpu_max_over_none_ms"] = _minus(m["oncpu_max_ms"], base.get("oncpu_max_ms"))
    return med


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _switch(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def report_table(med: dict[str, dict[str, Any]]) -> str:
    rows = []
    for m in med.values():
        written = "-" if m["written"] is None else f"{fmt(m['written'])} / {fmt(m['emitted'])}"
        rows.append(
            [
                m["label"],
                fmt(m["late_p50_ms"], 2),
                fmt(m["late_p99_ms"], 2),
                fmt(m["late_max_ms"], 2),
                fmt(m["oncpu_p99_ms"], 2),
                fmt(m["oncpu_max_ms"], 2),
                fmt(m["oncpu_max_over_none_ms"], 2),
                fmt(m["units_s"]),
                _times(m["units_vs_none"]),
                _times(m["units_per_cpu_vs_none"]),
                fmt(m["ctx_s"]),
                fmt(m["cpu_s_per_s"], 2),
                _switch(m["min_switch_interval"]),
                fmt(m["burst_emit_ms"], 1),
                written,
            ]
        )
    header = [
        "scenario",
        "ticker p50 ms",
        "p99 ms",
        "max ms",
        "on-CPU p99 ms",
        "on-CPU max ms",
        "on-CPU max - no tracer ms",
        "host units/s",
        "vs no tracer",
        "per CPU s vs no tracer",
        "ctx switches/s",
        "CPU s/s",
        "min switch interval",
        "burst emit ms",
        "written / emitted",
    ]
    return table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mode", choices=sorted(SCENARIOS), help="run one scenario here")
    parser.add_argument("--seconds", type=float, default=None, help="the window (default 3)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="1 round, a 1.5 s window")
    parser.add_argument("--only", nargs="*", default=None, help="scenarios to run")
    parser.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args()
    seconds = args.seconds or (QUICK_SECONDS if args.quick else DEFAULT_SECONDS)
    if args.mode:
        finish(run_scenario(args.mode, seconds))
        return
    repeat = 1 if args.quick else args.repeat
    chosen = args.only or list(SCENARIOS)
    if "none" not in chosen:
        chosen.insert(0, "none")  # every ratio is to it
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in chosen}
    # Other programs on the machine move every figure: their load is said with them.
    load_before = os.getloadavg()
    started = time.perf_counter()
    for rnd in range(repeat):
        shift = rnd % len(chosen)
        for mode in chosen[shift:] + chosen[:shift]:
            result = run_child(mode, seconds)
            runs[mode].append(result)
            note = result.get("error", "")[-300:]
            print(f"round {rnd + 1}/{repeat} {mode}: done {note}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()
    med = summarize(runs)

    m = machine()
    # Relative to this checkout where it is one (a table goes into the README).
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rt_files = sorted(
        {
            os.path.relpath(f, here) if f.startswith(here + os.sep) else f
            for v in med.values()
            for f in v["rt_files"]
        }
    )
    lines = [
        f"machine: {machine_line(m)}",
        f"rollout_trace imported by the children from: {', '.join(rt_files) or '-'}",
        "",
        f"Host impact: {repeat} rounds, median of each; a {seconds:g} s window per "
        f"scenario; {elapsed:.0f} s in all; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after ({os.cpu_count()} cores).",
        "",
        report_table(med),
    ]
    errors = [f"- {v['label']}: {e}" for v in med.values() for e in v["errors"]]
    if errors:
        lines += ["", "Failed runs:", *errors]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "machine": m,
                    "args": vars(args),
                    "seconds": seconds,
                    "repeat": repeat,
                    "elapsed_s": elapsed,
                    "loadavg_before": load_before,
                    "loadavg_after": load_after,
                    "medians": med,
                    "runs": runs,
                },
                f,
                indent=2,
            )
        print(f"\nresults: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
