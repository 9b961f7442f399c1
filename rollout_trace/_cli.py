"""The ``rollout-trace`` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from . import _cli_cost, _cli_demo, _cli_summary, _cli_timeline, _cli_validate
from ._errors import RolloutTraceError
from ._version import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollout-trace",
        description="Read rollout traces and answer what a checkpoint stop and restore cost.",
        epilog="The file format, the events, the figures and the exit codes are described "
        "in the README, section Reference.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (_cli_cost, _cli_summary, _cli_validate, _cli_timeline, _cli_demo):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (status 2)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = args.func(args)
    except RolloutTraceError as exc:
        print(f"rollout-trace {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `| head` closed the pipe: nothing more to say, and Python's own flush
        # at exit must not fail either. Not 0: under `set -o pipefail` a
        # failing validate must not pass.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except OSError as exc:  # a read that failed half way (a failing disk, NFS)
        print(f"rollout-trace {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
