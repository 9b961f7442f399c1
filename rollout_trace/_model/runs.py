"""Per run, its events in seq order: the normalize stage of the model.

Events come in any order of files and lines (``Collector.add``, a block at a
time). ``normalize`` puts one run's lines in seq order and settles the lines
that share a seq: lines that decode to one event (``terms.canonical``) are
one event read twice, a **copy**, kept once; lines that differ are
conflicting **versions**, all kept, in one order (their canonical encoding,
ascending), and flagged, so no file is read a second time to tell the two
apart. Lines whose seq no tracer gives are counted and left out.

A run's lines are gathered as ``Columns``: each attempt event read from a
file is a row of a few arrays (some 45 bytes where its object took some
250), the other events are kept as objects, and ``events[i]`` gives either
back as an event equal to the line's. A ``RunEvents`` holds those columns
in seq order and what the stage found: copy counts, the seqs with
versions, the seq ranges (hence the gaps), and the lowest/highest-seq
events the run order and the stop read.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress
from typing import Any, NamedTuple, Union, overload

import msgspec

from .._schema.registry import REGISTRY
from .terms import (
    ABANDONED,
    DISPATCHED,
    KIND,
    OPENED,
    OTHER,
    REFUSED,
    RESUMED,
    SEALED,
    SEQ_LIMIT,
    STEP,
    canonical,
    is_attempt,
    is_rollout,
    run_order_key,
    usable,
)

__all__ = ["AttemptTable", "Collector", "Columns", "RunEvents", "normalize", "settle"]

_ROLLOUT_KINDS = tuple(k for k in range(256) if is_rollout(k))

_seq_of = operator.attrgetter("seq")
_time_of = operator.attrgetter("time")
_run_id_of = operator.attrgetter("run_id")
_kind_of_type: Any = KIND.get
_OTHER = itertools.repeat(OTHER)
_ZERO = itertools.repeat(0)
_NONE = itertools.repeat(None)

_prompt_of = operator.attrgetter("prompt_id")
_index_of = operator.attrgetter("generation_index")
_attempt_of = operator.attrgetter("attempt")
_group_id_of = operator.attrgetter("group_id")
_RUN_ID = itertools.repeat("run_id")
_GROUP_ID = itertools.repeat("group_id")
_NO = itertools.repeat(False)
# The built-in classes with a group id (a str, as the decoder checked).
_GROUPED = {cls: True for cls in KIND if "group_id" in cls.__struct_fields__}

# How ``Columns`` makes a row's event again.
_ROW_CLASS: dict[int, Any] = {code: cls for cls, code in KIND.items() if is_attempt(code)}
# The column that holds each field of a row.
_COLUMN_OF = {
    "prompt_id": "p",
    "generation_index": "g",
    "attempt": "a",
    "group_id": "gid",
    "weight_version": "x",
    "turn": "x",
}
# The field ``x`` holds, by kind ("": none).
_X_NAME = {DISPATCHED: "weight_version", RESUMED: "turn", SEALED: "", REFUSED: "", ABANDONED: ""}
# Kind code -> 1 for the attempt kinds, for those with a reason, and its opposite.
_ATTEMPT_FLAGS = bytes(1 if is_attempt(k) else 0 for k in range(256))
_REASON_FLAGS = bytes(1 if k in (REFUSED, ABANDONED) else 0 for k in range(256))
_NOT = bytes([1, 0] + [0] * 254)
# The kind codes that are not of attempt events (``bytes.translate``'s delete).
_NOT_ATTEMPT = bytes(k for k in range(256) if not is_attempt(k))


def _msgpack_events() -> Any:
    """A msgpack decoder of lists of the registered event classes (tagged)."""
    return REGISTRY.cached(
        "msgpack-list",
        lambda: msgspec.msgpack.Decoder(
            list[Union.__getitem__(tuple(REGISTRY.decodable_types().values()))]  # type: ignore[misc]
        ),
    )


class Columns(Sequence[Any]):
    """One run's events as columns: a sequence of events that holds few objects.

    Every event has its ``seq`` (-1 where it is not one a tracer gives),
    ``time`` (NaN where it is not a number) and ``kind``. A decoded attempt
    event (most of a trace) is a **row** of the attempt columns: ``p``
    (``prompt_id``), ``g`` (``generation_index``), ``a`` (``attempt``),
    ``gid`` (``group_id``), ``x`` (a dispatch's ``weight_version``, a
    resume's ``turn``, else 0) and ``reasons`` (row -> a refusal's or
    abandon's ``reason``). Any other event, or a block whose fields do not
    fit the columns (a ``prompt_id`` that is a name, an int past 64 bits,
    events built in Python), is **held** as it is: ``objs``, at the indices
    ``held``. ``events[i]`` gives the event either way (a row made again:
    equal to the line's event, not the same object).
    """

    __slots__ = (
        "_place",
        "a",
        "g",
        "gid",
        "held",
        "held_attempts",
        "kind",
        "objs",
        "p",
        "reasons",
        "run_id",
        "seq",
        "time",
        "x",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.seq: array[int] = array("q")
        self.time: array[float] = array("d")
        self.kind = bytearray()
        self.objs: list[Any] = []
        self.held: array[int] = array("q")
        self.held_attempts = 0  # attempt events among the held ones
        self.p: array[int] = array("q")
        self.g: array[int] = array("i")
        self.a: array[int] = array("i")
        self.gid: list[str] = []
        self.x: array[int] = array("i")
        self.reasons: dict[int, str] = {}
        self._place: tuple[bytearray, array[int]] | None = None

    def __len__(self) -> int:
        return len(self.kind)

    def place(self) -> tuple[bytearray, array[int]]:
        """Where each event is: ``held[i]`` whether event ``i`` is held as an object,
        ``before[i]`` how many held events come before it. A held event is
        ``objs[before[i]]``, any other the row ``i - before[i]``."""
        if self._place is None or len(self._place[0]) != len(self):
            held = bytearray(len(self))
            for i in self.held:
                held[i] = 1
            self._place = (held, array("i", list(itertools.accumulate(held, initial=0))))
        return self._place

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        held, before = self.place()
        k = before[i]
        return self.objs[k] if held[i] else self._row_event(i, i - k)

    def _row_event(self, i: int, r: int) -> Any:
        """Event ``i``, row ``r``, made again from its fields."""
        kind = self.kind[i]
        fields: dict[str, Any] = {
            "time": self.time[i],
            "run_id": self.run_id,
            "seq": self.seq[i],
            "group_id": self.gid[r],
            "prompt_id": self.p[r],
            "generation_index": self.g[r],
            "attempt": self.a[r],
        }
        if kind in (DISPATCHED, RESUMED):
            fields[_X_NAME[kind]] = self.x[r]
        elif kind != SEALED:
            fields["reason"] = self.reasons[r]
        return _ROW_CLASS[kind](**fields)

    def __iter__(self) -> Iterator[Any]:
        return map(self.__getitem__, range(len(self)))

    def at(self, indices: Sequence[int]) -> list[Any]:
        """``[self[i] for i in indices]``, taken in C when all are held (marks are)."""
        held, before = self.place()
        if all(map(held.__getitem__, indices)):
            return list(map(self.objs.__getitem__, map(before.__getitem__, indices)))
        return list(map(self.__getitem__, indices))

    def add(self, events: Sequence[Any], *, decoded: bool, names: dict[str, str]) -> None:
        """Append events of this run. ``decoded``: read by the reader, so of the
        schema's types (events built in Python are held as they are); ``names``
        gives one string object per group id."""
        start, n = len(self.kind), len(events)
        kinds = bytes(map(_kind_of_type, map(type, events), _OTHER))
        try:
            # An array takes a list in C, any other iterable an item at a time.
            seq = array("q", list(map(_seq_of, events)))
            time = array("d", list(map(_time_of, events)))
        except (TypeError, OverflowError):
            seq, time = _envelope(events)
            decoded = False  # made again from its fields, an event would lose its seq
        flags = kinds.translate(_ATTEMPT_FLAGS)
        if decoded:
            rows = list(compress(events, flags))
            row_kinds = kinds.translate(None, _NOT_ATTEMPT)
            try:
                # A name or an int out of a column's range holds the block as objects.
                p = array("q", list(map(_prompt_of, rows)))
                g = array("i", list(map(_index_of, rows)))
                a = array("i", list(map(_attempt_of, rows)))
                x_names = map(_X_NAME.__getitem__, row_kinds)
                x = array("i", list(map(getattr, rows, x_names, _ZERO)))
            except (TypeError, OverflowError):
                decoded = False
        self.kind += kinds
        self.seq += seq
        self.time += time
        if not decoded:
            self.objs += events
            self.held += array("q", range(start, start + n))
            self.held_attempts += n - flags.count(0)
            return
        first = len(self.p)
        for r in compress(range(len(rows)), row_kinds.translate(_REASON_FLAGS)):
            self.reasons[first + r] = rows[r].reason
        self.p += p
        self.g += g
        self.a += a
        self.x += x
        gids = list(map(_group_id_of, rows))
        self.gid += map(names.setdefault, gids, gids)
        others = flags.translate(_NOT)
        held = list(compress(events, others))
        self._share(held, names)
        self.objs += held
        self.held += array("q", list(compress(range(start, start + n), others)))

    def _share(self, events: list[Any], names: dict[str, str]) -> None:
        """Make held events of the built-in classes hold the run's one string for
        their run id and one per group id: a decoder makes one per line (some 80
        bytes each)."""
        builtin = list(compress(events, map(_kind_of_type, map(type, events), _ZERO)))
        try:
            collections.deque(map(setattr, builtin, _RUN_ID, itertools.repeat(self.run_id)), 0)
        except AttributeError:  # frozen
            return
        grouped = list(compress(builtin, map(_GROUPED.get, map(type, builtin), _NO)))
        gids = list(map(_group_id_of, grouped))
        collections.deque(map(setattr, grouped, _GROUP_ID, map(names.setdefault, gids, gids)), 0)

    def extend(self, other: Columns) -> None:
        """Append another's events (a worker's, of the same run)."""
        shift, rows = len(self), len(self.p)
        self.held += array("q", list(map(operator.add, other.held, itertools.repeat(shift))))
        self.held_attempts += other.held_attempts
        self.reasons.update((r + rows, why) for r, why in other.reasons.items())
        for name in ("seq", "time", "kind", "objs", "p", "g", "a", "gid", "x"):
            getattr(self, name).extend(getattr(other, name))

    def take(self, order: Sequence[int]) -> Columns:
        """The events at ``order``, in that order."""
        out = Columns(self.run_id)
        out.seq = array("q", list(map(self.seq.__getitem__, order)))
        out.time = array("d", list(map(self.time.__getitem__, order)))
        out.kind = bytearray(map(self.kind.__getitem__, order))
        held, before = self.place()
        for at, i in enumerate(order):
            k = before[i]
            if held[i]:
                out.held.append(at)
                out.objs.append(self.objs[k])
                out.held_attempts += is_attempt(self.kind[i])
                continue
            r = i - k
            if r in self.reasons:
                out.reasons[len(out.p)] = self.reasons[r]
            out.p.append(self.p[r])
            out.g.append(self.g[r])
            out.a.append(self.a[r])
            out.gid.append(self.gid[r])
            out.x.append(self.x[r])
        return out

    def values(self, name: str, at: Sequence[int]) -> list[Any]:
        """``self[i].<name>`` for each ``i`` of ``at`` (each event there has the field),
        read from the columns in C: no row is made again."""
        objs = self.objs
        held, before = self.place()
        k = array("q", list(map(before.__getitem__, at)))
        is_held = bytes(map(held.__getitem__, at))
        got = map(getattr, map((*objs, None).__getitem__, k), itertools.repeat(name), _NONE)
        column = _COLUMN_OF.get(name)
        if column is None and name != "reason":
            return list(got)
        rows = map(operator.sub, at, k)
        if column is None:
            from_rows = map(self.reasons.get, rows)
        else:
            values = getattr(self, column)
            # A held event's row would be another's: it reads the added last one instead.
            safe = map(tuple.__getitem__, zip(rows, itertools.repeat(len(values))), is_held)
            from_rows = map((*values, None).__getitem__, safe)
        return list(map(tuple.__getitem__, zip(from_rows, got, strict=True), is_held))

    def attempts(self) -> AttemptTable:
        """The run's attempt events as one table, in order."""
        where = array("i", list(compress(range(len(self)), self.kind.translate(_ATTEMPT_FLAGS))))
        kinds = bytes(self.kind.translate(None, _NOT_ATTEMPT))
        if not self.held_attempts:
            # Rows are exactly the attempt events, in order.
            return AttemptTable(
                where, kinds, self.p, self.g, self.a, self.gid, self.x, self.reasons
            )
        p: list[Any] = []
        g: list[Any] = []
        a: list[Any] = []
        gid: list[Any] = []
        x: list[Any] = []
        reasons: dict[int, str] = {}
        for k, i in enumerate(where):
            ev = self[i]
            p.append(ev.prompt_id)
            g.append(ev.generation_index)
            a.append(ev.attempt)
            gid.append(ev.group_id)
            x.append(getattr(ev, _X_NAME.get(kinds[k], ""), 0))
            if kinds[k] in (REFUSED, ABANDONED):
                reasons[k] = ev.reason
        return AttemptTable(where, kinds, p, g, a, gid, x, reasons)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling event objects costs some 7 us an event both ways, msgpack about
        # 0.5: the held events go as msgpack where their classes allow.
        state = {name: getattr(self, name) for name in self.__slots__}
        state["_place"] = None  # made again where it is needed
        known = set(REGISTRY.decodable_types().values())
        if all(type(ev) in known for ev in self.objs):
            with contextlib.suppress(OverflowError, TypeError):
                state["objs"] = msgspec.msgpack.encode(self.objs)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        objs = state["objs"]
        if isinstance(objs, bytes):
            state["objs"] = _msgpack_events().decode(objs)
        for name, value in state.items():
            setattr(self, name, value)


class AttemptTable(NamedTuple):
    """A run's attempt events in seq order, one per position: ``where`` its index in
    the run, ``kind``, and its fields as ``Columns`` has them (``reasons`` by position)."""

    where: array[int]
    kind: bytes
    p: Sequence[Any]
    g: Sequence[int]
    a: Sequence[int]
    gid: Sequence[str]
    x: Sequence[int]
    reasons: dict[int, str]


def _envelope(events: Sequence[Any]) -> tuple[array[int], array[float]]:
    """``seq`` and ``time`` one by one: -1 for a seq no tracer gives, NaN for a time
    that is not a number."""
    seq, time = array("q"), array("d")
    for ev in events:
        s, t = ev.seq, ev.time
        seq.append(s if isinstance(s, int) and 0 <= s < SEQ_LIMIT else -1)
        time.append(t if isinstance(t, (int, float)) else math.nan)
    return seq, time


class Collector:
    """Gathers events per run (as ``Columns``), each with the file it came from.

    ``add`` takes a block (one file's, or any batch of events); nothing is
    ordered or compared until ``normalize``.
    """

    def __init__(self, *, lines: bool = False) -> None:
        self.files: list[str] = []
        # One string object per distinct group id.
        self._names: dict[str, str] = {}
        self._file_index: dict[str, int] = {}
        # run id -> (events, the file index of each)
        self.runs: dict[str, tuple[Columns, array[int]]] = {}
        # With ``lines``: run id -> the line of each event in its file (-1: not given).
        self.lines: dict[str, array[int]] | None = {} if lines else None

    def _index(self, source: str) -> int:
        src = self._file_index.get(source, -1)
        if src < 0:
            src = self._file_index[source] = len(self.files)
            self.files.append(source)
        return src

    def _held(self, run_id: str) -> tuple[Columns, array[int]]:
        held = self.runs.get(run_id)
        if held is None:
            held = self.runs[run_id] = (Columns(run_id), array("i"))
        return held

    def merge(self, other: Collector) -> None:
        """Take in what another collector gathered (a worker's): its files keep their names."""
        remap = [self._index(f) for f in other.files]
        identity = remap == list(range(len(remap)))
        for run_id, (cols, srcs) in other.runs.items():
            held = self._held(run_id)
            held[0].extend(cols)
            held[1].extend(
                srcs if identity else array("i", [remap[s] if s >= 0 else s for s in srcs])
            )
            if self.lines is not None:
                given = None if other.lines is None else other.lines.get(run_id)
                mine = self.lines.setdefault(run_id, array("q"))
                mine.extend(given if given is not None else array("q", [-1]) * len(cols))

    def add(
        self, events: Iterable[Any], source: str | None = None, lines: Iterable[int] | None = None
    ) -> None:
        """Take a block of events; ``source`` names the file they were read from
        (None: events built in Python, kept as they are), and ``lines`` (kept by
        a collector made with ``lines=True``) their lines in it."""
        src = -1 if source is None else self._index(source)
        if not isinstance(events, list):
            events = list(events)
        at = None if lines is None else list(lines)
        if at is not None and len(at) != len(events):
            raise ValueError(f"{len(events)} events, {len(at)} lines")
        # One file per run is the norm: a block of one run is taken whole, in C.
        ids = set(map(_run_id_of, events))
        if len(ids) == 1:
            groups: dict[str, Sequence[int]] = {ids.pop(): range(len(events))}
        else:
            groups = {}
            for i, run_id in enumerate(map(_run_id_of, events)):
                groups.setdefault(run_id, []).append(i)  # type: ignore[attr-defined]
        for run_id, where in groups.items():
            block = events if len(groups) == 1 else [events[i] for i in where]
            cols, srcs = self._held(run_id)
            cols.add(block, decoded=source is not None, names=self._names)
            srcs.extend(array("i", [src]) * len(block))
            if self.lines is not None:
                mine = self.lines.setdefault(run_id, array("q"))
                if at is None:
                    mine.extend(array("q", [-1]) * len(block))
                else:
                    mine.extend(at if len(groups) == 1 else [at[i] for i in where])


class RunEvents:
    """One run after normalize: every kept event, in seq order (versions in theirs).

    ``repeats`` counts the usable lines beyond the first of their seq (copies
    and versions alike: the ``read_twice`` note); ``same_file`` and
    ``other_file`` split the copies by where the repeat was (in the file that
    already held the seq, or in another); ``versions`` lists the seqs held by
    lines that differ; ``unusable`` counts the lines left out for their seq,
    and ``left_out`` holds them: ``(event, file index, line)`` in the order
    gathered. ``sources`` are the files the run was read from (indices into
    the set's).

    Where the collector kept lines (``Collector(lines=True)``), ``src`` and
    ``line`` give, per kept event, the file and line of the first line read
    that holds it, and ``copies`` each other usable line that holds a kept
    event: ``(its index, file index, line)``, seqs ascending, each seq's in
    the order read. Otherwise ``src`` and ``line`` are None and ``copies``
    empty; a line not given is -1.
    """

    __slots__ = (
        "copies",
        "events",
        "left_out",
        "line",
        "other_file",
        "repeats",
        "run_id",
        "same_file",
        "sources",
        "src",
        "unusable",
        "versions",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.events = Columns(run_id)
        self.repeats = 0
        self.same_file = 0
        self.other_file = 0
        self.versions: list[int] = []
        self.unusable = 0
        self.sources: set[int] = set()
        self.left_out: list[tuple[Any, int, int]] = []
        self.src: array[int] | None = None
        self.line: array[int] | None = None
        self.copies: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self.events)

    @property
    def seq(self) -> array[int]:
        """Each event's seq (the columns')."""
        return self.events.seq

    @property
    def time(self) -> array[float]:
        return self.events.time

    @property
    def kind(self) -> bytearray:
        """Each event's kind code (``terms``)."""
        return self.events.kind

    # --- what the model reads of a run --------------------------------------------

    def ranges(self) -> list[tuple[int, int]]:
        """The kept seqs as inclusive ``(lo, hi)`` ranges."""
        out: list[tuple[int, int]] = []
        for s in self.seq:
            if out and s <= out[-1][1] + 1:
                if s > out[-1][1]:
                    out[-1] = (out[-1][0], s)
            else:
                out.append((s, s))
        return out

    def where(self, *kinds: int) -> list[int]:
        """The indices of the events of ``kinds``, in seq order (found in C)."""
        flags = bytearray(256)
        for k in kinds:
            flags[k] = 1
        if not any(map(is_attempt, kinds)):
            # Events held as objects are far fewer, and every other kind is among them.
            held = self.events.held
            return list(compress(held, map(flags.__getitem__, map(self.kind.__getitem__, held))))
        return list(compress(range(len(self.kind)), self.kind.translate(flags)))

    def first_of(self, *kinds: int) -> int | None:
        """The index of the lowest-seq event of one of ``kinds`` (the first version)."""
        found = [i for i in map(self.kind.find, kinds) if i >= 0]
        return min(found) if found else None

    def first_rollout(self) -> int | None:
        """The index of the run's first rollout event (``terms.is_rollout``)."""
        return self.first_of(*_ROLLOUT_KINDS)

    @property
    def last_time(self) -> float:
        """The time of the run's last event: of the highest seq, the latest of its
        versions (the stop's time, and the end of an open try's bar)."""
        seq, time = self.seq, self.time
        if not time:
            return math.nan
        i = len(seq) - 1
        t = time[i]
        while i > 0 and seq[i - 1] == seq[-1]:
            i -= 1
            t = max(t, time[i])
        return t

    @property
    def min_time(self) -> float:
        """The earliest time of a kept event (what ``summary`` shows as first)."""
        return min(self.time, default=math.nan)

    @property
    def max_time(self) -> float:
        """The latest time of a kept event (what ``summary`` shows as last)."""
        return max(self.time, default=math.nan)

    @property
    def opened_at(self) -> float | None:
        i = self.first_of(OPENED)
        return None if i is None else self.time[i]

    @property
    def order(self) -> tuple[float, str]:
        """Its place in the run order (``terms.run_order_key``)."""
        return run_order_key(self.opened_at, self.time[0] if self.time else math.nan, self.run_id)

    def steps(self) -> list[tuple[int, float]]:
        """``(step, time)`` of each ``step_trained``, in seq order."""
        ev = self.events
        return [(ev[i].step, self.time[i]) for i in self.where(STEP)]


def normalize(
    run_id: str,
    events: Columns | Sequence[Any],
    sources: Sequence[int],
    lines: Sequence[int] | None = None,
) -> RunEvents:
    """One run's lines (any order, copies and versions included) as a ``RunEvents``;
    ``lines`` (optional) the line of each in its file."""
    out = RunEvents(run_id)
    if not isinstance(events, Columns):
        cols = Columns(run_id)
        cols.add(list(events), decoded=False, names={})
        events = cols
    seqs = events.seq
    out.sources = set(sources)
    # The usual case, done column by column in C: lines in seq order, none
    # repeated, every seq usable.
    if seqs and seqs[0] >= 0 and seqs[-1] < SEQ_LIMIT and all(map(operator.lt, seqs, seqs[1:])):
        out.events = events
        if lines is not None:
            out.src = array("i", sources)
            out.line = array("q", lines)
        return out
    keep = [i for i, seq in enumerate(seqs) if usable(seq)]
    out.unusable = len(seqs) - len(keep)
    if out.unusable:
        held = set(keep)
        out.left_out = [
            (events[i], sources[i], -1 if lines is None else lines[i])
            for i in range(len(seqs))
            if i not in held
        ]
    keep.sort(key=seqs.__getitem__)
    # The index of each kept event's line (its first line, for a copy).
    kept: list[int] = []
    n = len(keep)
    j = 0
    while j < n:
        seq = seqs[keep[j]]
        k = j + 1
        while k < n and seqs[keep[k]] == seq:
            k += 1
        if k == j + 1:
            kept.append(keep[j])
        else:
            kept += settle(out, seq, keep[j:k], events, sources, lines, base=len(kept))
        j = k
    out.events = events.take(kept)
    if lines is not None:
        out.src = array("i", [sources[x] for x in kept])
        out.line = array("q", [lines[x] for x in kept])
    return out


def settle(
    out: RunEvents,
    seq: int,
    group: list[int],
    events: Sequence[Any],
    sources: Sequence[int],
    lines: Sequence[int] | None,
    *,
    base: int,
) -> list[int]:
    """Of the lines ``group`` (indices into ``events``, in the order read) that share
    ``seq``, those kept: copies once (the first read), versions in their order.

    What it finds is counted on ``out`` (``repeats``, ``same_file``,
    ``other_file``, ``versions``; ``copies`` with ``lines``, indexed from
    ``base``, where the caller puts the kept ones).
    """
    out.repeats += len(group) - 1
    files = {sources[x] for x in group}
    out.other_file += len(files) - 1
    out.same_file += len(group) - len(files)
    codes = [canonical(events[x]) for x in group]
    first: dict[bytes, int] = {}
    for x, code in zip(group, codes, strict=True):
        first.setdefault(code, x)
    if len(first) > 1:
        out.versions.append(seq)
    order = sorted(first)
    if lines is not None:
        at = {code: base + rank for rank, code in enumerate(order)}
        for x, code in zip(group, codes, strict=True):
            if first[code] != x:
                out.copies.append((at[code], sources[x], lines[x]))
    return [first[c] for c in order]
