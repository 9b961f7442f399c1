"""The demo's controller: a ledger of groups, a rollout pump, a train pump, snapshots.

Its shape is the seed pull request's: groups of ``GROUP_SIZE`` generations go to
worker slots; every ``GROUPS_PER_STEP`` sealed groups train a step, after which
the weights are synced and tries too stale are dropped; trainer checkpoints
and rollout snapshots are published now and then; a restored controller
resumes the tries the snapshot saw mid-way and starts the rest over.
Every transition is an event of the rollout schema.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import rollout_trace as rt

from .sim import EPOCH, Plan, Request, Signal, Sim

__all__ = ["Controller", "GenerateFn"]

GROUP_SIZE = 4
GROUPS_PER_STEP = 2
SLOTS = 8
# Groups reserved but not yet trained, at most: rollout runs about a step ahead.
AHEAD_GROUPS = 3 * GROUPS_PER_STEP
# A try whose weights are more than this many versions old is dropped at a sync.
MAX_LAG = 2
TOTAL_STEPS = 16
CHECKPOINT_EVERY = 3
# Simulated seconds of each piece of work.
RESERVE_S = 0.25
DISPATCH_S = 0.1
REFUSED_AFTER_S = 0.4
RETRY_AFTER_S = 3.0
TRAIN_S = 4.0
SYNC_S = 1.5
CHECKPOINT_S = 4.0
# A rollout snapshot is taken when the trainer picks up a batch, at most this often.
SNAPSHOT_EVERY_S = 40.0
SNAPSHOT_S = 2.5
RESTORE_S = 4.0

GenerateFn = Callable[[int, Request], Awaitable[Plan]]
# What the controller itself abandons a running try for (a failed try reports
# its own abandon; a restore reports `restart`).
DemoAbandonReason = Literal["whole_group", "dropped", "cancelled"]


@dataclass
class Sibling:
    index: int
    # queued (waiting for a slot), running, failed (waiting to retry) or sealed
    state: str = "queued"
    attempt: int = -1
    turns_done: int = 0
    failures: int = 0
    version: int = 0


@dataclass
class Group:
    group_id: str
    prompt_id: int
    weight_version: int
    target_step: int
    siblings: list[Sibling] = field(default_factory=list)
    restarts: int = 0

    @classmethod
    def load(cls, d: dict[str, Any]) -> Group:
        sibs = [Sibling(**s) for s in d.pop("siblings")]
        return cls(**d, siblings=sibs)


class Controller:
    def __init__(
        self,
        sim: Sim,
        tracer: rt.Tracer,
        generate: GenerateFn,
        out: Path,
        seed: int,
        run_number: int,
    ) -> None:
        self.sim, self.tracer, self.generate = sim, tracer, generate
        self.out, self.seed, self.run_number = out, seed, run_number
        self.step = 0
        self.version = 0
        self.next_prompt = 0
        self.groups: dict[str, Group] = {}  # unfinished, in reservation order
        self.ready: list[Group] = []  # sealed, waiting for the trainer
        self.training: list[Group] = []
        self.queue: deque[tuple[Group, Sibling]] = deque()
        self.free = list(range(SLOTS))
        self.slot_of: dict[tuple[str, int], int] = {}
        self.changed = Signal(sim)
        self.finished = False
        self.started_at = sim.now()
        self.captures: list[float] = []
        # What the demo's stop point looks at: when steps trained and tries
        # sealed, how many failed, and each published snapshot's capture and
        # publish times with the tries it saw running and their turns done.
        self.step_times: list[float] = []
        # (time, (group_id, generation_index, attempt)) of each seal.
        self.seals: list[tuple[float, tuple[str, int, int]]] = []
        self.failures = 0
        self.published: list[tuple[float, float, dict[tuple[str, int, int], int]]] = []

    def emit(self, event: rt.Event) -> None:
        # Looked up each time: the tracer swaps its emit when it opens and closes.
        self.tracer.emit(event)

    def start(self) -> None:
        self.sim.spawn(self.rollout_pump(), "rollout pump")
        self.sim.spawn(self.train_pump(), "train pump")

    # --- rollout ------------------------------------------------------------

    async def rollout_pump(self) -> None:
        while not self.finished:
            if self.queue and self.free:
                await self.sim.sleep(DISPATCH_S)
                # A discarded group may have emptied the queue meanwhile.
                if self.queue and self.free and not self.finished:
                    self.dispatch(*self.queue.popleft())
            elif len(self.groups) + len(self.ready) + len(self.training) < AHEAD_GROUPS:
                await self.sim.sleep(RESERVE_S)
                self.reserve()
            else:
                await self.changed.wait()

    def reserve(self) -> None:
        pid = self.next_prompt
        self.next_prompt += 1
        ahead = len(self.groups) + len(self.ready) + len(self.training)
        g = Group(
            group_id=f"r{self.run_number}-p{pid:04d}",
            prompt_id=pid,
            weight_version=self.version,
            target_step=self.step + 1 + ahead // GROUPS_PER_STEP,
            siblings=[Sibling(i) for i in range(GROUP_SIZE)],
        )
        self.groups[g.group_id] = g
        self.emit(
            rt.GroupReserved(
                group_id=g.group_id,
                prompt_id=pid,
                size=GROUP_SIZE,
                weight_version=self.version,
                target_step=g.target_step,
            )
        )
        self.emit(rt.GroupAdmitted(group_id=g.group_id, prompt_id=pid))
        self.queue.extend((g, s) for s in g.siblings)

    def dispatch(self, g: Group, s: Sibling) -> None:
        s.attempt += 1
        s.state, s.turns_done, s.version = "running", 0, self.version
        self.emit(
            rt.AttemptDispatched(
                group_id=g.group_id,
                prompt_id=g.prompt_id,
                generation_index=s.index,
                attempt=s.attempt,
                weight_version=s.version,
            )
        )
        self.take_slot(g, s)

    def take_slot(self, g: Group, s: Sibling, from_turn: int = 0) -> None:
        self.free.sort()
        slot = self.free.pop(0)
        self.slot_of[(g.group_id, s.index)] = slot
        name = f"try {g.group_id}/{s.index}/{s.attempt}"
        self.sim.spawn(self.run_try(slot, g, s, s.attempt, from_turn), name)

    def release(self, g: Group, s: Sibling) -> None:
        self.free.append(self.slot_of.pop((g.group_id, s.index)))
        self.changed.notify()

    def running(self) -> set[tuple[str, int, int]]:
        """The tries running now, as (group_id, generation_index, attempt)."""
        return {
            (g.group_id, s.index, s.attempt)
            for g in self.groups.values()
            for s in g.siblings
            if s.state == "running"
        }

    def current(self, g: Group, s: Sibling, attempt: int) -> bool:
        """Whether this try still counts: not dropped, restarted or discarded meanwhile."""
        live = self.groups.get(g.group_id) is g and not self.finished
        return live and s.state == "running" and s.attempt == attempt

    async def run_try(self, slot: int, g: Group, s: Sibling, attempt: int, from_turn: int) -> None:
        req = Request(self.seed, g.group_id, g.prompt_id, s.index, attempt)
        plan = await self.generate(slot, req)
        ids: dict[str, Any] = {
            "group_id": g.group_id,
            "prompt_id": g.prompt_id,
            "generation_index": s.index,
            "attempt": attempt,
        }
        if plan.outcome == "refused":
            await self.sim.sleep(REFUSED_AFTER_S)
            if self.current(g, s, attempt):
                self.emit(rt.AttemptRefused(**ids, reason=plan.refuse_reason))
                s.state = "queued"
                self.queue.append((g, s))
                self.release(g, s)
            return
        for turn in range(from_turn, len(plan.turns)):
            await self.sim.sleep(plan.turns[turn])
            if not self.current(g, s, attempt):
                return
            if turn == plan.fail_turn:
                self.emit(rt.AttemptAbandoned(**ids, reason="failed"))
                self.release(g, s)
                self.failed(g, s, attempt)
                return
            s.turns_done = turn + 1
        self.emit(rt.AttemptSealed(**ids))
        self.seals.append((self.sim.now(), (g.group_id, s.index, attempt)))
        s.state = "sealed"
        self.release(g, s)
        if all(x.state == "sealed" for x in g.siblings):
            self.emit(rt.GroupSealed(group_id=g.group_id, prompt_id=g.prompt_id))
            del self.groups[g.group_id]
            self.ready.append(g)

    def failed(self, g: Group, s: Sibling, attempt: int) -> None:
        self.failures += 1
        s.failures += 1
        s.state = "failed"
        if s.failures < 2:
            self.sim.spawn(self.retry(g, s, attempt), f"retry {g.group_id}/{s.index}")
            return
        # A sibling that fails twice takes its group down: restart it once,
        # then give the prompt up.
        for other in g.siblings:
            if other.state == "running":
                self.abandon(g, other, "whole_group")
        self.queue = deque(item for item in self.queue if item[0] is not g)
        if g.restarts:
            self.emit(
                rt.GroupDiscarded(group_id=g.group_id, prompt_id=g.prompt_id, reason="failing")
            )
            del self.groups[g.group_id]
            return
        g.restarts += 1
        for other in g.siblings:
            other.state, other.failures = "queued", 0
            self.queue.append((g, other))

    async def retry(self, g: Group, s: Sibling, attempt: int) -> None:
        await self.sim.sleep(RETRY_AFTER_S)
        live = self.groups.get(g.group_id) is g
        if live and s.state == "failed" and s.attempt == attempt:
            s.state = "queued"
            self.queue.append((g, s))
            self.changed.notify()

    def abandon(self, g: Group, s: Sibling, reason: DemoAbandonReason) -> None:
        self.emit(
            rt.AttemptAbandoned(
                group_id=g.group_id,
                prompt_id=g.prompt_id,
                generation_index=s.index,
                attempt=s.attempt,
                reason=reason,
            )
        )
        s.state = "queued"
        self.release(g, s)

    # --- training, checkpoints, snapshots -----------------------------------

    async def train_pump(self) -> None:
        while not self.finished:
            if len(self.ready) < GROUPS_PER_STEP:
                await self.changed.wait()
                continue
            self.training = self.ready[:GROUPS_PER_STEP]
            del self.ready[:GROUPS_PER_STEP]
            since = self.sim.now() - (self.captures[-1] if self.captures else self.started_at)
            if since >= SNAPSHOT_EVERY_S:
                self.captures.append(self.sim.now())
                self.sim.spawn(self.snapshot(), "snapshot")
            await self.sim.sleep(TRAIN_S)
            self.step += 1
            self.emit(rt.StepTrained(step=self.step, group_ids=[g.group_id for g in self.training]))
            self.step_times.append(self.sim.now())
            self.training = []
            self.changed.notify()
            await self.sim.sleep(SYNC_S)
            self.version += 1
            self.emit(rt.WeightsSynced(weight_version=self.version))
            self.drop_stale()
            if self.step % CHECKPOINT_EVERY == 0:
                await self.sim.sleep(CHECKPOINT_S)
                path = self.out / "checkpoints" / f"step-{self.step:04d}.json"
                write_json(path, {"step": self.step, "weight_version": self.version})
                self.emit(rt.TrainerCheckpointPublished(step=self.step, path=str(path)))
            if self.step >= TOTAL_STEPS:
                self.finish()

    def drop_stale(self) -> None:
        for g in list(self.groups.values()):
            for s in g.siblings:
                if s.state == "running" and s.version < self.version - MAX_LAG:
                    self.abandon(g, s, "dropped")
                    self.queue.append((g, s))

    def finish(self) -> None:
        for g in list(self.groups.values()):
            for s in g.siblings:
                if s.state == "running":
                    self.abandon(g, s, "cancelled")
        for g in [*self.groups.values(), *self.ready]:
            self.emit(
                rt.GroupDiscarded(group_id=g.group_id, prompt_id=g.prompt_id, reason="run_end")
            )
        self.finished = True
        self.changed.notify()

    async def snapshot(self) -> None:
        """Publish a rollout snapshot of the state now (a step boundary)."""
        captured_at = self.sim.now()
        # The state is copied now; writing it takes a while, and a kill
        # before the write ends leaves the previous snapshot the latest.
        state = json.loads(json.dumps(self.capture()))
        await self.sim.sleep(SNAPSHOT_S)
        name = f"snapshot-t{round(captured_at - EPOCH):05d}.json"
        path = self.out / "snapshots" / name
        write_json(path, state)
        write_json(self.out / "snapshots" / "latest.json", {"path": str(path)})
        self.emit(rt.SnapshotPublished(step=state["step"], path=str(path), captured_at=captured_at))
        seen = {
            (g["group_id"], s["index"], s["attempt"]): s["turns_done"]
            for g in state["groups"]
            for s in g["siblings"]
            if s["state"] == "running"
        }
        self.published.append((captured_at, self.sim.now(), seen))

    def capture(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "step": self.step,
            "weight_version": self.version,
            "next_prompt": self.next_prompt,
            # Groups being trained on are not trained yet as far as a restore knows.
            "ready": [asdict(g) for g in [*self.training, *self.ready]],
            "groups": [asdict(g) for g in self.groups.values()],
        }

    # --- restore ------------------------------------------------------------

    async def restore(self) -> None:
        """Load the latest snapshot, resume or restart its interrupted tries, and go on."""
        path, state = load_latest(self.out)
        self.emit(rt.RestoreStarted(path=str(path), step=state["step"]))
        await self.sim.sleep(RESTORE_S)
        self.step = state["step"]
        self.version = state["weight_version"]
        self.next_prompt = state["next_prompt"]
        self.ready = [Group.load(g) for g in state["ready"]]
        self.groups = {g["group_id"]: Group.load(g) for g in state["groups"]}
        self.emit(rt.RestoreFinished(step=self.step, unfinished_groups=list(self.groups)))
        await self.sim.sleep(SYNC_S)
        self.emit(rt.WeightsSynced(weight_version=self.version))
        # The snapshot saw these tries mid-way: one with a finished turn goes
        # on from it; one without starts over, ahead of the queue. A try that
        # had failed was reported abandoned then, so it is just queued again.
        restarts: list[tuple[Group, Sibling]] = []
        for g in self.groups.values():
            for s in g.siblings:
                ids: dict[str, Any] = {
                    "group_id": g.group_id,
                    "prompt_id": g.prompt_id,
                    "generation_index": s.index,
                    "attempt": s.attempt,
                }
                if s.state == "running" and s.turns_done:
                    self.emit(rt.AttemptResumed(**ids, turn=s.turns_done))
                    self.take_slot(g, s, from_turn=s.turns_done)
                elif s.state == "running":
                    self.emit(rt.AttemptAbandoned(**ids, reason="restart"))
                    s.state = "queued"
                    restarts.append((g, s))
                elif s.state != "sealed":
                    s.state = "queued"
                    self.queue.append((g, s))
        self.queue.extendleft(reversed(restarts))
        self.start()


def load_latest(out: Path) -> tuple[Path, dict[str, Any]]:
    """The latest published snapshot: its path and state.

    Small files read on the event loop: only simulated time goes by meanwhile.
    """
    latest = out / "snapshots" / "latest.json"
    try:
        path = Path(json.loads(latest.read_text())["path"])
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeError(f"no snapshot to restore from in {latest.parent}: {exc}") from exc
    return path, state


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` whole or not at all: a kill mid-write leaves the old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
