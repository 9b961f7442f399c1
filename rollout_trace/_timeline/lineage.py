"""What crosses a stop: the tries a step trained, and a sibling's tries, over restored runs.

A run restored from another (a stop, ``Timeline.stops``) carries on its
work: its groups keep their ids, a step may train groups sealed before the
stop, and a sibling's tries go on in the new run. So a run is read with the
runs before it in its restore chain (``chain``: the run, the run it was
restored from, that run's own, ...).

**Trained tries.** A ``step_trained`` trains, for each group it names (once
however often it is named), the latest seal of each sibling of that group
before it: in its own run the highest seq below the step's, else the one in
the latest run of the chain before it. An earlier
seal of a sibling that was tried again (a whole group restarted, a sibling
redone after a restore) was thrown away, not trained. A try's version is its
dispatch's; a resumed try takes it from the chain's dispatch of that try.
A step's version, the one its tries' lags are measured from, is the model's
(``RunLine.step_versions``, from ``_model.stops.step_versions``): that of the
run's latest ``weights_synced`` before it, else the highest version
dispatched before it (for a restored run, at least that of the state it
restored).

**Tries per sibling.** One use of a sibling runs from its first try to the
seal that ends it; the tries counted are its starts. A start after a seal
carries the same use on (``_model.terms.same_use``) when it is the same group
and a higher attempt number (the seal was thrown away and the sibling tried
again), or the seal was in an earlier run and the state restored after it
does not hold it (resumed or redone after a restore: sealed after the
capture, ``Timeline.kept``); otherwise it begins a new use (a prompt that
comes round again). A resume is the try it resumes, counted where that
began. Events are
taken in seq order, so a try still open when another try of the sibling
seals (hedged tries) belongs to the sealed use.
"""

from __future__ import annotations

import itertools
import math
import operator
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

from .._model.terms import same_use
from .marks import STEP
from .model import RunLine, Timeline

__all__ = ["Lineage", "TrainedStep", "TriesState", "lag_of", "quantile", "tries_pass"]

Sibling = tuple["int | str", int]


@dataclass
class TrainedStep:
    step: int
    time: float
    seq: int
    # The version the step is judged against (``_model.stops.step_versions``);
    # None: not known.
    weight_version: int | None
    # The tries it trained, each as (its run, its index there, its dispatch
    # version; None: unknown).
    tries: list[tuple[RunLine, int, int | None]]
    missing_groups: int  # groups named with no sealed try in the chain


class Lineage:
    """The restore chains of a timeline's runs, and what they let a report say."""

    def __init__(self, tl: Timeline) -> None:
        by_id = {r.run_id: r for r in tl.runs}
        self.before: dict[str, RunLine] = {}
        self.after: dict[str, RunLine] = {}
        for stop in tl.stops:
            a = by_id.get(stop.stopped_run) if stop.stopped_run is not None else None
            b = by_id.get(stop.restored_run)
            if a is not None and b is not None and a is not b:
                self.before.setdefault(b.run_id, a)
                self.after.setdefault(a.run_id, b)
        # Run id -> group id -> sibling -> its latest sealed try there; and group
        # id -> the runs filed so that sealed it (a step looks only at those).
        self._seals: dict[str, dict[str, dict[Sibling, int]]] = {}
        self._sealed_in: dict[str, list[RunLine]] = {}
        self._versions: dict[str, dict[tuple[int | str, int, int], int]] = {}

    def chain(self, run: RunLine) -> list[RunLine]:
        out = [run]
        seen = {run.run_id}
        while (prev := self.before.get(out[-1].run_id)) is not None and prev.run_id not in seen:
            seen.add(prev.run_id)
            out.append(prev)
        return out

    def _seals_of(self, run: RunLine) -> dict[str, dict[Sibling, int]]:
        """Group id -> sibling -> its latest sealed try in ``run``."""
        held = self._seals.get(run.run_id)
        if held is None:
            held = self._seals[run.run_id] = {}
            t = run.tries
            p, g, gid, end_seq = t.prompt_id, t.generation_index, t.group_id, t.end_seq
            for i in _nameable(gid, t.sealed_indices()):
                group = held.setdefault(gid[i], {})
                key = (p[i], g[i])
                old = group.get(key)
                if old is None or end_seq[i] > end_seq[old]:
                    group[key] = i
            for group_id in held:
                self._sealed_in.setdefault(group_id, []).append(run)
        return held

    def _version(self, chain: list[RunLine], run: RunLine, i: int) -> int | None:
        t = run.tries
        v = t.weight_version[i]
        if v is not None:
            return v
        key = (t.prompt_id[i], t.generation_index[i], t.attempt[i])
        for r in chain:
            versions = self._versions.get(r.run_id)
            if versions is None:
                c = r.tries
                keys = zip(c.prompt_id, c.generation_index, c.attempt, strict=True)
                versions = self._versions[r.run_id] = {
                    k: w for k, w in zip(keys, c.weight_version, strict=True) if w is not None
                }
            v = versions.get(key)
            if v is not None:
                return v
        return None

    def trained(self, run: RunLine) -> list[TrainedStep]:
        """The run's steps in seq order, each with the tries it trained."""
        chain = self.chain(run)
        t = run.tries
        p, g, gid, end_seq = t.prompt_id, t.generation_index, t.group_id, t.end_seq
        m = run.marks
        steps = [at for at, code in enumerate(m.codes) if code == STEP]
        named_by = [m.b[at] if isinstance(m.b[at], list) else [] for at in steps]
        # The run's seals of the groups steps name, before its last step, by end
        # seq, filed by group id: each group's are taken into its latest seal per
        # sibling as steps reach them.
        named = {n for names in named_by for n in names if isinstance(n, str)}
        sealed = _nameable(gid, t.sealed_indices())
        sealed = list(compress(sealed, map(named.__contains__, map(gid.__getitem__, sealed))))
        own = sorted(sealed, key=end_seq.__getitem__)
        last_step = m.seqs[steps[-1]] if steps else -1
        pending: dict[str, list[int]] = {}
        for i in own[: bisect_left(own, last_step, key=end_seq.__getitem__)]:
            pending.setdefault(gid[i], []).append(i)
        latest: dict[str, dict[Sibling, int]] = {}
        taken: dict[str, int] = {}
        versions = run.step_versions
        # The earlier runs of the chain by place, the latest first; their seals are
        # filed at the first group a step names, as they are first needed.
        earlier = chain[1:]
        place = {r.run_id: k for k, r in enumerate(earlier)}
        filed = False
        out = []
        for at, names in zip(steps, named_by, strict=True):
            seq = m.seqs[at]
            tries: list[tuple[RunLine, int, int | None]] = []
            missing = 0
            for group in dict.fromkeys(n for n in names if isinstance(n, str)):
                seals = pending.get(group, [])
                k = taken.get(group, 0)
                upto = bisect_left(seals, seq, lo=k, key=end_seq.__getitem__)
                held = latest.setdefault(group, {})
                for i in seals[k:upto]:
                    held[(p[i], g[i])] = i
                taken[group] = upto
                found = {key: (run, i) for key, i in held.items()}
                if not filed:
                    for r in earlier:
                        self._seals_of(r)
                    filed = True
                # The earlier runs that sealed the group, the latest first (its seals
                # stand): of those filed as sealing it, or of the chain, the fewer.
                sealers = self._sealed_in.get(group, ())
                if len(sealers) < len(earlier):
                    ours = sorted(
                        (r for r in sealers if r.run_id in place), key=lambda r: place[r.run_id]
                    )
                else:
                    ours = earlier
                for r in ours:
                    for key, i in self._seals[r.run_id].get(group, {}).items():
                        found.setdefault(key, (r, i))
                if not found:
                    missing += 1
                tries += [(r, i, self._version(chain, r, i)) for r, i in found.values()]
            out.append(TrainedStep(m.a[at], m.times[at], seq, versions.get(seq), tries, missing))
        return out


def _nameable(gid: Sequence[Any], tries: Sequence[int]) -> list[int]:
    """Those of ``tries`` whose group id a step can name: a str. No other id is
    looked up (one that is a list, from events built in Python, could not be)."""
    return list(compress(tries, map(isinstance, map(gid.__getitem__, tries), _STR)))


def lag_of(synced: int | None, dispatched: int | None) -> float | None:
    """The policy lag of a try, or None when a version is missing or the two are
    too far apart for a float (a corrupt 300-digit version is valid JSON)."""
    if synced is None or dispatched is None:
        return None
    try:
        return float(synced - dispatched)
    except OverflowError:
        return None


def quantile(ordered: list[float], p: float) -> float:
    """The ``p`` quantile of sorted values, linear between the closest ranks
    (numpy's default), as every percentile of a report is."""
    pos = (len(ordered) - 1) * p
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class TriesState:
    """Per sibling: the tries of its use so far, and the seal that ended it (if any)."""

    # Every sibling seen has had a try: its count is at least 1.
    count: dict[Sibling, int] = field(default_factory=dict)
    # sibling -> the seal that ended its use: its run, and its try there.
    sealed: dict[Sibling, tuple[RunLine, int]] = field(default_factory=dict)

    def finish(self) -> Counter[tuple[str, str]]:
        """The uses sealed and not yet closed, each as (the run that sealed it, its
        bucket), as if every sibling's use ended here."""
        count = self.count
        wheres = map(_RUN_ID_OF, map(_RUN_OF, self.sealed.values()))
        buckets = map(_BUCKETS.get, map(count.__getitem__, self.sealed), _MANY)
        return Counter(zip(wheres, buckets, strict=False))

    def unsealed(self) -> int:
        """Siblings with tries and no seal since: their use is open."""
        # Every sealed sibling is counted (``tries_pass`` counts a seal's sibling).
        return len(self.count) - len(self.sealed)


_BUCKETS = {0: "1", 1: "1", 2: "2"}
_MANY = itertools.repeat("3+")
_RUN_OF = operator.itemgetter(0)
_RUN_ID_OF = operator.attrgetter("run_id")


def bucket(n: int) -> str:
    """The column a use of ``n`` tries counts in."""
    return _BUCKETS.get(n, "3+")


def tries_pass(
    run: RunLine,
    state: TriesState,
    kept: dict[str, frozenset[tuple[Any, int]] | None],
) -> Counter[tuple[str, str]]:
    """Walk ``run``'s starts and seals in seq order from ``state``; the uses a new
    one closed, each as (the run that sealed it, its bucket). ``kept``: per
    stopped run, the siblings whose seal there its restored state holds
    (``Timeline.kept``). A start comes before a seal of the same seq."""
    t = run.tries
    n = len(t)
    keys = list(zip(t.prompt_id, t.generation_index, strict=True))
    sealed_flags = t.sealed_flags
    count, sealed = state.count, state.sealed
    # Siblings walk apart. One with a single try in the run and none before it
    # (most of them) ends with one try, and its seal if it sealed: taken in C.
    # The others are walked event by event.
    tries_of = Counter(keys)
    walked = {key for key, k in tries_of.items() if k > 1} | (tries_of.keys() & count.keys())
    alone = list(map(operator.not_, map(walked.__contains__, keys)))
    touched = map(operator.or_, t.started, sealed_flags)
    count.update(zip(compress(keys, map(operator.and_, alone, touched)), _ONES, strict=False))
    alone_sealed = list(map(operator.and_, alone, sealed_flags))
    at_run = zip(itertools.repeat(run), compress(range(n), alone_sealed))
    sealed.update(zip(compress(keys, alone_sealed), at_run, strict=False))
    closed: Counter[tuple[str, str]] = Counter()
    if not walked:
        return closed
    starts = list(compress(range(n), map(operator.and_, t.started, map(operator.not_, alone))))
    seals = [i for i in t.sealed_indices() if not alone[i]]
    both = starts + seals
    # Starts and seals in one order, made in C: seq, then starts first.
    at = [s * 2 for s in map(t.start_seq.__getitem__, starts)]
    at += [s * 2 + 1 for s in map(t.end_seq.__getitem__, seals)]
    order = sorted(range(len(both)), key=at.__getitem__)
    gid, attempt, turn = t.group_id, t.attempt, t.resumed_turn
    n_starts = len(starts)
    run_id = run.run_id
    for k in order:
        i = both[k]
        key = keys[i]
        if k < n_starts:
            held = sealed.pop(key, None)
            if held is not None:
                by, j = held
                where = by.run_id
                held_there = kept.get(where)
                goes_on = same_use(
                    by.tries.group_id[j],
                    by.tries.attempt[j],
                    where,
                    gid[i],
                    attempt[i],
                    run_id,
                    held_there is not None and key in held_there,
                )
                if not goes_on:
                    closed[where, bucket(count[key])] += 1
                    count[key] = 0
            # A resume goes on with a try counted where it began (if that is
            # in the set: else it is the first try seen).
            c = count.get(key, 0)
            if turn[i] is None or not c:
                count[key] = c + 1
        else:
            if key not in count:
                count[key] = 1  # its start is before the trace set: one try at least
            sealed[key] = (run, i)  # the latest seal stands
    return closed


_ONES = itertools.repeat(1)
_STR = itertools.repeat(str)
