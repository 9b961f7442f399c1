"""``t.attempt(...)``: a try's lifecycle in one statement, under every driver (the
async tracer under asyncio, uvloop and trio with ``async with``, the sync tracer
with ``with``): one dispatch, exactly one end event."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from writing.harness import ASYNC_DRIVERS, DRIVERS, IDS, Driver, Handle

import rollout_trace as rt
from rollout_trace.testing import capture_events

README = Path(__file__).parents[1] / "README.md"
drivers = pytest.mark.parametrize("driver", DRIVERS, ids=IDS)
IDS_OF = {"group_id": "g1", "prompt_id": 42, "generation_index": 0, "weight_version": 3}


@contextlib.asynccontextmanager
async def attempt(h: Handle, n: int = 0, index: int = 0) -> AsyncIterator[rt.Attempt]:
    """``async with`` on the async tracer, a plain ``with`` on the sync one."""
    ids: dict[str, Any] = {**IDS_OF, "generation_index": index, "attempt": n}
    t = h.tracer
    if isinstance(t, rt.SyncTracer):
        with t.attempt(**ids) as a:
            yield a
    else:
        async with t.attempt(**ids) as a:
            yield a


def ends(events: list[rt.Event]) -> list[tuple[str, int, int, str | None]]:
    """(event, generation_index, attempt, reason) of each attempt event, in order."""
    out = []
    for ev in events:
        if isinstance(
            ev, (rt.AttemptDispatched, rt.AttemptSealed, rt.AttemptRefused, rt.AttemptAbandoned)
        ):
            tag = type(ev).__struct_config__.tag
            assert isinstance(tag, str)
            out.append((tag, ev.generation_index, ev.attempt, getattr(ev, "reason", None)))
    return out


def run(driver: Driver, scenario: Any, *, strict: bool = False) -> list[rt.Event]:
    with capture_events(strict=strict) as events:
        driver.run(["memory://"], scenario)
    return list(events)


@drivers
def test_the_body_s_choice_is_the_one_end_event(driver: Driver) -> None:
    outcomes: list[str | None] = []

    async def scenario(h: Handle) -> None:
        async with attempt(h, index=0) as a:
            assert a.outcome is None
            a.seal()
        outcomes.append(a.outcome)
        async with attempt(h, index=1) as a:
            a.refuse("too_long")
        outcomes.append(a.outcome)
        async with attempt(h, index=2) as a:
            a.drop()
        outcomes.append(a.outcome)

    events = run(driver, scenario)
    assert ends(events) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_sealed", 0, 0, None),
        ("attempt_dispatched", 1, 0, None),
        ("attempt_refused", 1, 0, "too_long"),
        ("attempt_dispatched", 2, 0, None),
        ("attempt_abandoned", 2, 0, "dropped"),
    ]
    dispatched = events[0]
    assert isinstance(dispatched, rt.AttemptDispatched)
    assert (dispatched.group_id, dispatched.prompt_id, dispatched.weight_version) == ("g1", 42, 3)
    assert outcomes == ["sealed", "refused", "dropped"]


@drivers
def test_an_exception_abandons_the_try_as_failed_and_goes_on(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        with pytest.raises(RuntimeError, match="worker lost"):
            async with attempt(h):
                raise RuntimeError("worker lost")
        # Chosen before the exception: the choice stands, the exception goes on.
        with pytest.raises(KeyError):
            async with attempt(h, n=1) as a:
                a.seal()
                raise KeyError("after the seal")

    assert ends(run(driver, scenario)) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_abandoned", 0, 0, "failed"),
        ("attempt_dispatched", 0, 1, None),
        ("attempt_sealed", 0, 1, None),
    ]


@drivers
def test_a_cancellation_abandons_the_try_as_cancelled_and_is_raised_again(
    driver: Driver,
) -> None:
    # anyio's cancellation: asyncio.CancelledError under asyncio and uvloop (and
    # the sync driver's loop), trio.Cancelled under trio.
    went_on: list[bool] = []

    async def scenario(h: Handle) -> None:
        with anyio.CancelScope() as scope:
            async with attempt(h):
                scope.cancel()
                await anyio.sleep(10)
                went_on.append(True)  # never: the cancellation was raised again
            went_on.append(True)
        assert scope.cancelled_caught

    assert ends(run(driver, scenario)) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_abandoned", 0, 0, "cancelled"),
    ]
    assert went_on == []


@pytest.mark.parametrize(
    "driver", [d for d in DRIVERS if d.name != "tracer-trio"], ids=lambda d: d.name
)
def test_a_task_cancelled_natively_abandons_its_try_as_cancelled(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        started = asyncio.Event()

        async def task() -> None:
            async with attempt(h):
                started.set()
                await asyncio.sleep(10)

        running = asyncio.ensure_future(task())
        await started.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    assert ends(run(driver, scenario)) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_abandoned", 0, 0, "cancelled"),
    ]


def test_trio_s_own_cancellation_abandons_the_try_as_cancelled() -> None:
    trio = pytest.importorskip("trio")
    caught: list[BaseException] = []

    async def main() -> None:
        async with rt.tracer("memory://") as t:
            with trio.CancelScope() as scope:
                try:
                    async with t.attempt(**IDS_OF, attempt=0):
                        scope.cancel()
                        await trio.sleep(10)
                except BaseException as exc:
                    caught.append(exc)
                    raise

    with capture_events() as events:
        trio.run(main)
    assert [type(e) for e in caught] == [trio.Cancelled]
    assert ends(list(events))[-1] == ("attempt_abandoned", 0, 0, "cancelled")


def test_ctrl_c_in_a_sync_block_ends_the_try_as_cancelled() -> None:
    with (
        capture_events() as events,
        rt.sync_tracer() as t,
        pytest.raises(KeyboardInterrupt),
        t.attempt(**IDS_OF, attempt=0),
    ):
        raise KeyboardInterrupt
    assert ends(list(events))[-1] == ("attempt_abandoned", 0, 0, "cancelled")


@drivers
def test_a_block_left_without_a_choice_is_dropped_and_said_once_naming_the_try(
    driver: Driver, trace_log: pytest.LogCaptureFixture
) -> None:
    async def scenario(h: Handle) -> None:
        async with attempt(h, index=0):
            pass
        async with attempt(h, index=1):
            pass

    assert ends(run(driver, scenario)) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_abandoned", 0, 0, "dropped"),
        ("attempt_dispatched", 1, 0, None),
        ("attempt_abandoned", 1, 0, "dropped"),
    ]
    said = [r.getMessage() for r in trace_log.records if "without a.seal()" in r.getMessage()]
    assert len(said) == 1, said  # once a run
    assert "attempt 0 of sibling (prompt_id=42, generation_index=0) in group 'g1'" in said[0]
    assert "attempt_abandoned(reason='dropped')" in said[0]
    assert all(r.levelno == logging.WARNING for r in trace_log.records if r.getMessage() in said)


@drivers
def test_a_strict_tracer_raises_for_a_block_left_without_a_choice(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        with pytest.raises(rt.TracerStateError, match=r"left its block without a\.seal\(\)"):
            async with attempt(h):
                pass

    # Recorded all the same: a trace never holds a try left open by mistake.
    assert ends(run(driver, scenario, strict=True))[-1] == ("attempt_abandoned", 0, 0, "dropped")


@drivers
def test_an_attempt_ends_once(driver: Driver) -> None:
    async def scenario(h: Handle) -> None:
        async with attempt(h) as a:
            a.seal()
            for second in (a.seal, a.drop, lambda: a.refuse("late")):
                with pytest.raises(rt.TracerStateError) as info:
                    second()
                message = str(info.value)
                assert "has ended already (sealed)" in message
                assert "attempt 0 of sibling (prompt_id=42, generation_index=0)" in message
        # Outside its block, after the end: still refused.
        with pytest.raises(rt.TracerStateError, match="has ended already"):
            a.drop()

    assert ends(run(driver, scenario)) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_sealed", 0, 0, None),
    ]


def test_an_attempt_is_chosen_inside_its_block_and_entered_once() -> None:
    with capture_events() as events, rt.sync_tracer() as t:
        a = t.attempt(**IDS_OF, attempt=0)
        with pytest.raises(rt.TracerStateError, match="is not dispatched: end it inside its block"):
            a.seal()
        with a:
            with pytest.raises(TypeError, match="refuse\\(\\) takes a str reason, not int"):
                a.refuse(3)  # type: ignore[arg-type]
            with pytest.raises(rt.TracerStateError, match="dispatched already"), a:
                pass
            a.seal()
    assert ends(list(events)) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_sealed", 0, 0, None),
    ]


@pytest.mark.parametrize("driver", ASYNC_DRIVERS, ids=[d.name for d in ASYNC_DRIVERS])
def test_the_async_block_never_awaits(driver: Driver) -> None:
    # Entering and leaving are no checkpoints: a try cancelled before it
    # enters its block is not dispatched half-way.
    async def scenario(h: Handle) -> None:
        t = h.tracer
        assert isinstance(t, rt.Tracer)
        cm = t.attempt(**IDS_OF, attempt=0)
        with anyio.CancelScope() as scope:
            scope.cancel()
            async with cm as a:  # no await inside: the cancellation waits for one
                a.seal()
        assert not scope.cancelled_caught

    assert [e[0] for e in ends(run(driver, scenario))] == ["attempt_dispatched", "attempt_sealed"]


def test_a_disabled_tracer_s_attempt_does_nothing_but_still_ends_once() -> None:
    t = rt.sync_tracer(enabled=False)
    with t.attempt(**IDS_OF, attempt=0) as a:
        a.seal()
        with pytest.raises(rt.TracerStateError):
            a.drop()
    assert t.counts.emitted == 0


def test_the_readme_s_attempt_example_runs_and_writes_one_end_per_try(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    marker = "<!-- example: attempt -->\n```python\n"
    assert text.count(marker) == 1
    code = text[text.index(marker) + len(marker) :].split("\n```\n", 1)[0]
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_TRACE"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    events = [ev for ev in rt.read(tmp_path / "attempts.jsonl") if isinstance(ev, rt.Event)]
    by_sibling: dict[int, list[tuple[str, int, int, str | None]]] = {}
    for end in ends(events):
        by_sibling.setdefault(end[1], []).append(end)
    assert by_sibling == {
        0: [("attempt_dispatched", 0, 0, None), ("attempt_sealed", 0, 0, None)],
        1: [
            ("attempt_dispatched", 1, 0, None),
            ("attempt_abandoned", 1, 0, "failed"),
            ("attempt_dispatched", 1, 1, None),
            ("attempt_sealed", 1, 1, None),
        ],
        2: [
            ("attempt_dispatched", 2, 0, None),
            ("attempt_refused", 2, 0, "too_long"),
            ("attempt_dispatched", 2, 1, None),
            ("attempt_sealed", 2, 1, None),
        ],
    }
    check = subprocess.run(
        [sys.executable, "-m", "rollout_trace", "validate", "attempts.jsonl"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_try_still_running_at_the_close_ends_in_the_run_as_cancelled(
    tmp_path: Path, trace_log: pytest.LogCaptureFixture
) -> None:
    # gather() raises at the first failure without cancelling the others:
    # `async with` closes the tracer while two tries still run.
    path = tmp_path / "t.jsonl"

    async def sibling(t: rt.Tracer, index: int, go: asyncio.Event) -> None:
        async with t.attempt(**{**IDS_OF, "generation_index": index, "attempt": 0}) as a:
            if index == 0:
                raise ValueError("worker died")
            await go.wait()
            a.seal()  # after the close: does nothing, raises nothing

    async def main() -> None:
        go = asyncio.Event()
        others: list[asyncio.Future[Any]] = []
        with pytest.raises(ValueError, match="worker died"):
            async with rt.tracer(str(path)) as t:
                tasks = [asyncio.ensure_future(sibling(t, i, go)) for i in range(3)]
                others = tasks[1:]
                await asyncio.gather(*tasks)
        go.set()
        await asyncio.gather(*others)  # their blocks end quietly

    asyncio.run(main())
    written = list(rt.read(path))
    assert ends(written) == [
        ("attempt_dispatched", 0, 0, None),
        ("attempt_abandoned", 0, 0, "failed"),
        ("attempt_dispatched", 1, 0, None),
        ("attempt_dispatched", 2, 0, None),
        ("attempt_abandoned", 1, 0, "cancelled"),
        ("attempt_abandoned", 2, 0, "cancelled"),
    ]
    assert isinstance(written[-1], rt.TraceClosed) and written[-1].dropped == 0
    assert trace_log.records == []
