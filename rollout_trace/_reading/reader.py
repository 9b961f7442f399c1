"""Streaming trace sets back into typed events (docs: Reference > Wire format).

Lines are decoded a block at a time: msgspec decodes a block of complete lines
in a single call (``decode_lines``), so the per-line cost is msgspec's and not
the interpreter's. A block that fails is split in halves until the bad
lines are isolated, so one bad line costs a few extra decodes, not a slow path
for the whole file. Whichever decoder a line meets (the block's or
``decode_one`` alone), it is read or skipped alike.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, Union, cast

import msgspec

from .._errors import TraceReadError
from .._schema.decoding import AnyEvent, bounded, decode_one, decoders
from .gunzip import MAGIC, Cut, gunzip, is_member
from .paths import expand_paths
from .stores import is_url, open_url

__all__ = [
    "ReadProblem",
    "Problems",
    "read",
    "read_located",
    "iter_blocks",
    "is_text",
    "open_trace",
    "TextRange",
]

# Raw bytes read per call. Large enough that the per-block overhead vanishes,
# small enough that memory stays flat however long the file is.
_CHUNK = 1 << 20
# Below this many lines, a failing block is decoded line by line.
_SPLIT_FLOOR = 32
# A line is held in memory up to this size; a longer one is skipped (it is
# not an event a tracer writes, and holding it could take all the memory).
_MAX_LINE = 64 << 20
# What of a skipped line is searched for its run_id and seq.
_HEAD = 4096
# Read from a bad line to charge it to its run; the id may lack its closing
# quote on a torn line.
_RUN_ID = re.compile(rb'"run_id"\s*:\s*"([^"\\]{1,64})')
_SEQ = re.compile(rb'"seq"\s*:\s*(\d{1,18})')
# Event gives the envelope defaults (time 0.0, run_id "", seq -1) so that
# users can build events without one; a line that lacks a field decodes to the
# default. A block holding one of them is re-checked line by line.
_get_time = operator.attrgetter("time")
_get_run_id = operator.attrgetter("run_id")
_get_seq = operator.attrgetter("seq")
_EVENT_START = b'{"event"'
# Where, inside one line, ``decode_lines`` could end one event and begin the
# next: `}{`, JSON whitespace aside (lines hold no newline). Inside one JSON
# value only a string holds it; a line holding it is read by the block only if
# it is one JSON value on its own.
_SEPARATOR = re.compile(rb"\}[ \t\r]*\{")
# Where a line the tracer wrote (its tag first) ends and the next begins. A
# longer pattern is counted faster: the search skips ahead by its length.
_NEXT_EVENT = b'}\n{"event":"'
_one_value = msgspec.json.Decoder(msgspec.Raw)


class ReadProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A line the reader skipped, and why.

    ``torn`` is true for what a killed writer cut short: a file's last line,
    or the end of a gzip member that another member follows (``line`` is
    then where the text breaks). ``run_id`` is read from the raw line where
    it can be, so that a bad line can be charged to its run; ``reason`` is
    at most a few hundred characters, however long the line.
    """

    file: str
    line: int
    reason: str
    torn: bool = False
    run_id: str | None = None
    seq: int | None = None

    def __str__(self) -> str:
        kind = "torn last line" if self.torn else "skipped"
        return f"{self.file}:{self.line}: {kind}: {self.reason}"


Problems = Union[list[ReadProblem], Callable[[ReadProblem], None], None]  # noqa: UP007


def _report(problems: Problems, problem: ReadProblem) -> None:
    if problems is None:
        return
    if isinstance(problems, list):
        problems.append(problem)
    else:
        problems(problem)


# --- raw bytes -----------------------------------------------------------------


def _chunks(path: str, on_bytes: Callable[[int], None] | None) -> Iterator[bytes | Cut]:
    """The decompressed bytes of one file, a chunk at a time, and ``Cut``s where
    a gzip stream breaks (``gunzip``); ``on_bytes`` is told of every raw byte read."""
    with open_trace(path) as f:
        first = f.read(_CHUNK)
        raw = _raw(f, first, on_bytes)
        yield from gunzip(raw) if is_gzip(first, path.endswith(".gz")) else raw


def _raw(f: BinaryIO, chunk: bytes, on_bytes: Callable[[int], None] | None) -> Iterator[bytes]:
    """``chunk``, read of ``f`` already, and the rest of ``f``, each told to ``on_bytes``."""
    while chunk:
        if on_bytes is not None:
            on_bytes(len(chunk))
        yield chunk
        chunk = f.read(_CHUNK)


def open_trace(path: str, *, ahead: bool = True) -> BinaryIO:
    """The trace file ``path`` opened for reading (an object store's object streamed,
    read ahead unless ``ahead=False``: ``stores``); a failure to open is a ``TraceReadError``."""
    if is_url(path):
        # Read as a binary file is: read, seek, tell and close (``stores.StoreFile``).
        return cast(BinaryIO, open_url(path, ahead=ahead))
    try:
        return open(path, "rb")
    except OSError as exc:
        raise TraceReadError(f"cannot open trace file {path!r}: {exc}") from exc


def is_text(path: str) -> bool:
    """Whether ``iter_blocks`` reads the file at ``path`` as plain text (not gzip).

    Only such a file can be read in byte ranges (``TextRange``).
    """
    with open_trace(path, ahead=False) as f:  # an object: its first chunk, no more
        first = f.read(_CHUNK)
    return not is_gzip(first, path.endswith(".gz"))


def _range_chunks(
    path: str, start: int, end: int, on_bytes: Callable[[int], None] | None
) -> Iterator[bytes]:
    """The bytes of the lines of ``path`` that ``TextRange(path, start, end)`` holds."""
    with open_trace(path) as f:
        pos = start
        f.seek(start)
        buf = f.read(_CHUNK)
        if start > 0:
            # The line under way at `start` is the range before's.
            while (cut := buf.find(b"\n")) < 0:
                if not buf:
                    return
                pos += len(buf)
                buf = f.read(_CHUNK)
            if pos + cut >= end:
                return  # that newline ends this range too: it holds no line
            pos += cut + 1
            buf = buf[cut + 1 :] or f.read(_CHUNK)
        while buf:
            if pos + len(buf) > end:
                cut = buf.find(b"\n", max(end - pos, 0))
                if cut >= 0:
                    buf = buf[: cut + 1]
                    if on_bytes is not None:
                        on_bytes(len(buf))
                    yield buf
                    return
            if on_bytes is not None:
                on_bytes(len(buf))
            yield buf
            pos += len(buf)
            buf = f.read(_CHUNK)


class TextRange:
    """The lines of a plain text file (``is_text``) that meet bytes ``[start, end)``.

    A range begins after the first newline at or after ``start`` (at 0 for
    ``start`` 0) and ends with the first newline at or after ``end`` (or
    the end of the file): ranges that tile a file hold each of its lines
    exactly once, a line longer than a range included. ``blocks`` gives them
    as ``iter_blocks`` does, line numbers counted from the range's first
    line; once they are read, ``lines`` is how many lines it held, which
    the line numbers of the ranges after it add (all but the last range end
    with a newline).
    """

    def __init__(
        self,
        path: str,
        start: int,
        end: int,
        problems: Problems = None,
        *,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        self.path, self.start, self.end = path, start, end
        self._lines = LineDecoder(path, problems, block_decoder())
        self._on_bytes = on_bytes

    def blocks(self) -> Iterator[tuple[str, list[Any], Sequence[int]]]:
        chunks = _range_chunks(self.path, self.start, self.end, self._on_bytes)
        return self._lines.read(chunks)

    @property
    def lines(self) -> int:
        return self._lines.line_no - 1


def is_gzip(first: bytes, named_gz: bool) -> bool:
    """Whether a file whose first chunk is ``first`` is read as gzip (``named_gz``:
    its name ends in ``.gz``).

    A file named ``.gz`` that begins with gzip's magic bytes is gzip. Any
    file is gzip when a member begins in its first chunk, at its start or
    after junk: magic bytes that inflate to the start of a line. A text file
    may begin with the magic bytes alone (a first line of garbage), even with
    what zlib takes for the start of a header that never ends; it is read as
    the lines it is.

    A file named ``.gz`` is gzip too when its first chunk holds a NUL byte,
    which no line of text holds, and does not begin with a line of JSON: zeros
    where a crash lost what a file system had not written, or the deflate
    data of a member whose header is lost. Read as text, such a file would
    give up every member after the junk; gunzip reports the junk and reads on
    from the next member it finds.
    """
    if first.startswith(MAGIC[:2]) and named_gz:
        return True
    if named_gz and b"\0" in first:
        end = first.find(b"\n")
        if end < 0 or not _whole(memoryview(first)[:end]):
            return True
    return _member_in(first)


def _member_in(data: bytes) -> bool:
    """Whether a gzip member begins somewhere in ``data``.

    Taken for one only once it inflates to the start of a line (never merely
    for lack of bytes to tell): a line of text can hold the magic bytes too.
    """
    view = memoryview(data)
    at = data.find(MAGIC)
    while at >= 0:
        if is_member(view[at:], ended=False):
            return True
        at = data.find(MAGIC, at + 1)
    return False


# --- decoding ------------------------------------------------------------------


def _is_fragment(head: bytes) -> bool:
    """Whether ``head`` is a cut-off line rather than whole JSON (``{..},{..}``)."""
    try:
        msgspec.json.decode(head.rstrip().rstrip(b","))
    except msgspec.DecodeError:
        return True
    return False


# A block decoder: one msgspec call for a block of lines (``decode_lines``).
_Many = msgspec.json.Decoder[Any]


def block_decoder() -> _Many:
    """The decoder of a block of lines, into the registered classes."""
    return decoders()[0]


def _whole(line: bytes | memoryview) -> bool:
    """Whether ``line`` is one JSON value on its own (its types unchecked)."""
    try:
        _one_value.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def _unsplit(text: bytes, end: int, count: int) -> bool:
    """Whether ``decode_lines`` took each of the ``count`` lines of ``text[:end]``
    for one event.

    It takes a newline for whitespace: lines decode as many events as there
    are lines even when one is `{A} {B` and the next its rest `..}`. A newline
    between `}` and `{` is no such rest, as inside one value an object is never
    followed by another without a comma: when every line begins with `{` and
    ends with `}`, each holds a whole number of events, one by the count.
    Lines as the tracer writes them are counted faster by ``_NEXT_EVENT``,
    which begins with `}`, the newline and `{`: when it is at every newline,
    so are they. Otherwise a line holding `}{` (``_SEPARATOR``), which is
    rare, is decoded alone to check it.
    """
    if (
        text.startswith(b"{")
        and text.endswith(b"}", 0, end)
        and (
            text.count(_NEXT_EVENT, 0, end) == count - 1 or text.count(b"}\n{", 0, end) == count - 1
        )
    ):
        return True
    view = memoryview(text)
    at = 0
    while (found := _SEPARATOR.search(text, at, end)) is not None:
        start = text.rfind(b"\n", 0, found.start()) + 1
        at = text.find(b"\n", found.end(), end)
        at = end if at < 0 else at
        if not _whole(view[start:at]):
            return False
    return True


def _decode_many(text: bytes | memoryview, count: int, many: _Many) -> list[AnyEvent] | None:
    """The events of ``text``, ``count`` whole lines, or None if any line is bad.

    Bad is what ``decode_one`` says of the line, so that a line is read or
    skipped whatever lines it shares a block with. That each line gave one
    event the caller checks (``_unsplit``).
    """
    try:
        events: list[AnyEvent] = many.decode_lines(text)
    except (msgspec.DecodeError, RecursionError):  # nested too deep: read line by line
        return None
    # An empty line gives no event, and an object across two lines one for two.
    if len(events) != count:
        return None
    # What `envelope_problem` asks, over the whole block at once.
    if (
        min(map(_get_seq, events)) < 0
        or not min(map(_get_time, events)) > 0.0
        or not all(map(_get_run_id, events))
    ):
        return None
    return events


class _Block:
    """Decodes the lines of one block, reporting the bad ones."""

    __slots__ = ("events", "lines", "many", "path", "problems")

    def __init__(self, path: str, problems: Problems, many: _Many) -> None:
        self.path = path
        self.problems = problems
        self.many = many
        self.events: list[AnyEvent] = []
        self.lines: list[int] = []

    def decode(self, lines: list[bytes], first_line: int) -> None:
        if len(lines) > _SPLIT_FLOOR:
            evs = _decode_many(b"\n".join(lines), len(lines), self.many)
            if evs is not None and all(map(_whole, filter(_SEPARATOR.search, lines))):
                self.events.extend(evs)
                self.lines.extend(range(first_line, first_line + len(lines)))
                return
            half = len(lines) // 2
            self.decode(lines[:half], first_line)
            self.decode(lines[half:], first_line + half)
            return
        for i, raw in enumerate(lines):
            self.line(raw, first_line + i, torn=False)

    def line(self, raw: bytes, line_no: int, *, torn: bool, why_torn: str = "") -> None:
        if not raw.strip():
            if not torn:
                self.problem(line_no, "empty line", torn=False, raw=raw)
            return
        ev, reason = decode_one(raw)
        if ev is not None:
            self.events.append(ev)
            self.lines.append(line_no)
            return
        # A writer killed mid-line and a later writer appending to the same file
        # glue a fragment onto the next whole line; keep the whole line.
        cut = raw.rfind(_EVENT_START)
        if cut > 0 and _is_fragment(raw[:cut]):
            rescued, _ = decode_one(raw[cut:])
            if rescued is not None:
                self.problem(
                    line_no,
                    "a cut-off line (killed writer) runs into this line; kept the event after it",
                    torn=True,
                    raw=raw[:cut],
                )
                self.events.append(rescued)
                self.lines.append(line_no)
                return
        if torn:
            reason = f"{why_torn}: {reason}"
        self.problem(line_no, reason or "undecodable", torn=torn, raw=raw)

    def problem(self, line_no: int, reason: str, *, torn: bool, raw: bytes = b"") -> None:
        run_id, seq = _RUN_ID.search(raw), _SEQ.search(raw)
        _report(
            self.problems,
            ReadProblem(
                file=self.path,
                line=line_no,
                reason=bounded(reason),
                torn=torn,
                run_id=run_id.group(1).decode("utf-8", "replace") if run_id else None,
                seq=int(seq.group(1)) if seq else None,
            ),
        )


def iter_blocks(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    problems: Problems = None,
    *,
    on_bytes: Callable[[int], None] | None = None,
    listed: bool = False,
) -> Iterator[tuple[str, list[Any], Sequence[int]]]:
    """Blocks of ``(file, events, line numbers)``, in file order.

    The building block of ``read`` and of the command line, which handle a
    block at a time to keep per-event overhead low. ``on_bytes`` is told how
    many raw bytes were consumed, for progress display.
    ``listed``: ``paths`` are ``expand_paths``'s, read as named, not listed again.
    """
    many = block_decoder()
    for path in cast("list[str]", paths) if listed else expand_paths(paths):
        yield from LineDecoder(path, problems, many).read(_chunks(path, on_bytes))


class LineDecoder:
    """Cuts a file's text into lines and decodes them a block at a time.

    A line is held as the pieces it arrived in and joined once, so a long
    one costs a copy, not one per chunk; one longer than ``_MAX_LINE`` is
    reported and skipped without being held. A held line is decoded alone,
    once its pieces are let go, so a long one costs its text and its event;
    the lines of a chunk are decoded where they lie, with no copy.
    """

    def __init__(self, path: str, problems: Problems, many: _Many) -> None:
        self.path = path
        self.problems = problems
        self.many = many
        self.line_no = 1
        # The start of the current line, which no newline has ended yet.
        self.pieces: list[bytes] = []
        self.held = 0
        # In a line too long to hold: its bytes are dropped up to its newline.
        self.skipping = False

    def read(
        self, chunks: Iterable[bytes | Cut]
    ) -> Iterator[tuple[str, list[AnyEvent], Sequence[int]]]:
        for chunk in chunks:
            if isinstance(chunk, Cut):
                yield from self._cut(chunk.reason, torn=chunk.torn)
            else:
                yield from self._chunk(chunk)
        if self.pieces:
            yield from self._cut("no newline at the end of the file", eof=True)

    def _chunk(self, chunk: bytes) -> Iterator[tuple[str, list[AnyEvent], Sequence[int]]]:
        end = chunk.rfind(b"\n")
        if end < 0:
            self._hold(chunk)
            return
        if self.skipping or self.pieces:
            # The line under way ends here; the bytes after its newline are new lines.
            start = chunk.find(b"\n") + 1
            if self.skipping:
                self.skipping = False
                self.line_no += 1
            else:
                yield from self._held_line(chunk[: start - 1])
            if start > end:
                self._hold(chunk[start:])
                return
            chunk, end = chunk[start:], end - start
        count = chunk.count(b"\n", 0, end) + 1
        events = _decode_many(memoryview(chunk)[:end], count, self.many)
        if events is not None and _unsplit(chunk, end, count):
            yield self.path, events, range(self.line_no, self.line_no + count)
        else:
            block = _Block(self.path, self.problems, self.many)
            block.decode(chunk[:end].split(b"\n"), self.line_no)
            if block.events:
                yield self.path, block.events, block.lines
        self.line_no += count
        self._hold(chunk[end + 1 :])

    def _held_line(self, last: bytes) -> Iterator[tuple[str, list[AnyEvent], Sequence[int]]]:
        """The held line, whose last piece is ``last``, decoded alone."""
        self._hold(last)
        if self.skipping:  # too long, and reported
            self.skipping = False
        else:
            line = b"".join(self.pieces)
            self.pieces, self.held = [], 0
            block = _Block(self.path, self.problems, self.many)
            block.line(line, self.line_no, torn=False)
            if block.events:
                yield self.path, block.events, block.lines
        self.line_no += 1

    def _hold(self, piece: bytes) -> None:
        if self.skipping or not piece:
            return
        self.pieces.append(piece)
        self.held += len(piece)
        if self.held > _MAX_LINE:
            head = b""
            for held in self.pieces:
                head += held[: _HEAD - len(head)]
            block = _Block(self.path, self.problems, self.many)
            block.problem(
                self.line_no,
                f"a line longer than {_MAX_LINE >> 20} MiB (no newline in it): skipped unread",
                torn=False,
                raw=head,
            )
            self.pieces, self.held = [], 0
            self.skipping = True

    def _cut(
        self, why: str, *, eof: bool = False, torn: bool = True
    ) -> Iterator[tuple[str, list[AnyEvent], Sequence[int]]]:
        """The text breaks here (a gzip member cut short, or the end): the line
        under way, if any, is torn."""
        block = _Block(self.path, self.problems, self.many)
        rest = b"".join(self.pieces)
        self.pieces = []
        if rest:
            # A whole line that only lacks its newline is kept as it is.
            block.line(rest, self.line_no, torn=True, why_torn=why)
        if not eof and (not rest or block.events or not torn):
            block.problem(self.line_no, why, torn=torn)
        if rest or self.skipping:
            self.line_no += 1
        self.held, self.skipping = 0, False
        if block.events:
            yield self.path, block.events, block.lines


def read(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    problems: Problems = None,
) -> Iterator[AnyEvent]:
    """Every event of a trace set: files, globs or folders, ``.jsonl`` or ``.jsonl.gz``.

    Events come typed (``UnknownEvent`` for a tag no class is defined for),
    envelope included, in file order; runs are not regrouped or sorted. Lines
    that are skipped (not JSON, bad fields, a torn last line) are reported to
    ``problems``, a list or a callable taking a ``ReadProblem``.
    """
    for _, events, _ in iter_blocks(paths, problems):
        yield from events


def read_located(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    problems: Problems = None,
) -> Iterator[tuple[str, int, AnyEvent]]:
    """Like ``read``, each event with the file and 1-based line number it came from."""
    for path, events, lines in iter_blocks(paths, problems):
        for line_no, ev in zip(lines, events, strict=True):
            yield path, line_no, ev
