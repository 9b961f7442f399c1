"""What ties the document's slices together: flows between tries and into steps, and the counters.

Flows follow what Perfetto's JSON importer reads. A flow is bound to a slice
by ``bind_id`` with ``flow_out`` / ``flow_in`` on the event that begins the
slice (``b``, ``X``, ``n``; an ``e`` carries none); ``s`` / ``f`` flow events
bind only slices of thread tracks, never the async slices the tries are. A
slice has one ``bind_id``: a try that ends one flow and starts the next takes
both flags (one flow id, stepped on), so a sibling's tries chain on one id.
A step trains many tries and a slice ends at most one flow, so each trained
try's flow ends on a slice of its own, named after the step, at the step's
time on the run's ``trained`` track.

The importer reads events by time, ties in file order, and binds a flow's end
to the slice that last began or stepped it: a link is drawn only when its
start is not later than its end and is written before it (the runs are
written in order, each run's tries in order, and the trained track after
them). Every link is between slices that are in the document.

- A try flows to the sibling's next try (same ``prompt_id`` and
  ``generation_index``) in its run, or, when it was the sibling's last try
  there, to the sibling's first try in the run that restored its run, when
  that next try goes on with the same use of the sibling (``_same_use``, as
  ``report`` counts tries): after a try that did not seal, or after a seal
  thrown away (in a restored run, one the restored state does not hold);
  never into a later use (a prompt that comes round again).
- A sealed try flows to the first step that trained it: the tries a step
  trained are read as ``report`` reads them (``lineage``: the latest seal
  before it of each sibling of the groups it names, in its run or in the runs
  it was restored from).

The policy lag of a step is, for each try it trained, the weight version the
step is judged against (``_model.stops.step_versions``: the run's latest
``weights_synced`` before the step, by seq, else the highest version
dispatched before it), minus the weight version the try was dispatched with
(``lineage``); a step with no version, or no try with a known one, has none.
Its p50 is linear between the closest ranks, as every percentile of
``report``.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, NamedTuple

from .._model.terms import same_use
from .lineage import Lineage, TrainedStep, lag_of, quantile
from .model import RunLine, Timeline

__all__ = [
    "FIRST_FLOW_ID",
    "FLOW_IN",
    "FLOW_OUT",
    "Lag",
    "RunLinks",
    "Trained",
    "plan_links",
]

FLOW_IN, FLOW_OUT = 1, 2
# The importer numbers `s`/`f` flows (a merged Ray timeline may hold some) from
# 0 in 32 bits, in the id space `bind_id` shares: ours start above it.
FIRST_FLOW_ID = 1 << 32

Us = Callable[[float], float]


@dataclass(slots=True)
class Trained:
    """A try a step trained (try ``at`` of ``run``: the step's run, or one it
    was restored from), and the flow that ends at the step."""

    step: Any
    time: float
    run: RunLine
    at: int
    flow: int


@dataclass(slots=True)
class Lag:
    """A step's policy lag over the tries it trained whose weight version is known."""

    time: float
    step: Any
    max: float
    p50: float  # linear between the closest ranks, as ``report``'s
    tries: int


@dataclass
class RunLinks:
    """One run's flows (a flow id and flags per attempt; 0: none) and its steps' figures;
    ``start`` each attempt's start as written (``us``)."""

    start: list[float]
    flows: array[int]
    flags: bytearray
    trained: list[Trained] = field(default_factory=list)
    lags: list[Lag] = field(default_factory=list)


class _Open(NamedTuple):
    """A sibling's latest try, waiting for the next try of the same use."""

    links: RunLinks
    at: int
    start: float
    run: RunLine


def _same_use(before: RunLine, j: int, run: RunLine, i: int, tl: Timeline) -> bool:
    """Whether try ``i`` of ``run`` goes on with the use of its sibling that try
    ``j`` of ``before`` belongs to (``lineage``): the same group, and after a
    try that did not seal, or after a seal thrown away (begun after it, with a
    higher attempt number in its run, or in a run restored from it whose
    restored state does not hold the seal: ``terms.same_use``)."""
    b, t = before.tries, run.tries
    if t.group_id[i] != b.group_id[j]:
        return False  # a new use: a prompt that comes round again
    if b.outcome[j] != "sealed":
        return True
    if before is not run:
        stopped = before.run_id
        kept = tl.kept.get(stopped)
        held = kept is not None and (b.prompt_id[j], b.generation_index[j]) in kept
        return same_use(
            b.group_id[j], b.attempt[j], stopped, t.group_id[i], t.attempt[i], run.run_id, held
        )
    return t.started[i] and t.start_seq[i] > b.end_seq[j] and t.attempt[i] > b.attempt[j]


_Sibling = tuple[Any, int]


def plan_links(tl: Timeline, us: Us, starts: Sequence[list[float]]) -> list[RunLinks]:
    """Every run's flows and policy lags, in run order; ``us`` gives the time written
    for a time, ``starts`` each run's tries' starts as written."""
    by_id = {r.run_id: r for r in tl.runs}
    restored_by: dict[int, int] = {}
    for stop in tl.stops:
        stopped = by_id.get(stop.stopped_run) if stop.stopped_run is not None else None
        restored = by_id.get(stop.restored_run) if stop.restored_run is not None else None
        if stopped is not None and restored is not None and restored.index > stopped.index:
            restored_by.setdefault(stopped.index, restored.index)
    ids = itertools.count(FIRST_FLOW_ID)
    lineage = Lineage(tl)
    # Run -> its links, for the runs planned so far: a step may train a try
    # of the run it was restored from.
    done: dict[int, RunLinks] = {}
    out: list[RunLinks] = []
    # Run index -> the tries handed on to it by the run it restored.
    handed: dict[int, dict[_Sibling, _Open]] = {}
    for run, starts_of_run in zip(tl.runs, starts, strict=True):
        t = run.tries
        n = len(t)
        links = RunLinks(starts_of_run, array("Q", bytes(8 * n)), bytearray(n))
        out.append(links)
        done[id(run)] = links
        incoming = handed.pop(run.index, {})
        keys = list(zip(t.prompt_id, t.generation_index, strict=True))
        # Sibling -> its first try in this run, and its last (waiting for the next).
        first = dict(zip(reversed(keys), range(n - 1, -1, -1), strict=True))
        waiting = dict(zip(keys, range(n), strict=True))
        # A try flows in from its sibling's try before it in the run, or, as its
        # first there, from one handed on; the others (most) take no flow.
        later = compress(range(n), map(operator.ne, map(first.__getitem__, keys), range(n)))
        handed_on = map(first.__getitem__, incoming.keys() & first.keys())
        last = dict(first)
        for i in sorted(itertools.chain(later, handed_on)):
            key, start = keys[i], links.start[i]
            j = last[key]
            last[key] = i
            if j != i:
                src_links, at, src_start, before = links, j, links.start[j], run
            else:
                # Taken at the sibling's first try in this run, whatever it is.
                src_links, at, src_start, before = incoming.pop(key)
            if (
                src_start <= start
                and not src_links.flags[at] & FLOW_OUT
                and _same_use(before, at, run, i, tl)
            ):
                fid = src_links.flows[at] or next(ids)
                src_links.flows[at] = fid
                src_links.flags[at] |= FLOW_OUT
                links.flows[i] = fid
                links.flags[i] |= FLOW_IN
        if waiting and run.index in restored_by:
            to = handed.setdefault(restored_by[run.index], {})
            for key, j in waiting.items():
                to.setdefault(key, _Open(links, j, links.start[j], run))
        _train(lineage.trained(run), links, done, ids, us)
    return out


def _train(
    steps: list[TrainedStep],
    links: RunLinks,
    done: dict[int, RunLinks],
    ids: Iterator[int],
    us: Us,
) -> None:
    """Each step's flows from the tries it trained (``lineage``: its groups' latest
    seals, in its run or the runs it was restored from), and its lag."""
    for step in steps:
        at = us(step.time)
        lags: list[float] = []
        for run, i, wv in step.tries:
            their = done.get(id(run))
            # A try trained by an earlier step keeps that flow (one bind_id a slice).
            if their is not None and their.start[i] <= at and not their.flags[i] & FLOW_OUT:
                fid = their.flows[i] or next(ids)
                their.flows[i] = fid
                their.flags[i] |= FLOW_OUT
                links.trained.append(Trained(step.step, step.time, run, i, fid))
            lag = lag_of(step.weight_version, wv)
            if lag is not None:
                lags.append(lag)
        if lags:
            lags.sort()
            links.lags.append(Lag(step.time, step.step, lags[-1], quantile(lags, 0.5), len(lags)))
