"""Shared plumbing of the benchmark scripts: the event, child processes, tables.

Every measurement runs in a child process of its own (``script --mode M``), so
that one library's threads, caches and heap never colour another's numbers and
``ru_maxrss`` is the high-water mark of that measurement alone. The child
prints one JSON object as its last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

# The one event every implementation records: `attempt_dispatched` with its
# five fields, plus the envelope (`event`, `time`, `run_id`, `seq`) = 8 fields.
# Peers get the same names and values; the time is stamped by each library.
EVENT = "attempt_dispatched"
GROUP_ID = "g-0042"
WEIGHT_VERSION = 3
RUN_ID = "0123456789abcdef0123456789abcdef"

# Events per measurement. The same count for every implementation, so that
# start-up and shutdown weigh the same in every end-to-end figure.
DEFAULT_EVENTS = 200_000
QUICK_EVENTS = 20_000

HERE = Path(__file__).resolve().parent


def maxrss_kib() -> int:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def count_lines(path: str | os.PathLike[str]) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def trace_closed(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``trace_closed`` line of a rollout_trace file (its last line), if any."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4096))
        tail = f.read().splitlines()
    if not tail:
        return None
    last: dict[str, Any] = json.loads(tail[-1])
    return last if last.get("event") == "trace_closed" else None


def tmp_dir() -> tempfile.TemporaryDirectory[str]:
    # On the same file system as a normal run's output: /tmp may be tmpfs,
    # which is what a benchmark of CPU cost wants (no disk in the numbers).
    return tempfile.TemporaryDirectory(prefix="rt-bench-")


def finish(result: dict[str, Any]) -> None:
    """Print a child's result as the last line of stdout."""
    result["maxrss_mib"] = round(maxrss_kib() / 1024, 1)
    print(json.dumps(result), flush=True)


def run_child(script: str, mode: str, events: int, timeout: float = 600) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return its result."""
    cmd = [sys.executable, str(HERE / script), "--mode", mode, "--events", str(events)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"mode": mode, "error": (proc.stderr or proc.stdout).strip()[-2000:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def median_of(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for dist in ("rollout-trace", "msgspec", "orjson", "anyio", "structlog", "loguru"):
        versions[dist] = _version(dist)
    versions["opentelemetry-sdk"] = _version("opentelemetry-sdk")
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "versions": versions,
    }


def machine_line(m: Mapping[str, Any]) -> str:
    libs = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    return f"{m['cpu']}, {m['cores']} cores, {m['implementation']} {m['python']}; {libs}"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def script_main(
    script: str,
    modes: Mapping[str, Callable[[int], dict[str, Any]]],
    doc: str | None,
    columns: Sequence[tuple[str, str, int]],
) -> None:
    """The command line shared by the scripts: ``--mode`` runs one measurement
    in this process; without it, every mode runs ``--repeat`` times, each in a
    fresh child, interleaved, and the medians are printed."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mode", choices=sorted(modes), help="run one measurement here")
    parser.add_argument("--events", type=int, default=None, help="events per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every mode")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--only", nargs="*", default=None, help="modes to run")
    parser.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args()
    events = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    if args.mode:
        result = modes[args.mode](events)
        result.setdefault("mode", args.mode)
        result.setdefault("events", events)
        finish(result)
        return
    repeat = 1 if args.quick else args.repeat
    chosen = args.only or list(modes)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in chosen}
    for _ in range(repeat):
        for mode in chosen:  # A B C A B C: drift in the machine hits every mode alike
            runs[mode].append(run_child(script, mode, events))
    for mode, results in runs.items():
        for r in results:
            if "error" in r:
                print(f"{mode}: failed: {r['error']}", file=sys.stderr)
    rows = []
    for mode in chosen:
        rows.append([mode] + [fmt(median_of(runs[mode], key), d) for _, key, d in columns])
    m = machine()
    print(f"machine: {machine_line(m)}")
    print(f"{events:,} events per run, median of {repeat} runs\n")
    print(table(["mode"] + [title for title, _, _ in columns], rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": m, "events": events, "runs": runs}, f, indent=2)
