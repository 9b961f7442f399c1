"""A run's siblings as the restore-cost figures need them, in any arrival order.

Per sibling, three things decide every figure: its latest start (dispatch or
resume, by seq), whether an end of that attempt comes after it, and its
latest seal with the start of the sealed try. Each is the event with the
highest seq of its kind, so folding events in is commutative and two tables
of parts of one run merge exactly.

Most tries are dispatched, then sealed. Such a sibling is *retired* from the
table of live rows (a dict) into columns of numbers: its start and its seal
are all the figures will ever need of what it has seen, whatever else of it
comes later, so a retired record is as good as its row. A sibling that shows
up again (its prompt reused, a retry, a restart, a line read out of order)
gets a new live row; a small filter of the retired keys notices that, and
only those siblings are joined up when the figures are computed.

A key reused a thousand times must not cost a thousand records. A record is
superseded by a later one of its key that starts the same attempt after its
seal (``compact``, run each time as many keys came back as there are
records), and a live row's start of an attempt with another start of that
attempt above it and below the row's latest seal is dropped (``prune``):
whatever arrives later, save a conflicting copy (below), no figure reads
them. Memory is a live row
per sibling open now (its starts: about one per attempt number it has used),
about 60 bytes plus its key per record (up to two per sibling between
compactions), however many times each was tried; and 32 bytes per start
dropped (the history, below), the one part that still grows with the tries.

Only a line that differs from one folded in with its seq (a conflicting
copy) can bring a dropped start back: a version of a later start with a lower
attempt, or of the dropped start itself with a higher one, changes which start
is the least at that seq. So the dropped starts are kept as numbers (``h_*``),
and folded back in when the figures are computed if the table saw a start
whose seq was seen before that no record held, or a merge of parts with seqs
in common (``unsure``); a run read once never is.

Two events of one sibling may share a seq: the same line read twice (a second
copy of the run), or two lines that differ (a conflicting copy). Each kept
value then holds the least of them (by attempt, then time), so that which came
first does not matter, and the same line again changes nothing. Telling the
second case from the first for a retired sibling needs its record: a run read
twice gets an index of its retired keys (``retired.KeyIndex``, 8 bytes per
record) the first time one of them is seen again.
"""

from __future__ import annotations

from array import array
from collections import Counter
from itertools import compress
from typing import Any

from .._reading.lean import DISPATCHED, RESUMED, SEALED
from .retired import (
    E_ATT,
    E_SEQ,
    EXTRA,
    INDEX_BITS,
    INT64_MAX,
    INT64_MIN,
    PROMPT_LIMIT,
    S_ATT,
    S_SEQ,
    S_TIME,
    Z_ATT,
    Z_SEQ,
    Z_TIME,
    Extra,
    KeyCodes,
    KeyIndex,
    PackedKey,
    Row,
    SiblingKey,
    earlier,
    extra_of,
    filter_of,
    latest_seal,
    new_row,
    pack_key,
    replay,
    unpack_key,
)
from .verdict import Siblings, judge

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


# Keys retired again before the first `SiblingTable.compact`; later, as many as
# the records it left.
_COMPACT_MIN = 64


class SiblingTable:
    """Live rows for the siblings that need them, columns for the retired ones."""

    __slots__ = (
        "_index",
        "again",
        "again_limit",
        "bits",
        "codes",
        "collide",
        "dropped",
        "h_att",
        "h_keys",
        "h_other",
        "h_seq",
        "h_time",
        "hashes",
        "history",
        "r_keys",
        "r_s_att",
        "r_s_seq",
        "r_s_time",
        "r_z_att",
        "r_z_seq",
        "r_z_time",
        "rows",
        "unsure",
    )

    def __init__(self, *, history: bool = True) -> None:
        # Without ``history``, a dropped start is forgotten: only a line that
        # differs from its copy could need it, and a reader that finds one
        # reads again with it (``CostAnalysis``).
        self.history = history
        self.rows: dict[SiblingKey, Row] = {}
        # Each record's key as an int (8 bytes, where a list of ints took 40).
        self.r_keys = array("q")
        self.codes = KeyCodes()
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
        self._index: KeyIndex | None = None  # made when a retired sibling is seen again
        # Keys retired again since the last `compact`, and how many make it due.
        self.again = 0
        self.again_limit = _COMPACT_MIN
        # The starts that no figure can read whatever comes later, unless a
        # line that differs from one folded in has its seq (see `compact`):
        # kept as numbers, and folded in at the end only if such a line came
        # (`unsure`: a start whose seq was seen, that no record held, or two
        # parts merged with seqs in common).
        # Each start's key packed (``pack_key``), or -1 - its place in `h_other`.
        self.h_keys = array("q")
        self.h_other: list[SiblingKey] = []
        self.h_seq = array("q")
        self.h_att = array("q")
        self.h_time = array("d")
        self.unsure = False
        # Starts dropped, kept in the history or not: without any, the
        # history would be empty, and a fold that keeps it gives the same.
        self.dropped = 0

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

    def start(
        self, row: Row, seq: int, attempt: int, t: float, key: SiblingKey | None = None
    ) -> None:
        """Fold a start in; with ``key``, prune the row's starts once they are many."""
        held = row[S_SEQ]
        if seq == held:
            # The same event again (a merge of overlapping parts), or another
            # with its seq (a conflicting copy): the earlier stands.
            if earlier((attempt, t), (row[S_ATT], row[S_TIME])):
                row[S_ATT], row[S_TIME] = attempt, t
            return
        if seq < held:
            extra = extra_of(row)
            extra.start(seq, attempt, t)
            if key is not None and len(extra.starts) > extra.limit:
                self.prune(key, row)
            return
        if held >= 0:
            extra_of(row).starts[held] = (row[S_ATT], row[S_TIME])
        extra = row[EXTRA]
        row[S_SEQ], row[S_ATT], row[S_TIME] = seq, attempt, t
        # Only ends after the latest start can end it: forget the others (one
        # with the start's own seq too, as `end` would never have taken it).
        if row[E_SEQ] <= seq:
            row[E_SEQ] = row[E_ATT] = -1
        if extra is not None:
            extra.ends = {s: a for s, a in extra.ends.items() if s > seq}
            if key is not None and len(extra.starts) > extra.limit:
                self.prune(key, row)

    def end(self, row: Row, seq: int, attempt: int) -> None:
        held = row[E_SEQ]
        if seq <= row[S_SEQ]:
            return  # not after the latest start
        if seq == held:
            if attempt < row[E_ATT]:  # see `start`
                row[E_ATT] = attempt
        elif seq > held:
            if held >= 0:
                extra_of(row).ends[held] = row[E_ATT]
            row[E_SEQ], row[E_ATT] = seq, attempt
        else:
            extra_of(row).end(seq, attempt)

    def seal(self, key: SiblingKey, row: Row, seq: int, attempt: int, t: float) -> None:
        """An ``attempt_sealed``: an end, and maybe the latest seal; retire the row if it can."""
        self.end(row, seq, attempt)
        latest_seal(row, seq, attempt, t)
        extra: Extra | None = row[EXTRA]
        if extra is not None and len(extra.starts) + len(extra.ends) > extra.limit:
            self.prune(key, row)
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
        self.r_keys.append(self.codes.code(key))
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
            self.again += 1
        bits[slot >> 3] |= bit
        if len(self.hashes) << 4 > len(bits) << 3:
            self.grow()
        if self.again > self.again_limit:
            self.compact()

    # --- keeping a sibling's state bounded ------------------------------------------

    def prune(self, key: SiblingKey, row: Row) -> None:
        """Move the starts of a live row that no figure can read into the history.

        A start of attempt ``a`` is read as the latest start (the highest seq
        of all) or as the start of the try a seal ends (the latest start of
        the seal's attempt below it). One with another start of ``a`` above
        it and below the row's latest seal is neither, now or later: the
        latest seal only rises and the start above it stays. Ends are kept.
        """
        extra: Extra | None = row[EXTRA]
        if extra is None:
            return
        # Pruned again once what is held has doubled, ends included (they are
        # never pruned): a prune per event would scan every start each time.
        extra.limit = max(2, 2 * (len(extra.starts) + len(extra.ends)))
        sealed = row[Z_SEQ]
        if sealed < 0:
            return
        starts = extra.starts
        top: dict[int, int] = {}  # attempt -> its highest start below the seal
        if 0 <= row[S_SEQ] < sealed:
            top[row[S_ATT]] = row[S_SEQ]
        for seq, (a, _) in starts.items():
            if seq < sealed and top.get(a, -1) < seq:
                top[a] = seq
        dead = [
            seq
            for seq, (a, _) in starts.items()
            if seq < top.get(a, -1) and INT64_MIN <= a <= INT64_MAX
        ]
        if dead:
            packed = pack_key(key)
            for seq in dead:
                a, t = starts.pop(seq)
                self.remember(packed, seq, a, t)
        extra.limit = max(2, 2 * (len(starts) + len(extra.ends)))
        if not starts and not extra.ends:
            row[EXTRA] = None

    def compact(self) -> None:
        """Drop the retired records that a later record of their key supersedes.

        Record ``A`` of a key is superseded by ``B`` when both start the same
        attempt and ``A``'s seal comes before ``B``'s start. Then ``A``'s end
        and seal are below ``B``'s start and seal, so never the end after the
        latest start nor the latest seal, whatever comes later; and ``A``'s
        start is below ``B``'s, which is below every seal that can be the
        latest, so never the latest start nor the latest start of its attempt
        before that seal. Its start goes to the history (see `__init__`). A
        key left with one record and no live row needs no join.
        """
        self.again = 0
        r_keys = self.r_keys
        n = len(r_keys)
        self.again_limit = max(_COMPACT_MIN, n)
        if not self.collide or not n:
            return
        # Only keys in `collide` have two records: their hashes pick them out.
        wanted = {hash(key) for key in self.collide}
        places = [i for i, h in enumerate(self.hashes) if h in wanted]
        s_seq, s_att, z_seq = self.r_s_seq, self.r_s_att, self.r_z_seq
        latest: dict[tuple[PackedKey, int], int] = {}  # (key, attempt) -> latest start
        for i in places:
            ka = (r_keys[i], s_att[i])
            if latest.get(ka, -1) < s_seq[i]:
                latest[ka] = s_seq[i]
        dead = [i for i in places if z_seq[i] < latest[(r_keys[i], s_att[i])]]
        if not dead:
            return
        s_time = self.r_s_time
        if not self.history:
            self.dropped += len(dead)
        elif all(r_keys[i] >= 0 for i in dead):
            self.h_keys.extend([r_keys[i] for i in dead])
            self.h_seq.extend([s_seq[i] for i in dead])
            self.h_att.extend([s_att[i] for i in dead])
            self.h_time.extend([s_time[i] for i in dead])
            self.dropped += len(dead)
        else:
            for i in dead:
                self.remember(self.codes.packed_of(r_keys[i]), s_seq[i], s_att[i], s_time[i])
        left = Counter(r_keys[i] for i in places)
        left.subtract(r_keys[i] for i in dead)
        rows, collide = self.rows, self.collide
        for code, count in left.items():
            if count == 1:
                key = self.codes.key_of(code)
                if key not in rows:
                    collide.discard(key)
        keep = bytearray(b"\x01") * n
        for i in dead:
            keep[i] = 0
        columns: tuple[Any, ...] = (
            r_keys,
            self.r_s_seq,
            self.r_s_att,
            self.r_s_time,
            self.r_z_seq,
            self.r_z_att,
            self.r_z_time,
            self.hashes,
        )
        for column in columns:  # in place: the hot loop holds their appends
            column[:] = array(column.typecode, compress(column, keep))
        self._index = None  # its places moved
        # Due again once a quarter as many keys have come back as records are
        # left: about 1.25 records a sibling at most, not 2 (10M lines, 100,000
        # siblings: 597 -> 444 MB), for about 8% more time (each compaction
        # scans every record's hash; an eighth cost 45% more time).
        self.again_limit = max(_COMPACT_MIN, len(r_keys) // 4)

    def remember(self, packed: PackedKey, seq: int, attempt: int, t: float) -> None:
        """Keep a start dropped from a row or a record in the history."""
        self.dropped += 1
        if not self.history:
            return
        if isinstance(packed, int):
            self.h_keys.append(packed)
        else:
            self.h_keys.append(-1 - len(self.h_other))
            self.h_other.append(packed)
        self.h_seq.append(seq)
        self.h_att.append(attempt)
        self.h_time.append(t)

    def _remembered(self, i: int) -> SiblingKey:
        packed = self.h_keys[i]
        return unpack_key(packed) if packed >= 0 else self.h_other[-1 - packed]

    # --- between processes ------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A table folded in another process (``--jobs``, ``--ray``): the hash of a
        key with a str in it differs from one process to the next (hash
        randomization), so what was built from those hashes is built again here,
        where the key will be looked up. Keys of ints hash alike everywhere."""
        for name, value in state.items():
            setattr(self, name, value)
        if all(type(key[0]) is int for key in self.codes.other):
            return
        self.hashes = array("q", (hash(self.codes.key_of(code)) for code in self.r_keys))
        self.bits = filter_of(self.hashes, len(self.bits))
        self._index = None

    def grow(self) -> None:
        """Make the filter four times as large, once it has fewer than 16 slots a key
        (one key in 16 then finds its bit set by chance)."""
        self.bits = filter_of(self.hashes, len(self.bits) << 2)

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
            index = self._index = KeyIndex()
        code = self.codes.code_of(key)
        if code is None:
            return False
        for i in index.find(h, self.hashes):
            if self.r_keys[i] != code:
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
        is marked to be joined up (``collide``) and counted, as ``retire``
        would (``compact`` when due). The history is taken over too.
        """
        self.unsure = self.unsure or other.unsure
        self.dropped += other.dropped
        if other.h_other:
            shift = len(self.h_other)
            self.h_keys += array("q", (k if k >= 0 else k - shift for k in other.h_keys))
            self.h_other += other.h_other
        else:
            self.h_keys += other.h_keys
        self.h_seq += other.h_seq
        self.h_att += other.h_att
        self.h_time += other.h_time
        collide = self.collide
        for key in self.rows:
            if other.maybe_retired(key):
                collide.add(key)
        for key, theirs in other.rows.items():
            row = self.live(key)
            replay(self, row, theirs, key)
        collide |= other.collide
        if not other.r_keys:
            return
        bits = self.bits
        mask = (len(bits) << 3) - 1
        for i, h in enumerate(other.hashes):
            slot = h & mask
            if bits[slot >> 3] & (1 << (slot & 7)):
                collide.add(other.codes.key_of(other.r_keys[i]))
                self.again += 1
        if other.codes.other:
            code, key_of = self.codes.code, other.codes.key_of
            self.r_keys += array("q", (c if c >= 0 else code(key_of(c)) for c in other.r_keys))
        else:
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
        mine = bits if len(bits) == size else filter_of(self.hashes, size)
        their_bits = other.bits if len(other.bits) == size else filter_of(other.hashes, size)
        both = int.from_bytes(mine, "big") | int.from_bytes(their_bits, "big")
        self.bits = bytearray(both.to_bytes(size, "big"))
        self.hashes += other.hashes
        if self.again > self.again_limit:
            self.compact()

    # --- what the figures read ------------------------------------------------------

    def summary(self) -> Siblings:
        """Which siblings are in flight at the run's end, and each one's last seal.

        A sibling is in flight when its latest start (by seq) is of an
        attempt that the run has no end of after that start.
        """
        if self.collide:
            self.compact()
        open_: dict[SiblingKey, float] = {}
        out = Siblings(open_, [], array("d"), array("d"))
        keys = set(self.collide)
        history = self.unsure and bool(self.h_keys)
        if history:
            keys.update(self._remembered(i) for i in range(len(self.h_keys)))
        joined: dict[SiblingKey, Row] = {key: new_row() for key in keys}
        coded = {self.codes.code_of(key): row for key, row in joined.items()}
        z_time, s_time, other = self.r_z_time, self.r_s_time, self.codes.other
        for i, code in enumerate(self.r_keys):
            row = coded.get(code) if coded else None
            if row is None:
                # Retired and never seen again: closed, and sealed once.
                out.seal_keys.append(code if code >= 0 else other[-1 - code])
                out.seal_times.append(z_time[i])
                out.seal_spans.append(z_time[i] - s_time[i])
                continue
            self.start(row, self.r_s_seq[i], self.r_s_att[i], s_time[i])
            # A record's end is of the attempt it started: `seal` retires no other.
            self.end(row, self.r_z_seq[i], self.r_s_att[i])
            latest_seal(row, self.r_z_seq[i], self.r_z_att[i], z_time[i])
        if history:
            for i in range(len(self.h_keys)):
                row = joined[self._remembered(i)]
                self.start(row, self.h_seq[i], self.h_att[i], self.h_time[i])
        for key, live in self.rows.items():
            row = joined.get(key)
            if row is not None:
                replay(self, row, live)
            else:
                judge(key, live, out)
        for key, row in joined.items():
            judge(key, row, out)
        return out
