"""Gzip as writers leave it: whole members, one per write, a last one cut short by a kill.

A ``.jsonl.gz`` sink writes every batch as a gzip member of its own, so
writers appending to one file (a forked child, a restored run) put whole
members one after another, and each member is read alone with the standard
library (``zlib``, ``unused_data`` giving the bytes after it). What is not a
whole member is one of three things, told apart here:

- A member cut short by a kill: its writer died in the middle of the write.
  What it inflates to is kept (its last line is torn) and reading goes on at
  the next member's header, which another writer appended after it.
- Damage: bytes that do not inflate, or a check sum that does not hold. What
  inflated before it is kept, and reading goes on at the next header.
- Zeros after a member, which a file system leaves after a crash.

A header is gzip's magic (``1f 8b 08``), taken for one only where it
inflates to the start of a line: deflate data holds the magic bytes too (one
in 16 MiB does). A member is fed no further than the next such bytes, so a
member cut short never reads the next one's header as its own data.

``Members`` walks the bytes as they come, for a file read whole and for one
still being written (``rollout-trace watch``): a member not yet whole gives
what inflates so far, and the rest once it is there.
"""

from __future__ import annotations

import zlib
from collections.abc import Generator, Iterable, Iterator

__all__ = ["MAGIC", "Cut", "Members", "gunzip", "is_member"]

MAGIC = b"\x1f\x8b\x08"
# What every gzip member begins with; the third byte (the method) is checked
# by zlib, so a damaged one is corrupt data rather than junk.
_ID = MAGIC[:2]
# The least text a chunk of ``gunzip`` holds (but where a member breaks).
_READ = 1 << 20
# The most text one inflate call gives, so a small member cannot expand into
# a huge chunk (a long run of one byte).
_OUT = 4 << 20
# Bytes a probe may inflate to see whether a member begins: a member's first
# text comes within a few hundred bytes of its header.
_PROBE = 64 << 10
# Raw bytes inflated a call at a time where a call failed on damage (zlib
# gives nothing of a call that fails): what is lost before the damage is at
# most what this many bytes inflate to.
_SALVAGE_STEP = 64
# A step of the walk: text and Cuts out, then whether to go on (False: the
# bytes so far are used up, or must wait for more).
_Step = Generator["bytes | Cut", None, bool]


class Cut:
    """Where the gzip stream breaks, in the middle of the text: why.

    ``torn`` when the break is a kill's mark (a member with no end, zeros
    after a crash), which a reader must expect; False for damage and junk,
    which lose events nobody killed.
    """

    __slots__ = ("reason", "torn")

    def __init__(self, reason: str, *, torn: bool = True) -> None:
        self.reason = reason
        self.torn = torn


def is_member(data: bytes | memoryview, *, ended: bool) -> bool | None:
    """Whether a gzip member begins at ``data[0]``: it inflates to the start of a line.

    None when too few bytes are there to tell; once the file has ``ended``,
    a member cut short before its first byte of text is one.
    """
    probe = zlib.decompressobj(wbits=31)
    try:
        first = probe.decompress(data[:_PROBE], 1)
    except zlib.error:
        return False
    if first or probe.eof:
        return first in (b"{", b"")
    if len(data) >= _PROBE:
        return False
    return True if ended else None


def _inflate(inflater: zlib._Decompress, data: bytes | memoryview) -> Iterator[bytes]:
    out = inflater.decompress(data, _OUT)
    while out:
        yield out
        # Not once the member ended: zlib would add what follows it to
        # unused_data a second time.
        if inflater.eof or not inflater.unconsumed_tail:
            break
        out = inflater.decompress(inflater.unconsumed_tail, _OUT)


def _salvage(inflater: zlib._Decompress, data: memoryview, given: int) -> Iterator[bytes]:
    """What ``data`` inflates to up to the damage in it, with ``inflater`` as it
    was before ``data``; but for the first ``given`` bytes, which are out already."""
    for at in range(0, len(data), _SALVAGE_STEP):
        try:
            out = inflater.decompress(data[at : at + _SALVAGE_STEP])
        except zlib.error:
            return
        skip = min(given, len(out))
        given -= skip
        if skip < len(out):
            yield out[skip:]


class Members:
    """The text of gzip members and ``Cut``s where they break, as the file's bytes come.

    ``feed`` gives what the bytes so far decide, holding back what the next
    bytes may change (the start of a header); ``end`` says the file ends
    there. Each generator is read to its end before the next call.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0  # the next byte to look at, in _buf
        self._base = 0  # the file offset of _buf[0]
        self._inflater: zlib._Decompress | None = None  # the member being read
        self._start = 0  # the file offset where it began, or where skipped bytes begin
        self._scan = 0  # the file offset from which to look for the next header
        self._fed = False  # whether the member was fed bytes already
        # Why bytes are being skipped up to the next header (None: they are
        # not; "": they are not gzip; else zlib's word for the damage).
        self._skip: str | None = None
        self._zeros = True  # whether the bytes skipped are all zeros
        self._members = 0

    def feed(self, data: bytes) -> Iterator[bytes | Cut]:
        self._base += self._pos
        self._buf = self._buf[self._pos :] + data
        self._pos = 0
        return self._walk(ended=False)

    def end(self) -> Iterator[bytes | Cut]:
        return self._walk(ended=True)

    def _walk(self, ended: bool) -> Iterator[bytes | Cut]:
        while True:
            if self._inflater is not None:
                going = yield from self._member(self._inflater, ended)
            elif self._skip is not None:
                going = yield from self._skipping(ended)
            else:
                going = self._between(ended)
            if not going:
                return

    def _between(self, ended: bool) -> bool:
        """After a member (or at the start): the next begins, or bytes are skipped."""
        rest = self._buf[self._pos : self._pos + len(_ID)]
        if rest == _ID:
            self._inflater, self._fed = zlib.decompressobj(wbits=31), False
            self._start = self._base + self._pos
            self._scan = self._start + 1
            self._members += 1
            return True
        if not rest or (not ended and _ID.startswith(rest)):
            return False  # nothing, or what may be a header's first byte
        self._skip, self._zeros = "", True
        self._start = self._base + self._pos
        return True

    def _member(self, inflater: zlib._Decompress, ended: bool) -> _Step:
        """Feed the member what there is of it, up to the next header; whether to go on."""
        buf = self._buf
        at = buf.find(MAGIC, max(self._scan - self._base, self._pos))
        stop = len(buf) if at < 0 else at
        if at < 0 and not ended:  # a header's start that the next bytes may complete
            hold = 2 if buf.endswith(_ID) else 1 if buf.endswith(_ID[:1]) else 0
            stop = max(self._pos, stop - hold)
        piece = memoryview(buf)[self._pos : stop]
        # A copy only where the member began in bytes fed before: most are fed whole.
        before = inflater.copy() if self._fed else None
        self._fed = True
        given = 0
        try:
            for out in _inflate(inflater, piece):
                given += len(out)
                yield out
        except zlib.error as exc:
            # What inflates before the damage is kept; the member's bytes from
            # there to the next header are lost.
            yield from _salvage(before or zlib.decompressobj(wbits=31), piece, given)
            self._inflater, self._pos = None, stop
            self._skip, self._zeros = str(exc), False
            return True
        if inflater.eof:
            self._inflater, self._pos = None, stop - len(inflater.unused_data)
            return True
        self._pos = stop
        if at < 0:
            if not ended:
                return False  # the rest of the member is still to come
            yield from self._cut_short(
                inflater,
                f"gzip member from byte {self._start:,} ends early at byte "
                f"{self._base + stop:,} (its writer was killed)",
            )
            return False
        header = is_member(memoryview(buf)[at:], ended=ended)
        if header is None:
            return False
        if header:
            yield from self._cut_short(
                inflater,
                f"gzip member from byte {self._start:,} has no end: at byte "
                f"{self._base + at:,} another begins (its writer was killed)",
            )
        else:
            self._scan = self._base + at + 1  # its own data: read on through it
        return True

    def _cut_short(self, inflater: zlib._Decompress, reason: str) -> Iterator[bytes | Cut]:
        tail = inflater.flush()
        if tail:
            yield tail
        yield Cut(reason)
        self._inflater = None

    def _skipping(self, ended: bool) -> _Step:
        """Skip bytes up to the next header; at it (or the end), say what they were."""
        buf, i = self._buf, self._pos
        while (at := buf.find(MAGIC, i)) >= 0:
            header = is_member(memoryview(buf)[at:], ended=ended)
            if header is None:
                self._drop(at)
                return False
            if header:
                self._drop(at)
                yield from self._skipped(ended=False)
                return True
            i = at + 1
        self._drop(len(buf) if ended else max(self._pos, len(buf) - len(MAGIC) + 1))
        if ended:
            yield from self._skipped(ended=True)
        return False

    def _drop(self, stop: int) -> None:
        if self._zeros and self._buf.count(0, self._pos, stop) != stop - self._pos:
            self._zeros = False
        self._pos = stop

    def _skipped(self, *, ended: bool) -> Iterator[Cut]:
        why, self._skip = self._skip, None
        span = f"bytes {self._start:,}-{self._base + self._pos:,}"
        if why:
            after = "" if ended else "; read on at the next member"
            yield Cut(f"corrupt gzip data in {span} ({why}){after}", torn=False)
        elif self._zeros and self._members:
            # A file system's padding after a crash, where the file was
            # appended to later; said nothing of at the end of the file.
            if not ended:
                yield Cut(f"{span} are zeros (padding after a crash)")
        else:
            yield Cut(f"{span} are not gzip data", torn=False)


def gunzip(chunks: Iterable[bytes]) -> Iterator[bytes | Cut]:
    """The text of every member of a gzip file, its bytes read as ``chunks``, with a
    ``Cut`` where it breaks."""
    members = Members()
    for chunk in chunks:
        yield from _joined(members.feed(chunk))
    yield from _joined(members.end())


def _joined(pieces: Iterator[bytes | Cut]) -> Iterator[bytes | Cut]:
    """``pieces`` with the text between two Cuts joined into chunks of ``_READ``
    or more: the reader decodes a chunk at a time, and a write of one line is a
    member (a piece) of its own."""
    held: list[bytes] = []
    size = 0
    for piece in pieces:
        if isinstance(piece, bytes):
            held.append(piece)
            size += len(piece)
            if size < _READ:
                continue
        if held:
            yield b"".join(held)
            held, size = [], 0
        if isinstance(piece, Cut):
            yield piece
    if held:
        yield b"".join(held)
