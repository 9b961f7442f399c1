"""How fast ``rollout-trace cost`` reads a large trace set, and how much memory it needs.

Generates a trace set of ``--lines`` lines (2,000,000 by default) in a temporary
folder: several controller runs, one file each, every run after the first
starting with a restore from the snapshot its predecessor published last, with
attempts resumed, restarted and redone, as an RL controller would write it.
Then runs ``python -m rollout_trace cost`` over it in a subprocess ``--repeat``
times and reports the median wall time, lines per second (lines of the trace
set divided by the whole command's wall time, start-up included) and the peak
resident memory of the subprocess (``ru_maxrss`` of the waited-for child).

Prints a Markdown table and writes the numbers as JSON to ``--json``.

    python benchmarks/cost_throughput.py
    python benchmarks/cost_throughput.py --lines 500000 --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

import rollout_trace as rt

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


def generate(folder: Path, total_lines: int, runs: int, seed: int) -> int:
    """Write ``runs`` run files holding about ``total_lines`` lines; return the exact count."""
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
            for _ in range(GROUPS_PER_STEP):
                prompt = next_prompt
                next_prompt += 1
                gid = f"p{prompt}"
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
            put(rt.StepTrained(step=step, group_ids=[]), t)
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


def measure(folder: Path, repeat: int) -> tuple[list[float], int, str]:
    """Wall times of each run, the largest peak RSS in bytes, and the last output."""
    cmd = [sys.executable, "-m", "rollout_trace", "cost", str(folder / "*.jsonl")]
    walls: list[float] = []
    peak = 0
    output = b""
    for _ in range(repeat):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=out, stderr=err)
            # wait4 gives this child's own rusage; RUSAGE_CHILDREN would also
            # count the generator's peak.
            _, status, usage = os.wait4(proc.pid, 0)
            walls.append(time.perf_counter() - start)
            proc.returncode = os.waitstatus_to_exitcode(status)
            peak = max(peak, usage.ru_maxrss * 1024)  # KiB on Linux
            out.seek(0)
            output = out.read()
            if proc.returncode not in (0, 1):
                err.seek(0)
                raise SystemExit(f"rollout-trace cost failed: {err.read().decode()}")
    return walls, peak, output.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2_000_000, help="lines in the trace set")
    parser.add_argument("--runs", type=int, default=5, help="controller runs (one file each)")
    parser.add_argument("--repeat", type=int, default=5, help="times to run the command")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", default="cost_throughput.json", help="where to write results")
    parser.add_argument("--generate-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate_into is not None:
        print(generate(args.generate_into, args.lines, args.runs, args.seed))
        return

    with tempfile.TemporaryDirectory(prefix="rollout-trace-bench-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        # Generated in a child process: a child forked from a parent that had
        # held the whole trace set would report the parent's peak as its own.
        gen = [sys.executable, __file__, "--generate-into", tmp, "--lines", str(args.lines)]
        gen += ["--runs", str(args.runs), "--seed", str(args.seed)]
        lines = int(subprocess.run(gen, capture_output=True, check=True, text=True).stdout)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(
            f"generated {lines:,} lines ({size / 1e6:.0f} MB) in "
            f"{time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        walls, peak, output = measure(folder, args.repeat)

    median = statistics.median(walls)
    result = {
        "lines": lines,
        "bytes": size,
        "runs": args.runs,
        "repeat": args.repeat,
        "wall_s": walls,
        "median_wall_s": median,
        "lines_per_s": lines / median,
        "peak_rss_bytes": peak,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print()
    print("| lines | MB | runs | median wall (s) | lines/s | peak RSS (MB) |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {lines:,} | {size / 1e6:.0f} | {args.runs} | {median:.2f} | "
        f"{lines / median:,.0f} | {peak / 1e6:.0f} |"
    )
    print()
    print(output.splitlines()[-1] if output else "")
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
