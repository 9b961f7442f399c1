"""How fast ``rollout-trace cost`` reads a large trace set, against msgspec alone, and its memory.

Generates a trace set of ``--lines`` lines (2,000,000 by default) in a temporary
folder: several controller runs, one file each, every run after the first
starting with a restore from the snapshot its predecessor published last, with
attempts resumed, restarted and redone, as an RL controller would write it.
Then runs, ``--repeat`` rounds, interleaved (each round starts one mode later,
so that the machine's drift falls on every mode alike), each in a subprocess:

- the bare loop: ``msgspec.json.Decoder().decode`` of every line of the same
  files, one by one, in one process: the baseline;
- ``python -m rollout_trace cost --jobs 1``: read in one process;
- ``python -m rollout_trace cost --jobs N`` (``--jobs``, default the usable
  cores): read in N worker processes;
- the floor, in one process and in N: the least any reader of the model
  written in Python does (``FLOOR_LOOP``): msgspec's typed decode of every
  line, the columns a try is made of, and the pairing of ends with starts.
  What ``cost`` can reach without code compiled for the purpose.

Reported per mode: the median wall time (start-up included), lines per second
(lines of the set divided by it), the ratio to the bare loop (its median wall
time divided by the mode's), and the peak RSS: the sum over the command's
processes (the command, a forkserver, the workers) of each one's own peak
(VmHWM, read from /proc every 20 ms), which is at least what they held at once.

Then the memory case: a set of ``--memory-lines`` lines (10,000,000) in 10
runs whose prompts come round again so that it holds ``--memory-siblings``
siblings (100,000), read once by ``cost --jobs N``: its peak RSS, as above,
and its wall time against one run of the bare loop over the same files.

Prints Markdown tables and writes the numbers as JSON to ``--json``.

    python benchmarks/cost_throughput.py
    python benchmarks/cost_throughput.py --lines 500000 --repeat 3 --memory-lines 0
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

import rollout_trace as rt
from rollout_trace import sinks

GROUP_SIZE = 8
GROUPS_PER_STEP = 64
SNAPSHOT_EVERY = 5


class _RunWriter:
    """Stamps the envelope as a tracer would and keeps the encoded lines."""

    def __init__(self, run_id: str, encode: Callable[[rt.Event], bytes]) -> None:
        self.run_id = run_id
        self.seq = 0
        self.lines: list[bytes] = []
        self._encode = encode

    def put(self, ev: rt.Event, at: float) -> None:
        ev.time, ev.run_id, ev.seq = at, self.run_id, self.seq
        self.seq += 1
        self.lines.append(self._encode(ev))


def _run_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def generate(
    folder: Path, total_lines: int, runs: int, seed: int, siblings: int | None = None
) -> int:
    """Write ``runs`` run files holding about ``total_lines`` lines; return the exact count.

    With ``siblings``, prompt ids come round again after ``siblings / GROUP_SIZE``
    prompts (epochs over one data set, attempts numbered from 0 each time), so
    that the set holds that many siblings however many lines it has.
    """
    prompts = max(1, siblings // GROUP_SIZE) if siblings else None
    rng = random.Random(seed)
    encode = msgspec.json.Encoder().encode
    per_run = total_lines // runs
    written = 0
    t = 1_780_000_000.0
    next_prompt = 0
    step = 0
    carried: list[tuple[int, int, int]] = []  # (prompt, index, attempt) open at the stop
    restore_from: tuple[str, int] | None = None
    for r in range(runs):
        writer = _RunWriter(_run_id(rng), encode)
        put, buf = writer.put, writer.lines

        put(rt.TraceOpened(sdk_version=rt.__version__, pid=4000 + r, host="bench"), t)
        t += 5.0
        if restore_from is not None:
            path, restored_step = restore_from
            put(rt.RestoreStarted(path=path, step=restored_step), t)
            t += 3.0
            put(rt.RestoreFinished(step=restored_step, unfinished_groups=[]), t)
            step = restored_step
            for prompt, index, attempt in carried:
                gid = f"p{prompt}"
                if rng.random() < 0.5:
                    put(
                        rt.AttemptResumed(
                            group_id=gid,
                            prompt_id=prompt,
                            generation_index=index,
                            attempt=attempt,
                            turn=1,
                        ),
                        t,
                    )
                    t += 0.0001
                    put(
                        rt.AttemptSealed(
                            group_id=gid, prompt_id=prompt, generation_index=index, attempt=attempt
                        ),
                        t,
                    )
                else:
                    put(
                        rt.AttemptAbandoned(
                            group_id=gid,
                            prompt_id=prompt,
                            generation_index=index,
                            attempt=attempt,
                            reason="restart",
                        ),
                        t,
                    )
                    put(
                        rt.AttemptDispatched(
                            group_id=gid,
                            prompt_id=prompt,
                            generation_index=index,
                            attempt=attempt + 1,
                            weight_version=step,
                        ),
                        t,
                    )
                    t += 0.0001
                    put(
                        rt.AttemptSealed(
                            group_id=gid,
                            prompt_id=prompt,
                            generation_index=index,
                            attempt=attempt + 1,
                        ),
                        t,
                    )
        last_run = r == runs - 1
        while len(buf) < per_run:
            step += 1
            open_now: list[tuple[float, rt.Event]] = []
            trained: list[str] = []
            for _ in range(GROUPS_PER_STEP):
                prompt = next_prompt if prompts is None else next_prompt % prompts
                next_prompt += 1
                gid = f"p{prompt}"
                trained.append(gid)
                put(
                    rt.GroupReserved(
                        group_id=gid,
                        prompt_id=prompt,
                        size=GROUP_SIZE,
                        weight_version=step,
                        target_step=step,
                    ),
                    t,
                )
                put(rt.GroupAdmitted(group_id=gid, prompt_id=prompt), t)
                for index in range(GROUP_SIZE):
                    attempt = 0
                    if rng.random() < 0.03:  # a try that fails and is dispatched again
                        put(
                            rt.AttemptDispatched(
                                group_id=gid,
                                prompt_id=prompt,
                                generation_index=index,
                                attempt=0,
                                weight_version=step,
                            ),
                            t,
                        )
                        put(
                            rt.AttemptAbandoned(
                                group_id=gid,
                                prompt_id=prompt,
                                generation_index=index,
                                attempt=0,
                                reason="failed",
                            ),
                            t + 0.5,
                        )
                        attempt = 1
                    put(
                        rt.AttemptDispatched(
                            group_id=gid,
                            prompt_id=prompt,
                            generation_index=index,
                            attempt=attempt,
                            weight_version=step,
                        ),
                        t,
                    )
                    done = t + rng.uniform(1.0, 30.0)
                    open_now.append(
                        (
                            done,
                            rt.AttemptSealed(
                                group_id=gid,
                                prompt_id=prompt,
                                generation_index=index,
                                attempt=attempt,
                            ),
                        )
                    )
                t += 0.01
            open_now.sort(key=lambda pair: pair[0])
            if not last_run and len(buf) + len(open_now) >= per_run:
                # The stop: a third of this step's tries are still running.
                cut = len(open_now) * 2 // 3
                for done, ev in open_now[:cut]:
                    put(ev, done)
                t = open_now[cut - 1][0]
                carried = [
                    (e.prompt_id, e.generation_index, e.attempt)  # type: ignore[misc]
                    for _, e in open_now[cut:]
                ]
                break
            for done, ev in open_now:
                put(ev, done)
            t = open_now[-1][0] + 0.5
            # The step trains the groups it reserved (their seals, for report and
            # the timeline's flows), as a controller names them.
            put(rt.StepTrained(step=step, group_ids=trained), t)
            put(rt.WeightsSynced(weight_version=step), t)
            if step % SNAPSHOT_EVERY == 0:
                path = f"/ckpt/snapshot-{step}"
                put(rt.SnapshotPublished(step=step, path=path, captured_at=t - 2.0), t)
                restore_from = (path, step)
        if last_run:
            n = writer.seq - 1
            put(rt.TraceClosed(emitted=n, written=n, dropped=0, invalid=0), t)
        t += 60.0  # the process is down for a minute
        (folder / f"run-{writer.run_id}.jsonl").write_bytes(b"\n".join(buf) + b"\n")
        written += len(buf)
    return written


# The baseline: msgspec decoding every line of the same files, one by one, in
# one process, and nothing else.
BARE_LOOP = """
import glob, sys
import msgspec
dec = msgspec.json.Decoder()
for p in sorted(glob.glob(sys.argv[1])):
    with open(p, "rb") as f:
        for line in f:
            dec.decode(line)
"""

# The floor of any reader of the model written in Python: per line, msgspec's
# typed decode (what reading strictly needs), the columns a try is made of
# (kind, seq, time, prompt, index, attempt) taken in C, and the pairing of
# each end with its start through a dict; no checks, no stops, nothing kept.
# Run in one process, or over N worker processes (argv[2]), a file each.
FLOOR_LOOP = """
import gc, glob, sys, operator
from array import array
from itertools import compress
from rollout_trace._reading.reader import block_decoder
from rollout_trace._model.terms import KIND, RESUMED, is_attempt

def work(paths):
    dec = block_decoder()
    attempt = bytes(is_attempt(k) for k in range(256))
    tries = 0
    for p in paths:
        evs = []
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                evs += dec.decode_lines(chunk + f.readline())
        kinds = bytes(map(KIND.get, map(type, evs)))
        seq = array("q", list(map(operator.attrgetter("seq"), evs)))
        time = array("d", list(map(operator.attrgetter("time"), evs)))
        rows = list(compress(evs, kinds.translate(attempt)))
        keys = zip(*(map(operator.attrgetter(f), rows)
                     for f in ("prompt_id", "generation_index", "attempt")))
        open_, end = {}, array("q")
        row_kinds = bytes(compress(kinds, kinds.translate(attempt)))
        for k, (key, kind) in enumerate(zip(keys, row_kinds)):
            j = open_.get(key)
            if kind <= RESUMED:
                open_[key] = len(end)
                end.append(-1)
            elif j is not None and j >= 0:
                end[j], open_[key] = k, ~j
            else:
                end.append(k)
        tries += len(end)
    return tries

if __name__ == "__main__":
    gc.disable()
    paths, jobs = sorted(glob.glob(sys.argv[1])), int(sys.argv[2])
    if jobs == 1:
        print(work(paths))
    else:
        import multiprocessing
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            print(sum(pool.map(work, [paths[i::jobs] for i in range(jobs)])))
"""


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _tree_peaks(root: int, peaks: dict[int, int]) -> None:
    """Each process under ``root`` (itself included) with the peak RSS it has had so far,
    from /proc: VmHWM, its own high-water mark, in bytes."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    todo = [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmHWM:"):
                        peaks[pid] = max(peaks.get(pid, 0), int(line.split()[1]) * 1024)
                        break
        except OSError:
            pass


def run_once(cmd: list[str]) -> tuple[float, int, int, int, bytes]:
    """Run ``cmd``; its wall time, exit code, the peak RSS of the whole process
    tree (bytes), the largest peak of any one process of it, and its stdout.

    The tree's peak is the sum, over the command's processes (itself, a
    forkserver, its workers), of each one's own peak RSS, read from /proc
    every 20 ms: at least what they held at any one moment. Without /proc, it
    is ``ru_maxrss`` of the child, as for the largest one.
    """
    peaks: dict[int, int] = {}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        polling = os.path.isdir("/proc")
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.02):
                _tree_peaks(proc.pid, peaks)

        poller = threading.Thread(target=poll, daemon=True)
        if polling:
            poller.start()
        # wait4 gives this child's own rusage (its own children's folded in);
        # RUSAGE_CHILDREN would also count the generator's peak.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        stop.set()
        if polling:
            poller.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        largest = usage.ru_maxrss * 1024  # KiB on Linux
        tree = max(sum(peaks.values()), largest)
        out.seek(0)
        if proc.returncode not in (0, 1):
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd[2:])} failed: {err.read().decode()}")
        return wall, proc.returncode, tree, largest, out.read()


def modes(folder: Path, jobs: int) -> dict[str, list[str]]:
    pattern = str(folder / "*.jsonl")
    cost = [sys.executable, "-m", "rollout_trace", "cost", pattern, "--json"]
    out = {"bare loop": [sys.executable, "-c", BARE_LOOP, pattern]}
    out["cost --jobs 1"] = [*cost, "--jobs", "1"]
    out["floor, 1 process"] = [sys.executable, "-c", FLOOR_LOOP, pattern, "1"]
    if jobs > 1:
        out[f"cost --jobs {jobs}"] = [*cost, "--jobs", str(jobs)]
        out[f"floor, {jobs} processes"] = [sys.executable, "-c", FLOOR_LOOP, pattern, str(jobs)]
    return out


def measure(folder: Path, repeat: int, jobs: int) -> dict[str, dict[str, Any]]:
    """Every mode ``repeat`` times, interleaved, each round starting one mode later."""
    cmds = modes(folder, jobs)
    names = list(cmds)
    runs: dict[str, list[tuple[float, int, int]]] = {name: [] for name in names}
    outputs: dict[str, set[bytes]] = {name: set() for name in names if name.startswith("cost")}
    for rnd in range(repeat):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            wall, _, tree, largest, output = run_once(cmds[name])
            runs[name].append((wall, tree, largest))
            if name in outputs:
                outputs[name].add(output)
            print(f"round {rnd + 1}/{repeat} {name}: {wall:.2f} s", file=sys.stderr)
    same = len(set().union(*outputs.values())) == 1
    return {
        name: {
            "wall_s": [w for w, _, _ in rs],
            "median_wall_s": statistics.median(w for w, _, _ in rs),
            "peak_rss_bytes": max(t for _, t, _ in rs),
            "largest_process_rss_bytes": max(x for _, _, x in rs),
            "same_output": same if name.startswith("cost") else None,
        }
        for name, rs in runs.items()
    }


def _generate(folder: Path, lines: int, runs: int, seed: int, siblings: int | None) -> int:
    """Generate in a child process: a child forked from a parent that had held
    the whole trace set would report the parent's peak as its own."""
    started = time.perf_counter()
    gen = [sys.executable, __file__, "--generate-into", str(folder), "--lines", str(lines)]
    gen += ["--runs", str(runs), "--seed", str(seed)]
    if siblings:
        gen += ["--siblings", str(siblings)]
    count = int(subprocess.run(gen, capture_output=True, check=True, text=True).stdout)
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(
        f"generated {count:,} lines ({size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=2_000_000, help="lines in the trace set")
    parser.add_argument("--runs", type=int, default=5, help="controller runs (one file each)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of every mode")
    parser.add_argument("--jobs", type=int, default=usable_cores(), help="--jobs of the last mode")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--memory-lines",
        type=int,
        default=10_000_000,
        help="lines of the memory case (0: no memory case)",
    )
    parser.add_argument(
        "--memory-siblings", type=int, default=100_000, help="siblings of the memory case"
    )
    parser.add_argument("--json", default="cost_throughput.json", help="where to write results")
    parser.add_argument("--generate-into", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--siblings", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate_into is not None:
        print(generate(args.generate_into, args.lines, args.runs, args.seed, args.siblings))
        return

    # As installed (pip writes the bytecode): with PYTHONDONTWRITEBYTECODE set
    # and none written, every process of every round (the command, its
    # forkserver) would compile the package again, 0.4 s of CPU each.
    for package in (rt.__file__, sinks.__file__):
        compileall.compile_dir(Path(package).parent, quiet=1)
    with tempfile.TemporaryDirectory(prefix="rollout-trace-bench-") as tmp:
        folder = Path(tmp)
        lines = _generate(folder, args.lines, args.runs, args.seed, None)
        size = sum(p.stat().st_size for p in folder.iterdir())
        speed = measure(folder, args.repeat, args.jobs)
    bare = speed["bare loop"]["median_wall_s"]
    for r in speed.values():
        r["lines_per_s"] = lines / r["median_wall_s"]
        r["vs_bare_loop"] = bare / r["median_wall_s"]
    result: dict[str, Any] = {
        "lines": lines,
        "bytes": size,
        "runs": args.runs,
        "repeat": args.repeat,
        "jobs": args.jobs,
        "modes": speed,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cores": usable_cores(),
    }
    print()
    print(f"{lines:,} lines, {size / 1e6:.0f} MB, {args.runs} runs; median of {args.repeat} rounds")
    print()
    print("| what | median wall (s) | lines/s | vs bare loop | peak RSS (MB) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in speed.items():
        print(
            f"| {name} | {r['median_wall_s']:.2f} | {r['lines_per_s']:,.0f} | "
            f"{r['vs_bare_loop']:.2f}x | {r['peak_rss_bytes'] / 1e6:.0f} |"
        )
    if not all(r["same_output"] in (None, True) for r in speed.values()):
        print("\nthe cost commands' outputs differ!")

    if args.memory_lines:
        with tempfile.TemporaryDirectory(prefix="rollout-trace-bench-") as tmp:
            folder = Path(tmp)
            mem_lines = _generate(folder, args.memory_lines, 10, args.seed, args.memory_siblings)
            pattern = str(folder / "*.jsonl")
            cmd = [sys.executable, "-m", "rollout_trace", "cost", pattern, "--json"]
            # The bare loop just before, on the same files: the case's speed target too.
            bare_wall = run_once([sys.executable, "-c", BARE_LOOP, pattern])[0]
            wall, _, tree, largest, _ = run_once([*cmd, "--jobs", str(args.jobs)])
        result["memory_case"] = {
            "lines": mem_lines,
            "siblings": args.memory_siblings,
            "jobs": args.jobs,
            "wall_s": wall,
            "bare_loop_wall_s": bare_wall,
            "vs_bare_loop": bare_wall / wall,
            "peak_rss_bytes": tree,
            "largest_process_rss_bytes": largest,
        }
        print(
            f"\nmemory case: {mem_lines:,} lines, {args.memory_siblings:,} siblings, "
            f"--jobs {args.jobs}: peak RSS {tree / 1e6:.0f} MB (all processes; the largest "
            f"one {largest / 1e6:.0f} MB), {wall:.1f} s ({bare_wall / wall:.2f}x the bare "
            f"loop's {bare_wall:.1f} s)"
        )
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
