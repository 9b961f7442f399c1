"""Each assumption `rollout_trace._internals` makes of CPython, asyncio or anyio.

If one of these fails after an upgrade, the trick it guards must change
before the counts or the close can be trusted again.
"""

from __future__ import annotations

import itertools
import threading

import anyio
import pytest

import rollout_trace as rt
from rollout_trace._internals import first_caller, is_cancellation, peek_count


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
