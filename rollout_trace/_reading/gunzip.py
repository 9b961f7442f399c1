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
is read alone (``read_alone``): a batch that stands alone gives its own text with
no history, and one that refers back fails rather than give another's; the
start of a batch cut short before it is found the same way. Only when that
fails too are the bytes up to the next header skipped and reported, never
guessed at. After corrupt data, what inflates before it is kept and reading
goes on at the next batch that reads alone.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Generator, Iterator
from typing import BinaryIO

from .inflating import (
    KEPT_ASIDE,
    MAGIC,
    PROBE,
    READ,
    SCAN,
    SCAN_BUDGET,
    SEGMENT,
    SYNC,
    Alone,
    Cut,
    Member,
    Raw,
    Reading,
    good_length,
    head_alone,
    inflate,
    may_go_on,
    pick_reading,
    read_alone,
    read_with,
)

__all__ = ["Cut", "gunzip"]

# A step of the walk: text and Cuts out, then the member to go on with
# (None: between members).
_Step = Generator["bytes | Cut", None, "Member | None"]


class _Reader:
    """Walks the members of one file; ``run`` yields their text and ``Cut``s."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw
        # Members cut short at the end of a batch: their writer may go on.
        self.aside: list[Member] = []
        # File offsets of magic bytes a probe found to be data, not a header.
        self.not_headers: set[int] = set()
        # Offsets still to try as the start of a batch read alone.
        self.scan_budget = SCAN_BUDGET

    # --- where members start -----------------------------------------------------

    def _is_header(self, i: int) -> bool:
        """Whether a member starts at ``i`` (an index in ``raw.data`` holding magic).

        Its first batch is inflated: a member's text begins a line, while data
        taken for a header fails or gives random bytes.
        """
        raw = self.raw
        if raw.offset(i) in self.not_headers:
            return False
        ahead = raw.need(i - raw.pos + PROBE)
        end = ahead
        for mark, skip in ((MAGIC, 1), (SYNC, 10)):
            at = raw.data.find(mark, i + skip, end)
            if at >= 0:
                end = at + (len(SYNC) if mark is SYNC else 0)
        probe = zlib.decompressobj(wbits=31)
        first = b""
        try:
            for out in inflate(probe, raw.data[i:end]):
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
            i = self.raw.data.find(MAGIC, i, end)
            if i < 0 or self._is_header(i):
                return i
            i += 1

    def _skip_to_header(self) -> bool:
        """Move to the next member's header; False (at the end) if there is none."""
        raw = self.raw
        while True:
            raw.compact()
            end = raw.need(READ)
            last = raw.ends_at(end)
            stop = end if last else max(raw.pos, end - len(MAGIC) + 1)
            i = self._header_in(raw.pos, stop)
            if i >= 0:
                raw.pos = i
                return True
            raw.pos = stop
            if last:
                return False

    # --- the walk ------------------------------------------------------------------

    def run(self) -> Iterator[bytes | Cut]:
        raw = self.raw
        cur: Member | None = Member(0)
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

    def _piece_end(self, cur: Member) -> tuple[int, bool]:
        """Where the next piece for ``cur`` ends, and whether a header begins there.

        While members are kept aside, a piece is one batch, read whole (up to
        ``SEGMENT``) when it is to be checked.
        """
        raw = self.raw
        whole = bool(self.aside) and cur.at_batch_end
        first = raw.pos + (1 if raw.offset() == cur.start else 0)
        raw.need(READ)
        while True:
            end = len(raw.data)
            # Magic or a batch end split across two reads is found after the next.
            stop = end if raw.eof else max(raw.pos + 1, end - len(SYNC) + 1)
            sync = raw.data.find(SYNC, raw.pos, stop) if self.aside else -1
            if sync >= 0:
                stop = sync + len(SYNC)
            header = self._header_in(first, stop)
            if header >= 0:
                return header, True
            if sync >= 0 or not whole or raw.eof or stop - raw.pos >= SEGMENT:
                return stop, False
            raw.need(end - raw.pos + READ)

    def _step(self, cur: Member) -> _Step:
        """Feed ``cur`` the next piece; the member to go on with (None: between members)."""
        raw = self.raw
        if cur.lost:
            return (yield from self._resume(cur, raw.pos))
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
            for out in inflate(cur.inflater, piece):
                given += len(out)
                cur.took(out)
                yield out
        except zlib.error as exc:
            reason = f"corrupt gzip data in bytes {start:,}-{raw.offset():,} ({exc})"
            # The salvage starts where the failed call did: what that call
            # gave already is not given twice.
            good = good_length(before, piece)
            try:
                for out in inflate(before, piece[:good]):
                    skip = min(given, len(out))
                    given -= skip
                    if skip < len(out):
                        cur.took(out[skip:])
                        yield out[skip:]
            except zlib.error:
                pass  # an inflater that failed before this piece
            yield Cut(reason, torn=False)
            # Batches that stand alone are read on from after the damage.
            return (yield from self._resume(cur, raw.pos - len(piece) + good))
        cur.at_batch_end = piece.endswith(SYNC) and cur.tail.endswith(b"\n")
        return self._after(cur)

    def _after(self, member: Member) -> Member | None:
        if not member.inflater.eof:
            return member
        # The member ended inside the piece: what follows it is given back,
        # but for the trailer of a member read raw, which is not checked.
        raw = self.raw
        raw.pos -= len(member.inflater.unused_data)
        if member.raw:
            raw.need(8)
            raw.pos = min(raw.pos + 8, len(raw.data))
        return None

    def _cut(self, cur: Member) -> _Step:
        """A header begins at the position, before ``cur`` ended: ``cur`` is cut short."""
        raw = self.raw
        if cur.at_batch_end:
            self._set_aside(cur)
        yield Cut(
            f"gzip member from byte {cur.start:,} has no end: at byte {raw.offset():,} "
            "another begins (its writer was killed, or two wrote to one file)"
        )
        return Member(raw.offset())

    def _set_aside(self, member: Member) -> None:
        self.aside.append(member)
        del self.aside[:-KEPT_ASIDE]

    def _between_members(self) -> _Step:
        """After a member's end: the next member, a kept-aside one going on, or nothing."""
        raw = self.raw
        start = raw.offset()
        end = raw.need(READ)
        if raw.data.startswith(MAGIC, raw.pos):
            return Member(start)
        if self.aside:
            stop, _ = self._piece_end(self.aside[-1])
            piece = raw.data[raw.pos : stop]
            pick = pick_reading([read_with(member, piece) for member in reversed(self.aside)])
            if pick is not None:
                raw.pos = stop
                self.aside.remove(pick.member)
                return (yield from self._take(pick, piece, start))
        else:
            stop = self._batch_end()
            piece = raw.data[raw.pos : stop]
        if piece:
            # A batch after a member's end, with no header: one that reads alone
            # is a writer's that shared the member (a fork) going on.
            raw.pos = stop
            rescued, member = yield from self._rescue(None, piece, start, scan=False)
            if rescued:
                return member
            raw.pos = stop - len(piece)
        if raw.ends_at(end) and not raw.data[raw.pos : end].strip(b"\0"):
            raw.pos = end  # zeros at the end: a file system's padding after a crash
            return None
        if self._skip_zeros() and self._header_in(raw.pos, raw.need(len(MAGIC))) == raw.pos:
            # Zeros up to a member: the padding a crash leaves, then a restored
            # run's member; what the crash lost was reported with its member.
            yield Cut(f"bytes {start:,}-{raw.offset():,} are zeros (padding after a crash)")
            return Member(raw.offset())
        found = self._skip_to_header()
        yield Cut(f"bytes {start:,}-{raw.offset():,} are not gzip data", torn=False)
        return Member(raw.offset()) if found else None

    def _skip_zeros(self) -> bool:
        """Move past the zero bytes at the position; whether there were any."""
        raw = self.raw
        moved = False
        while True:
            end = raw.need(READ)
            ahead = raw.data[raw.pos : end]
            at = raw.pos + len(ahead) - len(ahead.lstrip(b"\0"))
            moved = moved or at > raw.pos
            raw.pos = at
            if at < end or raw.ends_at(end):
                return moved
            raw.compact()

    def _batch_end(self) -> int:
        """The end of the batch at the position: past its ``SYNC``, before a
        header, or where ``SEGMENT`` bytes or the file end."""
        raw = self.raw
        while True:
            end = raw.need(len(raw.data) - raw.pos + READ)
            stop = end if raw.eof else max(raw.pos + 1, end - len(SYNC) + 1)
            sync = raw.data.find(SYNC, raw.pos, stop)
            if sync >= 0:
                stop = sync + len(SYNC)
            header = self._header_in(raw.pos + 1, stop)
            if header >= 0:
                return header
            if sync >= 0 or raw.eof or stop - raw.pos >= SEGMENT:
                return stop

    def _whose(self, cur: Member, piece: bytes, start: int) -> _Step:
        """A batch read while members are kept aside: the member it goes on.

        Every member is asked, cur too: cur reads another writer's batch as
        copies of its own lines, as the others read cur's.
        """
        mine = read_with(cur, piece)
        rivals = list(reversed(self.aside))
        pick = None
        if mine is not None and mine.first_goes_on():
            # Only a member whose reading could go on too stands against cur;
            # with none, cur's reading is taken without reading it through.
            rivals = [member for member in rivals if may_go_on(member, piece)]
            if not rivals:
                pick = mine
        tries = [mine]
        if pick is None:
            tries += [read_with(member, piece) for member in rivals]
            pick = pick_reading(tries)
        if pick is None and not piece.endswith(SYNC):
            readings = [t for t in tries if t is not None]
            if readings and not any(b"\n" in t.out for t in readings):
                # The start of a batch whose writer was killed before one line
                # of it ended: nothing in it to place, or to lose.
                cur.at_batch_end = False
                yield Cut(
                    f"gzip bytes {start:,}-{self.raw.offset():,} are the start of a batch "
                    "cut short (its writer was killed)"
                )
                return cur
        if pick is None:
            rescued, member = yield from self._rescue(cur, piece, start)
            if rescued:
                return member
        if pick is None:
            # Whoever wrote this batch, its next ones may refer to it: no
            # member begun so far can be read on with its history, only batches
            # that read alone.
            yield Cut(
                f"gzip bytes from {start:,} go on none of the members begun before them, or "
                "on more than one (two writers appending to one file at once, or damage); "
                "skipped to the next batch that reads alone",
                torn=False,
            )
            self.aside.clear()
            return (yield from self._resume(cur, self.raw.pos))
        if pick.member is not cur:
            self.aside.remove(pick.member)
            self._set_aside(cur)
        return (yield from self._take(pick, piece, start))

    def _take(self, pick: Reading, piece: bytes, start: int) -> _Step:
        """``piece`` read by the member of ``pick``; if it breaks past the text
        judged by, the batch that begins where it broke is looked for."""
        member = pick.member
        yield from pick.take(piece)
        if not member.lost:
            return self._after(member)
        # A batch cut short by a kill (a forked child's), and another
        # writer's after it in the same piece: zlib fails a little after the
        # cut, so the batch that reads alone is looked for back from there.
        good = good_length(pick.before, piece)
        found = self._batch_start(piece, back_from=good)
        if found is None:
            yield Cut(
                f"corrupt gzip data in bytes {start:,}-{start + len(piece):,} ({member.lost}); "
                "read on from the next batch that reads alone",
                torn=False,
            )
            return member  # lost: the next step resumes
        at, alone = found
        yield Cut(
            f"gzip bytes {start:,}-{start + at:,} are a batch cut short (its writer was "
            "killed); read on from the batch after them",
        )
        member.lost = ""
        member.at_batch_end = True
        return (yield from self._give(member, alone, piece[at:]))

    # --- batches read alone ------------------------------------------------------

    def _batch_start(
        self, piece: bytes, *, back_from: int | None = None
    ) -> tuple[int, Alone] | None:
        """The first offset of ``piece`` from which the rest reads alone (``read_alone``),
        with what it reads as; or the last before ``back_from``."""
        view = memoryview(piece)
        tries = min(len(piece), SCAN, self.scan_budget)
        if back_from is None:
            offsets = range(tries)
        else:
            offsets = range(min(back_from, len(piece) - 1), max(-1, back_from - tries), -1)
        found, tried = None, 0
        for at in offsets:
            tried += 1
            # Most offsets fail within a few bytes, or give what no line begins with.
            try:
                head = zlib.decompressobj(wbits=-15).decompress(view[at : at + 64], 1)
            except zlib.error:
                continue
            if head not in (b"", b"{"):
                continue
            alone = read_alone(view[at:], quick=at > 0)
            if alone is not None:
                found = at, alone
                break
        self.scan_budget -= tried
        return found

    def _rescue(
        self, cur: Member | None, piece: bytes, start: int, *, scan: bool = True
    ) -> Generator[bytes | Cut, None, tuple[bool, Member | None]]:
        """Read ``piece``, which no member's reading can be trusted with, as a
        batch that stands alone, maybe after the start of one cut short.

        Returns whether it did, with the member to go on with (None: between
        members); when it did not, nothing was read and the caller reports. The batch is given
        to the one member it goes on (or else fits); when there is no such
        one, each member it fits reads on raw (``go_raw``), as the check sum
        of the one that wrote it no longer covers its text.
        """
        if scan:
            found = self._batch_start(piece)
        else:
            alone = read_alone(piece)
            found = None if alone is None else (0, alone)
        if found is None:
            return False, cur
        at, alone = found
        if at:
            # The start of a batch whose writer was killed before it ended
            # (a forked child, say), or else damage.
            head, clean = head_alone(piece[:at])
            if clean and head:
                yield head
            yield Cut(
                f"gzip bytes {start:,}-{start + at:,} are "
                + ("a batch cut short (its writer was killed)" if clean else "damaged")
                + "; read on from the batch after them",
                torn=clean,
            )
        return True, (yield from self._give(cur, alone, piece[at:]))

    def _give(self, cur: Member | None, alone: Alone, batch: bytes) -> _Step:
        """``batch``, which read alone (``read_alone``), to its member."""
        text, keys, inflater = alone
        members = [m for m in (cur, *reversed(self.aside)) if m is not None and m.at_batch_end]
        fitting = [m for m in members if m.known().keys().isdisjoint(keys)]
        going_on = [m for m in fitting if m.goes_on(keys[0])]
        owners = going_on if going_on else fitting
        if len(owners) == 1:
            owner = owners[0]
            mine = None if owner.raw else read_with(owner, batch)
            if mine is not None and mine.out == text and not mine.inflater.unconsumed_tail:
                for _ in mine.take(batch):  # the check sum still holds
                    pass
            else:
                owner.go_raw(inflater)
                owner.took(text, keys)
        else:
            for member in owners:
                member.go_raw()
            owner = cur if cur is not None and cur in members else Member(self.raw.offset())
            owner.go_raw(inflater)
            owner.took(text, keys)
        owner.at_batch_end = True
        if owner in self.aside:
            self.aside.remove(owner)
        if cur is not None and cur is not owner and cur.at_batch_end:
            self._set_aside(cur)
        yield text
        return self._after(owner)

    def _resume(self, cur: Member, at: int) -> _Step:
        """After damage in ``cur``: read on from the first batch from index ``at``
        on that reads alone, or from the next member."""
        raw = self.raw
        raw.pos = at
        cur.go_raw()
        cur.at_batch_end = True
        cur.lost = ""
        while True:
            end = raw.need(READ)
            last = raw.ends_at(end)
            stop = end if last else max(raw.pos, end - len(SYNC) + 1)
            sync = raw.data.find(SYNC, raw.pos, stop)
            header = self._header_in(raw.pos, sync if sync >= 0 else stop)
            if header >= 0:
                raw.pos = header
                return Member(raw.offset())
            if sync < 0:
                raw.pos = stop
                if last:
                    return None
                raw.compact()
                continue
            raw.pos = sync + len(SYNC)
            batch_end = self._batch_end()
            found = read_alone(raw.data[raw.pos : batch_end]) if batch_end > raw.pos else None
            if found is not None:
                batch = raw.take(batch_end)
                return (yield from self._give(cur, found, batch))


def gunzip(
    f: BinaryIO, first: bytes, on_bytes: Callable[[int], None] | None
) -> Iterator[bytes | Cut]:
    """The text of every member of a gzip file, with a ``Cut`` where it breaks.

    ``first`` is what was read of ``f`` already; ``on_bytes`` is told of every
    raw byte read.
    """
    return _Reader(Raw(f, first, on_bytes)).run()
