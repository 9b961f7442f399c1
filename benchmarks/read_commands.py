"""Peak memory and lines/s of the reading commands on a large trace set.

Generates a trace set of ``--lines`` lines (3,000,000 by default; several
controller runs, one file each, written by ``cost_throughput.generate``) and
runs ``python -m rollout_trace`` ``cost``, ``summary``, ``validate``,
``report``, ``attempts -o OUT.csv``, ``watch --once`` and ``timeline -o
OUT.json`` / ``OUT.html`` over it, each ``--repeat`` times, in a subprocess of
its own, interleaved (A B C A B C: the machine's drift falls on every command
alike). Reported per command: the median wall time (start-up included), lines
per second (lines of the set divided by that median) and the peak resident
memory of the child (``ru_maxrss`` of the waited-for process, the largest over
the repeats); then, for ``report``, ``attempts``, ``summary``, ``watch`` and
the timeline JSON, their time and memory over ``cost``'s on the same input,
each to be at most 1.5x (``BOUND``).

Variants, each an input of its own:

- ``--user-events``: the same kind of set with every third line an event whose
  tag the reader does not know (``gpu_memory_sampled``, with the envelope and
  consistent ``seq``), as a program that defines its own events writes it;
- ``--text-log``: a plain text log of ``--lines`` lines, not a trace at all,
  read by ``validate``, ``summary`` and ``cost``;
- ``--no-newline-mb N``: an N MB file without a single newline (trace lines
  written back to back), read by ``summary`` with its own time limit.

A command that runs longer than ``--timeout`` seconds or grows beyond
``--max-rss-gb`` is killed, recorded as such, and not repeated.

``--pythonpath DIR`` puts DIR first on the children's PYTHONPATH, so that the
same sets can measure another checkout (before and after a change); the file
of ``rollout_trace`` the children import is printed. ``--keep DIR`` keeps the
generated sets in DIR and reuses them on the next invocation with the same
sizes. Prints a Markdown table; ``--json`` writes every run.

    python benchmarks/read_commands.py --lines 300000 --repeat 1
    python benchmarks/read_commands.py --user-events --text-log --keep sets/ --json read.json
    python benchmarks/read_commands.py --keep sets/ --pythonpath ../old-checkout
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from _bench import count_lines, fmt, machine, machine_line, maxrss_kib, table

COMMANDS = (
    "cost",
    "summary",
    "validate",
    "report",
    "attempts.csv",
    "watch",
    "timeline.json",
    "timeline.html",
)
# The one-model issue's bound: each of these within 1.5x of cost's time and
# memory on the same input (``watch`` is ``watch --once``).
WITHIN_COST = ("report", "attempts.csv", "summary", "watch", "timeline.json")
BOUND = 1.5
# A text log is no trace: there is nothing to draw, but what the analysis
# commands do with 3M lines of it (memory above all) is what users meet.
TEXT_LOG_COMMANDS = ("validate", "summary", "cost")
NO_NEWLINE_COMMANDS = ("summary",)
MANIFEST = "set.json"
# Growth between two looks of the watchdog is bounded by how fast a process
# can fault pages in; a tenth of a second keeps the overshoot small.
WATCH_EVERY_S = 0.1


# --- the inputs ------------------------------------------------------------------


def _generate_trace(folder: Path, lines: int, runs: int, seed: int) -> int:
    # Imported here: the parent stays small, so no child inherits its peak
    # (a child's ru_maxrss starts from its parent's high-water mark).
    from cost_throughput import generate

    return generate(folder, lines, runs, seed)


def _generate_user_events(folder: Path, lines: int, runs: int, seed: int) -> int:
    """A trace set of about ``lines`` lines, every third one a user event."""
    import msgspec

    rng = random.Random(seed)
    _generate_trace(folder, lines * 2 // 3, runs, seed)
    decode = msgspec.json.Decoder().decode
    encode = msgspec.json.Encoder().encode
    total = 0
    for path in sorted(folder.glob("*.jsonl")):
        out: list[bytes] = []
        seq = 0
        for i, raw in enumerate(path.read_bytes().splitlines()):
            ev: dict[str, Any] = decode(raw)
            if i and i % 2 == 0 and ev["event"] != "trace_closed":
                user = {
                    "event": "gpu_memory_sampled",
                    "time": ev["time"],
                    "run_id": ev["run_id"],
                    "seq": seq,
                    "device": seq % 8,
                    "allocated_bytes": rng.randrange(1 << 34),
                    "reserved_bytes": rng.randrange(1 << 34, 1 << 35),
                }
                out.append(encode(user))
                seq += 1
            if ev["event"] == "trace_closed":
                # Its counts cover the events written before it: they grew
                # by as many as its seq moved.
                ev["emitted"] += seq - ev["seq"]
                ev["written"] += seq - ev["seq"]
            ev["seq"] = seq
            seq += 1
            out.append(encode(ev))
        path.write_bytes(b"\n".join(out) + b"\n")
        total += len(out)
    return total


_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARNING")
_MESSAGES = (
    "rollout.controller: step={step} group=p{g} attempt={a} dispatched to worker-{w} "
    "(weight_version={step}, queue={q})",
    "rollout.worker-{w}: generated {q} tokens for p{g}/{a} in {ms} ms",
    "trainer: step {step} loss={loss:.4f} grad_norm={norm:.3f} lr=1e-6",
    "checkpoint: saving snapshot-{step} to /ckpt/snapshot-{step} ({q} MB)",
)


def _generate_text_log(folder: Path, lines: int, seed: int) -> int:
    """A training job's plain text log of ``lines`` lines, not JSON."""
    rng = random.Random(seed)
    with open(folder / "train.log", "w") as f:
        for i in range(lines):
            step = i // 5000
            stamp = 1_780_000_000 + i // 100
            message = rng.choice(_MESSAGES).format(
                step=step,
                g=i // 8,
                a=rng.randrange(2),
                w=rng.randrange(64),
                q=rng.randrange(100, 4000),
                ms=rng.randrange(50, 30_000),
                loss=rng.random(),
                norm=rng.random() * 4,
            )
            f.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(stamp))},{i % 1000:03d} "
                f"{rng.choice(_LEVELS)} {message}\n"
            )
    return lines


def _generate_no_newline(folder: Path, megabytes: int, seed: int) -> int:
    """``megabytes`` MB of trace lines written back to back, without one newline."""
    with tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp:
        _generate_trace(Path(tmp), 60_000, 1, seed)
        piece = b"".join(p.read_bytes().replace(b"\n", b"") for p in Path(tmp).glob("*.jsonl"))
    size = megabytes * 1_000_000
    data = piece * (size // len(piece) + 1)
    (folder / "no-newline.jsonl").write_bytes(data[:size])
    return 1


@dataclass(frozen=True)
class InputSet:
    """One input: the path handed to the commands, and which commands read it."""

    name: str
    kind: str
    params: dict[str, int]
    commands: tuple[str, ...]
    timeout: float

    def folder(self, root: Path) -> Path:
        return root / (self.kind + "-" + "-".join(f"{k}{v}" for k, v in self.params.items()))

    def target(self, root: Path) -> Path:
        """What the commands are given: the folder of a trace set, else the file."""
        folder = self.folder(root)
        if self.kind == "text-log":
            return folder / "train.log"
        if self.kind == "no-newline":
            return folder / "no-newline.jsonl"
        return folder


def _generate_here(kind: str, folder: Path, params: dict[str, int]) -> int:
    if kind == "trace":
        return _generate_trace(folder, params["lines"], params["runs"], params["seed"])
    if kind == "user-events":
        return _generate_user_events(folder, params["lines"], params["runs"], params["seed"])
    if kind == "text-log":
        return _generate_text_log(folder, params["lines"], params["seed"])
    if kind == "no-newline":
        return _generate_no_newline(folder, params["mb"], params["seed"])
    raise ValueError(
        f"unknown input kind {kind!r}: expected trace, user-events, text-log or no-newline"
    )


def prepare(spec: InputSet, root: Path, env: dict[str, str]) -> dict[str, Any]:
    """Generate ``spec`` under ``root`` unless a complete copy is there; describe it."""
    folder = spec.folder(root)
    manifest = folder / MANIFEST
    if manifest.exists():
        info: dict[str, Any] = json.loads(manifest.read_text())
        print(f"{spec.name}: reusing {folder}", file=sys.stderr)
        return info
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():  # a generation cut short earlier
        old.unlink()
    started = time.perf_counter()
    # In a child of its own, so that no measured child is forked from a
    # process that held the whole set (see _generate_trace).
    cmd = [sys.executable, __file__, "--generate", spec.kind, "--into", str(folder)]
    cmd += ["--params", json.dumps(spec.params)]
    subprocess.run(cmd, check=True, env=env, cwd=folder, stdout=subprocess.DEVNULL)
    files = sorted(p for p in folder.iterdir() if p.name != MANIFEST)
    target = spec.target(root)
    info = {
        "kind": spec.kind,
        "params": spec.params,
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        # Counted, not taken from the generator: what the reader will see.
        "lines": sum(_lines_in(p) for p in files),
        "path": str(target),
    }
    manifest.write_text(json.dumps(info, indent=2) + "\n")
    print(
        f"{spec.name}: generated {info['lines']:,} lines ({info['bytes'] / 1e6:,.0f} MB, "
        f"{info['files']} file(s)) in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )
    return info


def _lines_in(path: Path) -> int:
    """Newlines, plus one for an unterminated last line."""
    n = count_lines(path)
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return n
        f.seek(-1, os.SEEK_END)
        return n + (f.read(1) != b"\n")


# --- measuring ---------------------------------------------------------------------


def _peak_rss_now(pid: int) -> int:
    """The child's high-water RSS so far in bytes (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_once(
    cmd: list[str], env: dict[str, str], cwd: str, timeout: float, max_rss: int
) -> dict[str, Any]:
    """One run of ``cmd``: wall time, peak RSS, exit code, and whether it was stopped."""
    # A child starts from its parent's high-water mark (fork copies it, exec
    # keeps it): a figure no larger than this one says nothing of the child.
    parent_peak = maxrss_kib() * 1024
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        lock = threading.Lock()
        exited = False
        stopped: list[str] = []

        def watch() -> None:
            # The child is reaped only after `exited` is set under the lock, so
            # its pid cannot have been reused when this kills it.
            while True:
                time.sleep(WATCH_EVERY_S)
                with lock:
                    if exited:
                        return
                    if time.perf_counter() - start > timeout:
                        stopped.append(f"timeout > {timeout:g} s")
                    elif _peak_rss_now(proc.pid) > max_rss:
                        stopped.append(f"over {max_rss / 1e9:g} GB")
                    if stopped:
                        os.kill(proc.pid, signal.SIGKILL)
                        return

        watchdog = threading.Thread(target=watch, daemon=True)
        watchdog.start()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        wall = time.perf_counter() - start
        with lock:
            exited = True
        # wait4 gives this child's own rusage; RUSAGE_CHILDREN would also
        # count the generators' peaks.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        watchdog.join()
        out_bytes, out_tail = _tail(out)
        err_bytes, errors = _tail(err)
    tail = out_tail.splitlines()
    result: dict[str, Any] = {
        "wall_s": wall,
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # KiB on Linux
        "parent_peak_rss_bytes": parent_peak,
        "exit_code": proc.returncode,
        "stdout_bytes": out_bytes,
        "stderr_bytes": err_bytes,
        "stdout_last_line": tail[-1] if tail else "",
    }
    if stopped:
        result["stopped"] = stopped[0]
    elif proc.returncode not in (0, 1):
        result["stderr_tail"] = errors[-2000:]
    return result


def _tail(f: IO[bytes], size: int = 8192) -> tuple[int, str]:
    """The length of a child's output and its last ``size`` bytes.

    Never the whole of it: ``cost`` on a text log writes hundreds of MB of
    problems to stderr, and this process's peak would become every later
    child's (see run_once).
    """
    f.seek(0, os.SEEK_END)
    length = f.tell()
    f.seek(max(0, length - size))
    return length, f.read().decode("utf-8", "replace").strip()


def command_line(command: str, target: Path, out_dir: str) -> list[str]:
    name, _, suffix = command.partition(".")
    args = [sys.executable, "-m", "rollout_trace", name, str(target)]
    if suffix:  # a command that writes a file: timeline.json, attempts.csv
        args += ["-o", os.path.join(out_dir, command)]
    if name == "watch":
        args.append("--once")
    return args


def child_env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if pythonpath:
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.path.abspath(pythonpath) + (os.pathsep + old if old else "")
    return env


def imported_from(env: dict[str, str], cwd: str) -> str:
    """The ``rollout_trace`` file a child with this environment imports."""
    probe = "import rollout_trace as rt; print(rt.__file__, rt.__version__)"
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def against_cost(
    jobs: list[tuple[InputSet, str]], runs: dict[tuple[str, str], list[dict[str, Any]]]
) -> list[list[Any]]:
    """Per input with a ``cost`` run, each command of ``WITHIN_COST`` run on it: its
    median time and peak memory over cost's, and PASS or FAIL against ``BOUND``."""
    rows = []
    for spec, command in jobs:
        cost = runs.get((spec.name, "cost"))
        if command not in WITHIN_COST or not cost:
            continue
        mine, theirs = summarize(runs[spec.name, command], 1), summarize(cost, 1)
        if mine["median_wall_s"] is None or theirs["median_wall_s"] is None:
            rows.append([spec.name, command, "-", "-", "FAIL (stopped)"])
            continue
        time_x = mine["median_wall_s"] / theirs["median_wall_s"]
        memory_x = mine["peak_rss_bytes"] / theirs["peak_rss_bytes"]
        ok = time_x <= BOUND and memory_x <= BOUND
        rows.append(
            [spec.name, command, f"{time_x:.2f}x", f"{memory_x:.2f}x", "PASS" if ok else "FAIL"]
        )
    return rows


def summarize(runs: list[dict[str, Any]], lines: int) -> dict[str, Any]:
    done = [r for r in runs if "stopped" not in r]
    median = statistics.median(r["wall_s"] for r in done) if done else None
    return {
        "median_wall_s": median,
        "lines_per_s": lines / median if median else None,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
        "exit_codes": sorted({r["exit_code"] for r in runs}),
        "stopped": next((r["stopped"] for r in runs if "stopped" in r), None),
        "rss_is_parents": any(r["peak_rss_bytes"] <= r["parent_peak_rss_bytes"] for r in runs),
    }


def status_of(summary: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    if summary["stopped"]:
        status = f"stopped: {summary['stopped']}"
    elif any("stderr_tail" in r for r in runs):
        last = next(r["stderr_tail"] for r in runs if "stderr_tail" in r).splitlines()
        status = f"failed: {last[-1] if last else '?'}"[:120]
    else:
        status = "exit " + "/".join(str(c) for c in summary["exit_codes"])
    if summary["rss_is_parents"]:
        status += "; peak RSS is this script's, not the command's"
    return status


# --- the command line --------------------------------------------------------------


def input_sets(args: argparse.Namespace) -> list[InputSet]:
    trace = {"lines": args.lines, "runs": args.runs, "seed": args.seed}
    chosen = [c for c in COMMANDS if c in args.commands]
    sets = []
    if not args.no_plain:
        sets.append(InputSet("trace", "trace", trace, tuple(chosen), args.timeout))
    if args.user_events:
        sets.append(InputSet("user events", "user-events", trace, tuple(chosen), args.timeout))
    if args.text_log:
        text = tuple(c for c in TEXT_LOG_COMMANDS if c in chosen)
        params = {"lines": args.lines, "seed": args.seed}
        sets.append(InputSet("text log", "text-log", params, text, args.timeout))
    if args.no_newline_mb:
        once = tuple(c for c in NO_NEWLINE_COMMANDS if c in chosen)
        params = {"mb": args.no_newline_mb, "seed": args.seed}
        sets.append(InputSet("no newline", "no-newline", params, once, args.no_newline_timeout))
    return [s for s in sets if s.commands]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=3_000_000, help="lines per input set")
    parser.add_argument("--runs", type=int, default=5, help="controller runs (one file each)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="runs of every command")
    parser.add_argument(
        "--commands", nargs="+", default=list(COMMANDS), choices=COMMANDS, help="what to run"
    )
    parser.add_argument("--no-plain", action="store_true", help="skip the plain trace set")
    parser.add_argument("--user-events", action="store_true", help="also a set with user events")
    parser.add_argument("--text-log", action="store_true", help="also a plain text log")
    parser.add_argument(
        "--no-newline-mb", type=int, default=0, help="also a file of this many MB without newline"
    )
    parser.add_argument("--pythonpath", help="put this checkout first on the children's path")
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the generated sets here")
    parser.add_argument("--json", help="write every run to this file")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a kill")
    parser.add_argument(
        "--no-newline-timeout", type=float, default=120, help="seconds before a kill (no newline)"
    )
    parser.add_argument("--max-rss-gb", type=float, default=8, help="peak RSS before a kill")
    parser.add_argument("--generate", help=argparse.SUPPRESS)
    parser.add_argument("--into", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.generate:
        print(_generate_here(args.generate, args.into, json.loads(args.params)))
        return
    env = child_env(args.pythonpath)
    sets = input_sets(args)
    with tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp:
        root = args.keep.resolve() if args.keep else Path(tmp)
        # The children run in an empty folder: `python -m` puts the working
        # folder first on sys.path, ahead of PYTHONPATH.
        cwd = os.path.join(tmp, "cwd")
        os.mkdir(cwd)
        imported = imported_from(env, cwd)
        print(f"children import rollout_trace from: {imported}", file=sys.stderr)
        infos = {s.name: prepare(s, root, env) for s in sets}
        jobs = [(s, c) for s in sets for c in s.commands]
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {(s.name, c): [] for s, c in jobs}
        for rnd in range(args.repeat):
            for spec, command in jobs:  # interleaved: A B C A B C
                done = runs[spec.name, command]
                if any("stopped" in r for r in done):
                    continue  # once killed, a repeat costs the limit again for nothing
                cmd = command_line(command, spec.target(root), tmp)
                result = run_once(cmd, env, cwd, spec.timeout, int(args.max_rss_gb * 1e9))
                done.append(result)
                print(
                    f"round {rnd + 1}/{args.repeat} {spec.name} {command}: "
                    f"{result['wall_s']:.1f} s, {result['peak_rss_bytes'] / 1e6:,.0f} MB, "
                    f"exit {result['exit_code']} {result.get('stopped', '')}",
                    file=sys.stderr,
                )
                for name in os.listdir(tmp):  # written outputs can be hundreds of MB
                    if name in COMMANDS:
                        os.unlink(os.path.join(tmp, name))

    m = machine()
    rows = []
    results = []
    for spec, command in jobs:
        info = infos[spec.name]
        summary = summarize(runs[spec.name, command], info["lines"])
        done = len(runs[spec.name, command])
        wall = fmt(summary["median_wall_s"], 2)
        if summary["median_wall_s"] is None and (summary["stopped"] or "").startswith("timeout"):
            wall = f"> {spec.timeout:g}"
        rows.append(
            [
                spec.name,
                command,
                fmt(info["lines"]),
                fmt(info["bytes"] / 1e6),
                wall,
                fmt(summary["lines_per_s"]),
                fmt(summary["peak_rss_bytes"] / 1e6),
                done,
                status_of(summary, runs[spec.name, command]),
            ]
        )
        results.append(
            {
                "set": spec.name,
                "command": command,
                **info,
                **summary,
                "runs": runs[spec.name, command],
            }
        )
    print(f"machine: {machine_line(m)}")
    print(f"rollout_trace imported from: {imported}")
    print(
        f"median of up to {args.repeat} interleaved runs; each command in a fresh process, "
        f"start-up included; peak RSS is the largest of the runs; killed past "
        f"{args.timeout:g} s or {args.max_rss_gb:g} GB\n"
    )
    header = [
        "input",
        "command",
        "lines",
        "MB",
        "median wall s",
        "lines/s",
        "peak RSS MB",
        "runs",
        "status",
    ]
    print(table(header, rows))
    bounds = against_cost(jobs, runs)
    if bounds:
        print(f"\nagainst cost on the same input (the bound: {BOUND}x its time and memory):\n")
        print(table(["input", "command", "time", "memory", "verdict"], bounds))
    if args.json:
        report = {"machine": m, "imported": imported, "args": sys.argv[1:], "results": results}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
