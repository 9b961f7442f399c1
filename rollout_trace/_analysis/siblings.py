"""A run's siblings as the restore-cost figures need them, in any arrival order.

Per sibling, three things decide every figure: its latest start (dispatch or
resume, by seq), whether an end of that attempt comes after it, and its
latest seal with the start of the sealed try. Each is the event with the
highest seq of its kind, so folding events in is commutative and two tables
of parts of one run merge exactly.

Most siblings are tried once: dispatched, then sealed. Such a sibling is
*retired* from the table of live rows (a dict) into columns of numbers: its
start and its seal are all the figures will ever need of what it has seen,
whatever else of it comes later, so a retired record is as good as its row.
A sibling that shows up again (a retry, a restart, a line read out of order)
gets a new live row; a small filter of the retired keys notices that, and
only those siblings are joined up when the figures are computed. Memory is
a live row per sibling open now, and about 60 bytes plus its key per sibling
retired.

Two events of one sibling may share a seq: the same line read twice (a second
copy of the run), or two lines that differ (a conflicting copy). Each kept
value then holds the least of them (by attempt, then time), so that which came
first does not matter, and the same line again changes nothing. Telling the
second case from the first for a retired sibling needs its record: a run read
twice gets an index of its retired keys (``_Index``, 8 bytes per record) the
first time one of them is seen again.
"""

from __future__ import annotations

import bisect
import math
from array import array
from typing import Any, NamedTuple, Union

from .._reading.lean import DISPATCHED, RESUMED, SEALED

__all__ = [
    "INDEX_BITS",
    "INT64_MAX",
    "INT64_MIN",
    "PROMPT_LIMIT",
    "EXTRA",
    "E_SEQ",
    "S_ATT",
    "S_SEQ",
    "S_TIME",
    "Row",
    "Siblings",
    "SiblingKey",
    "SiblingTable",
    "earlier",
    "new_row",
    "pack_key",
    "unpack_key",
]

# A sibling: (prompt_id, generation_index); its attempts are its tries.
SiblingKey = tuple[Union[int, str], int]  # noqa: UP007

# A live row: the latest start (seq, attempt, time); the latest end after it
# (seq, attempt); the latest seal (seq, attempt, time); -1 or NaN for none;
# then the rare sibling's other starts and ends (``_Extra``), or None.
S_SEQ, S_ATT, S_TIME, E_SEQ, E_ATT, Z_SEQ, Z_ATT, Z_TIME, EXTRA = range(9)
Row = list[Any]


# A retired sibling's key is packed into one int where its prompt id is a
# small enough non-negative int: one object of 32 bytes, where the tuple and
# the prompt id it holds take 88. A packed key is never equal to a tuple.
INDEX_BITS = 24
PROMPT_LIMIT = 1 << 38
PackedKey = Union[int, SiblingKey]  # noqa: UP007


def pack_key(key: SiblingKey) -> PackedKey:
    prompt, index = key
    if type(prompt) is int and 0 <= prompt < PROMPT_LIMIT and 0 <= index < 1 << INDEX_BITS:
        return prompt << INDEX_BITS | index
    return key


def unpack_key(key: PackedKey) -> SiblingKey:
    if isinstance(key, int):
        return (key >> INDEX_BITS, key & ((1 << INDEX_BITS) - 1))
    return key


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def new_row() -> Row:
    return [-1, -1, math.nan, -1, -1, -1, -1, math.nan, None]


def earlier(a: tuple[Any, float], b: tuple[Any, float]) -> bool:
    """Whether ``(attempt, time)`` ``a`` sorts before ``b``: which of two events with one
    seq is kept. A total order (a NaN time last), so that it holds in any arrival order."""
    if a[0] != b[0]:
        return bool(a[0] < b[0])
    x, y = a[1], b[1]
    return x < y or (y != y and x == x)


class Siblings(NamedTuple):
    """A run's siblings as the figures see them at its end.

    ``open`` maps each sibling in flight to the time its open attempt began.
    Each sibling with an ``attempt_sealed`` has an entry in the other three,
    for its last seal: its key (packed, see ``pack_key``), the seal's time,
    and the seal's time minus the start of the try it sealed (NaN where the
    run has no start of that attempt before the seal). Columns, not tuples: a run has a seal for
    nearly every sibling.
    """

    open: dict[SiblingKey, float]
    seal_keys: list[PackedKey]
    seal_times: array[float]
    seal_spans: array[float]


class _Extra:
    """A sibling's starts other than its latest, and its ends after that start but one."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        # By seq, so that a part merged twice adds nothing and a sibling
        # tried thousands of times costs no scan per try.
        self.starts: dict[int, tuple[int, float]] = {}  # seq -> (attempt, time)
        self.ends: dict[int, int] = {}  # seq -> attempt, each after the latest start

    def start(self, seq: int, attempt: int, t: float) -> None:
        held = self.starts.get(seq)
        if held is None or earlier((attempt, t), held):
            self.starts[seq] = (attempt, t)

    def end(self, seq: int, attempt: int) -> None:
        held = self.ends.get(seq)
        if held is None or attempt < held:
            self.ends[seq] = attempt


class SiblingTable:
    """Live rows for the siblings that need them, columns for the retired ones."""

    __slots__ = (
        "_index",
        "bits",
        "collide",
        "hashes",
        "r_keys",
        "r_s_att",
        "r_s_seq",
        "r_s_time",
        "r_z_att",
        "r_z_seq",
        "r_z_time",
        "rows",
    )

    def __init__(self) -> None:
        self.rows: dict[SiblingKey, Row] = {}
        self.r_keys: list[PackedKey] = []
        self.r_s_seq = array("q")
        self.r_s_att = array("q")
        self.r_s_time = array("d")
        self.r_z_seq = array("q")
        self.r_z_att = array("q")
        self.r_z_time = array("d")
        # A bit per slot, a key's slot by its hash: set for each retired key.
        # A key that finds its bit set may have a retired record already
        # (or shares the slot by chance): it goes into `collide`, and only
        # those keys are joined up with their records at the end.
        self.bits = bytearray(1 << 10)
        self.hashes = array("q")  # each retired key's hash, to size the filter anew
        self.collide: set[SiblingKey] = set()
        self._index: _Index | None = None  # made when a retired sibling is seen again

    # --- folding in -------------------------------------------------------------

    def live(self, key: SiblingKey) -> Row:
        """The live row of ``key``, made if it has none."""
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = new_row()
            if self.maybe_retired(key):
                self.collide.add(key)
        return row

    def maybe_retired(self, key: SiblingKey) -> bool:
        slot = hash(key) & ((len(self.bits) << 3) - 1)
        return bool(self.bits[slot >> 3] & (1 << (slot & 7)))

    def start(self, row: Row, seq: int, attempt: int, t: float) -> None:
        held = row[S_SEQ]
        if seq == held:
            # The same event again (a merge of overlapping parts), or another
            # with its seq (a conflicting copy): the earlier stands.
            if earlier((attempt, t), (row[S_ATT], row[S_TIME])):
                row[S_ATT], row[S_TIME] = attempt, t
            return
        if seq < held:
            _extra(row).start(seq, attempt, t)
            return
        if held >= 0:
            _extra(row).starts[held] = (row[S_ATT], row[S_TIME])
        extra: _Extra | None = row[EXTRA]
        row[S_SEQ], row[S_ATT], row[S_TIME] = seq, attempt, t
        # Only ends after the latest start can end it: forget the others (one
        # with the start's own seq too, as `end` would never have taken it).
        if row[E_SEQ] <= seq:
            row[E_SEQ] = row[E_ATT] = -1
        if extra is not None:
            extra.ends = {s: a for s, a in extra.ends.items() if s > seq}

    def end(self, row: Row, seq: int, attempt: int) -> None:
        held = row[E_SEQ]
        if seq <= row[S_SEQ]:
            return  # not after the latest start
        if seq == held:
            if attempt < row[E_ATT]:  # see `start`
                row[E_ATT] = attempt
        elif seq > held:
            if held >= 0:
                _extra(row).ends[held] = row[E_ATT]
            row[E_SEQ], row[E_ATT] = seq, attempt
        else:
            _extra(row).end(seq, attempt)

    def seal(self, key: SiblingKey, row: Row, seq: int, attempt: int, t: float) -> None:
        """An ``attempt_sealed``: an end, and maybe the latest seal; retire the row if it can."""
        self.end(row, seq, attempt)
        _latest_seal(row, seq, attempt, t)
        if (
            row[EXTRA] is None
            and row[S_SEQ] >= 0
            and row[E_SEQ] == row[Z_SEQ]
            and row[E_ATT] == row[S_ATT]
        ):
            del self.rows[key]
            self.retire(
                key, row[S_SEQ], row[S_ATT], row[S_TIME], row[Z_SEQ], row[Z_ATT], row[Z_TIME]
            )

    def retire(
        self,
        key: SiblingKey,
        s_seq: int,
        s_att: int,
        s_time: float,
        z_seq: int,
        z_att: int,
        z_time: float,
    ) -> None:
        """Keep a sibling tried once and sealed as numbers: its start and its seal."""
        if not (INT64_MIN <= s_att <= INT64_MAX and INT64_MIN <= z_att <= INT64_MAX):
            # An attempt number no array holds (corrupt, but JSON allows
            # it): the sibling stays a live row, exactly as it was.
            self.rows[key] = [s_seq, s_att, s_time, z_seq, z_att, z_seq, z_att, z_time, None]
            return
        self.r_keys.append(pack_key(key))
        self.r_s_seq.append(s_seq)
        self.r_s_att.append(s_att)
        self.r_s_time.append(s_time)
        self.r_z_seq.append(z_seq)
        self.r_z_att.append(z_att)
        self.r_z_time.append(z_time)
        h = hash(key)
        self.hashes.append(h)
        bits = self.bits
        slot = h & ((len(bits) << 3) - 1)
        bit = 1 << (slot & 7)
        if bits[slot >> 3] & bit or key in self.rows:
            self.collide.add(key)
        bits[slot >> 3] |= bit
        if len(self.hashes) << 4 > len(bits) << 3:
            self.grow()

    def grow(self) -> None:
        """Make the filter four times as large, once it has fewer than 16 slots a key
        (one key in 16 then finds its bit set by chance)."""
        self.bits = _filter(self.hashes, len(self.bits) << 2)

    def holds(self, key: SiblingKey, kind: int, seq: int, attempt: int, t: float) -> bool:
        """Whether a retired record of ``key`` makes an event whose seq was seen change nothing.

        True for a copy of its start or its seal, and for an end at or before
        a start it holds (only ends after the latest start count). False when
        in doubt: the event then gets a live row, which is never wrong.
        """
        if key in self.rows:
            return False
        h = hash(key)
        bits = self.bits
        slot = h & ((len(bits) << 3) - 1)
        if not bits[slot >> 3] & (1 << (slot & 7)):
            return False  # never retired: see `maybe_retired`
        index = self._index
        if index is None:
            index = self._index = _Index()
        packed = pack_key(key)
        for i in index.find(h, self.hashes):
            if self.r_keys[i] != packed:
                continue
            s_seq = self.r_s_seq[i]
            if kind in (DISPATCHED, RESUMED):
                if seq == s_seq and attempt == self.r_s_att[i] and t == self.r_s_time[i]:
                    return True
            elif seq <= s_seq or (
                kind == SEALED
                and seq == self.r_z_seq[i]
                and attempt == self.r_z_att[i]
                and t == self.r_z_time[i]
            ):
                return True
        return False

    def merge(self, other: SiblingTable) -> None:
        """Fold in the table of another part of the same run.

        The retired records are taken over as they are, column by column: a
        key retired in both parts, or live in one and retired in the other,
        is marked to be joined up (``collide``), as ``retire`` would.
        """
        collide = self.collide
        for key in self.rows:
            if other.maybe_retired(key):
                collide.add(key)
        for key, theirs in other.rows.items():
            row = self.live(key)
            replay(self, row, theirs)
        collide |= other.collide
        if not other.r_keys:
            return
        bits = self.bits
        mask = (len(bits) << 3) - 1
        for i, h in enumerate(other.hashes):
            slot = h & mask
            if bits[slot >> 3] & (1 << (slot & 7)):
                collide.add(unpack_key(other.r_keys[i]))
        self.r_keys += other.r_keys
        self.r_s_seq += other.r_s_seq
        self.r_s_att += other.r_s_att
        self.r_s_time += other.r_s_time
        self.r_z_seq += other.r_z_seq
        self.r_z_att += other.r_z_att
        self.r_z_time += other.r_z_time
        size = len(bits)
        while (len(self.hashes) + len(other.hashes)) << 4 > size << 3:  # as `grow` grows it
            size <<= 2
        # The filter of both is the union of the two, each at that size.
        mine = bits if len(bits) == size else _filter(self.hashes, size)
        their_bits = other.bits if len(other.bits) == size else _filter(other.hashes, size)
        both = int.from_bytes(mine, "big") | int.from_bytes(their_bits, "big")
        self.bits = bytearray(both.to_bytes(size, "big"))
        self.hashes += other.hashes

    # --- what the figures read ------------------------------------------------------

    def summary(self) -> Siblings:
        """Which siblings are in flight at the run's end, and each one's last seal.

        A sibling is in flight when its latest start (by seq) is of an
        attempt that the run has no end of after that start.
        """
        open_: dict[SiblingKey, float] = {}
        out = Siblings(open_, [], array("d"), array("d"))
        joined: dict[SiblingKey, Row] = {key: new_row() for key in self.collide}
        z_time, s_time = self.r_z_time, self.r_s_time
        for i, packed in enumerate(self.r_keys):
            row = joined.get(unpack_key(packed)) if joined else None
            if row is None:
                # Retired and never seen again: closed, and sealed once.
                out.seal_keys.append(packed)
                out.seal_times.append(z_time[i])
                out.seal_spans.append(z_time[i] - s_time[i])
                continue
            self.start(row, self.r_s_seq[i], self.r_s_att[i], s_time[i])
            self.end(row, self.r_z_seq[i], self.r_z_att[i])
            _latest_seal(row, self.r_z_seq[i], self.r_z_att[i], z_time[i])
        for key, live in self.rows.items():
            row = joined.get(key)
            if row is not None:
                replay(self, row, live)
            else:
                _judge(key, live, out)
        for key, row in joined.items():
            _judge(key, row, out)
        return out


def _filter(hashes: array[int], size: int) -> bytearray:
    """A filter of ``size`` bytes with the bit of each of ``hashes`` set."""
    bits = bytearray(size)
    mask = (size << 3) - 1
    for h in hashes:
        slot = h & mask
        bits[slot >> 3] |= 1 << (slot & 7)
    return bits


def _latest_seal(row: Row, seq: int, attempt: int, t: float) -> None:
    held = row[Z_SEQ]
    if seq > held or (seq == held and earlier((attempt, t), (row[Z_ATT], row[Z_TIME]))):
        row[Z_SEQ], row[Z_ATT], row[Z_TIME] = seq, attempt, t


class _Index:
    """Where each retired key's records are: their hashes, sorted, each with its place.

    A hash's high 32 bits and the place below them share one int64: 8 bytes a
    record (a record whose hash only shares those bits is told apart by its
    key). Records retired after the sort wait in a dict, and are sorted in
    once they are more than a quarter as many as the rest.
    """

    __slots__ = ("_later", "_sorted", "_upto")

    def __init__(self) -> None:
        self._sorted = array("q")
        self._later: dict[int, list[int]] = {}
        self._upto = 0  # the records below this are in `_sorted` or `_later`

    def find(self, h: int, hashes: array[int]) -> list[int]:
        """The places of the records whose key may hash to ``h``."""
        n = len(hashes)
        if n > self._upto:
            if n - len(self._sorted) > len(self._sorted) // 4:
                self._sorted = array("q", sorted((x >> 32) << 32 | i for i, x in enumerate(hashes)))
                self._later = {}
            else:
                for i in range(self._upto, n):
                    self._later.setdefault(hashes[i], []).append(i)
            self._upto = n
        table, high = self._sorted, h >> 32
        i = bisect.bisect_left(table, high << 32)
        out = []
        while i < len(table) and table[i] >> 32 == high:
            out.append(table[i] & 0xFFFFFFFF)
            i += 1
        later = self._later.get(h) if self._later else None
        return out if later is None else out + later


def _extra(row: Row) -> _Extra:
    extra: _Extra | None = row[EXTRA]
    if extra is None:
        extra = row[EXTRA] = _Extra()
    return extra


def replay(table: SiblingTable, row: Row, theirs: Row) -> None:
    """Fold the events a live row stands for into ``row`` (another row of the same sibling)."""
    starts = [(theirs[S_SEQ], theirs[S_ATT], theirs[S_TIME])]
    ends = [(theirs[E_SEQ], theirs[E_ATT])]
    extra: _Extra | None = theirs[EXTRA]
    if extra is not None:
        starts += [(seq, a, t) for seq, (a, t) in extra.starts.items()]
        ends += list(extra.ends.items())
    for seq, attempt, t in starts:
        if seq >= 0:
            table.start(row, seq, attempt, t)
    for seq, attempt in ends:
        if seq >= 0:
            table.end(row, seq, attempt)
    if theirs[Z_SEQ] >= 0:
        _latest_seal(row, theirs[Z_SEQ], theirs[Z_ATT], theirs[Z_TIME])


def _judge(key: SiblingKey, row: Row, out: Siblings) -> None:
    extra: _Extra | None = row[EXTRA]
    if row[S_SEQ] >= 0:
        attempt = row[S_ATT]
        ended = row[E_SEQ] >= 0 and row[E_ATT] == attempt
        if not ended and extra is not None:
            ended = attempt in extra.ends.values()
        if not ended:
            out.open[key] = row[S_TIME]
    if row[Z_SEQ] >= 0:
        out.seal_keys.append(pack_key(key))
        out.seal_times.append(row[Z_TIME])
        out.seal_spans.append(row[Z_TIME] - _began(row, extra))


def _began(row: Row, extra: _Extra | None) -> float:
    """When the try of the sibling's last seal began: its latest start before the seal."""
    sealed, attempt = row[Z_SEQ], row[Z_ATT]
    best = (-1, math.nan)
    if row[S_ATT] == attempt and 0 <= row[S_SEQ] < sealed:
        best = (row[S_SEQ], row[S_TIME])
    if extra is not None:
        for seq, (a, t) in extra.starts.items():
            if a == attempt and best[0] < seq < sealed:
                best = (seq, t)
    return best[1]
