"""What each ``fsync`` mode of the JSONL sink costs, in events per second.

For every mode (``never``, ``batch``, ``always``) and both tracers, emit N
events to a fresh file and close the tracer; the time from the first emit to
the end of ``close()`` gives events per second. Modes run interleaved
(never, batch, always, never, ...) and repeated; the table shows medians.
The file lives in ``--dir`` (default: a temporary folder), so point it at the
file system you care about: fsync costs what that device makes it cost.

    python benchmarks/durability.py [--events N] [--repeat R] [--dir DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import rollout_trace as rt

MODES = ("never", "batch", "always")


def _event(i: int) -> rt.AttemptDispatched:
    return rt.AttemptDispatched(
        group_id="g-1234", prompt_id=i, generation_index=i % 8, attempt=0, weight_version=7
    )


def run_sync(path: Path, mode: str, n: int, flush_every: int) -> float:
    start = time.perf_counter()
    with rt.sync_tracer(f"jsonl://{path}?fsync={mode}", buffer=n + 1) as t:
        for i in range(n):
            t.emit(_event(i))
            if flush_every and i % flush_every == flush_every - 1:
                t.flush()
    elapsed = time.perf_counter() - start
    _check(path, n)
    return n / elapsed


def run_async(path: Path, mode: str, n: int, flush_every: int) -> float:
    async def main() -> float:
        start = time.perf_counter()
        async with rt.tracer(f"jsonl://{path}?fsync={mode}", buffer=n + 1) as t:
            for i in range(n):
                t.emit(_event(i))
                if flush_every and i % flush_every == flush_every - 1:
                    await t.flush()
                elif i % 1000 == 999:
                    await asyncio.sleep(0)
        return n / (time.perf_counter() - start)

    rate = asyncio.run(main())
    _check(path, n)
    return rate


def _check(path: Path, n: int) -> None:
    last = json.loads(path.read_bytes().splitlines()[-1])
    if last["event"] != "trace_closed" or last["written"] != n:
        raise SystemExit(f"the trace is not complete: {last}")
    path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--flush-every", type=int, default=0, help="also call flush() every N events (0: never)"
    )
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.quick:
        args.events, args.repeat = 20_000, 1
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "durability.jsonl"
        for _ in range(args.repeat):
            for mode in MODES:
                for kind, fn in (("sync_tracer", run_sync), ("tracer", run_async)):
                    rate = fn(path, mode, args.events, args.flush_every)
                    rates.setdefault((kind, mode), []).append(rate)
    print(f"{args.events:,} events per run, {args.repeat} runs each, medians:\n")
    print("| tracer | fsync | events/s |")
    print("|---|---|---:|")
    for (kind, mode), values in rates.items():
        print(f"| `{kind}` | `{mode}` | {statistics.median(values):,.0f} |")
    if args.out:
        medians = {f"{k}/{m}": statistics.median(v) for (k, m), v in rates.items()}
        args.out.write_text(json.dumps({"events": args.events, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
