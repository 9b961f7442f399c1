"""Gzip as writers leave it: cut short by a kill, appended to afterwards, shared after a fork.

Every open of a ``.jsonl.gz`` sink writes one gzip member, flushed to a byte
boundary after every batch of whole lines (``Z_FULL_FLUSH``, so that each
batch stands alone; files whose batches refer back have ``Z_SYNC_FLUSH``). So
a file can hold a member cut short by a kill and then the restored run's member, or the
members of a parent and its forked child with their batches interleaved: the
parent's next batch follows the child's, with no header of its own.

``zlib`` and ``gzip`` stop at the first bytes that do not go on the member
they are in. Here a member is cut where another's header begins (``1f 8b 08``,
taken for one only if it inflates to the start of a line) and, if it was cut
between two batches, kept aside: its writer may go on. While a member is kept
aside, a batch is not simply given to the member being read, because a batch
inflated with another member's history does not fail: deflate copies earlier
text from whatever history it is given, so the batch comes out as that
member's own lines, or a mix of them. A batch is the member's whose reading
of it goes on where it left off (its first line has the run's next seq), else
the one member's whose reading fits (JSON lines with a ``run_id`` and a
``seq`` it has not written lately). When that is not one member, the batch
is read alone (``_alone``): a batch that stands alone gives its own text with
no history, and one that refers back fails rather than give another's; the
start of a batch cut short before it is found the same way. Only when that
fails too are the bytes up to the next header skipped and reported, never
guessed at. After corrupt data, what inflates before it is kept and reading
goes on at the next batch that reads alone.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable, Generator, Iterator
from operator import itemgetter
from typing import BinaryIO

import msgspec

__all__ = ["Cut", "gunzip", "looks_like_gzip"]

_MAGIC = b"\x1f\x8b\x08"
# The end of every batch a sink writes: an empty stored block (either flush).
_SYNC = b"\x00\x00\xff\xff"
_READ = 1 << 20
# The most output one inflate call returns, so a small file cannot expand
# into a huge chunk.
_OUT = 4 << 20
# Raw bytes a probe inflates to tell a member's header from compressed data
# that happens to hold the magic bytes (one in 16 MiB does): data taken for a
# header fails within bytes, for want of the history deflate refers to.
_PROBE = 64 << 10
# Output a member keeps to check the next batch against: more than the 32 KiB
# that deflate can copy from.
_TAIL = 64 << 10
# (run_id, seq) pairs a member remembers: more lines than 32 KiB holds.
_RECENT = 8192
# A batch bigger than this is taken for the member it began in unchecked.
_SEGMENT = 8 << 20
_KEPT_ASIDE = 4
# Where no member's reading of a batch can be trusted, the batch is read
# alone (``_alone``): its start is looked for among this many offsets of a
# piece, and among this many in all per file, as each costs an inflate call.
_SCAN = 1 << 20
_SCAN_BUDGET = 8 << 20
# The most text a batch read alone may give.
_ALONE_OUT = 64 << 20


class Cut:
    """Where the gzip stream breaks, in the middle of the text: why.

    ``torn`` when the break is a kill's mark (a member with no end), which a
    reader must expect; False for damage and for bytes that could not be read
    with trust, which lose events nobody killed.
    """

    __slots__ = ("reason", "torn")

    def __init__(self, reason: str, *, torn: bool = True) -> None:
        self.reason = reason
        self.torn = torn


# A step of the walk: text and Cuts out, then the member to go on with
# (None: between members).
_Step = Generator["bytes | Cut", None, "_Member | None"]


class _Key(msgspec.Struct, gc=False):
    run_id: str
    seq: int


_keys_of_lines = msgspec.json.Decoder(list[_Key])
_key_of_line = msgspec.json.Decoder(_Key)
_run_of = operator.attrgetter("run_id")
_seq_of = operator.attrgetter("seq")


def _keys(text: bytes) -> list[tuple[str, int]] | None:
    """The (run_id, seq) of every line of ``text`` (whole lines), None if one has none."""
    try:
        keys = _keys_of_lines.decode(b"[" + text.replace(b"\n", b",") + b"]")
    except msgspec.DecodeError:
        return None
    if len(keys) != text.count(b"\n") + 1:  # a line holding `{..},{..}`
        return None
    return list(zip(map(_run_of, keys), map(_seq_of, keys), strict=True))


def _first_key(text: bytes) -> tuple[str, int] | None:
    try:
        key = _key_of_line.decode(text)
    except msgspec.DecodeError:
        return None
    return key.run_id, key.seq


class _Member:
    """One gzip member being inflated, and what it wrote last."""

    __slots__ = ("at_batch_end", "inflater", "last", "raw", "recent", "start", "tail", "whole")

    def __init__(self, start: int) -> None:
        self.start = start
        self.inflater = zlib.decompressobj(wbits=31)
        # Read on as raw deflate, without the member's check sum (``go_raw``).
        self.raw = False
        self.tail = b""
        # Whether the tail is all the member's text, so begins with a line.
        self.whole = True
        # Whether the bytes fed so far end a batch: whole lines, then _SYNC.
        self.at_batch_end = False
        # (run_id, seq) of its recent lines, and the highest seq of each run;
        # None until needed, or once lines went by unread (then from the tail).
        self.recent: dict[tuple[str, int], None] | None = None
        self.last: dict[str, int] | None = None

    def go_raw(self, inflater: zlib._Decompress | None = None) -> None:
        """Read on from this batch end with no history and no check sum.

        For a member whose batches stand alone (``Z_FULL_FLUSH``) once its
        reading was rescued: its check sum no longer covers what was read.
        """
        self.inflater = inflater or zlib.decompressobj(wbits=-15)
        self.raw = True

    def took(self, out: bytes, keys: list[tuple[str, int]] | None = None, end: bytes = b"") -> None:
        """``out`` is the member's next text: with its keys, or its last line ``end``."""
        tail = self.tail + out if len(out) < _TAIL else out
        self.whole = self.whole and len(tail) <= _TAIL
        self.tail = tail[-_TAIL:]
        if keys is not None and self.recent is not None:
            self._learn(keys)
            return
        self.recent = None
        key = _first_key(end) if end else None
        if key is None or self.last is None:
            self.last = None
        else:
            self.last[key[0]] = max(self.last.get(key[0], -1), key[1])

    def _learn(self, keys: list[tuple[str, int]]) -> None:
        recent, last = self.recent, self.last
        assert recent is not None
        assert last is not None
        recent.update(dict.fromkeys(keys))
        if len(recent) > 2 * _RECENT:
            self.recent = dict.fromkeys(list(recent)[-_RECENT:])
        runs = set(map(itemgetter(0), keys))
        if len(runs) == 1:  # as a member's lines are: one run's
            run = runs.pop()
            last[run] = max(last.get(run, -1), *map(itemgetter(1), keys))
            return
        for run, seq in keys:
            last[run] = max(last.get(run, -1), seq)

    def known(self) -> dict[tuple[str, int], None]:
        """The (run_id, seq) of its recent lines (read from its tail if need be)."""
        if self.recent is None or self.last is None:
            self.recent, self.last = {}, {}
            lines = self.tail.split(b"\n")
            # A tail cut from longer text begins inside a line.
            keys = [key for line in lines[0 if self.whole else 1 :] if (key := _first_key(line))]
            self._learn(keys)
        return self.recent

    def goes_on(self, key: tuple[str, int]) -> bool:
        """Whether a line keyed ``key`` is the next this member writes."""
        if self.last is None:
            self.known()
        assert self.last is not None
        return self.last.get(key[0], -2) + 1 == key[1]

    def judge(self, out: bytes) -> tuple[bool, bool, list[tuple[str, int]] | None]:
        """What ``out``, inflated at a batch end, says of being this member's next batch.

        Whether it can be (its lines are JSON with an envelope, none of
        which this member wrote already), whether it goes on where the member
        left off (its first line has the next seq of its run), and the
        (run_id, seq) of its lines.
        """
        end = out.rfind(b"\n")
        if end < 0:
            return True, False, []  # not one whole line: nothing to go by
        keys = _keys(out[:end])
        if keys is None:
            return False, False, None
        if len(set(keys)) != len(keys) or not self.known().keys().isdisjoint(keys):
            return False, False, keys
        return True, self.goes_on(keys[0]), keys


class _Try:
    """A member's reading of a batch, before it is taken: first just inflated,
    then judged (``judge``) when there is a doubt whose it is."""

    __slots__ = ("fits", "goes_on", "inflater", "judged", "keys", "member", "out")

    def __init__(self, member: _Member, piece: bytes) -> None:
        self.member = member
        self.inflater = member.inflater.copy()
        # Only the batch's first _OUT bytes of text are judged by: a small
        # batch may inflate to a huge one (a long run of one byte), and a
        # reading is made for each member in doubt. The rest streams at take().
        self.out = self.inflater.decompress(piece, _OUT)
        self.fits = self.goes_on = self.judged = False
        self.keys: list[tuple[str, int]] | None = None

    def judge(self) -> _Try:
        if not self.judged:
            self.judged = True
            self.fits, self.goes_on, self.keys = self.member.judge(self.out)
        return self

    def first_goes_on(self) -> bool:
        end = self.out.find(b"\n")
        key = _first_key(self.out[:end]) if end >= 0 else None
        return key is not None and self.member.goes_on(key)

    def take(self, piece: bytes) -> Iterator[bytes | Cut]:
        """The batch's text, given to the member whose reading this is."""
        member, out = self.member, self.out
        member.inflater = self.inflater
        if self.judged:
            member.took(out, self.keys)
        else:
            end = out.rfind(b"\n")
            member.took(out, end=out[out.rfind(b"\n", 0, end) + 1 : end] if end > 0 else b"")
        if out:
            yield out
        rest = self.inflater.unconsumed_tail
        if rest:
            try:
                for more in _inflate(self.inflater, rest):
                    member.took(more)
                    yield more
            except zlib.error as exc:
                member.at_batch_end = False
                yield Cut(f"corrupt gzip data in a batch ({exc})", torn=False)
                return
        member.at_batch_end = piece.endswith(_SYNC) and member.tail.endswith(b"\n")


def _try(member: _Member, piece: bytes) -> _Try | None:
    try:
        return _Try(member, piece)
    except zlib.error:
        return None


def _may_go_on(member: _Member, piece: bytes) -> bool:
    """Whether the first line ``member`` inflates ``piece`` to goes on where it left off.

    Cheaper than a ``_Try``, as it inflates the start of the piece only.
    """
    inflater = member.inflater.copy()
    head = b""
    try:
        for out in _inflate(inflater, piece[:4096]):
            head += out
    except zlib.error:
        return False
    end = head.find(b"\n")
    if end < 0:
        return True  # too little to tell
    key = _first_key(head[:end])
    return key is not None and member.goes_on(key)


def _pick(tries: list[_Try | None]) -> _Try | None:
    """The one reading to trust: of the one member the batch goes on, else of
    the one it fits; None when that is not one member.

    The member that wrote a batch always reads it as fitting, and it goes on
    unless events were dropped in between; a reading by another member rarely
    fits, and goes on more rarely still. Two that do are not told apart by a
    guess: a wrong one would give another run's events under this run's id.
    """
    fitting = [t for t in tries if t is not None and t.judge().fits]
    going_on = [t for t in fitting if t.goes_on]
    if len(going_on) == 1:
        return going_on[0]
    return fitting[0] if len(fitting) == 1 and not going_on else None


def _alone(piece: bytes | memoryview) -> tuple[bytes, zlib._Decompress] | None:
    """``piece``'s text if it inflates with no history into whole trace lines.

    A sink flushes every batch with ``Z_FULL_FLUSH``, so each batch refers to
    nothing before it: read alone, it gives its own text, whatever was
    written before it, and whoever wrote it. Deflate that refers further back
    than the piece goes fails instead (zlib refuses a distance past the start),
    so the text, when there is one, is never another writer's lines.
    """
    inflater = zlib.decompressobj(wbits=-15)
    parts: list[bytes] = []
    size = 0
    try:
        for out in _inflate(inflater, bytes(piece)):
            size += len(out)
            if size > _ALONE_OUT:
                return None
            parts.append(out)
    except zlib.error:
        return None
    text = b"".join(parts)
    if not text.startswith(b"{") or not text.endswith(b"\n") or _keys(text[:-1]) is None:
        return None
    return text, inflater


def _head_alone(piece: bytes) -> tuple[bytes, bool]:
    """What ``piece`` inflates to with no history before it fails, and whether
    it inflates without an error: the start of a batch whose writer was killed."""
    inflater = zlib.decompressobj(wbits=-15)
    parts: list[bytes] = []
    try:
        parts.extend(_inflate(inflater, piece))
    except zlib.error:
        return b"".join(parts), False
    text = b"".join(parts)
    return text, text.startswith(b"{")


def looks_like_gzip(first: bytes) -> bool:
    """Whether a file that begins with ``first`` (its first read) is gzip.

    Not when zlib refuses its first bytes, nor when it is so short that it
    ends inside what would be a header: a text file that begins like gzip.
    """
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(first[:_PROBE], 1)
    except zlib.error:
        return False
    return bool(out) or inflater.eof or len(first) > _PROBE


class _Raw:
    """The file's bytes from the read position on, read ahead as far as asked.

    Indexes into ``data`` stay valid until ``compact()``, which only a new
    step of the walk calls.
    """

    def __init__(self, f: BinaryIO, first: bytes, on_bytes: Callable[[int], None] | None) -> None:
        self._f = f
        self._on_bytes = on_bytes
        self.data = first
        self.pos = 0  # the read position, in data
        self.base = 0  # the file offset of data[0]
        self.eof = False
        if on_bytes is not None:
            on_bytes(len(first))

    def offset(self, i: int | None = None) -> int:
        return self.base + (self.pos if i is None else i)

    def compact(self) -> None:
        # Only once the bytes behind outweigh those ahead: a copy per read.
        if self.pos > _READ and self.pos * 2 > len(self.data):
            self.base += self.pos
            self.data = self.data[self.pos :]
            self.pos = 0

    def need(self, n: int) -> int:
        """Read until ``n`` bytes lie ahead of the position or the file ends; the end index."""
        while len(self.data) - self.pos < n and not self.eof:
            more = self._f.read(max(_READ, n - (len(self.data) - self.pos)))
            if not more:
                self.eof = True
                break
            if self._on_bytes is not None:
                self._on_bytes(len(more))
            self.data += more
        return min(len(self.data), self.pos + n)

    def take(self, end: int) -> bytes:
        piece = self.data[self.pos : end]
        self.pos = end
        return piece


def _inflate(inflater: zlib._Decompress, data: bytes) -> Iterator[bytes]:
    out = inflater.decompress(data, _OUT)
    while out:
        yield out
        if not inflater.unconsumed_tail:
            break
        out = inflater.decompress(inflater.unconsumed_tail, _OUT)


def _good_length(before: zlib._Decompress, piece: bytes) -> int:
    """The length of the longest prefix of ``piece`` that inflates without an error."""
    good, bad = 0, len(piece)
    while bad - good > 16:
        mid = (good + bad) // 2
        try:
            for _ in _inflate(before.copy(), piece[:mid]):
                pass
        except zlib.error:
            bad = mid
        else:
            good = mid
    return good


class _Reader:
    """Walks the members of one file; ``run`` yields their text and ``Cut``s."""

    def __init__(self, raw: _Raw) -> None:
        self.raw = raw
        # Members cut short at the end of a batch: their writer may go on.
        self.aside: list[_Member] = []
        # File offsets of magic bytes a probe found to be data, not a header.
        self.not_headers: set[int] = set()
        # Offsets still to try as the start of a batch read alone.
        self.scan_budget = _SCAN_BUDGET

    # --- where members start -----------------------------------------------------

    def _is_header(self, i: int) -> bool:
        """Whether a member starts at ``i`` (an index in ``raw.data`` holding magic).

        Its first batch is inflated: a member's text begins a line, while data
        taken for a header fails or gives random bytes.
        """
        raw = self.raw
        if raw.offset(i) in self.not_headers:
            return False
        ahead = raw.need(i - raw.pos + _PROBE)
        end = ahead
        for mark, skip in ((_MAGIC, 1), (_SYNC, 10)):
            at = raw.data.find(mark, i + skip, end)
            if at >= 0:
                end = at + (len(_SYNC) if mark is _SYNC else 0)
        probe = zlib.decompressobj(wbits=31)
        first = b""
        try:
            for out in _inflate(probe, raw.data[i:end]):
                first = first or out[:1]
        except zlib.error:
            first = b"!"
        at_end = end == len(raw.data) and raw.eof
        if first == b"{" or (not first and (probe.eof or at_end)):
            return True
        self.not_headers.add(raw.offset(i))
        return False

    def _header_in(self, i: int, end: int) -> int:
        """The index of the first header in ``raw.data[i:end]``, or -1."""
        while True:
            i = self.raw.data.find(_MAGIC, i, end)
            if i < 0 or self._is_header(i):
                return i
            i += 1

    def _skip_to_header(self) -> bool:
        """Move to the next member's header; False (at the end) if there is none."""
        raw = self.raw
        while True:
            raw.compact()
            end = raw.need(_READ)
            stop = end if raw.eof else max(raw.pos, end - len(_MAGIC) + 1)
            i = self._header_in(raw.pos, stop)
            if i >= 0:
                raw.pos = i
                return True
            raw.pos = stop
            if raw.eof:
                return False

    # --- the walk ------------------------------------------------------------------

    def run(self) -> Iterator[bytes | Cut]:
        raw = self.raw
        cur: _Member | None = _Member(0)
        while True:
            raw.compact()
            if raw.need(1) == raw.pos:
                break
            if cur is None:
                cur = yield from self._between_members()
            else:
                cur = yield from self._step(cur)
        if cur is not None and not cur.inflater.eof:
            tail = cur.inflater.flush()
            if tail:
                cur.took(tail)
                yield tail
            yield Cut("gzip stream ends early (a killed writer)")

    def _piece_end(self, cur: _Member) -> tuple[int, bool]:
        """Where the next piece for ``cur`` ends, and whether a header begins there.

        While members are kept aside, a piece is one batch, read whole (up to
        ``_SEGMENT``) when it is to be checked.
        """
        raw = self.raw
        whole = bool(self.aside) and cur.at_batch_end
        first = raw.pos + (1 if raw.offset() == cur.start else 0)
        raw.need(_READ)
        while True:
            end = len(raw.data)
            # Magic or a batch end split across two reads is found after the next.
            stop = end if raw.eof else max(raw.pos + 1, end - len(_SYNC) + 1)
            sync = raw.data.find(_SYNC, raw.pos, stop) if self.aside else -1
            if sync >= 0:
                stop = sync + len(_SYNC)
            header = self._header_in(first, stop)
            if header >= 0:
                return header, True
            if sync >= 0 or not whole or raw.eof or stop - raw.pos >= _SEGMENT:
                return stop, False
            raw.need(end - raw.pos + _READ)

    def _step(self, cur: _Member) -> _Step:
        """Feed ``cur`` the next piece; the member to go on with (None: between members)."""
        raw = self.raw
        start = raw.offset()
        stop, _ = self._piece_end(cur)
        if stop == raw.pos:  # a header right here: cur was cut short
            return (yield from self._cut(cur))
        piece = raw.take(stop)
        if self.aside and cur.at_batch_end:
            return (yield from self._whose(cur, piece, start))
        before = cur.inflater.copy()
        given = 0
        try:
            for out in _inflate(cur.inflater, piece):
                given += len(out)
                cur.took(out)
                yield out
        except zlib.error as exc:
            reason = f"corrupt gzip data in bytes {start:,}-{raw.offset():,} ({exc})"
            # The salvage starts where the failed call did: what that call
            # gave already is not given twice.
            good = _good_length(before, piece)
            for out in _inflate(before, piece[:good]):
                skip = min(given, len(out))
                given -= skip
                if skip < len(out):
                    cur.took(out[skip:])
                    yield out[skip:]
            yield Cut(reason, torn=False)
            # Batches that stand alone are read on from after the damage.
            return (yield from self._resume(cur, raw.pos - len(piece) + good))
        cur.at_batch_end = piece.endswith(_SYNC) and cur.tail.endswith(b"\n")
        return self._after(cur)

    def _after(self, member: _Member) -> _Member | None:
        if not member.inflater.eof:
            return member
        # The member ended inside the piece: what follows it is given back,
        # but for the trailer of a member read raw, which is not checked.
        unused = len(member.inflater.unused_data)
        self.raw.pos -= max(0, unused - 8) if member.raw else unused
        return None

    def _cut(self, cur: _Member) -> _Step:
        """A header begins at the position, before ``cur`` ended: ``cur`` is cut short."""
        raw = self.raw
        if cur.at_batch_end:
            self._set_aside(cur)
        yield Cut(
            f"gzip member from byte {cur.start:,} has no end: at byte {raw.offset():,} "
            "another begins (its writer was killed, or two wrote to one file)"
        )
        return _Member(raw.offset())

    def _set_aside(self, member: _Member) -> None:
        self.aside.append(member)
        del self.aside[:-_KEPT_ASIDE]

    def _between_members(self) -> _Step:
        """After a member's end: the next member, a kept-aside one going on, or nothing."""
        raw = self.raw
        start = raw.offset()
        end = raw.need(_READ)
        if raw.data.startswith(_MAGIC, raw.pos):
            return _Member(start)
        if self.aside:
            stop, _ = self._piece_end(self.aside[-1])
            piece = raw.data[raw.pos : stop]
            pick = _pick([_try(member, piece) for member in reversed(self.aside)])
            if pick is not None:
                raw.pos = stop
                self.aside.remove(pick.member)
                yield from pick.take(piece)
                return self._after(pick.member)
        else:
            stop = self._batch_end()
            piece = raw.data[raw.pos : stop]
        if piece:
            # A batch after a member's end, with no header: one that reads alone
            # is a writer's that shared the member (a fork) going on.
            raw.pos = stop
            rescued, member = yield from self._rescue(None, piece, start)
            if rescued:
                return member
            raw.pos = stop - len(piece)
        if raw.eof and not raw.data[raw.pos : end].strip(b"\0"):
            raw.pos = end  # zeros at the end: a file system's padding after a crash
            return None
        found = self._skip_to_header()
        yield Cut(f"bytes {start:,}-{raw.offset():,} are not gzip data", torn=False)
        return _Member(raw.offset()) if found else None

    def _batch_end(self) -> int:
        """The end of the batch at the position: past its ``_SYNC``, before a
        header, or where ``_SEGMENT`` bytes or the file end."""
        raw = self.raw
        while True:
            end = raw.need(len(raw.data) - raw.pos + _READ)
            stop = end if raw.eof else max(raw.pos + 1, end - len(_SYNC) + 1)
            sync = raw.data.find(_SYNC, raw.pos, stop)
            if sync >= 0:
                stop = sync + len(_SYNC)
            header = self._header_in(raw.pos + 1, stop)
            if header >= 0:
                return header
            if sync >= 0 or raw.eof or stop - raw.pos >= _SEGMENT:
                return stop

    def _whose(self, cur: _Member, piece: bytes, start: int) -> _Step:
        """A batch read while members are kept aside: the member it goes on.

        Every member is asked, cur too: cur reads another writer's batch as
        copies of its own lines, as the others read cur's.
        """
        mine = _try(cur, piece)
        rivals = list(reversed(self.aside))
        pick = None
        if mine is not None and mine.first_goes_on():
            # Only a member whose reading could go on too stands against cur;
            # with none, cur's reading is taken without reading it through.
            rivals = [member for member in rivals if _may_go_on(member, piece)]
            if not rivals:
                pick = mine
        if pick is None:
            pick = _pick([mine, *(_try(member, piece) for member in rivals)])
        if pick is None:
            rescued, member = yield from self._rescue(cur, piece, start)
            if rescued:
                return member
        if pick is None:
            # Whoever wrote this batch, its next ones refer to it: no member
            # begun so far can be read on with trust.
            yield Cut(
                f"gzip bytes from {start:,} go on none of the members begun before them, or "
                "on more than one (two writers appending to one file at once, or damage); "
                "skipped to the next member",
                torn=False,
            )
            self.aside.clear()
            self._skip_to_header()
            return None
        if pick.member is not cur:
            self.aside.remove(pick.member)
            self._set_aside(cur)
        yield from pick.take(piece)
        return self._after(pick.member)

    # --- batches read alone ------------------------------------------------------

    def _batch_start(self, piece: bytes) -> tuple[int, bytes, zlib._Decompress] | None:
        """The first offset of ``piece`` from which the rest reads alone (``_alone``),
        with that text and its inflater."""
        view = memoryview(piece)
        for at in range(min(len(piece), _SCAN, self.scan_budget)):
            # Most offsets fail within a few bytes, or give what no line begins with.
            try:
                head = zlib.decompressobj(wbits=-15).decompress(view[at : at + 64], 1)
            except zlib.error:
                continue
            if head not in (b"", b"{"):
                continue
            found = _alone(view[at:])
            if found is not None:
                self.scan_budget -= at
                return at, *found
        self.scan_budget -= min(len(piece), _SCAN, self.scan_budget)
        return None

    def _rescue(
        self, cur: _Member | None, piece: bytes, start: int
    ) -> Generator[bytes | Cut, None, tuple[bool, _Member | None]]:
        """Read ``piece``, which no member's reading can be trusted with, as a
        batch that stands alone, maybe after the start of one cut short.

        Returns whether it did, with the member to go on with (None: between
        members); when it did not, nothing was read and the caller reports. The batch is given
        to the one member it goes on (or else fits); when there is no such
        one, each member it fits reads on raw (``go_raw``), as the check sum
        of the one that wrote it no longer covers its text.
        """
        found = self._batch_start(piece)
        if found is None:
            return False, cur
        at, text, inflater = found
        if at:
            # The start of a batch whose writer was killed before it ended
            # (a forked child, say), or else damage.
            head, clean = _head_alone(piece[:at])
            if clean and head:
                yield head
            yield Cut(
                f"gzip bytes {start:,}-{start + at:,} are "
                + ("a batch cut short (its writer was killed)" if clean else "damaged")
                + "; read on from the batch after them",
                torn=clean,
            )
        return True, (yield from self._give(cur, text, inflater, piece[at:]))

    def _give(
        self, cur: _Member | None, text: bytes, inflater: zlib._Decompress, batch: bytes
    ) -> _Step:
        """``batch``, which read alone as ``text`` (with ``inflater``), to its member."""
        keys = _keys(text[:-1])
        assert keys is not None
        members = [m for m in (cur, *reversed(self.aside)) if m is not None and m.at_batch_end]
        fitting = [m for m in members if m.known().keys().isdisjoint(keys)]
        going_on = [m for m in fitting if m.goes_on(keys[0])]
        owners = going_on if going_on else fitting
        if len(owners) == 1:
            owner = owners[0]
            mine = None if owner.raw else _try(owner, batch)
            if mine is not None and mine.out == text and not mine.inflater.unconsumed_tail:
                for _ in mine.take(batch):  # the check sum still holds
                    pass
            else:
                owner.go_raw(inflater)
                owner.took(text, keys)
        else:
            for member in owners:
                member.go_raw()
            owner = cur if cur is not None and cur in members else _Member(self.raw.offset())
            owner.go_raw(inflater)
            owner.took(text, keys)
        owner.at_batch_end = True
        if owner in self.aside:
            self.aside.remove(owner)
        if cur is not None and cur is not owner and cur.at_batch_end:
            self._set_aside(cur)
        yield text
        return self._after(owner)

    def _resume(self, cur: _Member, at: int) -> _Step:
        """After damage in ``cur``: read on from the first batch from index ``at``
        on that reads alone, or from the next member."""
        raw = self.raw
        raw.pos = at
        cur.go_raw()
        cur.at_batch_end = True
        while True:
            end = raw.need(_READ)
            stop = end if raw.eof else max(raw.pos, end - len(_SYNC) + 1)
            sync = raw.data.find(_SYNC, raw.pos, stop)
            header = self._header_in(raw.pos, sync if sync >= 0 else stop)
            if header >= 0:
                raw.pos = header
                return _Member(raw.offset())
            if sync < 0:
                raw.pos = stop
                if raw.eof:
                    return None
                raw.compact()
                continue
            raw.pos = sync + len(_SYNC)
            batch_end = self._batch_end()
            found = _alone(raw.data[raw.pos : batch_end]) if batch_end > raw.pos else None
            if found is not None:
                batch = raw.take(batch_end)
                return (yield from self._give(cur, *found, batch))


def gunzip(
    f: BinaryIO, first: bytes, on_bytes: Callable[[int], None] | None
) -> Iterator[bytes | Cut]:
    """The text of every member of a gzip file, with a ``Cut`` where it breaks.

    ``first`` is what was read of ``f`` already; ``on_bytes`` is told of every
    raw byte read.
    """
    return _Reader(_Raw(f, first, on_bytes)).run()
