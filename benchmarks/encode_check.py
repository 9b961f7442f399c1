"""What the writer's schema check costs, in nanoseconds per event.

``BatchEncoder.encode`` (every event checked against its own class, then the
batch encoded) against the bare ``encode_lines`` it wraps (no check), for a
batch of ``--events`` events of two kinds: ``AttemptDispatched`` (five fields
of its own) and a user event with a ``dict[str, Any]`` field of five metrics.
The two run interleaved and repeated; the table shows medians.

    python benchmarks/encode_check.py [--events N] [--repeat R]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

import rollout_trace as rt
from rollout_trace._schema.encoding import BatchEncoder, _enc_hook


class Metrics(rt.Event, tag="bench_metrics"):
    step: int
    values: dict[str, Any]


def _stamped(events: list[rt.Event]) -> list[rt.Event]:
    for i, ev in enumerate(events):
        ev.seq, ev.time, ev.run_id = i + 1, 1.7e9 + i * 1e-3, "a" * 32
    return events


def batches(n: int) -> dict[str, list[rt.Event]]:
    dispatched: list[rt.Event] = [
        rt.AttemptDispatched(
            group_id=f"g{i // 8}",
            prompt_id=i // 8,
            generation_index=i % 8,
            attempt=0,
            weight_version=3,
        )
        for i in range(n)
    ]
    metrics: list[rt.Event] = [
        Metrics(
            step=i,
            values={
                "loss": 0.25 + i * 1e-6,
                "lr": 1e-5,
                "tokens": 1234 + i,
                "kl": 0.01,
                "tags": ["rollout", "gpu0"],
            },
        )
        for i in range(n)
    ]
    return {"AttemptDispatched": _stamped(dispatched), "dict[str, Any] event": _stamped(metrics)}


def ns_per_event(fn: Callable[[Sequence[rt.Event]], object], batch: list[rt.Event]) -> float:
    fn(batch)  # builds the class's check
    inner = 5
    start = time.perf_counter_ns()
    for _ in range(inner):
        fn(batch)
    return (time.perf_counter_ns() - start) / inner / len(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=31)
    args = parser.parse_args()
    checked = BatchEncoder()
    bare = msgspec.json.Encoder(enc_hook=_enc_hook)
    print(f"{'batch of ' + str(args.events):<24} {'checked':>10} {'bare':>10}  (ns/event)")
    for name, batch in batches(args.events).items():
        data, bad = checked.encode(batch)
        assert not bad, bad[0][1]
        assert data == bare.encode_lines(batch)
        with_check, without = [], []
        for _ in range(args.repeat):
            with_check.append(ns_per_event(checked.encode, batch))
            without.append(ns_per_event(bare.encode_lines, batch))
        print(
            f"{name:<24} {statistics.median(with_check):>10.0f} {statistics.median(without):>10.0f}"
        )


if __name__ == "__main__":
    main()
