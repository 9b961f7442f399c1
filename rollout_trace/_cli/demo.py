"""``rollout-trace demo``: a simulated controller, killed and restored, and its restore cost."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._demo.runner import DemoError, DemoUsageError, run_demo
from .command import Command

__all__ = ["COMMAND"]

_EPILOG = """\
examples:
  rollout-trace demo
  rollout-trace demo --out /tmp/demo --seed 7
  rollout-trace demo --ray            # workers as Ray actors: pip install 'rollout-trace[ray]'

A simulated asyncio RL controller runs rollouts and training steps, publishes
trainer checkpoints and rollout snapshots, and is killed with SIGKILL part way;
a new process restores the latest snapshot and runs to the end. Time is
simulated (a run takes seconds), so one seed always gives the same figures.
Exit status: 0 done, 1 the demo or a figure failed, 2 wrong usage.
"""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="DIR",
        default="rollout-trace-demo",
        help="folder for the traces, snapshots and checkpoints (default: %(default)s); "
        "the files of an earlier demo there are replaced",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="one seed, one set of figures (default: %(default)s)",
    )
    p.add_argument("--ray", action="store_true", help="run the rollout workers as Ray actors")


def _run(args: argparse.Namespace) -> int:
    try:
        return run_demo(Path(args.out), args.seed, use_ray=args.ray)
    except DemoUsageError as exc:
        print(f"rollout-trace demo: error: {exc}", file=sys.stderr)
        return 2
    except DemoError as exc:
        print(f"rollout-trace demo: failed: {exc}", file=sys.stderr)
        return 1


COMMAND = Command(
    name="demo",
    help="run a simulated controller that is killed and restored; print its restore cost",
    description="Run a simulated async RL controller that is killed and restored, "
    "traced with rollout_trace, and print what the stop cost.",
    epilog=_EPILOG,
    add_arguments=_add_arguments,
    run=_run,
)
