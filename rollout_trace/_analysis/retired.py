"""What a run's sibling table (``siblings.SiblingTable``) is made of.

A live row and the rare sibling's other starts and ends (``Extra``); and for
the siblings retired from rows into records, what finds a retired key again
cheaply: the key as one int where it fits, a bit per slot of its hash, and,
once a run is read twice, its records' places by hash.
"""

from __future__ import annotations

import bisect
import math
from array import array
from typing import Any, Protocol, Union

from .protocol import SiblingKey  # (prompt_id, generation_index)

__all__ = [
    "EXTRA",
    "E_ATT",
    "E_SEQ",
    "INDEX_BITS",
    "INT64_MAX",
    "INT64_MIN",
    "PROMPT_LIMIT",
    "S_ATT",
    "S_SEQ",
    "S_TIME",
    "Z_ATT",
    "Z_SEQ",
    "Z_TIME",
    "Extra",
    "KeyCodes",
    "KeyIndex",
    "PackedKey",
    "Row",
    "SiblingKey",
    "earlier",
    "extra_of",
    "filter_of",
    "latest_seal",
    "new_row",
    "pack_key",
    "replay",
    "unpack_key",
]


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


class KeyCodes:
    """Each retired record's key as one int (``SiblingTable.r_keys``): packed where it
    fits (``pack_key``), or else -1 - its place in ``other``, a place per key, so
    that the records of one key share its code."""

    __slots__ = ("_index", "other")

    def __init__(self) -> None:
        self.other: list[SiblingKey] = []
        self._index: dict[SiblingKey, int] = {}

    def code(self, key: SiblingKey) -> int:
        """The code of ``key``, given it if it has none yet."""
        code = self.code_of(key)
        if code is None:
            code = self._index[key] = -1 - len(self.other)
            self.other.append(key)
        return code

    def code_of(self, key: SiblingKey) -> int | None:
        """The code of ``key``, or None if it was never given one."""
        packed = pack_key(key)
        return packed if isinstance(packed, int) else self._index.get(key)

    def key_of(self, code: int) -> SiblingKey:
        return unpack_key(code) if code >= 0 else self.other[-1 - code]

    def packed_of(self, code: int) -> PackedKey:
        """The key of ``code`` as ``pack_key`` gives it."""
        return code if code >= 0 else self.other[-1 - code]


def filter_of(hashes: array[int], size: int) -> bytearray:
    """A filter of ``size`` bytes with the bit of each of ``hashes`` set."""
    bits = bytearray(size)
    mask = (size << 3) - 1
    for h in hashes:
        slot = h & mask
        bits[slot >> 3] |= 1 << (slot & 7)
    return bits


class KeyIndex:
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


# A live row: the latest start (seq, attempt, time); the latest end after it
# (seq, attempt); the latest seal (seq, attempt, time); -1 or NaN for none;
# then the rare sibling's other starts and ends (``_Extra``), or None.
S_SEQ, S_ATT, S_TIME, E_SEQ, E_ATT, Z_SEQ, Z_ATT, Z_TIME, EXTRA = range(9)
Row = list[Any]


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


class Extra:
    """A sibling's starts other than its latest, and its ends after that start but one."""

    __slots__ = ("ends", "limit", "starts")

    def __init__(self) -> None:
        # By seq, so that a part merged twice adds nothing and a sibling
        # tried thousands of times costs no scan per try.
        self.starts: dict[int, tuple[int, float]] = {}  # seq -> (attempt, time)
        self.ends: dict[int, int] = {}  # seq -> attempt, each after the latest start
        self.limit = 2  # starts and ends past which they are pruned (`SiblingTable.prune`)

    def start(self, seq: int, attempt: int, t: float) -> None:
        held = self.starts.get(seq)
        if held is None or earlier((attempt, t), held):
            self.starts[seq] = (attempt, t)

    def end(self, seq: int, attempt: int) -> None:
        held = self.ends.get(seq)
        if held is None or attempt < held:
            self.ends[seq] = attempt


def latest_seal(row: Row, seq: int, attempt: int, t: float) -> None:
    held = row[Z_SEQ]
    if seq > held or (seq == held and earlier((attempt, t), (row[Z_ATT], row[Z_TIME]))):
        row[Z_SEQ], row[Z_ATT], row[Z_TIME] = seq, attempt, t


def extra_of(row: Row) -> Extra:
    extra: Extra | None = row[EXTRA]
    if extra is None:
        extra = row[EXTRA] = Extra()
    return extra


class Folding(Protocol):
    """What ``replay`` folds into (``siblings.SiblingTable``)."""

    def start(self, row: Row, seq: int, attempt: int, t: float) -> None: ...
    def end(self, row: Row, seq: int, attempt: int) -> None: ...
    def prune(self, key: SiblingKey, row: Row) -> None: ...


def replay(table: Folding, row: Row, theirs: Row, key: SiblingKey | None = None) -> None:
    """Fold the events a live row stands for into ``row`` (another row of the same sibling);
    with ``key``, prune it after (``SiblingTable.prune``)."""
    starts = [(theirs[S_SEQ], theirs[S_ATT], theirs[S_TIME])]
    ends = [(theirs[E_SEQ], theirs[E_ATT])]
    extra: Extra | None = theirs[EXTRA]
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
        latest_seal(row, theirs[Z_SEQ], theirs[Z_ATT], theirs[Z_TIME])
    if key is not None and row[EXTRA] is not None:
        table.prune(key, row)
