"""One controller process of the demo: ``python -m rollout_trace._demo.child``.

It traces to its own ``trace-{pid}.jsonl`` and tells its parent how it goes
with JSON lines on stdout. With ``--kill`` it stops where the seed's
``Scenario`` says, flushes its trace, says so, and waits for the parent's
SIGKILL without closing the tracer. With ``--restore`` it restores from the
latest snapshot and runs to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rollout_trace as rt

from .controller import SLOTS, TOTAL_STEPS, Controller, GenerateFn
from .sim import EPOCH, LocalWorker, Plan, Request, Scenario, Sim

__all__ = ["main"]

# Rollout servers; each serves SLOTS // SERVERS tries at once (like an
# inference server with a few concurrent requests).
SERVERS = 2
PROGRESS_EVERY_S = 60.0
# A safety net: a parent that died cannot send the kill; leave without
# closing the trace, as the kill would have.
KILL_WAIT_S = 120.0


def tell(kind: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"kind": kind, **fields}) + "\n")
    sys.stdout.flush()


def _local_workers() -> GenerateFn:
    servers = [LocalWorker() for _ in range(SERVERS)]

    async def generate(slot: int, req: Request) -> Plan:
        return servers[slot * SERVERS // SLOTS].generate(req)

    return generate


def _ray_workers(address: str) -> GenerateFn:
    ray: Any = importlib.import_module("ray")
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    actor = ray.remote(num_cpus=0)(LocalWorker)
    servers = [actor.remote() for _ in range(SERVERS)]

    async def generate(slot: int, req: Request) -> Plan:
        plan: Plan = await servers[slot * SERVERS // SLOTS].generate.remote(req)
        return plan

    return generate


async def _report(sim: Sim, c: Controller) -> None:
    while True:
        await sim.sleep(PROGRESS_EVERY_S)
        tell("progress", sim=sim.now() - EPOCH, step=c.step, events=c.tracer.counts.emitted)


def _instructive(sim: Sim, c: Controller, scenario: Scenario) -> bool:
    if len(c.published) < scenario.stop_after_snapshot:
        return False
    captured_at, published_at, seen = c.published[-1]
    # A restore resumes the tries the snapshot saw past their first turn and
    # starts over the ones it saw at turn 0.
    midway = {key for key, turns in seen.items() if turns}
    running = c.running()
    if sim.now() < published_at + scenario.min_gap_s:
        return False
    if c.step >= TOTAL_STEPS - 4:
        return True  # no such moment came: stop while there is a run left to restore
    return (
        c.failures > 0
        and any(t > captured_at for t in c.step_times[-1:])
        # a try sealed after the capture that the restore cannot resume
        # (the snapshot did not see it past its first turn): it is redone
        and any(t > captured_at and key not in midway for t, key in c.seals)
        and len(midway) < len(seen)
        and bool(running & midway)
        and bool(running - midway)
    )


async def _stop_point(sim: Sim, c: Controller, scenario: Scenario, stop: list[bool]) -> None:
    """Wait for the scenario's moment to stop (see ``Scenario``), then stop the clock."""
    while not _instructive(sim, c, scenario):
        await c.changed.wait()
    stop.append(True)


async def run_controller(args: argparse.Namespace) -> None:
    """Run one controller under a tracer until its end, or until the seed's stop point."""
    out = Path(args.out)
    generate = _ray_workers(args.ray_address) if args.ray_address else _local_workers()
    sim = Sim(args.start)
    meta = {
        "demo": True,
        "seed": args.seed,
        "run": args.run,
        "workers": "ray" if args.ray_address else "asyncio",
    }
    async with rt.tracer(str(out / "trace-{pid}.jsonl"), meta=meta, clock=sim.now) as t:
        c = Controller(sim, t, generate, out, args.seed, args.run)
        tell("started", sim=sim.now() - EPOCH)
        if args.restore:
            sim.spawn(c.restore(), "restore")
        else:
            c.start()
        sim.spawn(_report(sim, c), "progress")
        stop: list[bool] = []
        if args.kill:
            sim.spawn(_stop_point(sim, c, Scenario.from_seed(args.seed), stop), "stop point")
        await sim.run(math.inf, lambda: c.finished or bool(stop))
        await sim.shutdown()
        if stop:
            await t.flush()
            tell("stop", at=sim.now(), sim=sim.now() - EPOCH, step=c.step, events=t.counts.emitted)
            await asyncio.sleep(KILL_WAIT_S)
            os._exit(3)
    tell("done", sim=sim.now() - EPOCH, step=c.step, events=t.counts.emitted)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout_trace._demo.child")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--run", type=int, required=True)
    p.add_argument("--start", type=float, default=EPOCH, help="simulated Unix time to start at")
    p.add_argument("--kill", action="store_true", help="stop where the seed says; wait for a kill")
    p.add_argument("--restore", action="store_true")
    p.add_argument("--ray-address")
    args = p.parse_args(argv)
    asyncio.run(run_controller(args))
    if args.ray_address:
        importlib.import_module("ray").shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
