"""The demo's world: a virtual clock over real asyncio tasks, and simulated workers.

The demo's figures are times, and the tracer stamps ``time`` at ``emit``; for
one seed to give one set of figures, time must be simulated and the order in
which tasks act must not depend on the machine. ``Sim`` is a discrete-event
clock: tasks wait only on it, and the driver wakes one of them at a time, in
(time, order) order, and only once every task is waiting again. A task that
awaits something real meanwhile (a Ray actor call) just holds the clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

__all__ = ["EPOCH", "Plan", "Request", "Scenario", "Signal", "Sim", "plan_try"]

# Every demo starts at 2026-01-01 00:00:00 UTC, so runs of one seed line up.
EPOCH = 1_767_225_600.0


class Sim:
    """Simulated Unix time for tasks spawned with ``spawn``; ``now`` is the tracer's clock."""

    def __init__(self, start: float) -> None:
        self._now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        # Tasks that are not waiting on the clock; the driver waits for none.
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None

    def now(self) -> float:
        return self._now

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._add_running(1)
        task = asyncio.get_running_loop().create_task(self._guard(coro), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def sleep(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"cannot sleep {seconds!r} simulated seconds: must be >= 0")
        await self._wait_for(self._timer(self._now + seconds))

    async def run(self, until: float, done: Callable[[], bool]) -> None:
        """Advance time until ``done()`` or past ``until``; re-raises a task's error."""
        while True:
            while self._running:
                await self._idle.wait()
            if self._error is not None:
                raise self._error
            if done():
                return
            if not self._timers:
                raise RuntimeError(f"the simulation stalled at {self._now}: no task can go on")
            if self._timers[0][0] > until:
                return
            when, _, fut = heapq.heappop(self._timers)
            self._now = when
            self._add_running(1)
            fut.set_result(None)

    async def shutdown(self) -> None:
        """Cancel the tasks still waiting (the run is over; the clock stops here)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- internals ----------------------------------------------------------

    def _timer(self, when: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (when, next(self._order), fut))
        return fut

    async def _wait_for(self, fut: asyncio.Future[None]) -> None:
        # The driver counts this task as running again before it wakes it.
        self._add_running(-1)
        await fut

    def _add_running(self, n: int) -> None:
        self._running += n
        if self._running:
            self._idle.clear()
        else:
            self._idle.set()

    async def _guard(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if self._error is None:
                self._error = exc
        finally:
            self._add_running(-1)


class Signal:
    """Wakes every waiter, one at a time through the clock, at the current time."""

    def __init__(self, sim: Sim) -> None:
        self._sim = sim
        self._waiters: list[asyncio.Future[None]] = []

    async def wait(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await self._sim._wait_for(fut)

    def notify(self) -> None:
        for fut in self._waiters:
            # A timer at `now` keeps the wake-ups in one order the driver sets.
            heapq.heappush(self._sim._timers, (self._sim.now(), next(self._sim._order), fut))
        self._waiters.clear()


# --- the scenario and the workers -------------------------------------------


class Scenario(NamedTuple):
    """Where the seed puts the stop, and how long the outage lasts.

    A stop at a random time often costs nothing of some kind. The demo's stop
    lands at the first moment, ``min_gap_s`` or more after a snapshot from the
    ``stop_after_snapshot``-th on was published, when a stop costs something
    of every kind: a try failed before it; since the snapshot's capture a step
    trained and a try sealed; a try the snapshot saw mid-way still runs (it
    will be resumed) and so does one it did not (it will start over); and the
    snapshot saw a try at its first turn (the restore reports it restarted).
    Where no such moment comes, the stop lands 4 steps before the end.
    """

    stop_after_snapshot: int
    min_gap_s: float
    downtime_s: float

    @classmethod
    def from_seed(cls, seed: int) -> Scenario:
        rng = random.Random(f"{seed}/scenario")
        return cls(
            stop_after_snapshot=rng.choice((3, 4)),
            min_gap_s=round(rng.uniform(0.0, 6.0), 3),
            downtime_s=round(rng.uniform(15.0, 30.0), 3),
        )


class Request(NamedTuple):
    seed: int
    group_id: str
    prompt_id: int
    generation_index: int
    attempt: int


class Plan(NamedTuple):
    """What a try does: its turns' durations, then ``sealed``, ``failed`` or ``refused``."""

    outcome: str
    turns: tuple[float, ...]
    fail_turn: int = -1
    refuse_reason: str = ""


_REFUSE_P = 0.05
# A few prompts are hard: their tries fail far more often, so some groups
# lose a sibling twice and restart as a whole.
_HARD_P = 0.12
_FAIL_P = (0.06, 0.35)


def plan_try(req: Request) -> Plan:
    """The try's plan, a function of the request alone (the same on any worker)."""
    hard = random.Random(f"{req.seed}/prompt/{req.prompt_id}").random() < _HARD_P
    rng = random.Random(f"{req.seed}/{req.group_id}/{req.generation_index}/{req.attempt}")
    turns = tuple(round(rng.uniform(2.0, 10.0), 3) for _ in range(rng.randint(1, 7)))
    roll = rng.random()
    if roll < _REFUSE_P:
        return Plan("refused", (), refuse_reason="worker_busy")
    if roll < _REFUSE_P + _FAIL_P[hard]:
        return Plan("failed", turns, fail_turn=rng.randrange(len(turns)))
    return Plan("sealed", turns)


class LocalWorker:
    """A rollout worker in the controller's own process."""

    def generate(self, req: Request) -> Plan:
        return plan_try(req)
