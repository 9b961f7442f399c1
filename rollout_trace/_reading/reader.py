"""Streaming trace sets back into typed events (README: Reference > Wire format).

Lines are decoded a block at a time: a block of complete lines becomes one JSON
array that msgspec decodes in a single call, so the per-line cost is msgspec's
and not the interpreter's. A block that fails is split in halves until the bad
lines are isolated, so one bad line costs a few extra decodes, not a slow path
for the whole file.
"""

from __future__ import annotations

import operator
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, Union

import msgspec

from .._errors import TraceReadError
from .._schema.decoding import AnyEvent, decode_one, decoders
from .lean import lean_list_decoder
from .paths import expand_paths

__all__ = [
    "ReadProblem",
    "Problems",
    "read",
    "read_located",
    "iter_blocks",
]

# Raw bytes read per call. Large enough that the per-block overhead vanishes,
# small enough that memory stays flat however long the file is.
_CHUNK = 1 << 20
# Below this many lines, a failing block is decoded line by line.
_SPLIT_FLOOR = 32
_GZIP_MAGIC = b"\x1f\x8b"
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


class ReadProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A line the reader skipped, and why.

    ``torn`` is true for a last line cut short by a killed writer (or the cut
    end of a truncated gzip stream). ``run_id`` is read from the raw line where
    it can be, so that a bad line can be charged to its run.
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


def _run_id_of(raw: bytes) -> str | None:
    m = _RUN_ID.search(raw)
    return m.group(1).decode("utf-8", "replace") if m else None


def _seq_of(raw: bytes) -> int | None:
    m = _SEQ.search(raw)
    return int(m.group(1)) if m else None


# --- raw bytes -----------------------------------------------------------------


class _Source:
    """The decompressed bytes of one file, a chunk at a time.

    gzip is decoded with zlib directly rather than ``gzip.open``: a killed
    writer leaves a member without its end marker, and ``gzip`` raises then
    and loses the tail it already decompressed. Here every byte that could be
    decompressed is yielded and ``cut_short`` says why the stream ended early.

    A file is gzip when it begins with gzip's magic bytes, whatever its name;
    but one not named ``.gz`` whose first chunk gives not a single byte (zlib
    refuses it, or it ends inside what looked like a header) only began like
    gzip, with a first line of garbage, and is read as the lines it is.
    """

    def __init__(self, path: str, on_bytes: Callable[[int], None] | None) -> None:
        self.path = path
        self.cut_short: str | None = None
        self._on_bytes = on_bytes
        self._not_gzip = False

    def chunks(self) -> Iterator[bytes]:
        try:
            f: BinaryIO = open(self.path, "rb")  # noqa: SIM115
        except OSError as exc:
            raise TraceReadError(f"cannot open trace file {self.path!r}: {exc}") from exc
        with f:
            first = f.read(_CHUNK)
            if first.startswith(_GZIP_MAGIC):
                yield from self._gunzip(f, first)
                if not self._not_gzip:
                    return
                yield first  # _gunzip has counted its bytes
                first = f.read(_CHUNK)
            while first:
                if self._on_bytes is not None:
                    self._on_bytes(len(first))
                yield first
                first = f.read(_CHUNK)

    def _gunzip(self, f: BinaryIO, raw: bytes) -> Iterator[bytes]:
        inflater = zlib.decompressobj(wbits=31)
        fed = False
        # Until a byte comes out of the first chunk, the file may not be gzip.
        maybe_text = not self.path.endswith(".gz")
        while raw:
            if self._on_bytes is not None:
                self._on_bytes(len(raw))
            while raw:
                fed = True
                try:
                    out = inflater.decompress(raw)
                except zlib.error as exc:
                    if maybe_text:
                        self._not_gzip = True
                    else:
                        self.cut_short = f"corrupt gzip data ({exc})"
                    return
                if out:
                    maybe_text = False
                    yield out
                if not inflater.eof:
                    break
                # A member ended; concatenated members are one stream (gzip -c a b).
                raw = inflater.unused_data
                inflater = zlib.decompressobj(wbits=31)
                fed = False
                if raw and not raw.startswith(_GZIP_MAGIC[: len(raw)]):
                    if raw.strip(b"\0"):
                        self.cut_short = "bytes after the last gzip member are not gzip data"
                    return
            raw = f.read(_CHUNK)
            if raw:
                maybe_text = False
        if fed and not inflater.eof:
            # A member began and the file ended before its end marker.
            tail = inflater.flush()
            if maybe_text and not tail:
                self._not_gzip = True  # one chunk, and not a byte of it came out
                return
            if tail:
                yield tail
            self.cut_short = "gzip stream ends early (a killed writer)"


# --- decoding ------------------------------------------------------------------


def _is_fragment(head: bytes) -> bool:
    """Whether ``head`` is a cut-off line rather than whole JSON (``{..},{..}``)."""
    try:
        msgspec.json.decode(head.rstrip().rstrip(b","))
    except msgspec.DecodeError:
        return True
    return False


def _decode_many(
    payload: bytes, count: int, many: msgspec.json.Decoder[Any]
) -> list[AnyEvent] | None:
    """A JSON array of ``count`` lines' events, or None if any line is bad.

    Only the real event classes need the envelope check; ``lean``'s classes
    require their envelope fields.
    """
    try:
        events: list[AnyEvent] = many.decode(payload)
    except msgspec.DecodeError:
        return None
    # A line holding `{..},{..}` would decode as two events.
    if len(events) != count:
        return None
    if many is not lean_list_decoder() and (
        min(map(_get_seq, events)) < 0
        or min(map(_get_time, events)) <= 0.0
        or "" in set(map(_get_run_id, events))
    ):
        return None
    return events


class _Block:
    """Decodes the lines of one block, reporting the bad ones."""

    __slots__ = ("events", "lines", "many", "path", "problems")

    def __init__(self, path: str, problems: Problems, many: msgspec.json.Decoder[Any]) -> None:
        self.path = path
        self.problems = problems
        self.many = many
        self.events: list[AnyEvent] = []
        self.lines: list[int] = []

    def decode(self, lines: list[bytes], first_line: int) -> None:
        if len(lines) > _SPLIT_FLOOR:
            evs = _decode_many(b"[" + b",".join(lines) + b"]", len(lines), self.many)
            if evs is not None:
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
                self._problem(line_no, "empty line", torn=False, raw=raw)
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
                self._problem(
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
        self._problem(line_no, reason or "undecodable", torn=torn, raw=raw)

    def _problem(self, line_no: int, reason: str, *, torn: bool, raw: bytes) -> None:
        _report(
            self.problems,
            ReadProblem(
                file=self.path,
                line=line_no,
                reason=reason,
                torn=torn,
                run_id=_run_id_of(raw),
                seq=_seq_of(raw),
            ),
        )


def iter_blocks(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    problems: Problems = None,
    *,
    on_bytes: Callable[[int], None] | None = None,
    lean: bool = False,
) -> Iterator[tuple[str, list[Any], Sequence[int]]]:
    """Blocks of ``(file, events, line numbers)``, in file order.

    The building block of ``read`` and of the command line, which handle a
    block at a time to keep per-event overhead low. ``on_bytes`` is told how
    many raw bytes were consumed, for progress display. ``lean`` decodes the
    common events into the slim classes of ``lean`` (for the cost analysis);
    a block with a bad line still decodes line by line into real events.
    """
    many = lean_list_decoder() if lean else decoders()[1]
    for path in expand_paths(paths):
        yield from _iter_file(path, problems, on_bytes, many)


def _iter_file(
    path: str,
    problems: Problems,
    on_bytes: Callable[[int], None] | None,
    many: msgspec.json.Decoder[Any],
) -> Iterator[tuple[str, list[AnyEvent], Sequence[int]]]:
    source = _Source(path, on_bytes)
    rest = b""
    line_no = 1
    for chunk in source.chunks():
        end = chunk.rfind(b"\n")
        if end < 0:
            rest += chunk
            continue
        count = chunk.count(b"\n", 0, end) + 1
        # The common case costs one copy for the commas and one for the join.
        payload = b"".join((b"[", rest, memoryview(chunk.replace(b"\n", b","))[:end], b"]"))
        events = _decode_many(payload, count, many)
        if events is not None:
            yield path, events, range(line_no, line_no + count)
        else:
            block = _Block(path, problems, many)
            block.decode((rest + chunk[:end]).split(b"\n"), line_no)
            if block.events:
                yield path, block.events, block.lines
        line_no += count
        rest = chunk[end + 1 :]
    block = _Block(path, problems, many)
    if rest:
        why = source.cut_short or "no newline at the end of the file"
        # A whole line that only lacks its newline is kept as it is.
        block.line(rest, line_no, torn=True, why_torn=why)
    if source.cut_short is not None and (not rest or block.events):
        _report(
            problems,
            ReadProblem(file=path, line=line_no, reason=source.cut_short, torn=True),
        )
    if block.events:
        yield path, block.events, block.lines


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
