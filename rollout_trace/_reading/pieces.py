"""A trace set cut into pieces that separate processes read: files, and ranges of large ones.

A piece is a whole file (any format, gzip included), or a byte range of a
plain text file (``reader.TextRange``: every line in exactly one range of its
file), so that one large ``.jsonl`` file keeps every core busy too. A gzip
file is always whole: its bytes cannot be entered in the middle.

``plan`` cuts a trace set into pieces of about the same size and groups
them into tasks, a few per worker, so that a worker that draws the slow
pieces does not leave the others idle at the end, while each task's result
(a fold, merged by the caller) stays one of a few.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from .._errors import TraceReadError
from .reader import is_text
from .stores import is_url, url_size

__all__ = ["WHOLE", "Piece", "plan"]

# A piece is at least this large: a worker's start-up and its result's
# merge cost about what reading this much does.
_MIN_PIECE = 32 << 20
# Tasks per worker, for the load to even out.
_TASKS_PER_JOB = 4
# `Piece.end` of a whole file.
WHOLE = -1


class Piece(NamedTuple):
    """A whole file (``end`` is ``WHOLE``), or the lines of bytes ``[start, end)`` of one."""

    path: str
    start: int = 0
    end: int = WHOLE

    def __str__(self) -> str:
        if self.end == WHOLE:
            return self.path
        return f"{self.path} (the lines of bytes {self.start:,} to {self.end:,})"


def plan(files: Sequence[str], jobs: int) -> tuple[list[Piece], list[list[int]]]:
    """The pieces of ``files`` in file order, and tasks for ``jobs`` workers (their indices).

    A file larger than a piece is cut into ranges if it is read as plain text
    (``reader.is_text``); smaller files are grouped, in file order, into
    tasks of about a piece each. The tasks come largest first, so that the
    last ones to finish are small. A file that is gone raises the
    ``TraceReadError`` a read of it would.
    """
    sizes = [_size(f) for f in files]
    target = max(_MIN_PIECE, -(-sum(sizes) // (jobs * _TASKS_PER_JOB)))
    pieces: list[Piece] = []
    weights: list[int] = []
    for path, size in zip(files, sizes, strict=True):
        if size > target and is_text(path):
            n = -(-size // target)
            step = -(-size // n)
            pieces += [Piece(path, s, min(s + step, size)) for s in range(0, size, step)]
            weights += [p.end - p.start for p in pieces[len(weights) :]]
        else:
            pieces.append(Piece(path))
            weights.append(size)
    tasks: list[list[int]] = []
    task: list[int] = []
    held = 0
    for i, size in enumerate(weights):
        task.append(i)
        held += size
        if held >= target:
            tasks.append(task)
            task, held = [], 0
    if task:
        tasks.append(task)
    tasks.sort(key=lambda t: -sum(weights[i] for i in t))  # stable: file order among equals
    return pieces, tasks


def _size(path: str) -> int:
    if is_url(path):
        return url_size(path)
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        raise TraceReadError(f"no such trace file: {path!r}") from None
    except OSError as exc:
        raise TraceReadError(f"cannot open trace file {path!r}: {exc}") from exc
