"""The ``rollout-trace`` command line: one parser built from ``COMMANDS``, and ``main``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from .._errors import RolloutTraceError
from .._version import __version__
from . import attempts, cost, demo, report, sql, summary, timeline, validate, watch
from .command import Command

__all__ = ["COMMANDS", "build_parser", "main", "program"]

# Every subcommand, in the order `rollout-trace --help` lists them. Adding one
# is adding its `Command` here.
COMMANDS: tuple[Command, ...] = (
    cost.COMMAND,
    summary.COMMAND,
    validate.COMMAND,
    timeline.COMMAND,
    report.COMMAND,
    attempts.COMMAND,
    sql.COMMAND,
    watch.COMMAND,
    demo.COMMAND,
)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser, and each subcommand's parser by name."""
    parser = argparse.ArgumentParser(
        prog="rollout-trace",
        description="Read rollout traces and answer what a checkpoint stop and restore cost.",
        epilog="The file format, the events, the figures and the exit codes are described "
        "in the docs, section Reference.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for command in COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            epilog=command.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        parsers[command.name] = p
    return parser, parsers


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; a wrong word is reported with the usage of the parser it was given to.

    The top-level parser takes only options, none with a value, so the first
    word that is not an option names the subcommand and every word after it
    is the subcommand's. Each part goes to its own parser: argparse would hand
    a subcommand's unknown flags up to the top-level parser, where a flag seen
    on both sides or an option's missing value is easily charged to the wrong
    one. The subcommand's words may mix options and paths in any order
    (``cost a.jsonl --json b.jsonl``).
    """
    parser, parsers = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, w in enumerate(words) if not w.startswith("-") or w == "--"), len(words))
    head, rest = words[:at], words[at:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if head:
        _, extra = parser.parse_known_args(head)  # --help and --version exit here
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not rest:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    name = rest[0]
    sub = parsers.get(name)
    if sub is None:
        choices = ", ".join(repr(c) for c in parsers)
        parser.error(f"argument COMMAND: invalid choice: {name!r} (choose from {choices})")
    # argparse's intermixed mode loses the paths after a `--` (a file named
    # like an option); with one, options come first, as argparse always wants.
    words = rest[1:]
    args = sub.parse_args(words) if "--" in words else sub.parse_intermixed_args(words)
    args.command = name
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rollout-trace`` with ``argv`` (default: the process's); return the exit status.

    This is how another program runs a command, in its own process: ``cost``
    starts worker processes only when given ``--jobs N`` (above 1), and the
    program must then start from an ``if __name__ == "__main__":`` block,
    as multiprocessing requires. ``program`` is the command line itself.
    """
    return _main(argv, program=False)


def program() -> int:
    """The ``rollout-trace`` program: its console script and ``python -m rollout_trace``.

    ``main`` with the process's arguments, where ``cost`` reads in a worker
    process per usable core unless told otherwise: the program's own
    ``__main__`` is safe to start worker processes from.
    """
    return _main(None, program=True)


def _main(argv: Sequence[str] | None, *, program: bool) -> int:
    try:
        args = _parse(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (status 2)
        return exc.code if isinstance(exc.code, int) else 2
    args.program = program
    command = next(c for c in COMMANDS if c.name == args.command)
    try:
        return command.run(args)
    except RolloutTraceError as exc:
        print(f"rollout-trace {command.name}: error: {exc}", file=sys.stderr)
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
    except OSError as exc:  # a read that failed half way (a failing disk, NFS, a store)
        print(f"rollout-trace {command.name}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(program())
