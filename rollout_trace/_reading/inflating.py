"""The pieces the gzip walk (``gunzip``) is made of: a member being inflated
and what it wrote last, a member's reading of a batch, a batch read alone, and
the file's bytes read ahead."""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import BinaryIO, TypeAlias

import msgspec

MAGIC = b"\x1f\x8b\x08"
# The end of every batch a sink writes: an empty stored block (either flush).
SYNC = b"\x00\x00\xff\xff"
READ = 1 << 20
# The most output one inflate call returns, so a small file cannot expand
# into a huge chunk.
_OUT = 4 << 20
# Raw bytes a probe inflates to tell a member's header from compressed data
# that happens to hold the magic bytes (one in 16 MiB does): data taken for a
# header fails within bytes, for want of the history deflate refers to.
PROBE = 64 << 10
# Output a member keeps to check the next batch against: more than the 32 KiB
# that deflate can copy from.
_TAIL = 64 << 10
# (run_id, seq) pairs a member remembers: more lines than 32 KiB holds.
_RECENT = 8192
# A batch bigger than this is taken for the member it began in unchecked.
SEGMENT = 8 << 20
KEPT_ASIDE = 64
# Where no member's reading of a batch can be trusted, the batch is read
# alone (``read_alone``): its start is looked for among this many offsets of a
# piece, and among this many in all per file, as each costs an inflate call.
SCAN = 1 << 20
SCAN_BUDGET = 4 << 20
# The most text a batch read alone may give, and what is looked at first:
# a batch of trace lines has its first line whole in it.
_ALONE_OUT = 16 << 20
_ALONE_FIRST = 64 << 10


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


class _Key(msgspec.Struct, gc=False):
    run_id: str
    seq: int


_keys_of_lines = msgspec.json.Decoder(list[_Key])
_key_of_line = msgspec.json.Decoder(_Key)
_run_of = operator.attrgetter("run_id")
_seq_of = operator.attrgetter("seq")


def line_keys(text: bytes) -> list[tuple[str, int]] | None:
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


class Member:
    """One gzip member being inflated, and what it wrote last."""

    __slots__ = (
        "at_batch_end",
        "inflater",
        "last",
        "lost",
        "raw",
        "recent",
        "start",
        "tail",
        "whole",
    )

    def __init__(self, start: int) -> None:
        self.start = start
        self.inflater = zlib.decompressobj(wbits=31)
        # Read on as raw deflate, without the member's check sum (``go_raw``).
        self.raw = False
        # Why its reading broke inside a batch ("": it did not): go on at the
        # next batch.
        self.lost = ""
        self.tail = b""
        # Whether the tail is all the member's text, so begins with a line.
        self.whole = True
        # Whether the bytes fed so far end a batch: whole lines, then SYNC.
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
        keys = line_keys(out[:end])
        if keys is None:
            return False, False, None
        if len(set(keys)) != len(keys) or not self.known().keys().isdisjoint(keys):
            return False, False, keys
        return True, self.goes_on(keys[0]), keys


class Reading:
    """A member's reading of a batch, before it is taken: first just inflated,
    then judged (``judge``) when there is a doubt whose it is."""

    __slots__ = ("before", "fits", "goes_on", "inflater", "judged", "keys", "member", "out")

    def __init__(self, member: Member, piece: bytes) -> None:
        self.member = member
        self.before = member.inflater
        self.inflater = member.inflater.copy()
        # Only the batch's first _OUT bytes of text are judged by: a small
        # batch may inflate to a huge one (a long run of one byte), and a
        # reading is made for each member in doubt. The rest streams at take().
        self.out = self.inflater.decompress(piece, _OUT)
        self.fits = self.goes_on = self.judged = False
        self.keys: list[tuple[str, int]] | None = None

    def judge(self) -> Reading:
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
        if rest and not self.inflater.eof:
            try:
                for more in inflate(self.inflater, rest):
                    member.took(more)
                    yield more
            except zlib.error as exc:
                member.lost = str(exc)
                return
        member.at_batch_end = piece.endswith(SYNC) and member.tail.endswith(b"\n")


def read_with(member: Member, piece: bytes) -> Reading | None:
    try:
        return Reading(member, piece)
    except zlib.error:
        return None


def may_go_on(member: Member, piece: bytes) -> bool:
    """Whether the first line ``member`` inflates ``piece`` to goes on where it left off.

    Cheaper than a ``Reading``, as it inflates the start of the piece only.
    """
    inflater = member.inflater.copy()
    head = b""
    try:
        for out in inflate(inflater, piece[:4096]):
            head += out
    except zlib.error:
        return False
    end = head.find(b"\n")
    if end < 0:
        return True  # too little to tell
    key = _first_key(head[:end])
    return key is not None and member.goes_on(key)


def pick_reading(tries: list[Reading | None]) -> Reading | None:
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


# What a batch read alone gives: its text, the (run_id, seq) of its lines, and
# the inflater to read on with. (zlib's inflater type exists for checkers only.)
Alone: TypeAlias = "tuple[bytes, list[tuple[str, int]], zlib._Decompress]"


def read_alone(piece: bytes | memoryview, *, quick: bool = False) -> Alone | None:
    """``piece``'s text, the (run_id, seq) of its lines and its inflater, if it
    inflates with no history into whole trace lines.

    A sink flushes every batch with ``Z_FULL_FLUSH``, so each batch refers to
    nothing before it: read alone, it gives its own text, whatever was
    written before it, and whoever wrote it. Deflate that refers further back
    than the piece goes fails instead (zlib refuses a distance past the start),
    so the text, when there is one, is never another writer's lines.
    """
    inflater = zlib.decompressobj(wbits=-15)
    try:
        first = inflater.decompress(piece, _ALONE_FIRST)
    except zlib.error:
        return None
    if quick:
        # Where an offset is only tried (``_batch_start``): given up on at once
        # unless its first line is a trace line, as most wrong offsets are.
        end = first.find(b"\n")
        if not first.startswith(b"{") or end < 0 or _first_key(first[:end]) is None:
            return None
    parts = [first]
    size = len(first)
    rest = inflater.unconsumed_tail
    try:
        if rest and not inflater.eof:
            for out in inflate(inflater, rest):
                size += len(out)
                if size > _ALONE_OUT:
                    return None
                parts.append(out)
    except zlib.error:
        return None
    text = b"".join(parts)
    if not text.startswith(b"{") or not text.endswith(b"\n"):
        return None
    keys = line_keys(text[:-1])
    return None if keys is None else (text, keys, inflater)


def head_alone(piece: bytes) -> tuple[bytes, bool]:
    """What ``piece`` inflates to with no history before it fails, and whether
    it inflates without an error: the start of a batch whose writer was killed."""
    inflater = zlib.decompressobj(wbits=-15)
    parts: list[bytes] = []
    try:
        parts.extend(inflate(inflater, piece))
    except zlib.error:
        return b"".join(parts), False
    text = b"".join(parts)
    return text, text.startswith(b"{")


class Raw:
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
        if self.pos > READ and self.pos * 2 > len(self.data):
            self.base += self.pos
            self.data = self.data[self.pos :]
            self.pos = 0

    def need(self, n: int) -> int:
        """Read until ``n`` bytes lie ahead of the position or the file ends; the end index."""
        while len(self.data) - self.pos < n and not self.eof:
            more = self._f.read(max(READ, n - (len(self.data) - self.pos)))
            if not more:
                self.eof = True
                break
            if self._on_bytes is not None:
                self._on_bytes(len(more))
            self.data += more
        return min(len(self.data), self.pos + n)

    def ends_at(self, end: int) -> bool:
        """Whether index ``end`` is the end of the file (not only of what ``need`` asked)."""
        return self.eof and end == len(self.data)

    def take(self, end: int) -> bytes:
        piece = self.data[self.pos : end]
        self.pos = end
        return piece


def inflate(inflater: zlib._Decompress, data: bytes) -> Iterator[bytes]:
    out = inflater.decompress(data, _OUT)
    while out:
        yield out
        # Not once the stream ended: CPython's zlib then keeps what follows it
        # in both unconsumed_tail and unused_data, and a further call adds it
        # to unused_data a second time.
        if inflater.eof or not inflater.unconsumed_tail:
            break
        out = inflater.decompress(inflater.unconsumed_tail, _OUT)


def good_length(before: zlib._Decompress, piece: bytes) -> int:
    """The length of the longest prefix of ``piece`` that inflates without an error."""
    good, bad = 0, len(piece)
    while bad - good > 16:
        mid = (good + bad) // 2
        try:
            for _ in inflate(before.copy(), piece[:mid]):
                pass
        except zlib.error:
            bad = mid
        else:
            good = mid
    return good
