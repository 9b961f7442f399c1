"""Random trace sets, one per seed: the inputs of the differential and agreement tests.

``random_trace_set(random.Random(k))`` is case ``k``: the same seed gives the
same set on every machine. Each run is what a tracer writes: ``trace_opened``
at seq 0, its events numbered on from there, ``trace_closed`` last when it
closed cleanly. The controller behind it is simulated loosely (groups, tries,
steps, weight syncs, snapshots), widened with what the commands have been
seen to read differently:

- a dispatch or a resume of an attempt that is still open (a superseded try);
- older tries left open in runs that closed cleanly and were stopped;
- restore chains: run B restores a snapshot run A published, its
  ``restore_started`` first among its rollout events, and resumes, restarts
  or leaves A's open tries;
- step_trained naming the sealed groups, weights_synced, group events;
- prompt ids that are sometimes str (rarely a str that looks like an int);
- closed runs with right or wrong counts, and seq gaps; a lost trace_opened;
- a clock that steps back, runs opened at one time, runs with no rollout
  events, unknown event kinds, hosts and pids shared across runs;
- rarely, two lines of one seq that differ (a conflicting copy).

Times are multiples of 1/4 s near 2025's Unix time: sums and differences of
them are exact in a float, so a figure differs only where a rule does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Union

import msgspec

import rollout_trace as rt

__all__ = ["AnyEvent", "T0", "encode", "has_conflicts", "random_trace_set", "run_id"]

AnyEvent = Union[rt.Event, rt.UnknownEvent]  # noqa: UP007 - a runtime alias on 3.10
Pid = Union[int, str]  # noqa: UP007

T0 = 1_750_000_000.0
_STEPS = (0.0, 0.25, 0.5, 0.5, 1.0, 1.0, 1.0, 2.5)
_encode = msgspec.json.Encoder().encode


def run_id(rng: random.Random) -> str:
    """A valid run id: 32 lowercase hex digits."""
    return f"{rng.getrandbits(128):032x}"


def encode(ev: AnyEvent) -> bytes:
    """The line a tracer writes for ``ev`` (without its newline).

    An ``UnknownEvent`` stands for a kind this package does not know: it is
    written as its writer would have, the envelope and then its fields.
    """
    if isinstance(ev, rt.UnknownEvent):
        doc = {"event": ev.event, "time": ev.time, "run_id": ev.run_id, "seq": ev.seq}
        return _encode({**doc, **ev.fields})
    return _encode(ev)


def has_conflicts(runs: list[list[AnyEvent]]) -> bool:
    """Whether two lines of one run and seq differ (a conflicting copy)."""
    for run in runs:
        seen: dict[int, bytes] = {}
        for ev in run:
            line = encode(ev)
            if seen.setdefault(ev.seq, line) != line:
                return True
    return False


@dataclass
class _Group:
    gid: str
    prompt: Pid
    size: int
    sealed: set[int] = field(default_factory=set)
    admitted: bool = False
    done: bool = False  # sealed or discarded as a group


@dataclass
class _Carry:
    """What a stopped run leaves to the run that restores it."""

    version: int
    step: int
    groups: list[_Group]
    open_tries: list[tuple[Pid, int, int, str]]  # (prompt, generation, attempt, group)
    next_attempt: dict[tuple[Pid, int], int]
    paths: list[tuple[str, int]]  # (path, step) of its snapshots and checkpoints


class _Sim:
    """One run's controller, loosely: what it emits, with times."""

    def __init__(self, rng: random.Random, n: int, t: float, prompts: list[int]) -> None:
        self.rng = rng
        self.n = n
        self.t = t
        self.body: list[tuple[float, AnyEvent]] = []
        self.version = 1
        self.step = 0
        self.groups: list[_Group] = []
        self.trained: set[str] = set()
        # (prompt, generation, attempt) -> group id, in the order they started
        self.open: dict[tuple[Pid, int, int], str] = {}
        self.next_attempt: dict[tuple[Pid, int], int] = {}
        self.paths: list[tuple[str, int]] = []
        self.prompts = prompts  # shared across runs: prompt ids stay unique in a set
        self.stepped_back = False

    # --- time and emitting ---------------------------------------------------

    def tick(self) -> None:
        self.t += self.rng.choice(_STEPS)
        if not self.stepped_back and self.rng.random() < 0.01:
            # The wall clock stepped back (NTP): later events read earlier.
            self.stepped_back = True
            self.t -= 0.75

    def emit(self, ev: AnyEvent) -> None:
        self.tick()
        self.body.append((self.t, ev))

    # --- the controller's moves ----------------------------------------------

    def new_prompt(self) -> Pid:
        self.prompts[0] += 1
        k = self.prompts[0]
        r = self.rng.random()
        if r < 0.05:
            return str(k - 1)  # "7" beside an int 7 elsewhere: two siblings
        if r < 0.25:
            return f"q{k}"
        return k

    def reserve(self) -> None:
        g = _Group(f"grp-{self.n}-{len(self.groups)}", self.new_prompt(), self.rng.randint(1, 3))
        self.groups.append(g)
        self.emit(
            rt.GroupReserved(
                group_id=g.gid,
                prompt_id=g.prompt,
                size=g.size,
                weight_version=self.version,
                target_step=self.rng.choice([None, self.step + 1]),
            )
        )

    def admit(self, g: _Group) -> None:
        g.admitted = True
        self.emit(rt.GroupAdmitted(group_id=g.gid, prompt_id=g.prompt))

    def dispatch(self, g: _Group, gen: int, attempt: int | None = None) -> None:
        sib = (g.prompt, gen)
        if attempt is None:
            attempt = self.next_attempt.get(sib, 0)
            self.next_attempt[sib] = attempt + 1
        # An attempt number still open is started again: its try is superseded.
        self.open.pop((g.prompt, gen, attempt), None)
        self.open[g.prompt, gen, attempt] = g.gid
        self.emit(
            rt.AttemptDispatched(
                group_id=g.gid,
                prompt_id=g.prompt,
                generation_index=gen,
                attempt=attempt,
                weight_version=self.version,
            )
        )

    def resume(self, key: tuple[Pid, int, int], gid: str) -> None:
        self.open.pop(key, None)
        self.open[key] = gid
        p, gen, a = key
        turn = self.rng.randint(0, 3)
        self.emit(
            rt.AttemptResumed(group_id=gid, prompt_id=p, generation_index=gen, attempt=a, turn=turn)
        )

    def end(self, key: tuple[Pid, int, int], gid: str, how: str) -> None:
        self.open.pop(key, None)
        p, gen, a = key
        if how == "seal":
            self.emit(rt.AttemptSealed(group_id=gid, prompt_id=p, generation_index=gen, attempt=a))
            for g in self.groups:
                if g.gid == gid and g.prompt == p:
                    g.sealed.add(gen)
        elif how == "refuse":
            self.emit(
                rt.AttemptRefused(
                    group_id=gid, prompt_id=p, generation_index=gen, attempt=a, reason="stale"
                )
            )
        else:
            self.emit(
                rt.AttemptAbandoned(
                    group_id=gid,
                    prompt_id=p,
                    generation_index=gen,
                    attempt=a,
                    reason=how,  # type: ignore[arg-type]
                )
            )

    def group_end(self) -> None:
        full = [g for g in self.groups if not g.done and len(g.sealed) >= g.size]
        if full and self.rng.random() < 0.8:
            g = self.rng.choice(full)
            g.done = True
            self.emit(rt.GroupSealed(group_id=g.gid, prompt_id=g.prompt))
            return
        live = [g for g in self.groups if not g.done]
        if live:
            g = self.rng.choice(live)
            g.done = True
            self.emit(rt.GroupDiscarded(group_id=g.gid, prompt_id=g.prompt, reason="stale"))

    def train(self) -> None:
        ready = [g.gid for g in self.groups if g.done and g.sealed and g.gid not in self.trained]
        names = self.rng.sample(ready, min(len(ready), self.rng.randint(0, 3)))
        if self.rng.random() < 0.1:
            names.append(f"grp-unknown-{self.rng.randint(0, 9)}")  # a group never sealed here
        self.trained.update(names)
        self.step += self.rng.choice([1, 1, 1, 2])
        self.emit(rt.StepTrained(step=self.step, group_ids=names))

    def publish(self) -> None:
        k = len(self.paths)
        if self.rng.random() < 0.7:
            path = f"/ckpt/run-{self.n}/snap-{k}"
            captured = self.t - self.rng.choice([0.0, 0.5, 3.0, 7.5])
            self.emit(rt.SnapshotPublished(step=self.step, path=path, captured_at=captured))
        else:
            path = f"/ckpt/run-{self.n}/trainer-{k}"
            self.emit(rt.TrainerCheckpointPublished(step=self.step, path=path))
        self.paths.append((path, self.step))

    def other(self) -> None:
        self.tick()
        fields = {"util": self.rng.choice([0.25, 0.5, 0.75]), "device": self.rng.randint(0, 3)}
        ev = rt.UnknownEvent(event="gpu_util", time=self.t, run_id="", seq=-1, fields=fields)
        self.body.append((self.t, ev))

    def move(self) -> None:
        """One random move of the controller."""
        rng = self.rng
        live = [g for g in self.groups if not g.done]
        r = rng.random()
        if r < 0.12 or not live:
            if len([g for g in live if len(g.sealed) < g.size]) < 3:
                self.reserve()
            else:
                self.train()
        elif r < 0.17:
            unadmitted = [g for g in live if not g.admitted]
            if unadmitted:
                self.admit(rng.choice(unadmitted))
            else:
                self.other()
        elif r < 0.45:
            g = rng.choice(live)
            gens = [i for i in range(g.size) if i not in g.sealed]
            if gens:
                self.dispatch(g, rng.choice(gens))
            else:
                self.group_end()
        elif r < 0.48 and self.open:
            # The same attempt number dispatched again while its try is open.
            _, gen, a = key = rng.choice(list(self.open))
            gid = self.open[key]
            grp = next((g for g in self.groups if g.gid == gid), None)
            if grp is not None:
                self.dispatch(grp, gen, a)
        elif r < 0.51 and self.open:
            # A resume of a try that is still open (the case).
            key = rng.choice(list(self.open))
            self.resume(key, self.open[key])
        elif r < 0.72 and self.open:
            keys = list(self.open)
            # Mostly the latest try of its sibling; sometimes an older one, late.
            key = keys[-1] if rng.random() < 0.3 else rng.choice(keys)
            how = rng.choices(
                ["seal", "failed", "refuse", "dropped", "cancelled"], [12, 3, 1, 1, 1]
            )[0]
            self.end(key, self.open[key], how)
        elif r < 0.74 and self.open:
            # A whole group restarted: each open sibling of it abandoned.
            gid = self.open[rng.choice(list(self.open))]
            for key in [k for k, v in self.open.items() if v == gid]:
                self.end(key, gid, "whole_group")
        elif r < 0.80:
            self.group_end()
        elif r < 0.86:
            self.train()
        elif r < 0.91:
            self.version += 1
            self.emit(rt.WeightsSynced(weight_version=self.version))
        elif r < 0.96:
            self.publish()
        elif r < 0.98:
            self.other()
        else:
            # An end with no start in the run: a late seal of a try long gone.
            g = rng.choice(live)
            gen = rng.randrange(g.size)
            self.end((g.prompt, gen, self.next_attempt.get((g.prompt, gen), 0) + 5), g.gid, "seal")

    # --- restores --------------------------------------------------------------

    def restore(self, carry: _Carry, earlier: list[tuple[str, int]]) -> None:
        """Begin with a restore of ``carry``'s run and take up its open tries."""
        rng = self.rng
        r = rng.random()
        if carry.paths and r < 0.75:
            path, step = rng.choice(carry.paths)
        elif earlier and r < 0.85:
            path, step = rng.choice(earlier)  # a snapshot of a run before the stopped one
        else:
            path, step = "/ckpt/missing", carry.step
        self.emit(rt.RestoreStarted(path=path, step=step))
        self.step, self.version = step, carry.version
        self.groups = [g for g in carry.groups if not g.done]
        self.next_attempt = dict(carry.next_attempt) if rng.random() < 0.5 else {}
        if rng.random() < 0.85:
            unfinished = [g.gid for g in self.groups]
            self.emit(rt.RestoreFinished(step=step, unfinished_groups=unfinished))
        whole = {gid for *_, gid in carry.open_tries if rng.random() < 0.1}
        for p, gen, a, gid in carry.open_tries:
            if gid in whole:
                self.end((p, gen, a), gid, "whole_group")
                continue
            r = rng.random()
            if r < 0.45:
                self.resume((p, gen, a), gid)
            elif r < 0.75:
                self.end((p, gen, a), gid, "restart")
        if rng.random() < 0.05 and self.groups:
            # A resume of a try the stopped run had ended.
            g = rng.choice(self.groups)
            self.resume((g.prompt, 0, 0), g.gid)

    def carry(self) -> _Carry:
        return _Carry(
            version=self.version,
            step=self.step,
            groups=self.groups,
            open_tries=[(p, g, a, gid) for (p, g, a), gid in self.open.items()],
            next_attempt=self.next_attempt,
            paths=self.paths,
        )


def _stamp(
    rng: random.Random,
    rid: str,
    opened: float,
    body: list[tuple[float, AnyEvent]],
    host: str,
    pid: int,
    closed_at: float | None,
) -> list[AnyEvent]:
    """The run's lines as its tracer numbers them; then what the writing lost."""
    events: list[AnyEvent] = [rt.TraceOpened(sdk_version="0.9.0", pid=pid, host=host)]
    events += [ev for _, ev in body]
    times = [opened, *(t for t, _ in body)]
    out: list[AnyEvent] = []
    for seq, (t, ev) in enumerate(zip(times, events, strict=True)):
        out.append(msgspec.structs.replace(ev, time=t, run_id=rid, seq=seq))
    emitted = len(out) - 1
    lost = 0
    if len(out) > 3 and rng.random() < 0.15:
        # Events dropped by a full buffer: their seqs are gaps.
        for i in sorted(rng.sample(range(1, len(out)), rng.randint(1, 2)), reverse=True):
            del out[i]
            lost += 1
    if closed_at is not None:
        right = rng.random() < 0.6
        dropped = lost if right else 0
        close = rt.TraceClosed(
            emitted=emitted, written=emitted - dropped, dropped=dropped, invalid=0
        )
        out.append(msgspec.structs.replace(close, time=closed_at, run_id=rid, seq=emitted + 1))
    if len(out) > 1 and rng.random() < 0.04:
        del out[0]  # the first line lost: a run with no trace_opened
    return out


def _conflict(rng: random.Random, runs: list[list[AnyEvent]]) -> None:
    """A second, different line for one seq of one run (two writers, a bad copy)."""
    run = rng.choice(runs)
    body = [i for i, ev in enumerate(run) if not isinstance(ev, (rt.TraceOpened, rt.TraceClosed))]
    if not body:
        return
    i = rng.choice(body)
    ev = run[i]
    if isinstance(ev, rt.AttemptDispatched) and rng.random() < 0.5:
        other: AnyEvent = msgspec.structs.replace(ev, weight_version=ev.weight_version + 1)
    else:
        other = msgspec.structs.replace(ev, time=ev.time + 0.25)
    run.insert(i + 1, other)


def random_trace_set(rng: random.Random) -> list[list[AnyEvent]]:
    """A trace set: one list of events per run, in seq order (a conflicting copy next to its
    seq's other line)."""
    runs: list[list[AnyEvent]] = []
    prompts = [0]
    earlier: list[tuple[str, int]] = []
    carry: _Carry | None = None
    t = T0 + rng.randrange(0, 4000) / 4
    opened_times: list[float] = []
    hosts = [f"node-{i}" for i in range(1, rng.randint(2, 4))]
    for n in range(rng.randint(1, 4)):
        sim = _Sim(rng, n, t, prompts)
        if carry is not None and rng.random() < 0.7:
            sim.restore(carry, earlier)
            earlier += carry.paths
        for _ in range(rng.randint(0, 40)):
            sim.move()
        closed_at = sim.t + 0.25 if rng.random() < 0.65 else None
        host = rng.choice(hosts)
        pid = rng.randint(1000, 1003)
        runs.append(_stamp(rng, run_id(rng), t, sim.body, host, pid, closed_at))
        opened_times.append(t)
        carry = sim.carry()
        t = (closed_at if closed_at is not None else sim.t) + rng.randrange(4, 160) / 4
    if rng.random() < 0.25:
        # A side process that traces no rollout work, opened with another run.
        # Opened when another run opened (a tie in the run order), or after
        # its own first event (a clock that read later for trace_opened).
        start = rng.choice(opened_times)
        side = _Sim(rng, len(runs), start, prompts)
        for _ in range(rng.randint(0, 3)):
            side.other()
        opened = start if rng.random() < 0.7 else start + 1.0
        closed_at = side.t + 0.25 if rng.random() < 0.5 else None
        side_run = _stamp(rng, run_id(rng), opened, side.body, "node-1", 1000, closed_at)
        runs.insert(rng.randrange(len(runs) + 1), side_run)
    if rng.random() < 0.04:
        _conflict(rng, runs)
    return [r for r in runs if r]
