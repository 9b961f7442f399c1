"""Each assumption `rollout_trace._internals` makes of CPython, asyncio or anyio.

If one of these fails after an upgrade, the trick it guards must change
before the counts or the close can be trusted again.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time

import anyio
import pytest

import rollout_trace as rt
from rollout_trace._internals import (
    LEND_INTERVAL,
    first_caller,
    forget_native_cancel,
    is_cancellation,
    lend_gil,
    peek_count,
    restore_gil,
)


@pytest.mark.parametrize(
    "start",
    [
        0,  # a fresh count
        1,  # where seq counters start
        2**40,  # wider than a machine word on 32-bit builds
    ],
)
def test_a_count_is_read_without_taking_a_value(start: int) -> None:
    counter = itertools.count(start)
    assert peek_count(counter) == start
    assert next(counter) == start  # peeking took nothing
    assert peek_count(counter) == start + 1


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_backends_cancellation_is_recognised(backend: str) -> None:
    async def main() -> bool:
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await anyio.sleep(1)
            except BaseException as exc:
                return is_cancellation(exc)
        return False

    assert anyio.run(main, backend=backend)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is 3.11+")
def test_a_native_cancel_taken_in_a_task_of_our_own_is_forgotten() -> None:
    # After a swallowed Task.cancel(), anyio's scopes in the same task must
    # work as usual: a move_on_after must time out, not look cancelled.
    async def pump() -> bool:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            forget_native_cancel()
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep(1)
        return scope.cancelled_caught

    async def main() -> bool:
        task = asyncio.create_task(pump())
        await asyncio.sleep(0)
        task.cancel()
        return await task

    assert asyncio.run(main())


def test_asyncio_run_cancels_the_tracers_own_tasks() -> None:
    # What the pump's patience is for: asyncio.run cancels every task left,
    # natively, through any anyio shield.
    seen: list[bool] = []

    async def shielded() -> None:
        with anyio.CancelScope(shield=True):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append(True)

    async def main() -> None:
        task = asyncio.create_task(shielded())
        await asyncio.sleep(0.01)
        assert not task.done()

    asyncio.run(main())
    assert seen == [True]


def test_public_names_live_at_the_package() -> None:
    for name in rt.__all__:
        obj = getattr(rt, name)
        if hasattr(obj, "__module__") and not isinstance(obj, str):
            assert obj.__module__ == "rollout_trace", (name, obj.__module__)


def test_exactly_one_thread_is_the_first_caller() -> None:
    for _ in range(200):
        counter = itertools.count()
        wins: list[bool] = []
        start = threading.Barrier(8)

        def race(
            counter: itertools.count[int] = counter,
            wins: list[bool] = wins,
            start: threading.Barrier = start,
        ) -> None:
            start.wait()
            wins.append(first_caller(counter))

        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wins.count(True) == 1


@pytest.mark.parametrize(
    ("steps", "during", "after"),
    [
        # Lent, then put back.
        (["lend"], LEND_INTERVAL, 0.005),
        # Lent twice, put back once: back to the program's.
        (["lend", "lend"], LEND_INTERVAL, 0.005),
        # The program sets its own while lent: putting back keeps the program's.
        (["lend", "set 0.002"], 0.002, 0.002),
        # The program's own is shorter already: nothing is lent.
        (["set 0.000001", "lend"], 0.000001, 0.000001),
        # Put back when nothing was lent: nothing changes.
        ([], 0.005, 0.005),
    ],
)
def test_the_gil_is_lent_and_put_back(steps: list[str], during: float, after: float) -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        for step in steps:
            if step == "lend":
                lend_gil()
            else:
                sys.setswitchinterval(float(step.split()[1]))
        assert sys.getswitchinterval() == pytest.approx(during, rel=0.01)
        restore_gil()
        assert sys.getswitchinterval() == pytest.approx(after, rel=0.01)
    finally:
        restore_gil()
        sys.setswitchinterval(before)


def test_a_thread_waiting_for_the_gil_gets_it_while_lent() -> None:
    # What lend_gil() relies on: with the GIL lent, a thread waiting for it
    # gets its turns while this one drops the GIL and takes it back again and
    # again, as an event loop polling its selector does (without it, such a
    # thread may wait as long as the loop stays busy, depending on how soon
    # the system wakes it: not something a test can count on).
    turns: list[float] = []
    done = threading.Event()

    def wait_for_the_gil() -> None:
        while not done.is_set():
            time.sleep(0.001)  # the GIL is dropped here and wanted back after
            turns.append(time.monotonic())

    before = sys.getswitchinterval()
    waiter = threading.Thread(target=wait_for_the_gil, daemon=True)
    waiter.start()
    try:
        lend_gil()
        deadline = time.monotonic() + 5
        begun = len(turns)
        while len(turns) < begun + 20 and time.monotonic() < deadline:
            time.sleep(0)  # drop the GIL and take it back at once, as a busy loop does
        assert len(turns) >= begun + 20  # the waiting thread had its turns
    finally:
        done.set()
        restore_gil()
        waiter.join(5)
        sys.setswitchinterval(before)
