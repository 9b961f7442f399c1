"""What the subcommands share: trace-set arguments, progress, bad lines, and table layout."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import BinaryIO, TextIO

import msgspec

from .._errors import TraceReadError
from .._model.traceset import Builder, M, Model, gc_paused
from .._reading.paths import expand_paths
from .._reading.reader import Problems, ReadProblem, iter_blocks
from .._reading.stores import is_url, url_size
from .._schema.decoding import UnknownEvent
from .._schema.events import Event
from .._timeline.model import Timeline, timeline_of

__all__ = [
    "PROBLEMS_SHOWN",
    "BadLines",
    "add_paths",
    "blocks",
    "fold_timeline",
    "output_error",
    "write_whole",
    "progress_for",
    "trace_files",
    "report_problems",
    "fmt_time",
    "fmt_num",
    "table",
]

# Progress is worth showing only when reading takes more than a moment.
_PROGRESS_BYTES = 64 << 20
_PROGRESS_EVERY_S = 0.25
# Bad lines shown on standard error before the rest are only counted: a
# binary file read as a trace has one per line.
PROBLEMS_SHOWN = 10


def add_paths(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATHS",
        help=(
            "trace files (.jsonl, .jsonl.gz), globs such as 'runs/*.jsonl', or folders; "
            "object store URLs such as 's3://bucket/runs/*.jsonl' too"
        ),
    )


class _Progress:
    """``reading 120/800 MB`` on stderr, redrawn in place, when stderr is a terminal."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total = total
        self.done = 0
        self.out = out
        self.next_draw = 0.0

    def __call__(self, n: int) -> None:
        self.at(self.done + n)

    def at(self, done: int) -> None:
        """Say that ``done`` bytes are read (by worker processes, which count them)."""
        self.done = done
        now = time.monotonic()
        if now >= self.next_draw:
            self.next_draw = now + _PROGRESS_EVERY_S
            self.out.write(f"\rreading {self.done >> 20}/{self.total >> 20} MB")
            self.out.flush()

    def clear(self) -> None:
        self.out.write("\r\033[K")
        self.out.flush()


def progress_for(files: Sequence[str]) -> _Progress | None:
    """A progress display for reading ``files``, or None where it is not worth one."""
    total = sum(_size(f) for f in files)
    if total >= _PROGRESS_BYTES and sys.stderr.isatty():
        return _Progress(total, sys.stderr)
    return None


def _size(path: str) -> int:
    try:
        return url_size(path) if is_url(path) else os.path.getsize(path)
    except (OSError, TraceReadError):
        return 0  # gone since it was listed: its read says so


def trace_files(paths: Sequence[str]) -> list[str]:
    """The files that ``paths`` (files, globs, folders, URLs) name, each once: what a
    command lists, once, and reads (``blocks``)."""
    return expand_paths(paths)


def blocks(
    files: Sequence[str], problems: Problems
) -> Iterator[tuple[str, list[Event | UnknownEvent], Sequence[int]]]:
    """The event blocks of ``files`` (``trace_files``, not listed again), with progress
    on stderr for large inputs.

    A name a listing gave is that file or object, whatever characters it holds;
    and an object's size and etag are the listing's, with no request more.
    """
    progress = progress_for(files)
    try:
        yield from iter_blocks(files, problems, on_bytes=progress, listed=True)
    finally:
        if progress is not None:
            progress.clear()


def output_error(out: str, suffixes: Mapping[str, str], files: Sequence[str]) -> str | None:
    """Why ``out`` may not be written, if so: a suffix that names no output kind
    (``suffixes``: suffix -> what is written), or one of the trace files read."""
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in suffixes:
        allowed = "; ".join(f"{s} for {what}" for s, what in suffixes.items())
        shown = f"suffix {suffix!r}" if suffix else "no suffix"
        return f"output {out!r} has {shown}; the output kind follows the suffix: {allowed}"
    if os.path.exists(out) and any(not is_url(f) and os.path.samefile(out, f) for f in files):
        return (
            f"output {out!r} is one of the trace files read; writing it would destroy that "
            "trace: choose another -o"
        )
    return None


def write_whole(out: str, write: Callable[[BinaryIO], int]) -> int:
    """What ``write`` returns, having written a file beside ``out`` and renamed it over
    ``out`` once whole: a failure part way (a full disk, Ctrl-C) leaves an earlier
    file as it was and no torn one, and no file beside it."""
    part = f"{out}.part"
    try:
        with open(part, "wb") as f:
            n = write(f)
        os.replace(part, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return n


class BadLines:
    """The reader's bad lines, counted, with the first ``PROBLEMS_SHOWN`` kept to show.

    Pass it as the reader's ``problems``; ``then`` is called with every one too.
    """

    def __init__(self, then: Callable[[ReadProblem], None] | None = None) -> None:
        self.count = 0
        self.torn = 0
        self.first: list[ReadProblem] = []
        self._then = then

    def __call__(self, p: ReadProblem) -> None:
        self.count += 1
        self.torn += p.torn
        if len(self.first) < PROBLEMS_SHOWN:
            self.first.append(p)
        if self._then is not None:
            self._then(p)

    def extend(self, other: BadLines, line_offset: int = 0) -> None:
        """Count in the bad lines of a later part, their line numbers moved on by
        ``line_offset``."""
        self.count += other.count
        self.torn += other.torn
        for p in other.first[: PROBLEMS_SHOWN - len(self.first)]:
            self.first.append(msgspec.structs.replace(p, line=p.line + line_offset))


def read_model(files: list[str], problems: Problems, make: type[M] = Model) -> M:  # type: ignore[assignment]
    """The model of the trace set ``files`` hold (``_model``), read once."""
    builder = Builder()
    # Millions of small acyclic records: the cyclic collector would walk them
    # all, again and again, for nothing.
    with gc_paused():
        for path, block, _ in blocks(files, problems):
            builder.add(block, source=path)
    return builder.build(None, make)


def fold_timeline(files: list[str], problems: BadLines) -> Timeline:
    """The timeline of ``files`` (``read_model``)."""
    model: Model = read_model(files, problems)
    with gc_paused():
        return timeline_of(model)


def report_problems(problems: Sequence[ReadProblem], total: int | None = None) -> None:
    """The first bad lines on standard error, one a line, then how many more there were.

    ``total`` is how many there were in all, when ``problems`` holds only the
    first of them (``BadLines``); ``validate`` is the command that lists every one.
    """
    stream = sys.stderr
    count = len(problems) if total is None else total
    for p in problems[:PROBLEMS_SHOWN]:
        print(f"rollout-trace: {p}", file=stream)
    more = count - min(len(problems), PROBLEMS_SHOWN)
    if more > 0:
        print(
            f"rollout-trace: ... and {more:,} more bad line(s) "
            "(rollout-trace validate says where each is)",
            file=stream,
        )


def fmt_time(t: float | None) -> str:
    if t is None:
        return "n/a"
    try:
        stamp = dt.datetime.fromtimestamp(t, tz=dt.timezone.utc)
    except (OverflowError, ValueError, OSError):  # milliseconds, or no date at all
        return f"{t:.3f} (not a date)"
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def fmt_num(v: float | int | None, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.{digits}f}"


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Sequence[int] = (),
    indent: str = "",
) -> str:
    """Rows under headers, columns padded to line up; ``right`` columns align right."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return (indent + "  ".join(parts)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
