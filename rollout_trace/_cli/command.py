"""What a subcommand is to the command line: its name, its help texts, its arguments, its run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    """One ``rollout-trace`` subcommand; ``main.COMMANDS`` lists them all.

    ``help`` is its line in ``rollout-trace --help``; ``description`` and
    ``epilog`` open and close ``rollout-trace NAME --help``, the epilog laid
    out as written (examples, exit statuses). ``add_arguments`` adds its
    arguments to its parser; ``run`` does the work and returns the exit status.
    """

    name: str
    help: str
    description: str
    epilog: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
