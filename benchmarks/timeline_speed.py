"""How long ``rollout-trace timeline`` takes on a large trace set, and how big its outputs are.

Writes a trace set of ``--attempts`` attempts (100,000 by default: two runs of
a 64-slot controller, stopped once and restored; see
``tests/timeline_data.py``) to a temporary folder, then runs
``python -m rollout_trace timeline`` over it once for ``.json`` and once for
``.html``, ``--repeat`` times each, in a subprocess (start-up and reading
included), and prints the median wall time and the size of each output.

    python benchmarks/timeline_speed.py
    python benchmarks/timeline_speed.py --attempts 300000 --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from scenario import write
from timeline_data import many_attempts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = write(Path(tmp) / "trace.jsonl", many_attempts(args.attempts))
        print(f"trace set: {args.attempts:,} attempts, {trace.stat().st_size / 1e6:,.1f} MB")
        print("| output | median wall time (s) | size (MB) |")
        print("|---|---:|---:|")
        for suffix in (".json", ".html"):
            out = Path(tmp) / f"timeline{suffix}"
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "rollout_trace", "timeline", str(trace), "-o", str(out)],
                    check=True,
                    capture_output=True,
                )
                times.append(time.perf_counter() - start)
            size = out.stat().st_size / 1e6
            print(f"| {suffix} | {statistics.median(times):.2f} | {size:,.2f} |")


if __name__ == "__main__":
    main()
